#!/usr/bin/env python3
"""Talks to a generated server with OpenAI's official Python client, as its users would, and
prints one JSON object of what it got (tests/tests/serve.rs checks it against the model run
alone).

Usage: python3 openai_client.py BASE_URL MODEL API_KEY
"""

import json
import sys

import openai

base_url, model, api_key = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
out = {"openai_version": openai.__version__}

out["models"] = [m.id for m in client.models.list().data]

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0)
out["completion"] = {
    "text": completion.choices[0].text,
    "finish_reason": completion.choices[0].finish_reason,
    "usage": completion.usage.model_dump(),
}

pieces, finish, usage = [], None, None
for chunk in client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices:
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
out["completion_stream"] = {"text": "".join(pieces), "finish_reason": finish, "usage": usage}

messages = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0)
out["chat"] = {
    "role": chat.choices[0].message.role,
    "content": chat.choices[0].message.content,
    "finish_reason": chat.choices[0].finish_reason,
    "usage": chat.usage.model_dump(),
}

pieces, roles = [], []
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0, stream=True):
    delta = chunk.choices[0].delta
    if delta.role:
        roles.append(delta.role)
    if delta.content:
        pieces.append(delta.content)
out["chat_stream"] = {"content": "".join(pieces), "roles": roles}

errors = {}
for name, call in {
    "unknown_model": lambda: client.completions.create(model="gpt-4", prompt="a", max_tokens=2),
    "max_tokens": lambda: client.completions.create(model=model, prompt="a", max_tokens=100000),
    "priority_header": lambda: client.completions.create(
        model=model, prompt="a", max_tokens=2, extra_headers={"X-Priority": "urgent"}),
}.items():
    try:
        call()
        errors[name] = None
    except openai.APIStatusError as e:
        errors[name] = {"status": e.status_code, "message": e.message}
out["errors"] = errors

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    out["wrong_key"] = None
except openai.AuthenticationError as e:
    out["wrong_key"] = e.status_code

print(json.dumps(out))
