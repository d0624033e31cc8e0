"""cedar's numeric formats and QDQ recipes (src/core/numeric.h) against independent references.

References: ml_dtypes (bfloat16, float8_e4m3fn, float4_e2m1fn, float8_e8m0fnu) for the element
formats, and numpy re-implementations of the three QDQ recipes written from
shared/spec/architecture.md §3.1 / §3.12. cedar's outputs come from the test-only tool
tests/tools/cedar_numeric_dump.cpp (env CEDAR_NUMERIC_DUMP, default build/release/tests/...).
Every comparison is bit-exact.
"""

import os
import subprocess
from pathlib import Path

import ml_dtypes as md
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
F32 = np.float32
RNG_SEED = 20240611


# ---- running the tool -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dump_tool():
    path = Path(os.environ.get("CEDAR_NUMERIC_DUMP", REPO / "build/release/tests/cedar_numeric_dump"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"cedar_numeric_dump not found at {path}: build it (cmake --build --preset release) "
            "or point CEDAR_NUMERIC_DUMP at it",
            pytrace=False,
        )
    return path


def run_tool(tool, tmp_path, op, x=None):
    prefix = tmp_path / op
    if x is None:
        args = [str(tool), op, str(prefix)]
    else:
        inp = tmp_path / f"{op}.in.f32"
        np.ascontiguousarray(x, dtype=F32).tofile(inp)
        args = [str(tool), op, str(inp), str(prefix)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(args)} failed: {proc.stderr}"
    return prefix


def read(prefix, suffix, dtype):
    return np.fromfile(f"{prefix}.{suffix}", dtype=dtype)


def assert_same_f32(got, want, what):
    """Bitwise equality of float32 arrays; any NaN matches any NaN."""
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    assert got.shape == want.shape, what
    both_nan = np.isnan(got) & np.isnan(want)
    bad = (got.view(np.uint32) != want.view(np.uint32)) & ~both_nan
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} mismatches, first at {i}: cedar {got[i]!r} vs reference {want[i]!r}")


def assert_same_codes(got, want, what, inputs=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    bad = got != want
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        at = f" (input {inputs[i]!r})" if inputs is not None else ""
        raise AssertionError(
            f"{what}: {bad.sum()} mismatches, first at {i}{at}: cedar {got[i]:#x} vs reference {want[i]:#x}"
        )


# ---- inputs -----------------------------------------------------------------------------------


def bits_to_f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(F32)


def neighbours(x):
    """x with its fp32 neighbours on both sides."""
    x = np.asarray(x, F32)
    return np.concatenate([x, np.nextafter(x, F32(np.inf)), np.nextafter(x, F32(-np.inf))])


def with_negatives(x):
    return np.concatenate([x, -x]).astype(F32)


def random_f32(rng, n):
    """Random fp32 bit patterns (every class: zero, subnormal, normal, Inf, NaN) plus log-uniform values."""
    raw = bits_to_f32(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32))
    logu = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-20, 12, n))).astype(F32)
    return np.concatenate([raw, logu])


def format_grid(dtype):
    """All finite non-negative values of a small float format, sorted, as float32."""
    n = 256 if np.dtype(dtype).itemsize == 1 else 65536
    v = np.arange(n, dtype=np.uint8 if n == 256 else np.uint16).view(dtype).astype(F32)
    v = v[np.isfinite(v) & (v >= 0)]
    return np.unique(v)


def midpoints(grid):
    return ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)


def bf16_up(x):
    b = np.asarray(x, F32).astype(md.bfloat16).view(np.uint16)
    return (b + 1).astype(np.uint16).view(md.bfloat16).astype(F32)


def bf16_down(x):
    b = np.asarray(x, F32).astype(md.bfloat16).view(np.uint16)
    return (b - 1).astype(np.uint16).view(md.bfloat16).astype(F32)


# ---- independent references -------------------------------------------------------------------


def ref_bf16(x):
    with np.errstate(invalid="ignore"):
        return np.asarray(x, F32).astype(md.bfloat16).view(np.uint16)


def ref_e4m3(x):
    """OCP e4m3fn, RNE, saturating (satfinite): clip to ±448 first (ml_dtypes itself overflows to NaN)."""
    with np.errstate(invalid="ignore"):
        return np.clip(np.asarray(x, F32), F32(-448), F32(448)).astype(md.float8_e4m3fn).view(np.uint8)


def ref_e2m1(x):
    return np.asarray(x, F32).astype(md.float4_e2m1fn).view(np.uint8)


