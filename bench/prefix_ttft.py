#!/usr/bin/env python3
"""Time to first token with and without the prefix cache (issue "Speculative decoding and prefix
caching", item 1), against one running generated server whose workload sets
`request.shared_prefix_len`.

Each round sends, one request at a time, streamed and greedy, with token ids as the prompt:

- cold: a prefix of `--prefix-len` ids never sent before, then a tail of `--tail-len` ids;
- cached: the same prefix with another tail (the cold request's kept cache holds the prefix).

Rounds alternate the two, so that the machine's drift touches both alike. It prints the median
TTFT of each over the rounds and their ratio (cached / cold). That a cached request's tokens are
those of its prompt run alone is the tests' (tests/tests/serve.rs).

Standard library only; the server listens on loopback and every request has a timeout.

Usage: bench/prefix_ttft.py --url http://127.0.0.1:8080 --model NAME [--rounds 10]
           [--prefix-len 512] [--tail-len 8] [--max-tokens 4] [--vocab 32000]
"""

import argparse
import http.client
import json
import random
import statistics
import time
import urllib.parse


def stream(url, model, prompt, max_tokens):
    """Sends one streamed greedy completion; returns (time to first token, the text)."""
    parts = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}: {response.read()[:200]!r}")
    first = None
    text = []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices"):
            if first is None:
                first = time.perf_counter() - start
            text.append(chunk["choices"][0].get("text", ""))
    conn.close()
    return first, "".join(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--tail-len", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    rng = random.Random(7)

    def ids(n):
        return [rng.randrange(100, args.vocab) for _ in range(n)]

    cold, cached = [], []
    for _ in range(args.rounds):
        prefix = [1] + ids(args.prefix_len - 1)
        t, _ = stream(args.url, args.model, prefix + ids(args.tail_len), args.max_tokens)
        cold.append(t)
        t, _ = stream(args.url, args.model, prefix + ids(args.tail_len), args.max_tokens)
        cached.append(t)
    c, k = statistics.median(cold), statistics.median(cached)
    print(f"prefix {args.prefix_len} ids + tail {args.tail_len}, {args.rounds} rounds, alternating")
    print(f"cold:   median TTFT {c * 1000:.1f} ms  (all: {', '.join(f'{t * 1000:.1f}' for t in cold)})")
    print(f"cached: median TTFT {k * 1000:.1f} ms  (all: {', '.join(f'{t * 1000:.1f}' for t in cached)})")
    print(f"cached / cold: {k / c:.3f}")


if __name__ == "__main__":
    main()
