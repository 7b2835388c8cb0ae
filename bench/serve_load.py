#!/usr/bin/env python3
"""A load generator for OpenAI-compatible servers: a generated crate's `serve`, or llama.cpp's
`llama-server`, on the same request mix.

Closed loop (`--concurrency 1,2,4,...`): C clients, each sending its next request as soon as its
last one ends, until every client has sent `--requests` requests. Open loop (`--rate 2,4,...`):
requests arrive as a Poisson process of that many per second, `--requests` of them, whatever the
server's pace. Every request streams (`stream: true`), its prompt given as token ids (the same
ids for both servers: `--prompt-len` ids drawn from a fixed seed), `--max-tokens` new tokens,
greedy. For each level it prints, and writes as one JSON line to `--out`:

- aggregate output tokens per second (all completion tokens over the level's wall time),
- time to first token (TTFT) at p50 and p99 (from sending the request to its first streamed
  token),
- inter-token latency (ITL) at p50 and p99 (between two streamed tokens of one request),
- the requests answered, refused (429) or failed,
- the load generator's own CPU time (`client_cpu_s`): the servers compute on the same cores,
- with `--probe CLASS` (and the load in `--priority` another class): the TTFT of requests of
  CLASS sent one at a time into the loaded server.

Standard library only. Servers listen on loopback; every request has a timeout, so a run ends.

Usage: bench/serve_load.py --url http://127.0.0.1:8080 --model NAME --label ours-f32 \
           [--concurrency 1,2,4,8,16,32] [--rate ...] [--requests 64] [--prompt-len 64] \
           [--max-tokens 64] [--vocab 32000] [--out results.jsonl]
       bench/serve_load.py --plot results.jsonl --svg bench/serve_frontier.svg
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(url, model, prompt, max_tokens, priority, timeout):
    """Sends one streaming completion; returns (ttft, [token times], tokens, status)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if priority:
        body["priority"] = priority
    started = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            return None, [], 0, response.status
        times, usage = [], None
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    times.append(time.perf_counter())
        tokens = usage if usage is not None else len(times)
        ttft = times[0] - started if times else None
        return ttft, times, tokens, 200
    except (OSError, http.client.HTTPException, json.JSONDecodeError):
        return None, [], 0, -1
    finally:
        conn.close()


def summarize(label, mode, level, results, wall):
    ttfts = [r[0] for r in results if r[3] == 200 and r[0] is not None]
    itls = []
    for r in results:
        itls.extend(b - a for a, b in zip(r[1], r[1][1:]))
    tokens = sum(r[2] for r in results if r[3] == 200)
    return {
        "label": label, "mode": mode, "level": level,
        "requests": sum(1 for r in results if r[3] == 200),
        "refused": sum(1 for r in results if r[3] == 429),
        "failed": sum(1 for r in results if r[3] not in (200, 429)),
        "wall_s": wall, "tokens": tokens, "tok_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "itl_p50_ms": percentile(itls, 50) * 1e3, "itl_p99_ms": percentile(itls, 99) * 1e3,
    }


