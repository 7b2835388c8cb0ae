#!/usr/bin/env python3
"""Writes fixtures that pin down how Hugging Face transformers renders real chat templates, to
tests/fixtures/chat_templates/<family>.json (run once by hand; the test suite reads the files and
needs no Python).

The generated servers render a model's `chat_template` with minijinja (trim_blocks and
lstrip_blocks on, minijinja-contrib's pycompat methods, `raise_exception(msg)`,
`strftime_now(fmt)`, and the variables `messages`, `add_generation_prompt`, `bos_token`,
`eos_token` plus any further variables). These fixtures hold what
`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` gives for the
same template, so the Rust side can be checked against the reference.

The templates are the `chat_template` strings of the models' tokenizer_config.json files as
published on the Hugging Face hub, copied verbatim from public repositories that vendor them (each
fixture's `source` says which; `expected_chars` below is the length of the stored copy, checked at
run time to catch a transcription slip). The vocabulary does not matter for tokenize=False, so the
tokenizer is stories260k's tokenizer.json with the family's bos/eos strings set.

The bos/eos strings are the families' well-known special tokens as their tokenizer_config.json
files give them (read from a vendored copy only for SmolLM2); of these templates only the Llama
ones use bos_token and only the Mistral ones use bos_token and eos_token.

Each fixture file holds: `name`, `models`, `source`, `transformers_version`, `jinja2_version`,
`chat_template`, `bos_token`, `eos_token` (null where the model's tokenizer_config has none),
`notes`, and `cases`: a list of {`name`, `messages`, `add_generation_prompt`, `extra` (further
template variables, passed to apply_chat_template as keyword arguments; usually empty), and either
`expected` (the rendered text) or `error`: true with `error_message` (the template refused the
conversation through raise_exception)}.

Llama 3.2's template calls `strftime_now("%d %b %Y")` unless `date_string` is defined; its cases
all pass `date_string` in `extra`, so the expected text is fixed. Llama 3.1's template falls back
to "26 Jul 2024" (no strftime_now); it has cases with and without `date_string`.

Generated with transformers 5.25.0 and Jinja2 3.1.6 (recorded in every file).

Usage: pip install transformers jinja2   (torch is not needed)
       python3 tools/chat_template_fixtures.py [SHARED_MODELS_DIR]
"""

import json
import pathlib
import sys

import jinja2
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "models"
OUT = ROOT / "tests" / "fixtures" / "chat_templates"

# --- The templates (Python string literals with the same escapes as the JSON they came from). ---

SMOLLM2 = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

QWEN2 = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

QWEN2_5 = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"

LLAMA3 = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

LLAMA3_1 = "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if builtin_tools is defined or tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{%- if builtin_tools is defined %}\n    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n{%- endif %}\n    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for message in messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n            {%- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_name + '=\"' + arg_val + '\"' }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- endif %}\n                {%- endfor %}\n            {{- \")\" }}\n        {%- else  %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n            {{- '\"parameters\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- \"}\" }}\n        {%- endif %}\n        {%- if builtin_tools is defined %}\n            {#- This means we're in ipython mode #}\n            {{- \"<|eom_id|>\" }}\n        {%- else %}\n            {{- \"<|eot_id|>\" }}\n        {%- endif %}\n    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"

LLAMA3_2 = "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n        {%- set date_string = \"26 Jul 2024\" %}\n    {%- endif %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n{#- System message #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n{%- endif %}\n    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for message in messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n        {{- tool_call.arguments | tojson }}\n        {{- \"}\" }}\n        {{- \"<|eot_id|>\" }}\n    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"

MISTRAL_LEGACY = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"

MISTRAL_V1 = "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"

MISTRAL_V3 = "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n            {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] [\" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n                {{- '{\"type\": \"function\", \"function\": {' }}\n                {%- for key, val in tool.items() if key != \"return\" %}\n                    {%- if val is string %}\n                        {{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- else %}\n                        {{- '\"' + key + '\": ' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last %}\n                        {{- \", \" }}\n                    {%- endif %}\n                {%- endfor %}\n                {{- \"}}\" }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                    {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n        {{- \"[TOOL_CALLS] [\" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- endif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"

