"""A small, independent reader for sharded safetensors checkpoints used by the pytest suites: parses the
8-byte header length + JSON header itself (no `safetensors` package), validates the layout, and decodes the
DeepSeek storage dtypes with plain numpy from their bit definitions (OCP E4M3 / E8M0 / E2M1, bfloat16)."""
from __future__ import annotations

import json
import pathlib
import struct
from dataclasses import dataclass

import numpy as np

DTYPE_SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def _e4m3_table() -> np.ndarray:
    table = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            table[b] = np.nan
        elif exp == 0:
            table[b] = sign * (man / 8.0) * 2.0 ** -6
        else:
            table[b] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return table


E4M3_VALUES = _e4m3_table()
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])  # code bit 3 = sign


@dataclass
class StoredTensor:
    name: str
    dtype: str
    shape: tuple
    raw: bytes
    file: str

    def decode(self) -> np.ndarray:
        """Exact values: F32/BF16 as float32, FP8 as float64, integers as int64 (I8 bytes as stored; for
        packed FP4 see unpack_e2m1)."""
        if self.dtype == "F32":
            return np.frombuffer(self.raw, "<f4").reshape(self.shape)
        if self.dtype == "BF16":
            bits = np.frombuffer(self.raw, "<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(self.shape)
        if self.dtype == "F8_E4M3":
            return E4M3_VALUES[np.frombuffer(self.raw, np.uint8)].reshape(self.shape)
        if self.dtype == "F8_E8M0":
            b = np.frombuffer(self.raw, np.uint8).astype(np.int64)
            if (b == 0xFF).any():
                raise ValueError(f"{self.name}: E8M0 NaN byte 0xFF")
            return np.ldexp(1.0, b - 127).reshape(self.shape)
        if self.dtype == "I8":
            return np.frombuffer(self.raw, np.int8).astype(np.int64).reshape(self.shape)
        if self.dtype == "I64":
            return np.frombuffer(self.raw, "<i8").reshape(self.shape)
        if self.dtype == "I32":
            return np.frombuffer(self.raw, "<i4").astype(np.int64).reshape(self.shape)
        raise ValueError(f"{self.name}: no decoder for {self.dtype}")


def unpack_e2m1(packed: StoredTensor) -> np.ndarray:
    """I8 [out, in/2] -> E2M1 values [out, in]; element 2i is the low nibble of byte i."""
    b = np.frombuffer(packed.raw, np.uint8).reshape(packed.shape)
    codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = b & 0x0F
    codes[:, 1::2] = b >> 4
    return E2M1_VALUES[codes]


def read_shard(path: pathlib.Path) -> dict[str, StoredTensor]:
    """Parses and validates one .safetensors file (offsets contiguous, sizes = numel·dtype size)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    spans, tensors = [], {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        dtype, shape = h["dtype"], tuple(h["shape"])
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"{path.name}:{name}: unknown dtype {dtype}")
        if end - begin != int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZES[dtype]:
            raise ValueError(f"{path.name}:{name}: {end - begin} bytes for {dtype} {list(shape)}")
        spans.append((begin, end))
        tensors[name] = StoredTensor(name, dtype, shape, body[begin:end], path.name)
    spans.sort()
    cursor = 0
    for begin, end in spans:
        if begin != cursor:
            raise ValueError(f"{path.name}: gap or overlap at byte {begin} (expected {cursor})")
        cursor = end
    if cursor != len(body):
        raise ValueError(f"{path.name}: data section is {len(body)} bytes, tensors cover {cursor}")
    return tensors


def read_checkpoint(directory: pathlib.Path) -> tuple[dict, dict[str, StoredTensor]]:
    """(index json, every tensor of every shard named by the index); duplicate names are an error."""
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    tensors: dict[str, StoredTensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        for name, t in read_shard(directory / file).items():
            if name in tensors:
                raise ValueError(f"{name} is in both {tensors[name].file} and {file}")
            tensors[name] = t
    return index, tensors