def ref_ceil_pow2(x):
    """Exponent byte of the smallest 2^(b-127) >= x, via frexp (no bit tricks); 0xFF where none exists."""
    x = np.asarray(x, F32)
    out = np.full(x.shape, 0xFF, dtype=np.int64)
    ok = np.isfinite(x) & (x >= 0)
    m, e = np.frexp(np.where(ok, x, 1).astype(np.float64))  # x = m * 2^e, m in [0.5, 1)
    ceil_log2 = np.where(m == 0.5, e - 1, e)
    b = np.where(x == 0, 0, np.maximum(ceil_log2 + 127, 0))
    out[ok] = np.where(b[ok] > 254, 0xFF, b[ok])
    return out.astype(np.uint8)


def ue8m0_value(byte):
    return np.asarray(byte, np.uint8).view(md.float8_e8m0fnu).astype(F32)


def pack_e2m1(codes):
    codes = np.asarray(codes, np.uint8).reshape(-1, 2)
    return (codes[:, 0] | (codes[:, 1] << 4)).astype(np.uint8)  # element 2i in the low nibble


def ref_qdq(x, recipe):
    """numpy re-implementation of the three recipes of §3.1; returns (values, stored codes, scale bytes)."""
    block = {"fp8_block32_ue8m0": 32, "fp4_block16_e4m3": 16, "fp4_block32_ue8m0": 32}[recipe]
    b = np.asarray(x, F32).reshape(-1, block)
    finite = np.isfinite(b).all(axis=1)
    amax = np.abs(np.where(np.isfinite(b), b, F32(0))).max(axis=1).astype(F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if recipe == "fp8_block32_ue8m0":
            amax = np.maximum(amax, F32(1e-4))
            sbyte = ref_ceil_pow2(amax * F32(1 / 448))
            s = ue8m0_value(sbyte)
            q = np.clip(b / s[:, None], F32(-448), F32(448)).astype(md.float8_e4m3fn)
            nan_scale, nan_code = 0xFF, 0x7F
        elif recipe == "fp4_block16_e4m3":
            amax = np.maximum(amax, F32(6 * 2.0**-9))
            s8 = np.minimum(amax / F32(6), F32(448)).astype(md.float8_e4m3fn)
            sbyte, s = s8.view(np.uint8), s8.astype(F32)
            q = np.clip(b / s[:, None], F32(-6), F32(6)).astype(md.float4_e2m1fn)
            nan_scale, nan_code = 0x7F, 0
        else:
            amax = np.maximum(amax, F32(6 * 2.0**-126))
            sbyte = ref_ceil_pow2(amax * F32(1 / 6))
            s = ue8m0_value(sbyte)
            q = np.clip(b / s[:, None], F32(-6), F32(6)).astype(md.float4_e2m1fn)
            nan_scale, nan_code = 0xFF, 0
        values = (q.astype(F32) * s[:, None]).astype(F32)
    codes = q.view(np.uint8).copy()
    sbyte = np.array(sbyte, dtype=np.uint8)
    # Poisoned blocks (numeric.h): NaN scale, NaN (e4m3) or zero (e2m1) codes, NaN values.
    sbyte[~finite], codes[~finite], values[~finite] = nan_scale, nan_code, np.nan
    codes = codes.reshape(-1)
    if recipe != "fp8_block32_ue8m0":
        codes = pack_e2m1(codes)
    return values.reshape(-1), codes, sbyte


# ---- element formats --------------------------------------------------------------------------


def test_decode_tables_match_ml_dtypes(dump_tool, tmp_path):
    prefix = run_tool(dump_tool, tmp_path, "tables")
    def decoded(n, dtype):
        return np.arange(n, dtype=np.uint8 if n <= 256 else np.uint16).view(dtype).astype(F32)

    assert_same_f32(read(prefix, "bf16.f32", F32), decoded(65536, md.bfloat16), "bf16")
    assert_same_f32(read(prefix, "e4m3.f32", F32), decoded(256, md.float8_e4m3fn), "e4m3")
    assert_same_f32(read(prefix, "e2m1.f32", F32), decoded(16, md.float4_e2m1fn), "e2m1")
    np.testing.assert_array_equal(np.abs(decoded(16, md.float4_e2m1fn)[:8]), [0, 0.5, 1, 1.5, 2, 3, 4, 6])  # §2.1
    assert_same_f32(read(prefix, "ue8m0.f32", F32), decoded(256, md.float8_e8m0fnu), "ue8m0")


def test_bf16_encode(dump_tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED)
    b = np.arange(65536, dtype=np.uint32)
    b = b[((b >> 7) & 0xFF) != 0xFF]  # finite bf16 codes
    ties = bits_to_f32((b << 16) | 0x8000)
    x = np.concatenate([random_f32(rng, 200_000), neighbours(ties), bits_to_f32(b << 16)])
    got = read(run_tool(dump_tool, tmp_path, "bf16", x), "codes", np.uint16)
    assert_same_codes(got, ref_bf16(x), "f32 -> bf16", x)


def test_e4m3_encode(dump_tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED + 1)
    grid = format_grid(md.float8_e4m3fn)
    special = np.array([448, 464, 465, 480, 1e6, 3.4e38, np.inf, np.nan, 2.0**-10, 2.0**-11, 1e-30], F32)
    x = np.concatenate([
        random_f32(rng, 200_000),
        with_negatives(neighbours(np.concatenate([grid, midpoints(grid), special]))),
        rng.uniform(-600, 600, 50_000).astype(F32),
    ])
    got = read(run_tool(dump_tool, tmp_path, "e4m3", x), "codes", np.uint8)
    assert_same_codes(got, ref_e4m3(x), "f32 -> e4m3", x)
    # NaN keeps its sign; saturation is to ±448.
    assert list(got[np.isnan(x) & ~np.signbit(x)][:1]) == [0x7F]
    assert set(got[np.isinf(x)]) <= {0x7E, 0xFE}


def test_e2m1_encode(dump_tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED + 2)
    grid = format_grid(md.float4_e2m1fn)
    ties = midpoints(grid)
    np.testing.assert_array_equal(ties, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # §3.1 thresholds
    x = np.concatenate([
        random_f32(rng, 100_000),
        with_negatives(neighbours(np.concatenate([grid, ties, [6.5, 7, 100, np.inf]]))),
        rng.uniform(-8, 8, 50_000).astype(F32),
    ])
    got = read(run_tool(dump_tool, tmp_path, "e2m1", x), "codes", np.uint8)
    nan = np.isnan(x)
    assert_same_codes(got[~nan], ref_e2m1(x[~nan]), "f32 -> e2m1", x[~nan])
    # The spec's tie rule, stated directly: 0.25, 1.25, 2.5, 5.0 round down; 0.75, 1.75, 3.5 round up.
    tie_codes = read(run_tool(dump_tool, tmp_path, "e2m1", with_negatives(ties)), "codes", np.uint8)
    np.testing.assert_array_equal(tie_codes, [0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14])
    # e2m1 has no NaN: cedar saturates NaN like Inf, keeping the sign (documented in numeric.h).
    np.testing.assert_array_equal(got[nan], np.where(np.signbit(x[nan]), 0xF, 0x7))


def test_ue8m0_ceil_pow2(dump_tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED + 3)
    powers = ue8m0_value(np.arange(255, dtype=np.uint8))
    special = np.array([0, -0.0, -1, np.inf, -np.inf, np.nan, 3.4e38, 2.0**127, 1e-45, 2.0**-127], F32)
    x = np.concatenate([random_f32(rng, 200_000), neighbours(powers), special, np.abs(random_f32(rng, 50_000))])
    got = read(run_tool(dump_tool, tmp_path, "ue8m0_ceil", x), "codes", np.uint8)
    assert_same_codes(got, ref_ceil_pow2(x), "ue8m0 ceil pow2", x)
    # Where a byte is produced, it is the smallest power of two >= x (checked with ml_dtypes' decoder).
    ok = got != 0xFF
    assert (ue8m0_value(got[ok]) >= x[ok]).all()
    below = got[ok] > 0
    assert (ue8m0_value(got[ok][below] - 1) < x[ok][below]).all()


# ---- QDQ recipes ------------------------------------------------------------------------------

RECIPES = ["fp8_block32_ue8m0", "fp4_block16_e4m3", "fp4_block32_ue8m0"]
BLOCK = {"fp8_block32_ue8m0": 32, "fp4_block16_e4m3": 16, "fp4_block32_ue8m0": 32}


def tie_blocks(rng, recipe, n_blocks):
    """Blocks whose scale is known exactly and whose other elements sit on every rounding tie of the
    element format (and on their bf16 neighbours): amax = max_code * S makes s = S."""
    block = BLOCK[recipe]
    if recipe == "fp8_block32_ue8m0":
        scales = np.exp2(rng.integers(-20, 100, n_blocks)).astype(F32)
        top, grid = F32(448), format_grid(md.float8_e4m3fn)
    else:
        if recipe == "fp4_block16_e4m3":
            scales = rng.choice(format_grid(md.float8_e4m3fn)[1:], n_blocks).astype(F32)  # every e4m3 scale > 0
        else:
            scales = np.exp2(rng.integers(-120, 120, n_blocks)).astype(F32)
        top, grid = F32(6), format_grid(md.float4_e2m1fn)
    ties = midpoints(grid)
    out = np.empty((n_blocks, block), F32)
    for i, s in enumerate(scales):
        t = rng.choice(ties, block - 1) * s
        t = np.where(rng.random(block - 1) < 0.5, t, np.where(rng.random(block - 1) < 0.5, bf16_up(t), bf16_down(t)))
        t = np.minimum(t, top * s)  # never above the intended amax
        row = np.concatenate([[top * s], t]) * rng.choice([-1, 1], block)
        out[i] = rng.permutation(row)
    return out.reshape(-1)


def special_blocks(recipe):
    block = BLOCK[recipe]
    clamps = {"fp8_block32_ue8m0": 1e-4, "fp4_block16_e4m3": 6 * 2.0**-9, "fp4_block32_ue8m0": 6 * 2.0**-126}
    clamp = F32(clamps[recipe])
    rows = [
        np.zeros(block),
        np.full(block, clamp),
        np.full(block, -clamp / 3),
        np.linspace(-clamp, clamp, block),
        np.full(block, 3.0e38),  # near the bf16 / fp32 maximum
        np.linspace(-3.3e38, 3.3e38, block),
        np.full(block, 1e-40),  # fp32 subnormals
    ]
    for bad in (np.nan, np.inf, -np.inf):
        r = np.linspace(-1, 1, block)
        r[block // 3] = bad
        rows.append(r)
    return np.concatenate(rows).astype(F32)


def random_blocks(rng, recipe, n_blocks, bf16_exact):
    block = BLOCK[recipe]
    mag = np.exp2(rng.integers(-60, 60, n_blocks))[:, None]
    x = (rng.standard_normal((n_blocks, block)) * mag).astype(F32).reshape(-1)
    if bf16_exact:
        x = x.astype(md.bfloat16).astype(F32)
    return x


@pytest.mark.parametrize("recipe", RECIPES)
def test_qdq_recipe_matches_numpy_reference(dump_tool, tmp_path, recipe):
    rng = np.random.default_rng(RNG_SEED + 10 + RECIPES.index(recipe))
    x = np.concatenate([
        random_blocks(rng, recipe, 3000, bf16_exact=True),
        random_blocks(rng, recipe, 1000, bf16_exact=False),  # the recipes are defined on any fp32
        tie_blocks(rng, recipe, 2000),
        special_blocks(recipe),
    ])
    prefix = run_tool(dump_tool, tmp_path, recipe, x)
    values, codes = read(prefix, "values.f32", F32), read(prefix, "codes.u8", np.uint8)
    scales, dequant = read(prefix, "scales.u8", np.uint8), read(prefix, "dequant.f32", F32)
    want_values, want_codes, want_scales = ref_qdq(x, recipe)
    assert_same_codes(scales, want_scales, f"{recipe} scales")
    assert_same_codes(codes, want_codes, f"{recipe} codes")
    assert_same_f32(values, want_values, f"{recipe} values")
    # The packed cache representation reproduces the QDQ values exactly (§3.1: "a packed store +
    # dequant reproduces them bit-exactly"), and the values are bf16-representable.
    assert_same_f32(dequant, values, f"{recipe} dequant(codes, scales)")
    finite = np.isfinite(values)
    assert_same_f32(values[finite].astype(md.bfloat16).astype(F32), values[finite], f"{recipe} values are bf16")


def test_tie_blocks_really_hit_ties():
    """Guards the generator above: the tie blocks must exercise exact e2m1 / e4m3 ties."""
    rng = np.random.default_rng(RNG_SEED)
    for recipe in RECIPES:
        x = tie_blocks(rng, recipe, 50).reshape(-1, BLOCK[recipe])
        amax = np.abs(x).max(axis=1, keepdims=True)
        top = 448 if recipe == "fp8_block32_ue8m0" else 6
        ratio = np.abs(x) / (amax / top)
        grid = format_grid(md.float8_e4m3fn if top == 448 else md.float4_e2m1fn)
        assert np.isin(ratio, midpoints(grid)).mean() > 0.25, recipe
