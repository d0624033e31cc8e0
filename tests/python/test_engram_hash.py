"""Engram hash rows (architecture.md §3.9 items 2–6): `cedar engram-rows` against a NumPy implementation of
the spec written here — multipliers from NumPy's own `default_rng`, primes by trial division, int64 rolling
XOR with NumPy's wraparound, floor modulo, exclusive prefix-sum offsets — over random token sequences,
image (DEAD) spans, chunked hashing and non-default layouts."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CEDAR = os.environ.get("CEDAR_BINARY", str(ROOT / "build" / "release" / "cedar"))
REAL_CONFIG = ROOT / "tests" / "data" / "configs" / "deepseek_v41_flash" / "config.json"
TOKEN_MAP = ROOT / "assets" / "engram" / "deepseek_v41_token_map.npy"
IMAGE_TOKEN = 129264


# ---- NumPy reference from the spec ---------------------------------------------------------------------

def is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, math.isqrt(n) + 1))


class Reference:
    def __init__(self, text_config: dict, token_map: np.ndarray):
        t = text_config
        self.layer_ids = list(t["engram_layer_ids"])
        self.n = t["engram_max_ngram_size"]
        self.heads = t["engram_n_heads"]
        self.cols = (self.n - 1) * self.heads
        self.map = token_map.astype(np.int64)
        self.pad = int(self.map[t["engram_pad_token_id"]])
        bound = max(1, (np.iinfo(np.int64).max // t["engram_compressed_vocab_size"]) // 2)
        self.multipliers = [np.random.default_rng(10007 * layer).integers(0, bound, self.n, dtype=np.int64) * 2 + 1
                            for layer in self.layer_ids]
        # next unused prime >= engram_vocab_size, drawn in (layer, order, head) order
        self.primes, candidate = [], t["engram_vocab_size"]
        for _ in self.layer_ids:
            layer = []
            while len(layer) < self.cols:
                if is_prime(candidate):
                    layer.append(candidate)
                candidate += 1
            self.primes.append(np.array(layer, dtype=np.int64))
        self.offsets = [np.concatenate([[0], np.cumsum(p)[:-1]]).astype(np.int64) for p in self.primes]

    def contexts(self, ids: list[int], image: list[int]) -> np.ndarray:
        """[positions, N] of c_s with pad substitution: p < s or a DEAD token at p..p-s (sticky)."""
        compressed = [-1 if image[i] else int(self.map[tok]) for i, tok in enumerate(ids)]
        out = np.empty((len(ids), self.n), dtype=np.int64)
        for p in range(len(ids)):
            blocked = False
            for s in range(self.n):
                blocked = blocked or p < s or compressed[p - s] == -1
                out[p, s] = self.pad if blocked else compressed[p - s]
        return out

    def rows(self, ids: list[int], image: list[int]) -> list[np.ndarray]:
        ctx = self.contexts(ids, image)
        result = []
        with np.errstate(over="ignore"):
            for slot in range(len(self.layer_ids)):
                products = ctx * self.multipliers[slot]  # int64, wraps like the reference
                rolling = products[:, 0]
                cols = []
                for order in range(1, self.n):
                    rolling = np.bitwise_xor(rolling, products[:, order])
                    primes = self.primes[slot][(order - 1) * self.heads: order * self.heads]
                    cols.append(rolling[:, None] % primes[None, :])
                result.append(np.concatenate(cols, axis=1) + self.offsets[slot][None, :])
        return result


# ---- helpers ------------------------------------------------------------------------------------------

def run_rows(config_dir: pathlib.Path, ids: list[int], image: list[int] | None = None, chunk: int | None = None,
             token_map: pathlib.Path | None = None):
    """Without `token_map`, cedar hashes with its built-in map (the asset compiled in)."""
    args = [CEDAR, "engram-rows", "--config", str(config_dir), "--ids", ",".join(map(str, ids)), "--json"]
    if token_map is not None:
        args += ["--map", str(token_map)]
    if image is not None:
        args += ["--image", ",".join(map(str, image))]
    if chunk is not None:
        args += ["--chunk", str(chunk)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def token_map() -> np.ndarray:
    return np.load(TOKEN_MAP)


@pytest.fixture(scope="module")
def real_config() -> dict:
    return json.loads(REAL_CONFIG.read_text())


def write_config(tmp_path: pathlib.Path, base: dict, **text_overrides) -> tuple[pathlib.Path, dict]:
    cfg = json.loads(json.dumps(base))
    cfg["text_config"].update(text_overrides)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path, cfg["text_config"]


def random_sequence(rng: np.random.Generator, length: int, with_images: bool) -> tuple[list[int], list[int]]:
    ids = rng.integers(0, 129280, length).tolist()
    ids[rng.integers(0, length)] = 2  # the pad token itself
    image = [0] * length
    if with_images and length > 6:
        start = int(rng.integers(0, length - 3))
        for i in range(start, min(length, start + int(rng.integers(1, 4)))):
            image[i], ids[i] = 1, IMAGE_TOKEN
    return ids, image


# ---- tests --------------------------------------------------------------------------------------------

def test_real_layout_matches_numpy(real_config, token_map):
    ref = Reference(real_config["text_config"], token_map)
    doc = run_rows(REAL_CONFIG.parent, [0])
    assert doc["pad"] == ref.pad
    assert [layer["layer"] for layer in doc["layers"]] == [1, 14]
    for slot, layer in enumerate(doc["layers"]):
        assert layer["multipliers"] == ref.multipliers[slot].tolist()
        assert layer["primes"] == ref.primes[slot].tolist()
        assert layer["offsets"] == ref.offsets[slot].tolist()
        assert sum(layer["primes"]) == real_config["text_config"]["engram_num_embeddings"][slot]


@pytest.mark.parametrize("seed", range(6))
def test_real_rows_match_numpy(real_config, token_map, seed):
    rng = np.random.default_rng(1000 + seed)
    ids, image = random_sequence(rng, int(rng.integers(1, 40)), with_images=seed % 2 == 1)
    ref = Reference(real_config["text_config"], token_map).rows(ids, image)
    doc = run_rows(REAL_CONFIG.parent, ids, image)
    for slot, layer in enumerate(doc["layers"]):
        assert np.array_equal(np.array(layer["rows"], dtype=np.int64), ref[slot]), f"layer {layer['layer']}"
        assert all(0 <= r < real_config["text_config"]["engram_num_embeddings"][slot] for row in layer["rows"] for r in row)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_chunked_rows_equal_one_shot(real_config, token_map, chunk):
    rng = np.random.default_rng(7)
    ids, image = random_sequence(rng, 23, with_images=True)
    one_shot = run_rows(REAL_CONFIG.parent, ids, image)
    chunked = run_rows(REAL_CONFIG.parent, ids, image, chunk=chunk)
    assert chunked == one_shot
    ref = Reference(real_config["text_config"], token_map).rows(ids, image)
    assert np.array_equal(np.array(chunked["layers"][0]["rows"], dtype=np.int64), ref[0])


def test_other_layouts_match_numpy(real_config, token_map, tmp_path):
    """Layer ids with other RNG seeds (incl. 0: entropy 0), other orders / heads / prime starts."""
    overrides = {"engram_layer_ids": [0, 5, 77, 4095], "engram_max_ngram_size": 3, "engram_n_heads": 5,
                 "engram_vocab_size": 1000}
    text = dict(real_config["text_config"], **overrides)
    ref = Reference(text, token_map)
    overrides["engram_num_embeddings"] = [int(p.sum()) for p in ref.primes]
    config_dir, _ = write_config(tmp_path, real_config, **overrides)
    rng = np.random.default_rng(11)
    ids, image = random_sequence(rng, 30, with_images=True)
    doc = run_rows(config_dir, ids, image, chunk=4)
    want = ref.rows(ids, image)
    assert [layer["layer"] for layer in doc["layers"]] == overrides["engram_layer_ids"]
    for slot, layer in enumerate(doc["layers"]):
        assert layer["multipliers"] == ref.multipliers[slot].tolist()
        assert layer["primes"] == ref.primes[slot].tolist()
        assert np.array_equal(np.array(layer["rows"], dtype=np.int64), want[slot])


def test_explicit_map_replaces_the_built_in_one(real_config, token_map, tmp_path):
    other = token_map.copy()
    other[:1000] = other[1000:2000]  # still compressed ids, but not the frozen map's
    np.save(tmp_path / "other.npy", other)
    ids = list(range(0, 1000, 7))
    doc = run_rows(REAL_CONFIG.parent, ids, token_map=tmp_path / "other.npy")
    want = Reference(real_config["text_config"], other).rows(ids, [0] * len(ids))
    frozen = Reference(real_config["text_config"], token_map).rows(ids, [0] * len(ids))
    for slot, layer in enumerate(doc["layers"]):
        rows = np.array(layer["rows"], dtype=np.int64)
        assert np.array_equal(rows, want[slot]) and not np.array_equal(rows, frozen[slot])


def test_bad_explicit_map_is_named(tmp_path):
    missing = tmp_path / "no-such-map.npy"
    proc = subprocess.run([CEDAR, "engram-rows", "--config", str(REAL_CONFIG.parent), "--ids", "1,2", "--map",
                           str(missing)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and str(missing) in proc.stderr, proc.stderr


def test_num_embeddings_mismatch_is_reported(real_config, tmp_path):
    config_dir, _ = write_config(tmp_path, real_config, engram_num_embeddings=[384006168, 384016681])
    proc = subprocess.run([CEDAR, "engram-rows", "--config", str(config_dir), "--ids", "1,2"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "layer 14" in proc.stderr and "384016682" in proc.stderr and "384016681" in proc.stderr, proc.stderr


def test_out_of_range_token_is_reported():
    proc = subprocess.run([CEDAR, "engram-rows", "--config", str(REAL_CONFIG.parent), "--ids", "5,129280"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "129280" in proc.stderr, proc.stderr
