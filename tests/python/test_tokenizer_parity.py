"""cedar's tokenizer against HF `tokenizers` (the reference DeepSeek's tokenizer.json is made for).

Every request goes through one `cedar tokenize --jsonl` process, so >10 MB of text takes seconds.
References: HF tokenizers (pinned in requirements-test.txt) on the real DeepSeek V4 tokenizer.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess

import pytest
from tokenizers import Tokenizer

from tokenizer_corpus import TOKEN_STRINGS, build_corpus, corpus_size

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_JSON = ROOT / "third_party" / "downloads" / "deepseek-v4" / "tokenizer.json"
CEDAR = os.environ.get("CEDAR_BINARY", str(ROOT / "build" / "release" / "cedar"))


@pytest.fixture(scope="module")
def tokenizer_path() -> pathlib.Path:
    assert TOKENIZER_JSON.exists(), f"{TOKENIZER_JSON} missing: run tools/fetch_tokenizer.py (scripts/setup.sh does)"
    return TOKENIZER_JSON


@pytest.fixture(scope="module")
def hf_full(tokenizer_path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_path))


@pytest.fixture(scope="module")
def hf_plain(tokenizer_path) -> Tokenizer:
    """The same tokenizer with its added vocabulary removed: HF's behaviour for content (control-token
    strings are plain text), which is cedar's default."""
    cfg = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    cfg["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(cfg))


def run_cedar(tokenizer_path, requests: list, *flags: str) -> list[dict]:
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests).encode("utf-8")
    proc = subprocess.run([CEDAR, "tokenize", "--tokenizer", str(tokenizer_path), "--jsonl", "--file", "-", *flags],
                          input=payload, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    lines = proc.stdout.decode("utf-8").split("\n")[:-1]  # not splitlines(): U+2028 etc. are text
    assert len(lines) == len(requests)
    return [json.loads(line) for line in lines]


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"at index {i}: cedar {a[max(0, i - 3):i + 4]} vs HF {b[max(0, i - 3):i + 4]}"
    return f"lengths differ: cedar {len(a)} vs HF {len(b)}"


def test_corpus_ids_and_round_trip_match_hf(tokenizer_path, hf_plain):
    docs = build_corpus()
    assert corpus_size(docs) >= 10_000_000
    expected = [e.ids for e in hf_plain.encode_batch(docs, add_special_tokens=False)]
    got = run_cedar(tokenizer_path, docs)
    failures = []
    for doc, exp, res in zip(docs, expected, got):
        assert "error" not in res, res["error"]
        if res["ids"] != exp:
            failures.append(f"{doc[:60]!r}: {first_difference(res['ids'], exp)}")
        elif res["text"] != doc:
            failures.append(f"{doc[:60]!r}: decode does not round-trip")
    assert not failures, f"{len(failures)} of {len(docs)} documents differ; first: " + "\n".join(failures[:5])


def test_added_tokens_on_match_hf(tokenizer_path, hf_full):
    rng = random.Random(7)
    added = [t.content for t in hf_full.get_added_tokens_decoder().values()]
    docs = []
    for _ in range(500):
        parts = [rng.choice(added if rng.random() < 0.5 else TOKEN_STRINGS) if rng.random() < 0.5
                 else rng.choice(["x", " hello", "\n\n", "<", "｜", "<｜", "think>", "日本", " 12"])
                 for _ in range(rng.randint(1, 10))]
        docs.append("".join(parts))
    docs += ["<｜User｜>", "<<｜User｜>>", "<｜User｜<｜Assistant｜>", "｜DSML｜｜DSML｜", "</think></think>",
             "<｜/table>｜", "<｜place▁holder▁no▁799｜>x", "<｜begin▁of▁sentence｜><｜▁pad▁｜>"]
    expected = [e.ids for e in hf_full.encode_batch(docs, add_special_tokens=False)]
    got = run_cedar(tokenizer_path, docs, "--special")
    for doc, exp, res in zip(docs, expected, got):
        assert res["ids"] == exp, f"{doc!r}: {first_difference(res['ids'], exp)}"
        assert res["text"] == doc


def test_added_token_strings_are_plain_text_by_default(tokenizer_path, hf_full):
    got = run_cedar(tokenizer_path, TOKEN_STRINGS)
    added_ids = set(hf_full.get_added_tokens_decoder())
    for s, res in zip(TOKEN_STRINGS, got):
        assert not added_ids.intersection(res["ids"]) or s == "", f"{s!r} produced a control token: {res['ids']}"
    # encoding.md §4.5 / deepseek-recipe: user text "<｜User｜>" is five BPE tokens.
    assert got[0]["ids"] == [30, 28217, 6756, 28217, 32]


def test_decode_matches_hf_on_random_ids(tokenizer_path, hf_full):
    """Random id sequences (split UTF-8 characters, byte tokens, added tokens) decode like HF decode()."""
    rng = random.Random(11)
    vocab = hf_full.get_vocab_size(with_added_tokens=True)
    byte_tokens = list(range(0, 256)) + list(range(100, 400))
    seqs = []
    for _ in range(3000):
        pool = byte_tokens if rng.random() < 0.5 else None
        seqs.append([rng.choice(pool) if pool else rng.randrange(vocab) for _ in range(rng.randint(0, 12))])
    expected = [hf_full.decode(s, skip_special_tokens=False) for s in seqs]
    got = run_cedar(tokenizer_path, seqs)
    for s, exp, res in zip(seqs, expected, got):
        assert res["text"] == exp, f"ids {s}: cedar {res['text']!r} vs HF {exp!r}"


def test_decode_skip_special_tokens_matches_hf(tokenizer_path, hf_full):
    """decode(skip_special_tokens=True) = HF's: added tokens flagged `special` vanish (BOS/EOS/pad, placeholders,
    grounding tokens); the think/DSML/role markers are not `special` in DeepSeek's file and stay."""
    rng = random.Random(12)
    added = sorted(hf_full.get_added_tokens_decoder())
    byte_tokens = list(range(100, 400))
    seqs = [[rng.choice(added if rng.random() < 0.4 else byte_tokens) for _ in range(rng.randint(0, 12))] for _ in range(2000)]
    seqs.append([0, 128803, 128804, 128821, 128822, 128825, 1, 2])
    expected = [hf_full.decode(s, skip_special_tokens=True) for s in seqs]
    got = run_cedar(tokenizer_path, seqs, "--skip-special-tokens")
    for s, exp, res in zip(seqs, expected, got):
        assert res["text"] == exp, f"ids {s}: cedar {res['text']!r} vs HF {exp!r}"
    assert got[-1]["text"] == "<｜User｜><｜Assistant｜><think></think>｜DSML｜"


def test_every_code_point_pretokenizes_like_hf(tokenizer_path, hf_full):
    """Each scalar value between NULs: the pieces reveal the class cedar's table gives it (letter/mark,
    punctuation/symbol, number, whitespace, CJK or other) — compared with HF's Oniguruma on all 1,112,064."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    chunks = ["".join("\x00" + chr(c) for c in cps[i:i + 50000]) + "\x00" for i in range(0, len(cps), 50000)]
    got = run_cedar(tokenizer_path, chunks, "--pretokenize")
    for i, (chunk, res) in enumerate(zip(chunks, got)):
        expected = [p for p, _ in hf_full.pre_tokenizer.pre_tokenize_str(chunk)]
        assert res["pretokens"] == expected, f"chunk {i}: {first_difference(res['pretokens'], expected)}"


def test_invalid_utf8_is_rejected_with_offset(tmp_path, tokenizer_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\xffno")
    proc = subprocess.run([CEDAR, "tokenize", "--tokenizer", str(tokenizer_path), "--file", str(bad)],
                          capture_output=True)
    assert proc.returncode == 1
    assert b"byte offset 2" in proc.stderr
