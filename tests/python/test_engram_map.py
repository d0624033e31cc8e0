"""Engram token-normalization map: cedar's builder and the frozen map against the official algorithm
(`build_compressed_token_map` of DeepSeek-V4.1's inference/engram.py, as ported in transformers deepseek_v41),
run here with HF tokenizers' decoder and normalizers."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, normalizers

ROOT = pathlib.Path(__file__).resolve().parents[2]
V4_JSON = ROOT / "third_party" / "downloads" / "deepseek-v4" / "tokenizer.json"
FROZEN = ROOT / "assets" / "engram" / "deepseek_v41_token_map.npy"
CEDAR = os.environ.get("CEDAR_BINARY", str(ROOT / "build" / "release" / "cedar"))
EXPECTED_CLASSES = 99092  # engram_compressed_vocab_size of DeepSeek-V4.1-Flash


def reference_normalizer():
    sentinel = "\ue000"
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " "),
    ])


def reference_map(tok: Tokenizer) -> tuple[np.ndarray, int]:
    norm = reference_normalizer()
    key_to_new: dict[str, int] = {}
    lookup = []
    for token_id in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(token_id)
        else:
            normalized = norm.normalize_str(text)
            key = normalized if normalized else text
        lookup.append(key_to_new.setdefault(key, len(key_to_new)))
    return np.asarray(lookup, dtype=np.int32), len(key_to_new)


@pytest.fixture(scope="module")
def v4_config() -> dict:
    assert V4_JSON.exists(), f"{V4_JSON} missing: run tools/fetch_tokenizer.py (scripts/setup.sh does)"
    return json.loads(V4_JSON.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def v41_json(v4_config, tmp_path_factory) -> pathlib.Path:
    spec = importlib.util.spec_from_file_location("derive_v41_tokenizer", ROOT / "tools" / "derive_v41_tokenizer.py")
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    path = tmp_path_factory.mktemp("v41") / "tokenizer.json"
    path.write_text(json.dumps(derive.derive(v4_config), ensure_ascii=False), encoding="utf-8")
    return path


def cedar_map(tokenizer: pathlib.Path, out: pathlib.Path) -> np.ndarray:
    proc = subprocess.run([CEDAR, "engram-map", "--tokenizer", str(tokenizer), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def test_frozen_v41_map_is_the_reference(v41_json):
    ref, classes = reference_map(Tokenizer.from_file(str(v41_json)))
    assert classes == EXPECTED_CLASSES
    frozen = np.load(FROZEN)
    assert frozen.dtype == np.int32 and frozen.shape == (129280,)
    mismatch = np.flatnonzero(frozen != ref)
    assert mismatch.size == 0, f"{mismatch.size} ids differ, first {mismatch[:10]}"


def test_cedar_builds_the_frozen_map(v41_json, tmp_path):
    proc = subprocess.run([CEDAR, "engram-map", "--tokenizer", str(v41_json), "--expect", str(EXPECTED_CLASSES),
                           "--check", str(FROZEN)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"{EXPECTED_CLASSES} compressed ids" in proc.stdout and "matches" in proc.stdout


def test_cedar_map_on_v4_tokenizer_matches_reference(tmp_path):
    built = cedar_map(V4_JSON, tmp_path / "v4.npy")
    ref, classes = reference_map(Tokenizer.from_file(str(V4_JSON)))
    assert classes == EXPECTED_CLASSES
    assert np.array_equal(built, ref)


def test_check_reports_a_differing_id(tmp_path):
    frozen = np.load(FROZEN)
    frozen[1234] += 1
    np.save(tmp_path / "bad.npy", frozen)
    proc = subprocess.run([CEDAR, "engram-map", "--tokenizer", str(V4_JSON), "--check", str(tmp_path / "bad.npy")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "id 1234" in proc.stderr


def test_normalizer_matches_hf_on_every_code_point(tmp_path):
    """Every scalar value (between NULs, which block composition and reordering, in 40 chunks), each
    whitespace character alone (Strip and the lone-space sentinel act at the ends), and strings where order,
    composition and context matter."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    step = len(cps) // 40 + 1
    samples = ["".join("\x00" + chr(c) for c in cps[i:i + step]) for i in range(0, len(cps), step)]
    samples += [chr(c) for c in cps if chr(c).isspace() or c in (0x85, 0x180E, 0x200B, 0xFEFF, 0xE000)]
    samples += ["ΑΣ", "ΟΔΟΣ ΟΔΟΣ", "İstanbul", "ﬁﬂ", "e\u0301", "A\u030A\u0323", "\u1100\u1161\u11A8", "한국어",
                " ", "  ", "\t", "\n", " \n ", " x ", "\u3000", "\u3000 \u3000", "\ue000", " \ue000 ", "ｶﾞ", "㍿",
                "x\u0338", "\u00c5\u0327", "Ǆ", "ß", "ẞ", "ﬀ", "①", "⑽", "\u0344", "\u0f73", "\U0001D400",
                "Ⅻ", "\u2126\u212b", "a\u200bb", "\u00a0x\u00a0", "\u180ex\u200b", "\u1e9b\u0323"]
    path = tmp_path / "strings.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    proc = subprocess.run([CEDAR, "engram-map", "--normalize-file", str(path)], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    got = [json.loads(line)["key"] for line in proc.stdout.decode("utf-8").split("\n")[:-1]]
    assert len(got) == len(samples)
    norm = reference_normalizer()
    bad = []
    for s, g in zip(samples, got):
        e = norm.normalize_str(s)
        if g != e:
            i = next((k for k, (x, y) in enumerate(zip(g, e)) if x != y), min(len(g), len(e)))
            bad.append(f"input {ascii(s[:40])}{'...' if len(s) > 40 else ''}: at char {i} cedar "
                       f"{ascii(g[max(0, i - 8):i + 8])} HF {ascii(e[max(0, i - 8):i + 8])}")
    assert not bad, f"{len(bad)} differ: " + "; ".join(bad[:8])
