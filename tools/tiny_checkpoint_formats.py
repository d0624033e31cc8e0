"""Numeric storage formats and Engram constants for tools/tiny_checkpoint.py, written from
../shared/spec/architecture.md (§2.1 storage formats, §3.9 Engram) — independently of cedar's C++ code.

* block FP8: F8_E4M3 weight + F8_E8M0 (UE8M0, power-of-two) scale per (rows × cols) block; the scale
  of a block is 2^ceil(log2(amax / 448)), so every |w| / scale ≤ 448 and the E4M3 cast never saturates.
* MXFP4: E2M1 codes, two per byte (element 2i in the low nibble), stored as I8 [out, in/2], plus an
  F8_E8M0 scale per 32 consecutive elements of a row: 2^ceil(log2(amax / 6)).
* Engram prime table and hash multipliers (the rules of §3.9 items 3 and 5).
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

E4M3_MAX = 448.0
E2M1_MAX = 6.0
MXFP4_BLOCK = 32
INT64_MAX = np.iinfo(np.int64).max


def _pow2_scale_exponent(amax: np.ndarray, qmax: float) -> np.ndarray:
    """Smallest integer e with amax / 2^e <= qmax (e = ceil(log2(amax / qmax))); all-zero blocks get 0."""
    amax = np.asarray(amax, dtype=np.float64)
    safe = np.where(amax > 0, amax, qmax)  # amax 0 -> ratio 1 -> exponent 0 (scale 1)
    mant, exp = np.frexp(safe / qmax)      # ratio = mant · 2^exp with mant in [0.5, 1)
    e = np.where(mant == 0.5, exp - 1, exp).astype(np.int64)
    # Guard against a rounded-down quotient: the bound must hold for the stored value itself.
    e = np.where(safe / np.ldexp(1.0, e) > qmax, e + 1, e)
    return np.clip(e, -127, 127)


def _block_amax(w: np.ndarray, block_rows: int, block_cols: int) -> np.ndarray:
    rows, cols = w.shape
    br, bc = -(-rows // block_rows), -(-cols // block_cols)
    padded = np.zeros((br * block_rows, bc * block_cols), dtype=np.float32)
    padded[:rows, :cols] = np.abs(w)
    return padded.reshape(br, block_rows, bc, block_cols).max(axis=(1, 3))


def quantize_fp8_block(w: np.ndarray, block_rows: int, block_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [rows, cols] -> (F8_E4M3 [rows, cols], F8_E8M0 [ceil(rows/br), ceil(cols/bc)])."""
    w = np.asarray(w, dtype=np.float32)
    exp = _pow2_scale_exponent(_block_amax(w, block_rows, block_cols), E4M3_MAX)
    scale_full = np.ldexp(1.0, np.repeat(np.repeat(exp, block_rows, 0), block_cols, 1))
    scaled = w / scale_full[: w.shape[0], : w.shape[1]].astype(np.float32)  # power of two: exact
    q = scaled.astype(ml_dtypes.float8_e4m3fn)
    scale = np.ldexp(1.0, exp).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu)
    return q, scale


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] (in % 32 == 0) -> (I8 [out, in/2] packed E2M1 pairs, F8_E8M0 [out, in/32])."""
    w = np.asarray(w, dtype=np.float32)
    out, inn = w.shape
    if inn % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs the input dim to be a multiple of {MXFP4_BLOCK}, got {inn}")
    blocks = w.reshape(out, inn // MXFP4_BLOCK, MXFP4_BLOCK)
    exp = _pow2_scale_exponent(np.abs(blocks).max(axis=2), E2M1_MAX)
    scaled = blocks / np.ldexp(1.0, exp)[:, :, None].astype(np.float32)
    # ml_dtypes rounds to nearest-even; the E2M1 code sits in the low 4 bits (bit 3 = sign).
    codes = scaled.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(out, inn) & 0x0F
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    scale = np.ldexp(1.0, exp).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu)
    return packed, scale


def to_bf16(w: np.ndarray) -> np.ndarray:
    return np.asarray(w, dtype=np.float32).astype(ml_dtypes.bfloat16)


# ---- Engram (§3.9) ---------------------------------------------------------------------------


def _is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for 64-bit n (bases valid below 3.3e24)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(num_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> list[list[list[int]]]:
    """Per Engram layer (in engram_layer_ids order), per order n = 2..max_ngram_size, per head: the next
    unused prime greater than vocab_size - 1, drawn in order layer, order, head."""
    used: set[int] = set()
    table = []
    for _ in range(num_layers):
        orders = []
        for _ in range(2, max_ngram_size + 1):
            heads = []
            for _ in range(n_heads):
                candidate = vocab_size  # "> vocab_size - 1"
                while candidate in used or not _is_prime(candidate):
                    candidate += 1
                used.add(candidate)
                heads.append(candidate)
            orders.append(heads)
        table.append(orders)
    return table


def engram_num_embeddings(num_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> list[int]:
    """Rows of each Engram layer's table: the sum of that layer's primes."""
    return [sum(sum(heads) for heads in orders)
            for orders in engram_primes(num_layers, max_ngram_size, n_heads, vocab_size)]


def engram_hash_multipliers(layer: int, compressed_vocab_size: int, max_ngram_size: int) -> list[int]:
    """Odd int64 multipliers M[layer][s], s = 0..max_ngram_size-1 (§3.9 item 3)."""
    bound = (INT64_MAX // compressed_vocab_size) // 2
    draws = np.random.default_rng(10007 * layer).integers(0, bound, max_ngram_size, dtype=np.int64)
    return [int(v) * 2 + 1 for v in draws]