TEMPLATES = [
    dict(
        name="smollm2",
        models=["HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct",
                "HuggingFaceTB/SmolLM2-1.7B-Instruct"],
        source=[
            "a public Rust (candle) test, found by text search, that loads "
            "HuggingFaceTB/SmolLM2-135M-Instruct/tokenizer_config.json from the hub and asserts that "
            "chat_template, bos_token and eos_token equal these strings (its repository was not "
            "confirmed; probably github.com/biom8er/phymes)",
            "several other public copies match (tests that read the SmolLM2-135M-Instruct "
            "GGUF's tokenizer.chat_template; one records the stored template as 368 bytes)",
        ],
        template=SMOLLM2, expected_chars=368, bos="<|im_start|>", eos="<|im_end|>",
        notes="ChatML; injects a default system message when the first message is not a system one.",
    ),
    dict(
        name="qwen2",
        models=["Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2-0.5B-Instruct", "Qwen/Qwen2-1.5B-Instruct"],
        source=[
            "github.com/ggerganov/llama.cpp tests/chat/templates/Qwen-Qwen2-7B-Instruct.jinja "
            "(commit 68dd2f75737062f44a5d8d189158003de36e7cf7; fetched from the hub by llama.cpp)",
            "matches (compared by eye, not byte for byte) an entry of github.com/ollama/ollama template/index.json",
        ],
        template=QWEN2, expected_chars=328, bos=None, eos="<|im_end|>",
        notes="ChatML with the default system prompt 'You are a helpful assistant.'. "
              "bos_token is null in Qwen's tokenizer_config (the template does not use it).",
    ),
    dict(
        name="qwen2_5",
        models=["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                "Qwen/Qwen2.5-3B-Instruct"],
        source=[
            "github.com/ggerganov/llama.cpp tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja "
            "(commit eaca756ecca033e6fdd241dad091974a2c0354ff; fetched from the hub by llama.cpp)",
            "matches (compared by eye, not byte for byte) copies of Qwen2.5-Instruct's tokenizer_config.json chat_template pasted in "
            "other public code",
        ],
        template=QWEN2_5, expected_chars=2507, bos=None, eos="<|im_end|>",
        notes="ChatML with the default system prompt 'You are Qwen, created by Alibaba Cloud. You are "
              "a helpful assistant.' and a tools branch (not exercised: no `tools` variable). "
              "bos_token is null in Qwen's tokenizer_config.",
    ),
    dict(
        name="llama3",
        models=["meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct"],
        source=[
            "github.com/huggingface/trl trl/chat_templates/llama3.jinja "
            "(commit 72dfe9b6493b4c68a4c4b7f03ba5eeca474760dc; 'Original Llama 3 chat template')",
            "matches (compared by eye, not byte for byte) the llama3-instruct entry of github.com/ollama/ollama template/index.json",
        ],
        template=LLAMA3, expected_chars=389, bos="<|begin_of_text|>", eos="<|eot_id|>",
        notes="Trims every message's content; the bos_token is prepended to the first message.",
    ),
    dict(
        name="llama3_1",
        models=["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"],
        source=[
            "github.com/ggerganov/llama.cpp tests/chat/templates/meta-llama-Llama-3.3-70B-Instruct.jinja "
            "(commit a4b2d1d0d415e6c15a4ce2010f045d92dbd97a0e; fetched from the hub by llama.cpp)",
            "matches (compared by eye, not byte for byte) the Llama 3.1 entry (named llama3-instruct) of github.com/ollama/ollama "
            "template/index.json",
        ],
        template=LLAMA3_1, expected_chars=4614, bos="<|begin_of_text|>", eos="<|eot_id|>",
        notes="Always emits a system block with 'Cutting Knowledge Date: December 2023' and "
              "'Today Date: ' + date_string; date_string defaults to '26 Jul 2024' (no strftime_now).",
    ),
    dict(
        name="llama3_2",
        models=["meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"],
        source=[
            "github.com/ggerganov/llama.cpp models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja "
            "(commit 7b5e0803c84435e8005725d8f9ddceb5d1820443; fetched from the hub by llama.cpp)",
        ],
        template=LLAMA3_2, expected_chars=3827, bos="<|begin_of_text|>", eos="<|eot_id|>",
        notes="Like Llama 3.1, but date_string defaults to strftime_now('%d %b %Y') (today's date). "
              "Every case passes date_string in `extra` to fix the text.",
    ),
    dict(
        name="mistral_legacy",
        models=["mistralai/Mistral-7B-Instruct-v0.2 (earlier revision of its tokenizer_config)",
                "mistralai/Mixtral-8x7B-Instruct-v0.1 (earlier revision of its tokenizer_config)"],
        source=[
            "github.com/ggml-org/llama.cpp tests/test-chat-template.cpp (commit "
            "03f94f19a2c4c9d039fa1a84838fe3e2110cc28d), the case named 'mistralai/Mistral-7B-Instruct-v0.2 "
            "(NOTE: Old pre-v1 without a system prompt)'",
            "matches (compared by eye, not byte for byte) the mistral-instruct entry of github.com/ollama/ollama template/index.json and "
            "'mistralai/Mixtral-8x7B-Instruct-v0.1' in github.com/huggingface/huggingface.js "
            "packages/jinja/test/e2e.test.js",
        ],
        template=MISTRAL_LEGACY, expected_chars=None, bos="<s>", eos="</s>",
        notes="The older [INST] template: refuses a system message and non-alternating roles.",
    ),
    dict(
        name="mistral_v1",
        models=["mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mistral-7B-Instruct-v0.2"],
        source=[
            "github.com/ggerganov/llama.cpp tests/chat/templates/mistralai-Mixtral-8x7B-Instruct-v0.1.jinja "
            "(commit eaca756ecca033e6fdd241dad091974a2c0354ff; fetched from the hub by llama.cpp)",
            "matches (compared by eye, not byte for byte) the case named \"mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with "
            "a system prompt)\" of github.com/ggml-org/llama.cpp tests/test-chat-template.cpp",
        ],
        template=MISTRAL_V1, expected_chars=1058, bos="<s>", eos="</s>",
        notes="Mistral's 'v1' tokenizer template: ' [INST] ' with a leading space, the system message "
              "joined to the first user message, roles must alternate.",
    ),
    dict(
        name="mistral_v0_3",
        models=["mistralai/Mistral-7B-Instruct-v0.3 (attribution: see notes)"],
        source=[
            "github.com/huggingface/trl trl/chat_templates/mistral.jinja "
            "(commit 4a56de4bd88d182856b8a92798cc285bd50d35f0)",
        ],
        template=MISTRAL_V3, expected_chars=3959, bos="<s>", eos="</s>",
        notes="Mistral's 'v3' tokenizer template with tool calling: '[INST] ' without a leading space, "
              "the system message joined to the LAST user message, assistant content trimmed. TRL "
              "stores it as the original Mistral template; that it is exactly the one "
              "Mistral-7B-Instruct-v0.3 ships is inferred (its 9-character tool-call-id check matches "
              "vLLM's description of v0.3's tokenizer_config template), not read from the hub.",
    ),
]

# --- The conversations. ---

SYSTEM = "You are a concise assistant."
Q1 = "What is the capital of France?"
A1 = "The capital of France is Paris."
Q2 = "And of Germany?"

CONVERSATIONS = [
    ("user", [{"role": "user", "content": Q1}]),
    ("system_user", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q1}]),
    ("system_user_assistant_user", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": Q1},
        {"role": "assistant", "content": A1},
        {"role": "user", "content": Q2},
    ]),
    ("user_assistant_user", [
        {"role": "user", "content": Q1},
        {"role": "assistant", "content": A1},
        {"role": "user", "content": Q2},
    ]),
    # Surrounding whitespace and an inner newline: some templates trim, others keep it.
    ("whitespace", [
        {"role": "system", "content": "  Answer in French.\n"},
        {"role": "user", "content": "\n  Hello,\nworld!  "},
        {"role": "assistant", "content": "  Bonjour !  "},
        {"role": "user", "content": "Thanks. "},
    ]),
]

