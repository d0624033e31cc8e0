"""cedar's safetensors reader and writer against the official Python `safetensors` package (numpy +
ml_dtypes for BF16 and the FP8 formats).

* Python writes (single file and an HF-style sharded directory); `cedar tensors --json` must list the
  same names, dtypes, shapes, byte counts and shards, and `cedar tensors --dump` the same bytes.
* cedar writes (tests/cedar_safetensors_write, a test-only tool around SafetensorsWriter); Python must
  load the files and get back the bytes it handed over — and a single file must be byte-identical to
  what `safetensors.numpy.save` produces for the same tensors.
* Malformed files: cedar exits 1 with an error naming the file and the tensor.

Binaries: $CEDAR_BINARY (default <repo>/build/release/cedar); the writer tool sits in tests/ beside it.
"""
from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors import deserialize, safe_open
from safetensors.numpy import save, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("CEDAR_BINARY", ROOT / "build" / "release" / "cedar"))
WRITER = BINARY.parent / "tests" / "cedar_safetensors_write"

# numpy dtype → safetensors name, as the format defines them (independent of cedar's table).
ST_NAME = {
    np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0",
    np.dtype(np.int8): "I8", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2", np.dtype(np.int16): "I16",
    np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64",
}


def sample_tensors() -> dict[str, np.ndarray]:
    """Every dtype cedar knows, in DeepSeek-like names and shapes, plus a scalar and an empty tensor."""
    rng = np.random.default_rng(20240611)
    t = {
        "embed.weight": rng.standard_normal((5, 8)).astype(ml_dtypes.bfloat16),
        "layers.0.attn_norm.weight": rng.standard_normal(8).astype(np.float16),
        "layers.0.hc_attn_fn": rng.standard_normal((3, 7)).astype(np.float32),
        "layers.0.attn.wq_a.weight": rng.uniform(-448, 448, (4, 8)).astype(ml_dtypes.float8_e4m3fn),
        "layers.0.attn.wq_a.scale": (2.0 ** rng.integers(-20, 20, (1, 1))).astype(ml_dtypes.float8_e8m0fnu),
        "layers.0.ffn.experts.0.w1.weight": rng.integers(-128, 128, (4, 4), dtype=np.int8),
        "f64": rng.standard_normal(3), "i64": rng.integers(-(2**62), 2**62, 2), "u8": rng.integers(0, 256, 5, dtype=np.uint8),
        "bool": rng.integers(0, 2, 6).astype(np.bool_), "f8e5m2": rng.standard_normal(4).astype(ml_dtypes.float8_e5m2),
        "i16": rng.integers(-999, 999, 3, dtype=np.int16), "u16": rng.integers(0, 999, 3, dtype=np.uint16),
        "i32": rng.integers(-999, 999, 3, dtype=np.int32), "u32": rng.integers(0, 999, 3, dtype=np.uint32),
        "u64": rng.integers(0, 2**62, 2, dtype=np.uint64),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=ml_dtypes.bfloat16),
    }
    assert {ST_NAME[a.dtype] for a in t.values()} == set(ST_NAME.values())
    return t


def cedar(*args: str) -> subprocess.CompletedProcess:
    if not BINARY.is_file():
        pytest.fail(f"cedar binary {BINARY} does not exist (build the release preset, or set CEDAR_BINARY)")
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=120)


