#!/usr/bin/env python3
"""Times HF tokenizers single-threaded on the tokenizer parity corpus and, if built, cedar's tokenizer_bench on
the same text, and prints both.

    python bench/tokenizer_vs_hf.py                 # writes build/tokenizer_corpus.jsonl, runs both
    python bench/tokenizer_vs_hf.py --write-corpus PATH   # only write the corpus

HF runs with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false (set before tokenizers is imported), on the
DeepSeek tokenizer with its added vocabulary removed (cedar's default: control-token strings are text) and, for
reference, with it. Both sides are timed in CPU time (HF: process_time of the single-threaded process; cedar:
Google Benchmark's default), so a busy shared machine slows neither side's figure much.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

from tokenizer_corpus import build_corpus, corpus_size  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(ROOT / "third_party/downloads/deepseek-v4/tokenizer.json"))
    ap.add_argument("--corpus", default=str(ROOT / "build/tokenizer_corpus.jsonl"))
    ap.add_argument("--write-corpus", metavar="PATH", help="write the corpus to PATH and exit")
    ap.add_argument("--bench", default=str(ROOT / "build/release/bench/tokenizer_bench"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    docs = build_corpus()
    path = pathlib.Path(args.write_corpus or args.corpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    size = corpus_size(docs)
    print(f"corpus: {len(docs)} documents, {size / 1e6:.2f} MB -> {path}")
    if args.write_corpus:
        return 0

    cfg = json.loads(pathlib.Path(args.tokenizer).read_text(encoding="utf-8"))
    full = Tokenizer.from_str(json.dumps(cfg))
    cfg["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(cfg))
    ids = [e.ids for e in plain.encode_batch(docs, add_special_tokens=False)]
    tokens = sum(len(i) for i in ids)
    for name, tok in (("HF encode (added tokens off)", plain), ("HF encode (added tokens on)", full)):
        t = best_time(lambda: tok.encode_batch(docs, add_special_tokens=False), args.repeats)
        print(f"{name:34s} {size / t / 1e6:7.2f} MB/s  {tokens / t / 1e6:6.2f} M tokens/s  ({t:.2f} s)")
    t = best_time(lambda: plain.decode_batch(ids, skip_special_tokens=False), args.repeats)
    print(f"{'HF decode':34s} {size / t / 1e6:7.2f} MB/s  {tokens / t / 1e6:6.2f} M tokens/s  ({t:.2f} s)")

    if not pathlib.Path(args.bench).exists():
        print(f"cedar: {args.bench} not built (needs libbenchmark-dev)")
        return 0
    env = dict(os.environ, CEDAR_TOKENIZER_CORPUS=str(path), CEDAR_TOKENIZER=args.tokenizer)
    proc = subprocess.run([args.bench, "--benchmark_format=json", "--benchmark_min_time=2"],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr)
        return 1
    for b in json.loads(proc.stdout)["benchmarks"]:
        if "bytes_per_second" in b:
            print(f"cedar {b['name']:28s} {b['bytes_per_second'] / 1e6:7.2f} MB/s  "
                  f"{b['tokens/s'] / 1e6:6.2f} M tokens/s")
        else:
            print(f"cedar {b['name']:28s} {b['real_time']:7.1f} {b['time_unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
