"""KV cache records (src/kv/kv_format.h) against a numpy packing written from
shared/spec/architecture.md §3.12 (layouts) and §3.1 (recipes, via the numpy references of
test_numeric_formats.py): every record byte and every decoded value, bit for bit.

cedar's records come from the test-only tool tests/tools/cedar_kv_dump.cpp (env CEDAR_KV_DUMP,
default build/release/tests/cedar_kv_dump).
"""

import os
import subprocess
from pathlib import Path

import ml_dtypes as md
import numpy as np
import pytest

from test_numeric_formats import (
    F32,
    assert_same_codes,
    assert_same_f32,
    random_blocks,
    ref_ceil_pow2,
    ref_qdq,
    special_blocks,
    tie_blocks,
    ue8m0_value,
)

REPO = Path(__file__).resolve().parents[2]

# recipe name in cedar, numeric recipe, width, record bytes (§3.12)
V41 = [
    ("fp4_b16_e4m3", "fp4_block16_e4m3", 512, 288),
    ("fp4_b32_ue8m0", "fp4_block32_ue8m0", 128, 68),
    ("fp8_b32_ue8m0", "fp8_block32_ue8m0", 512, 528),
]


@pytest.fixture(scope="session")
def kv_tool():
    path = Path(os.environ.get("CEDAR_KV_DUMP", REPO / "build/release/tests/cedar_kv_dump"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"cedar_kv_dump not found at {path}: build it or point CEDAR_KV_DUMP at it", pytrace=False)
    return path


def pack(tool, tmp_path, recipe, width, rope, x):
    inp, prefix = tmp_path / f"{recipe}.in.f32", tmp_path / recipe
    np.ascontiguousarray(x, dtype=F32).tofile(inp)
    args = [str(tool), recipe, str(width), str(rope), str(inp), str(prefix)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(args)} failed: {proc.stderr}"
    return (np.fromfile(f"{prefix}.records.u8", dtype=np.uint8), np.fromfile(f"{prefix}.decoded.f32", dtype=F32))


def rows_of(x, width):
    n = (x.size // width) * width
    return x[:n].reshape(-1, width)


@pytest.mark.parametrize("name,recipe,width,record", V41)
def test_v41_records_match_numpy_packing(kv_tool, tmp_path, name, recipe, width, record):
    rng = np.random.default_rng(4100 + width)
    x = np.concatenate([
        random_blocks(rng, recipe, 4000, bf16_exact=True),
        tie_blocks(rng, recipe, 1000),
        np.resize(special_blocks(recipe), width * 4),
    ])
    rows = rows_of(x, width)
    got_rec, got_dec = pack(kv_tool, tmp_path, name, width, 0, rows)
    want_rec, want_dec = [], []
    for r in rows:
        values, codes, scales = ref_qdq(r, recipe)
        want_rec.append(np.concatenate([codes, scales]))  # codes, then one scale byte per block
        want_dec.append(values)
    want_rec = np.concatenate(want_rec)
    assert want_rec.size == rows.shape[0] * record
    assert_same_codes(got_rec, want_rec, f"{name} record bytes")
    assert_same_f32(got_dec, np.concatenate(want_dec), f"{name} decoded")


def ref_v4_record(row, rope):
    """V4 FlashMLA row (serving.md §2c): e4m3 NoPE codes (FP8 recipe, blocks of 64, UE8M0), bf16 RoPE
    dims (little-endian), one UE8M0 byte per NoPE block, zero padding to a multiple of 8."""
    nope = row.size - rope
    b = row[:nope].reshape(-1, 64).astype(F32)
    amax = np.maximum(np.abs(b).max(axis=1), F32(1e-4)).astype(F32)
    sbyte = ref_ceil_pow2(amax * F32(1 / 448))
    s = ue8m0_value(sbyte)
    q = np.clip(b / s[:, None], F32(-448), F32(448)).astype(md.float8_e4m3fn)
    values = (q.astype(F32) * s[:, None]).reshape(-1)
    r16 = row[nope:].astype(md.bfloat16)
    rec = np.concatenate([q.view(np.uint8).reshape(-1), r16.view(np.uint8), sbyte])
    rec = np.concatenate([rec, np.zeros((-rec.size) % 8, np.uint8)])
    return rec, np.concatenate([values, r16.astype(F32)])


def test_v4_records_match_numpy_packing(kv_tool, tmp_path):
    rng = np.random.default_rng(4000)
    width, rope = 512, 64
    mag = np.exp2(rng.integers(-30, 30, (300, 1)))
    rows = (rng.standard_normal((300, width)) * mag).astype(md.bfloat16).astype(F32)
    got_rec, got_dec = pack(kv_tool, tmp_path, "v4_fp8_bf16", width, rope, rows)
    want = [ref_v4_record(r, rope) for r in rows]
    assert want[0][0].size == 584
    assert_same_codes(got_rec, np.concatenate([w[0] for w in want]), "v4 record bytes")
    assert_same_f32(got_dec, np.concatenate([w[1] for w in want]), "v4 decoded")