def cedar_listing(path: pathlib.Path) -> dict:
    proc = cedar("tensors", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def cedar_dump(path: pathlib.Path, name: str, out: pathlib.Path) -> bytes:
    proc = cedar("tensors", str(path), "--dump", name, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes()


def expect_cedar_sees(path: pathlib.Path, tensors: dict[str, np.ndarray], shard_of: dict[str, str], tmp: pathlib.Path):
    listing = cedar_listing(path)
    listed = {t["name"]: t for t in listing["tensors"]}
    assert sorted(listed) == sorted(tensors)
    assert [t["name"] for t in listing["tensors"]] == sorted(tensors)  # cedar lists by name
    for name, arr in tensors.items():
        entry = listed[name]
        assert entry["dtype"] == ST_NAME[arr.dtype], name
        assert entry["shape"] == list(arr.shape), name
        assert entry["bytes"] == arr.nbytes, name
        assert entry["shard"] == shard_of[name], name
        assert cedar_dump(path, name, tmp / "dump.bin") == arr.tobytes(), name
    assert listing["total_bytes"] == sum(a.nbytes for a in tensors.values())
    assert sorted(listing["shards"]) == sorted(set(shard_of.values()))


def test_cedar_reads_a_python_written_file(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    expect_cedar_sees(path, tensors, {n: "model.safetensors" for n in tensors}, tmp_path)
    expect_cedar_sees(tmp_path, tensors, {n: "model.safetensors" for n in tensors}, tmp_path)  # the directory


def test_cedar_reads_a_python_written_sharded_checkpoint(tmp_path):
    """The Hugging Face layout: save_file per shard plus model.safetensors.index.json."""
    tensors = sample_tensors()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = list(tensors)
    groups = [names[0::3], names[1::3], names[2::3]]
    weight_map = {}
    for k, group in enumerate(groups, start=1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(ckpt / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    expect_cedar_sees(ckpt, tensors, weight_map, tmp_path)


def write_with_cedar(tmp: pathlib.Path, tensors: dict[str, np.ndarray], out: pathlib.Path, shards: int = 0,
                     metadata: dict | None = None):
    if not WRITER.is_file():
        pytest.fail(f"writer tool {WRITER} does not exist (build the release preset's tests)")
    raw = tmp / "raw"
    raw.mkdir(exist_ok=True)
    manifest = {"metadata": metadata or {}, "tensors": []}
    for i, (name, arr) in enumerate(tensors.items()):
        (raw / f"{i}.bin").write_bytes(arr.tobytes())
        manifest["tensors"].append({"name": name, "dtype": ST_NAME[arr.dtype], "shape": list(arr.shape),
                                    "file": f"raw/{i}.bin"})
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run([str(WRITER), str(tmp / "manifest.json"), str(out), str(shards)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def python_view(path: pathlib.Path) -> dict[str, tuple[str, list[int], bytes]]:
    """What the official package reads from one file: {name: (dtype, shape, raw bytes)}."""
    return {n: (v["dtype"], list(v["shape"]), bytes(v["data"])) for n, v in deserialize(path.read_bytes())}


def test_python_reads_a_cedar_written_file(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "cedar.safetensors"
    write_with_cedar(tmp_path, tensors, path, metadata={"format": "np", "source": "cedar"})
    view = python_view(path)
    assert view == {n: (ST_NAME[a.dtype], list(a.shape), a.tobytes()) for n, a in tensors.items()}
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "np", "source": "cedar"}
        for name in ("layers.0.hc_attn_fn", "f64", "i64", "bool", "embed.weight"):
            np.testing.assert_array_equal(f.get_tensor(name), tensors[name])


def test_cedar_writes_the_same_bytes_as_python(tmp_path):
    tensors = sample_tensors()
    tensors['odd "name"\\\t\x01/é ü'] = np.arange(3, dtype=np.float32)  # JSON escapes must match serde_json
    path = tmp_path / "cedar.safetensors"
    write_with_cedar(tmp_path, tensors, path, metadata={"format": "np"})
    assert path.read_bytes() == save(tensors, metadata={"format": "np"})


def test_python_reads_a_cedar_written_sharded_checkpoint(tmp_path):
    tensors = sample_tensors()
    ckpt = tmp_path / "ckpt"
    write_with_cedar(tmp_path, tensors, ckpt, shards=3, metadata={"format": "pt"})
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    assert sorted(index["weight_map"]) == sorted(tensors)
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)]
    seen = {}
    for file in files:
        view = python_view(ckpt / file)
        assert view, f"{file} is empty"
        for name, entry in view.items():
            assert index["weight_map"][name] == file
            seen[name] = entry
    assert seen == {n: (ST_NAME[a.dtype], list(a.shape), a.tobytes()) for n, a in tensors.items()}


def raw_file(header: str, data: bytes) -> bytes:
    h = header.encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def test_cedar_rejects_malformed_files_naming_file_and_tensor(tmp_path):
    truncated = tmp_path / "truncated.safetensors"
    full = save({"layers.0.w": np.arange(64, dtype=np.float32)})
    truncated.write_bytes(full[:-10])
    proc = cedar("tensors", str(truncated))
    assert proc.returncode == 1
    assert str(truncated) in proc.stderr and "'layers.0.w'" in proc.stderr and "truncated" in proc.stderr

    mismatch = tmp_path / "mismatch.safetensors"
    mismatch.write_bytes(raw_file('{"w.scale":{"dtype":"F8_E8M0","shape":[2,3],"data_offsets":[0,5]}}', b"\x7f" * 5))
    proc = cedar("tensors", str(mismatch))
    assert proc.returncode == 1
    assert str(mismatch) in proc.stderr and "'w.scale'" in proc.stderr and "needs 6 bytes" in proc.stderr

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file({"a": np.ones(2, np.float32)}, str(ckpt / "model-00001-of-00002.safetensors"))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    proc = cedar("tensors", str(ckpt))
    assert proc.returncode == 1
    assert "model.safetensors.index.json" in proc.stderr and "'model-00002-of-00002.safetensors'" in proc.stderr
    assert "'b'" in proc.stderr

    proc = cedar("tensors", str(truncated.with_name("none.safetensors")))
    assert proc.returncode == 1 and "none.safetensors" in proc.stderr


def test_dump_of_a_missing_tensor_fails(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(2, np.float32)}, str(path))
    proc = cedar("tensors", str(path), "--dump", "b", "--out", str(tmp_path / "b.bin"))
    assert proc.returncode == 1 and "tensor 'b' not found" in proc.stderr
    assert not (tmp_path / "b.bin").exists()
