#!/usr/bin/env python3
"""Derives a DeepSeek-V4.1 tokenizer.json from the V4 one by applying only the documented differences.

The V4.1 BPE (vocab and merges) is the V4/V3 one (encoding.md §4.1); the known added-token changes are
(encoding.md §1):
  * id 128799: `<｜place▁holder▁no▁799｜>` -> `<｜System｜>`  (V4.1 system/effort prefix, GOLD-BUG §1.3)
  * id 129264: `<｜image2｜>` -> `<｜deepseek_image｜>`      (image_token_id, transformers deepseek_v41)
Only `content` changes; the flags (special/normalized) stay those of the V4 entry, which is unverified for
`<｜System｜>`. Other V4.1 added-token differences, if any, are unknown. This is a stand-in until the real V4.1
file is available; the Engram map frozen from it (assets/engram/) must be re-checked against the real file.

usage: python tools/derive_v41_tokenizer.py [--src V4_JSON] [--out OUT_JSON]
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT / "third_party" / "downloads" / "deepseek-v4" / "tokenizer.json"
DEFAULT_OUT = ROOT / "third_party" / "downloads" / "deepseek-v41-derived" / "tokenizer.json"

RENAMES = {
    128799: ("<｜place▁holder▁no▁799｜>", "<｜System｜>"),
    129264: ("<｜image2｜>", "<｜deepseek_image｜>"),
}


def derive(v4: dict) -> dict:
    out = json.loads(json.dumps(v4))
    seen = set()
    for tok in out["added_tokens"]:
        if tok["id"] in RENAMES:
            old, new = RENAMES[tok["id"]]
            if tok["content"] != old:
                raise ValueError(f"id {tok['id']} is {tok['content']!r}, expected {old!r}: not the V4 tokenizer")
            tok["content"] = new
            seen.add(tok["id"])
    missing = set(RENAMES) - seen
    if missing:
        raise ValueError(f"added tokens {sorted(missing)} not found")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=pathlib.Path, default=DEFAULT_SRC)
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    try:
        v41 = derive(json.loads(args.src.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as e:
        print(f"derive_v41_tokenizer: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(v41, ensure_ascii=False, indent=2), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