def closed_loop(args, prompts, concurrency):
    results, lock = [], threading.Lock()
    per_client = max(1, args.requests // concurrency)
    probes = []

    def probe():
        # Requests of class --probe, one at a time, into the loaded server: their TTFT shows
        # what a more urgent class waits for while the others saturate it.
        time.sleep(0.5)
        while len(probes) < args.probes and any(t.is_alive() for t in threads):
            r = one_request(args.url, args.model, prompts[len(probes)], args.max_tokens, args.probe, args.timeout)
            probes.append(r)
            time.sleep(0.1)

    def client(c):
        for i in range(per_client):
            r = one_request(args.url, args.model, prompts[(c * per_client + i) % len(prompts)],
                            args.max_tokens, args.priority, args.timeout)
            with lock:
                results.append(r)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for t in threads:
        t.start()
    prober = threading.Thread(target=probe)
    if args.probe:
        prober.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if args.probe:
        prober.join()
    closed_loop.probes = probes
    return results, wall


def open_loop(args, prompts, rate):
    results, lock, threads = [], threading.Lock(), []
    rng = random.Random(7)

    def send(i):
        r = one_request(args.url, args.model, prompts[i % len(prompts)], args.max_tokens, args.priority, args.timeout)
        with lock:
            results.append(r)

    started = time.perf_counter()
    at = started
    for i in range(args.requests):
        at += rng.expovariate(rate)
        time.sleep(max(0.0, at - time.perf_counter()))
        t = threading.Thread(target=send, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results, time.perf_counter() - started


def run(args):
    rng = random.Random(1234)
    # Ids above the control tokens, the same for every server.
    prompts = [[1] + [rng.randrange(100, args.vocab) for _ in range(args.prompt_len - 1)] for _ in range(64)]
    # One warm-up request, untimed.
    one_request(args.url, args.model, prompts[0], 4, args.priority, args.timeout)
    levels = [("closed", int(c)) for c in args.concurrency.split(",") if c] + \
             [("open", float(r)) for r in args.rate.split(",") if r]
    out = open(args.out, "a") if args.out else None
    print(f"{'label':<16} {'mode':<6} {'level':>6} {'req':>4} {'429':>4} {'tok/s':>8} "
          f"{'ttft p50':>9} {'ttft p99':>9} {'itl p50':>8} {'itl p99':>8}")
    for mode, level in levels:
        cpu = time.process_time()
        results, wall = closed_loop(args, prompts, level) if mode == "closed" else open_loop(args, prompts, level)
        s = summarize(args.label, mode, level, results, wall)
        # This process's own CPU time over the level: what the load generator took from the
        # cores that the server computes on (both share the machine).
        s["client_cpu_s"] = time.process_time() - cpu
        probes = getattr(closed_loop, "probes", []) if mode == "closed" else []
        if args.probe:
            ttfts = [r[0] for r in probes if r[3] == 200 and r[0] is not None]
            s["probe"] = args.probe
            s["probe_requests"] = len(ttfts)
            s["probe_ttft_p50_ms"] = percentile(ttfts, 50) * 1e3
            s["probe_ttft_max_ms"] = max(ttfts) * 1e3 if ttfts else float("nan")
        print(f"{s['label']:<16} {mode:<6} {level:>6} {s['requests']:>4} {s['refused']:>4} {s['tok_s']:>8.1f} "
              f"{s['ttft_p50_ms']:>8.1f}ms {s['ttft_p99_ms']:>8.1f}ms {s['itl_p50_ms']:>7.1f}ms {s['itl_p99_ms']:>7.1f}ms"
              f"   client cpu {s['client_cpu_s'] / wall:.0%} of a core",
              flush=True)
        if args.probe:
            print(f"{'':<16} probes of class {args.probe}: {s['probe_requests']}, ttft p50 {s['probe_ttft_p50_ms']:.1f}ms, "
                  f"max {s['probe_ttft_max_ms']:.1f}ms", flush=True)
        if out:
            out.write(json.dumps(s) + "\n")
            out.flush()


def plot(args):
    """An SVG of aggregate throughput against p99 inter-token latency, one line per label,
    each point a closed-loop concurrency."""
    rows = [json.loads(l) for l in open(args.plot) if l.strip()]
    rows = [r for r in rows if r["mode"] == "closed" and r["requests"] > 0]
    labels = sorted({r["label"] for r in rows})
    w, h, m = 720, 460, 70
    xs = [r["tok_s"] for r in rows] or [1]
    ys = [r["itl_p99_ms"] for r in rows] or [1]
    xmax, ymax = max(xs) * 1.1, max(ys) * 1.15
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    sx = lambda x: m + (w - 2 * m) * x / xmax
    sy = lambda y: h - m - (h - 2 * m) * y / ymax
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w/2}" y="24" text-anchor="middle" font-size="15">{args.title}</text>',
           f'<line x1="{m}" y1="{h-m}" x2="{w-m}" y2="{h-m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h-m}" stroke="black"/>',
           f'<text x="{w/2}" y="{h-25}" text-anchor="middle">aggregate output tokens per second</text>',
           f'<text x="18" y="{h/2}" text-anchor="middle" transform="rotate(-90 18 {h/2})">p99 inter-token latency (ms)</text>']
    for i in range(6):
        x, y = xmax * i / 5, ymax * i / 5
        svg.append(f'<text x="{sx(x)}" y="{h-m+16}" text-anchor="middle">{x:.0f}</text>')
        svg.append(f'<text x="{m-6}" y="{sy(y)+4}" text-anchor="end">{y:.0f}</text>')
        svg.append(f'<line x1="{m}" y1="{sy(y)}" x2="{w-m}" y2="{sy(y)}" stroke="#eee"/>')
    for k, label in enumerate(labels):
        pts = sorted((r for r in rows if r["label"] == label), key=lambda r: r["level"])
        color = colors[k % len(colors)]
        path = " ".join(f"{sx(r['tok_s']):.1f},{sy(r['itl_p99_ms']):.1f}" for r in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r in pts:
            svg.append(f'<circle cx="{sx(r["tok_s"]):.1f}" cy="{sy(r["itl_p99_ms"]):.1f}" r="3.5" fill="{color}"/>')
            svg.append(f'<text x="{sx(r["tok_s"])+5:.1f}" y="{sy(r["itl_p99_ms"])-5:.1f}" fill="{color}" font-size="10">{r["level"]}</text>')
        svg.append(f'<rect x="{m+10}" y="{m+10+18*k}" width="12" height="12" fill="{color}"/>')
        svg.append(f'<text x="{m+28}" y="{m+20+18*k}">{label}</text>')
    svg.append("</svg>")
    open(args.svg, "w").write("\n".join(svg) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url")
    p.add_argument("--model")
    p.add_argument("--label", default="server")
    p.add_argument("--concurrency", default="1,2,4,8,16,32")
    p.add_argument("--rate", default="")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--priority", default=None, help="the class of the load's requests")
    p.add_argument("--probe", default=None, help="the class of probe requests sent into the load")
    p.add_argument("--probes", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out")
    p.add_argument("--plot")
    p.add_argument("--svg", default="bench/serve_frontier.svg")
    p.add_argument("--title", default="latency against throughput, closed loop (labels: concurrency)")
    args = p.parse_args()
    if args.plot:
        plot(args)
    elif args.url and args.model:
        run(args)
    else:
        p.error("give --url and --model, or --plot")


if __name__ == "__main__":
    sys.exit(main())
