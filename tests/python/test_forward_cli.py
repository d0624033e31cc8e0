"""`cedar forward` on a checkpoint written by the independent Python writer (tools/tiny_checkpoint.py).

Besides the file contract (a float32 .npy [positions, vocab], finite values, one .npy per dumped tensor plus
index.json), the block wiring of architecture.md §3.2–3.3 is re-computed here with NumPy in float64 from
the dumped module inputs/outputs and the checkpoint's own tensors (read by the independent
safetensors_dir_reader): embedding and stream expansion, the single-pass mHC shift (the attention input
is collapsed with the previous site's `pre`, the ffn input with the attention site's `pre`), the
Sinkhorn-projected residual mixes, the final collapse with the last ffn `pre`, the final RMSNorm and the
fp32 head. The modules themselves (attention, MoE, Engram) are tested against references in their own
suites; here their dumped outputs are taken as given.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cedar_cli import REPO, cedar_binary
from safetensors_dir_reader import read_checkpoint

VOCAB = 129280
IDS = [0, 15, 27, 1000, 5, 99, 128, 7, 31337, 2, 64000]


def forward(model, ids, *extra, check=True):
    cmd = [cedar_binary(), "forward", str(model), "--ids", ",".join(str(i) for i in ids), "--threads", "2", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("tiny_v41")
    subprocess.run([sys.executable, str(REPO / "tools" / "tiny_checkpoint.py"), str(out), "--arch", "deepseek_v41",
                    "--seed", "3", "--overwrite"], check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def one_shot(tiny, tmp_path_factory):
    """Logits of every position and every intermediate tensor of one exact-mode call."""
    d = tmp_path_factory.mktemp("one_shot")
    proc = forward(tiny, IDS, "--logits-out", str(d / "logits.npy"), "--dump-tensors", ".", str(d / "dump"))
    return {"dir": d, "summary": json.loads(proc.stdout), "logits": np.load(d / "logits.npy"),
            "index": json.loads((d / "dump" / "index.json").read_text())}


@pytest.fixture(scope="module")
def weights(tiny):
    config = json.loads((tiny / "config.json").read_text())
    _, tensors = read_checkpoint(tiny)
    return config["text_config"], tensors


def test_logits_file_and_summary(one_shot):
    logits = one_shot["logits"]
    assert logits.dtype == np.float32 and logits.shape == (len(IDS), VOCAB)
    assert np.isfinite(logits).all()
    assert logits.std(axis=1).min() > 0
    s = one_shot["summary"]
    assert s["positions"] == list(range(len(IDS)))
    assert s["shape"] == [len(IDS), VOCAB]
    assert s["mode"] == "exact" and s["replay_start"] == 0
    assert s["last_argmax"] == int(np.argmax(logits[-1]))


def test_dumped_tensors(one_shot, weights):
    text, _ = weights
    d, hc = text["hidden_size"], text["hc_mult"]
    index, dump = one_shot["index"], one_shot["dir"] / "dump"
    n_layers = text["num_hidden_layers"]
    expected = {"embed": d, "final_norm": d, "logits": VOCAB}
    for layer in range(n_layers):
        expected.update({f"layers.{layer}.{t}": d for t in ("attn_in", "attn_out", "ffn_in", "ffn_out")})
        expected[f"layers.{layer}.out"] = hc * d
    for layer in text["engram_layer_ids"]:
        expected[f"layers.{layer}.engram_out"] = hc * d
    for layer in text["index_source_layer_ids"]:
        expected[f"layers.{layer}.topk"] = text["index_topk"]
    assert set(index) == set(expected)
    for name, width in expected.items():
        arr = np.load(dump / f"{name}.npy")
        rows = len(IDS)
        assert arr.dtype == np.float32 and arr.shape == (rows, width), name
        assert index[name]["shape"] == [rows, width] and index[name]["positions"] == list(range(rows)), name
        assert np.isfinite(arr).all(), name
    np.testing.assert_array_equal(np.load(dump / "logits.npy"), one_shot["logits"])
    for layer in text["index_source_layer_ids"]:  # compressed-entry ids: ascending, visible, then -1
        ratio = text["compress_ratios"][layer]
        for t, row in enumerate(np.load(dump / f"layers.{layer}.topk.npy").astype(np.int64)):
            chosen = row[row >= 0]
            visible = (t + 1) // ratio
            assert (row[len(chosen):] == -1).all() and (np.diff(chosen) > 0).all(), (layer, t, row)
            assert len(chosen) == min(visible, text["index_topk"]) or layer > text["candidate_source_layer_id"]
            assert (chosen < visible).all(), (layer, t, row)


# ---- NumPy re-computation of the block wiring (float64, bf16 rounding where the reference stores bf16) ----


def bf16(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def rms_norm(x, w, eps):
    return bf16(w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hc_mix(X, fn, base, scale, hc, text):
    """§3.3 steps 1–5 for every row of X [n, hc*d]: pre [n, hc], post [n, hc], comb [n, hc, hc] ([j, k])."""
    eps = text["hc_eps"]
    m = (X @ fn.T) / np.sqrt(np.mean(X * X, axis=1, keepdims=True) + text["rms_norm_eps"])
    pre = sigmoid(m[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(-1, hc, hc)
    comb = np.exp(logits - logits.max(axis=2, keepdims=True))
    comb = comb / comb.sum(axis=2, keepdims=True) + eps
    comb = comb / (comb.sum(axis=1, keepdims=True) + eps)
    for _ in range(text["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(axis=2, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=1, keepdims=True) + eps)
    return pre, post, comb


def collapse(X, a, hc):
    return bf16(np.einsum("nk,nkc->nc", a, X.reshape(X.shape[0], hc, -1)))


def expand(y, X, post, comb, hc):
    Xs = X.reshape(X.shape[0], hc, -1)
    return bf16(post[:, :, None] * y[:, None, :] + np.einsum("njk,njc->nkc", comb, Xs)).reshape(X.shape[0], -1)


def assert_close_bf16(got, ref, name):
    """Within two bf16 ulps everywhere, and bit-equal nearly everywhere (float64 vs the reference's fp32
    sums flips a rounding only near ties)."""
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(got, ref, rtol=2.0 ** -7, atol=1e-30, err_msg=name)
    assert np.mean(got != ref) < 0.02, f"{name}: {np.mean(got != ref):.3%} of values differ"


def test_block_wiring_matches_numpy(one_shot, weights):
    text, tensors = weights
    hc, eps = text["hc_mult"], text["rms_norm_eps"]
    dump = one_shot["dir"] / "dump"

    def t(name):
        return tensors[name].decode().astype(np.float64)

    def load(name):
        return np.load(dump / f"{name}.npy").astype(np.float64)

    embed = t("embed.weight")[IDS]
    np.testing.assert_array_equal(load("embed"), embed)
    X = np.tile(embed, (1, hc))
    pre_prev = np.zeros((len(IDS), hc))
    pre_prev[:, 0] = 1.0
    for layer in range(text["num_hidden_layers"]):
        p = f"layers.{layer}."
        if layer in text["engram_layer_ids"]:
            X = load(p + "engram_out")  # the Engram module's output is taken as given
        pre_a, post_a, comb_a = hc_mix(X, t(p + "hc_attn_fn"), t(p + "hc_attn_base"), t(p + "hc_attn_scale"), hc, text)
        assert_close_bf16(load(p + "attn_in"), rms_norm(collapse(X, pre_prev, hc), t(p + "attn_norm.weight"), eps),
                          p + "attn_in")
        X_mid = expand(load(p + "attn_out"), X, post_a, comb_a, hc)
        pre_f, post_f, comb_f = hc_mix(X_mid, t(p + "hc_ffn_fn"), t(p + "hc_ffn_base"), t(p + "hc_ffn_scale"), hc, text)
        assert_close_bf16(load(p + "ffn_in"), rms_norm(collapse(X_mid, pre_a, hc), t(p + "ffn_norm.weight"), eps),
                          p + "ffn_in")
        X_ref = expand(load(p + "ffn_out"), X_mid, post_f, comb_f, hc)
        assert_close_bf16(load(p + "out"), X_ref, p + "out")
        X, pre_prev = load(p + "out"), pre_f  # continue from cedar's values: every check stays local
    final = rms_norm(collapse(X, pre_prev, hc), t("norm.weight"), eps)
    assert_close_bf16(load("final_norm"), final, "final_norm")
    logits_ref = load("final_norm") @ t("head.weight").T
    np.testing.assert_allclose(one_shot["logits"], logits_ref, rtol=1e-4, atol=1e-5 * np.abs(logits_ref).max())


def test_last_position_and_chunks_equal_one_shot(tiny, one_shot, tmp_path):
    forward(tiny, IDS, "--positions", "last", "--logits-out", str(tmp_path / "last.npy"))
    last = np.load(tmp_path / "last.npy")
    assert last.shape == (1, VOCAB)
    np.testing.assert_array_equal(last[0], one_shot["logits"][-1])
    for chunk in (1, 3):
        forward(tiny, IDS, "--chunk", str(chunk), "--logits-out", str(tmp_path / f"c{chunk}.npy"))
        np.testing.assert_array_equal(np.load(tmp_path / f"c{chunk}.npy"), one_shot["logits"], err_msg=f"chunk {chunk}")


def test_ced_mode_computes_the_tail(tiny, tmp_path, weights):
    text, _ = weights
    window, n = text["sliding_window"], 20
    ids = [(37 * i + 11) % 120000 for i in range(n)]
    proc = forward(tiny, ids, "--mode", "ced", "--logits-out", str(tmp_path / "ced.npy"),
                   "--dump-tensors", r"^layers\.(0|11)\.attn_in$", str(tmp_path / "dump"))
    summary = json.loads(proc.stdout)
    assert summary["replay_start"] == n - window
    assert summary["positions"] == list(range(n - window, n))
    logits = np.load(tmp_path / "ced.npy")
    assert logits.shape == (window, VOCAB) and np.isfinite(logits).all()
    index = json.loads((tmp_path / "dump" / "index.json").read_text())
    assert sorted(index) == ["layers.0.attn_in", "layers.11.attn_in"]
    assert index["layers.0.attn_in"]["positions"] == list(range(n))  # encoder: every row
    assert index["layers.11.attn_in"]["positions"] == list(range(n - window, n))  # decoder: the tail
    # A prompt within the tail is computed exactly.
    forward(tiny, ids[:window], "--mode", "ced", "--logits-out", str(tmp_path / "short_ced.npy"))
    forward(tiny, ids[:window], "--logits-out", str(tmp_path / "short_exact.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "short_ced.npy"), np.load(tmp_path / "short_exact.npy"))


def test_errors(tiny, tmp_path):
    proc = forward(tmp_path / "nothing-here", [1, 2], check=False)
    assert proc.returncode == 1 and "nothing-here" in proc.stderr
    proc = forward(tiny, [1, VOCAB], check=False)
    assert proc.returncode == 1 and f"token {VOCAB} at position 1 is outside the vocabulary" in proc.stderr
    proc = subprocess.run([cedar_binary(), "forward", str(tiny), "--ids", "1,x"], capture_output=True, text=True)
    assert proc.returncode == 2 and "'x' is not an integer" in proc.stderr
    proc = subprocess.run([cedar_binary(), "forward", str(tiny), "--ids", "1", "--dump-tensors", "("],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--dump-tensors needs REGEX and DIR" in proc.stderr
    proc = subprocess.run([cedar_binary(), "forward", str(tiny), "--ids", "1", "--mode", "fast"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown forward mode 'fast'" in proc.stderr
