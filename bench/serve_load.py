#!/usr/bin/env python3
"""Load test for `cedar serve` (loopback only, bounded): N concurrent streaming chat clients for a fixed
duration, each looping request after request. Reports requests, errors, time to first token and
end-to-end latency percentiles (p50 / p99), tokens/s, and the server's in-flight / running gauges
after the run (both must return to 0: nothing leaked).

  bench/serve_load.py                         # starts `cedar serve --fake-backend` itself
  bench/serve_load.py --url http://127.0.0.1:8000 --model deepseek-v4.1-flash   # an already running server

Uses only the standard library (http.client + threads), so it measures the server, not a client stack.
"""
import argparse
import json
import http.client
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def one_stream(host, port, body, timeout):
    """(ttft_s, e2e_s, completion_tokens) of one streamed chat request; raises on any protocol error."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, tokens, done, buf = None, 0, False, b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                done = True
                continue
            j = json.loads(data)
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            for ch in j.get("choices", []):
                d = ch.get("delta", {})
                if ttft is None and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
                    ttft = time.perf_counter() - t0
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return ttft if ttft is not None else float("nan"), time.perf_counter() - t0, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="server base URL (default: start cedar serve --fake-backend)")
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--fake-tick-ms", type=int, default=5, help="started server: ms per decode step")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()

    server = None
    if args.url:
        u = urlparse(args.url)
        host, port = u.hostname, u.port
    else:
        from serve_util import CedarServer
        server = CedarServer(["--fake-backend", "--fake-tick-ms", str(args.fake_tick_ms), "--max-inflight",
                              str(max(128, args.concurrency * 2))])
        host, port = "127.0.0.1", server.port
    body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": "Tell me a story."}],
                       "stream": True, "stream_options": {"include_usage": True}, "max_tokens": args.max_tokens,
                       "temperature": 0})
    ttfts, e2es, errors, tokens = [], [], [], [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + args.duration

    def worker():
        while time.perf_counter() < stop_at:
            try:
                ttft, e2e, n = one_stream(host, port, body, timeout=60)
                with lock:
                    ttfts.append(ttft)
                    e2es.append(e2e)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    leaks = {}
    if server is not None:
        time.sleep(0.2)
        leaks = {m: server.metric(m) for m in ("cedar_requests_inflight", "cedar_requests_running")}
        server.stop()
    res = {
        "concurrency": args.concurrency, "duration_s": round(wall, 2), "requests": len(e2es), "errors": len(errors),
        "ttft_p50_ms": round(1000 * percentile(ttfts, 50), 2), "ttft_p99_ms": round(1000 * percentile(ttfts, 99), 2),
        "e2e_p50_ms": round(1000 * percentile(e2es, 50), 2), "e2e_p99_ms": round(1000 * percentile(e2es, 99), 2),
        "e2e_mean_ms": round(1000 * statistics.mean(e2es), 2) if e2es else None,
        "requests_per_s": round(len(e2es) / wall, 1), "tokens_per_s": round(tokens[0] / wall, 1), **leaks,
    }
    print(json.dumps(res, indent=2))
    if errors:
        print("first errors:", errors[:5], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    ok = not errors and all(v == 0 for v in leaks.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
