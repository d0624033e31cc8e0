"""`cedar run` and `cedar chat` on the embedded default model (the README's first command creates it).

References: HF `tokenizers` on the model's own tokenizer.json (prompt ids and the decoded text of the
generated ids), `cedar forward`'s argmax for the first greedy token (a different code path: the CLI
forward without the engine), and the KV budget rule of architecture.md §3.12 recomputed from config.json.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from tokenizers import Tokenizer

from cedar_cli import cedar_binary

EOS = 1


def cedar(*args, input_text=None, check=True):
    proc = subprocess.run([cedar_binary(), *args], input=input_text, capture_output=True, text=True, check=False,
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def default_model() -> str:
    """Path of the embedded default model (created on first use by `cedar forward`)."""
    proc = cedar("forward", "--ids", "0", "--positions", "last")
    return json.loads(proc.stdout)["model"]


def run_stats(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    proc = cedar("run", "--threads", "2", "--stats-json", str(out), *args)
    return proc, json.loads(out.read_text())


def test_run_greedy_matches_forward_and_tokenizer(default_model, tmp_path):
    hf = Tokenizer.from_file(os.path.join(default_model, "tokenizer.json"))
    prompt = "The quick brown fox"
    ids = [0] + hf.encode(prompt, add_special_tokens=False).ids
    proc, stats = run_stats(tmp_path, "greedy", "--prompt", prompt, "--max-tokens", "6", "--exact")
    for key in ("kv_bytes_per_token_measured", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s",
                "prompt_tokens", "output_tokens", "token_ids", "text", "finish_reason"):
        assert key in stats, key
    assert stats["prompt_tokens"] == len(ids)
    assert stats["mode"] == "exact"
    assert 1 <= stats["output_tokens"] <= 6
    assert stats["ttft_s"] > 0 and stats["prefill_tokens_per_s"] > 0
    # First generated token: argmax of the last prompt row, as `cedar forward` computes it.
    fwd = json.loads(cedar("forward", "--ids", ",".join(map(str, ids)), "--positions", "last").stdout)
    assert stats["token_ids"][0] == fwd["last_argmax"]
    # Text: HF decode of the generated ids without a final EOS; stdout streams the same text.
    gen = [t for t in stats["token_ids"] if t != EOS]
    assert stats["text"] == hf.decode(gen, skip_special_tokens=False)
    assert proc.stdout == stats["text"] + "\n"


def test_run_kv_bytes_per_token(default_model, tmp_path):
    cfg = json.loads(open(os.path.join(default_model, "config.json")).read())
    cfg = cfg.get("text_config", cfg)
    _, stats = run_stats(tmp_path, "kv", "--prompt", "one two three four five six seven eight nine ten " * 3,
                         "--max-tokens", "4", "--ignore-eos")
    # §3.12: a KV source of ratio r stores floor(len / r) main entries (head_dim/2 + head_dim/16 bytes)
    # and as many indexer keys (index_head_dim/2 + index_head_dim/32 bytes). Which layers are sources
    # comes from the checkpoint; here only the bound: between the ratio-2-only and ratio-1-only extremes.
    per_entry = cfg["head_dim"] // 2 + cfg["head_dim"] // 16 + cfg["index_head_dim"] // 2 + cfg["index_head_dim"] // 32
    payload = stats["kv_bytes_per_token_payload"]
    assert payload > 0
    assert payload <= stats["kv_bytes_per_token_expected"] + 1e-9
    # floor() rounding loses at most one entry per source over kv_tokens tokens.
    assert stats["kv_bytes_per_token_expected"] - payload <= 8 * per_entry / stats["kv_tokens"]
    # Allocated in the paged pool: blocks of 64 positions (64 / r entries of a ratio-r source). With
    # fewer than 64 tokens every source holds exactly one block, so with n1 ratio-1 and n2 ratio-2
    # sources: payload = (n1·len + n2·floor(len/2))·per_entry and allocated = (64·n1 + 32·n2)·per_entry.
    n = stats["kv_tokens"]
    assert n < 64
    assert stats["kv_bytes_per_token_measured"] == pytest.approx(stats["kv_bytes_allocated"] / n)
    assert stats["kv_padding_bytes"] == stats["kv_bytes_allocated"] - round(payload * n)
    sources = sum(1 for r in cfg["compress_ratios"][: cfg["num_hidden_layers"]] if r > 0)
    fits = [(n1, n2) for n1 in range(sources + 1) for n2 in range(sources + 1 - n1)
            if (n1 * n + n2 * (n // 2)) * per_entry == round(payload * n)
            and (64 * n1 + 32 * n2) * per_entry == stats["kv_bytes_allocated"]]
    assert fits, (stats["kv_bytes_allocated"], payload * n, per_entry)
    assert stats["kv_pool_peak_used_bytes"] == stats["kv_bytes_allocated"]


def test_run_seed_determinism_and_modes(tmp_path):
    args = ("--prompt", "Once upon a time", "--max-tokens", "8", "--temperature", "1.0", "--ignore-eos")
    _, a = run_stats(tmp_path, "a", *args, "--seed", "5")
    _, b = run_stats(tmp_path, "b", *args, "--seed", "5")
    _, c = run_stats(tmp_path, "c", *args, "--seed", "6")
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] != c["token_ids"]
    # A prompt shorter than the sliding window: CED replays every row, so it equals exact mode.
    _, ced = run_stats(tmp_path, "ced", "--prompt", "Hi", "--max-tokens", "5", "--ignore-eos")
    _, exact = run_stats(tmp_path, "exact", "--prompt", "Hi", "--max-tokens", "5", "--ignore-eos", "--exact")
    assert ced["mode"] == "ced" and exact["mode"] == "exact"
    assert ced["token_ids"] == exact["token_ids"]


def test_run_errors():
    proc = cedar("run", "--max-tokens", "3", check=False)
    assert proc.returncode == 2 and "--prompt" in proc.stderr
    proc = cedar("run", "--prompt", "x", "--temperature", "-1", check=False)
    assert proc.returncode == 1 and "temperature" in proc.stderr
    proc = cedar("run", "/nonexistent/model", "--prompt", "x", check=False)
    assert proc.returncode == 1 and "/nonexistent/model" in proc.stderr


def test_run_prefix_cache_flags(tmp_path):
    """The prefix cache is on by default (one request: nothing to hit), off with --no-prefix-cache, and
    its options are validated; the output does not depend on it."""
    args = ("--prompt", "Once upon a time", "--max-tokens", "4", "--ignore-eos")
    _, on = run_stats(tmp_path, "on", *args)
    _, off = run_stats(tmp_path, "off", *args, "--no-prefix-cache")
    _, small = run_stats(tmp_path, "small", *args, "--swa-pool-mb", "0", "--swa-ttl-s", "1", "--swa-history", "0")
    assert on["prefix_cache"] == "on" and off["prefix_cache"] == "off" and small["prefix_cache"] == "on"
    assert on["cached_tokens"] == 0 and on["replayed_tokens"] == 0
    assert on["token_ids"] == off["token_ids"] == small["token_ids"]
    _, window = run_stats(tmp_path, "window", *args, "--swa-replay", "window")
    assert window["token_ids"] == on["token_ids"] and window["cache_approximate"] is False
    for bad in (["--swa-pool-mb", "-1"], ["--swa-ttl-s", "x"], ["--swa-history", "-2"], ["--swa-replay", "x"]):
        proc = cedar("run", *args, *bad, check=False)
        assert proc.returncode == 2 and bad[0] in proc.stderr, proc.stderr


def test_chat_two_turns_from_stdin():
    proc = cedar("chat", "--threads", "2", "--max-tokens", "6", "--ignore-eos",
                 input_text="Hello there\n\nWhat is 2+2?\n/exit\nnever read\n")
    out = proc.stdout
    assert out.count("[finish] length") == 2, out
    assert "[answer]" in out or "[tool call]" in out, out


def test_chat_thinking_shows_reasoning_apart():
    proc = cedar("chat", "--threads", "2", "--thinking", "--max-tokens", "5", "--ignore-eos",
                 input_text="Think about it\n")
    out = proc.stdout
    assert out.startswith("[reasoning] "), out
    assert out.rstrip().endswith("[finish] length"), out


def test_bench_json_has_every_point(tmp_path):
    out = tmp_path / "bench.json"
    cedar("bench", "--threads", "1", "--concurrency", "1,2", "--prompt-len", "6", "--output-len", "2,3",
          "--ced-lens", "8,24", "--repeats", "1", "--json", str(out))
    data = json.loads(out.read_text())
    points = {(p["concurrency"], p["output_len"]): p for p in data["load"]}
    assert sorted(points) == [(1, 2), (1, 3), (2, 2), (2, 3)]
    for (c, _), p in points.items():
        assert p["requests"] == 2 * c and p["prompt_len"] == 6
        assert p["ttft_mean_s"] > 0 and p["tpot_mean_s"] > 0 and p["output_tokens_per_s"] > 0
        assert p["ttft_p50_s"] <= p["ttft_p90_s"] + 1e-12
    assert [p["prompt_len"] for p in data["prefill"]["points"]] == [8, 24]
    for p in data["prefill"]["points"]:
        assert p["exact_cpu_s"] > 0 and p["ced_cpu_s"] > 0
        assert abs(p["exact_over_ced"] - p["exact_cpu_s"] / p["ced_cpu_s"]) < 1e-9
    assert data["prefill"]["ced_tail"] == data["sliding_window"]


def test_run_kv_cache_dir(default_model, tmp_path):
    """--kv-cache-dir: the SSD tier of the prefix cache (docs/prefix_cache.md). Two processes, one prompt,
    one directory: the second takes the prompt's full 64-token blocks from disk. No SWA snapshot survives
    the process: both modes rebuild the rings by the exact bounded replay and must produce exactly the
    first run's tokens; ced mode's opt-in window replay (--swa-replay window) replays the window only and
    says it is approximate."""
    cache = tmp_path / "kv"
    prompt = "In the beginning " * 40  # 122 tokens with BOS: one full cache block
    args = ("--prompt", prompt, "--max-tokens", "3", "--kv-cache-dir", str(cache), "--kv-cache-dir-gb", "0.05")
    _, first = run_stats(tmp_path, "kv1", *args)
    assert (cache / "lock").exists()
    assert first["prefix_cache"] == "on"
    assert first["kv_disk"]["budget_bytes"] == int(0.05 * 2**30)
    assert first["cached_tokens"] == 0
    assert first["kv_disk"]["puts"] == first["kv_disk"]["files"] == 1
    _, second = run_stats(tmp_path, "kv2", *args)
    assert second["cached_tokens"] == 64
    assert second["replayed_tokens"] > 0  # no snapshot survives the process: SWA bounded replay
    assert second["cache_approximate"] is False and second["token_ids"] == first["token_ids"]
    assert second["kv_disk"]["hits"] == 1 and second["kv_disk"]["corrupt"] == 0
    assert second["kv_disk"]["puts"] == 0  # the block is not written again
    _, window = run_stats(tmp_path, "kv2w", *args, "--swa-replay", "window")
    assert window["cached_tokens"] == 64 and window["cache_approximate"] is True
    assert 0 < window["replayed_tokens"] < second["replayed_tokens"]

    exact_dir = tmp_path / "kv-exact"
    exact_args = ("--exact", "--prompt", prompt, "--max-tokens", "3", "--kv-cache-dir", str(exact_dir))
    _, e1 = run_stats(tmp_path, "kv3", *exact_args)
    _, e2 = run_stats(tmp_path, "kv4", *exact_args)
    assert e2["cached_tokens"] == 64 and e2["replayed_tokens"] > 0 and e2["cache_approximate"] is False
    assert e2["token_ids"] == e1["token_ids"]

    # Bad values are usage errors that name the option.
    bad = cedar("run", "--prompt", "x", "--kv-cache-dir-gb", "1", check=False)
    assert bad.returncode != 0 and "--kv-cache-dir-gb needs --kv-cache-dir" in bad.stderr
    bad = cedar("run", "--prompt", "x", "--kv-cache-dir", str(cache), "--kv-cache-dir-gb", "0", check=False)
    assert bad.returncode != 0 and "--kv-cache-dir-gb must be a positive number" in bad.stderr
    bad = cedar("run", "--prompt", "x", "--kv-cache-dir", str(cache), "--no-prefix-cache", check=False)
    assert bad.returncode != 0 and "--no-prefix-cache" in bad.stderr
