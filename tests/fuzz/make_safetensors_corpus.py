"""Regenerates the seed corpus tests/fuzz/corpus/safetensors/ with the official safetensors writer.

Tiny files on purpose: libFuzzer mutates them, so small seeds that reach every branch are best.
Run: .venv/bin/python tests/fuzz/make_safetensors_corpus.py
"""
import json
import pathlib

import ml_dtypes
import numpy as np
from safetensors.numpy import save

OUT = pathlib.Path(__file__).parent / "corpus" / "safetensors"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    files = {
        "single_f32.safetensors": save({"w": np.arange(4, dtype=np.float32).reshape(2, 2)}),
        "mixed.safetensors": save(
            {
                "a.weight": np.arange(6).astype(ml_dtypes.bfloat16).reshape(2, 3),
                "b.weight": np.linspace(-2, 2, 4).astype(ml_dtypes.float8_e4m3fn).reshape(2, 2),
                "b.scale": np.ones((1, 1), dtype=ml_dtypes.float8_e8m0fnu),
                "e.weight": np.arange(-2, 2, dtype=np.int8).reshape(2, 2),
                "s": np.array(1.5, dtype=np.float32),
            },
            metadata={"format": "pt"},
        ),
        "zero_size.safetensors": save({"e": np.zeros((0, 3), dtype=np.float16), "x": np.ones(1, dtype=np.uint8)}),
        "empty.safetensors": save({}),
    }
    for name, data in files.items():
        (OUT / name).write_bytes(data)
    index = {
        "metadata": {"total_size": 30},
        "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"},
    }
    (OUT / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