DATE = {"date_string": "05 Mar 2025"}


def cases_for(spec):
    """(name, messages, add_generation_prompt, extra) for one template."""
    out = []
    if spec["name"] == "llama3_2":
        # Without date_string the text depends on today's date (strftime_now).
        variants = [("", DATE)]
    elif spec["name"] == "llama3_1":
        variants = [("", {}), ("+date_string", DATE)]
    else:
        variants = [("", {})]
    for suffix, extra in variants:
        for name, messages in CONVERSATIONS:
            out.append((name + suffix, messages, True, extra))
    # One rendering without the generation prompt (the whole multi-turn conversation).
    name, messages = CONVERSATIONS[2]
    out.append((name + "+no_generation_prompt", messages, False, variants[0][1]))
    return out


def tokenizer(shared_models):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(shared_models / "stories260k" / "tokenizer.json"))


def render(tok, spec, messages, add_generation_prompt, extra):
    tok.chat_template = spec["template"]
    tok.bos_token = spec["bos"]
    tok.eos_token = spec["eos"]
    return tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **extra)


def main():
    tok = tokenizer(MODELS)
    OUT.mkdir(parents=True, exist_ok=True)
    for spec in TEMPLATES:
        if spec["expected_chars"] is not None and len(spec["template"]) != spec["expected_chars"]:
            sys.exit(f"{spec['name']}: the template has {len(spec['template'])} characters, the "
                     f"source {spec['expected_chars']}: a transcription slip")
        cases = []
        for name, messages, add_generation_prompt, extra in cases_for(spec):
            case = dict(name=name, messages=messages, add_generation_prompt=add_generation_prompt,
                        extra=extra)
            try:
                case["expected"] = render(tok, spec, messages, add_generation_prompt, extra)
            except jinja2.exceptions.TemplateError as e:
                case["error"] = True
                case["error_message"] = str(e)
            cases.append(case)
        fixture = dict(
            name=spec["name"],
            models=spec["models"],
            source=spec["source"],
            transformers_version=transformers.__version__,
            jinja2_version=jinja2.__version__,
            chat_template=spec["template"],
            bos_token=spec["bos"],
            eos_token=spec["eos"],
            notes=spec["notes"],
            cases=cases,
        )
        path = OUT / f"{spec['name']}.json"
        path.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + "\n")
        refused = sum(1 for c in cases if c.get("error"))
        print(f"{path.relative_to(ROOT)}: {len(cases)} cases ({refused} refused)")


if __name__ == "__main__":
    main()
