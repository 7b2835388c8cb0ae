#!/usr/bin/env python3
"""Asks a generated embeddings server for vectors with OpenAI's official Python client, as its
users would, and prints one JSON object of what it got (tests/tests/serve_embeddings.rs checks
it against the model run alone).

Usage: python3 openai_embeddings.py BASE_URL MODEL API_KEY SENTENCES_JSON
"""

import json
import sys

import openai

base_url, model, api_key = sys.argv[1:4]
sentences = json.loads(sys.argv[4])
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
out = {"openai_version": openai.__version__}

# Without encoding_format the client asks for base64 and decodes it into floats itself.
default = client.embeddings.create(model=model, input=sentences)
out["default"] = {
    "vectors": [d.embedding for d in default.data],
    "indices": [d.index for d in default.data],
    "usage": default.usage.model_dump(),
    "model": default.model,
}
floats = client.embeddings.create(model=model, input=sentences[0], encoding_format="float")
out["float"] = {"vectors": [d.embedding for d in floats.data], "usage": floats.usage.model_dump()}

errors = {}
for name, call in {
    "unknown_model": lambda: client.embeddings.create(model="no-such-model", input="x"),
    "empty_string": lambda: client.embeddings.create(model=model, input=""),
    "dimensions": lambda: client.embeddings.create(model=model, input="x", dimensions=7),
}.items():
    try:
        call()
        errors[name] = {"status": None}
    except openai.APIStatusError as e:
        errors[name] = {"status": e.status_code, "body": e.body}
out["errors"] = errors

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).embeddings.create(model=model, input="x")
    out["wrong_key"] = None
except openai.AuthenticationError as e:
    out["wrong_key"] = e.status_code

print(json.dumps(out))
