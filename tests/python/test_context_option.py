"""`--context N` of `cedar serve|run|chat` (docs/server.md "Context length") on the embedded default model.

Checked against the model's own config.json and HF `tokenizers` (prompt lengths): bad values are usage
errors (exit 2) found before the weights load; a context above max_position_embeddings names both numbers;
one that one sequence's KV cannot fit in the KV budget names the budget; with --device cpu the default is
max_position_embeddings, and an explicit N caps the context the engine accepts: `run` stops the output
where the context ends, `serve` reports N in /v1/models, clamps max_tokens to it and answers longer prompts
with 400 context_length_exceeded. --device cuda without the CUDA backend is refused before any model loads.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest
from tokenizers import Tokenizer

from cedar_cli import cedar_binary
from serve_util import CedarServer


def cedar(*args, input_text=None):
    return subprocess.run([cedar_binary(), *args], input=input_text, capture_output=True, text=True, check=False,
                          timeout=300)


@pytest.fixture(scope="module")
def default_model() -> str:
    proc = cedar("forward", "--ids", "0", "--positions", "last")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["model"]


@pytest.fixture(scope="module")
def max_positions(default_model) -> int:
    cfg = json.loads(open(os.path.join(default_model, "config.json")).read())
    return cfg.get("text_config", cfg)["max_position_embeddings"]


def is_cuda_build() -> bool:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = cedar("doctor", "--json", os.path.join(root, "tests", "data", "configs", "deepseek_v41_flash"))
    build = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "cuda build")
    return build["outcome"] != "skip"


COMMANDS = {
    "run": ["run", "--prompt", "hi"],
    "chat": ["chat"],
    "serve": ["serve", "--port", "0"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5", ""])
def test_bad_values_are_usage_errors(default_model, command, value):
    proc = cedar(*COMMANDS[command], "--context", value, input_text="")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "--context must be a positive number of positions" in proc.stderr, proc.stderr
    assert f"'{value}'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_above_max_position_embeddings_names_both_numbers(default_model, max_positions, command):
    n = max_positions + 1
    proc = cedar(*COMMANDS[command], "--context", str(n), input_text="")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert str(n) in proc.stderr and f"max_position_embeddings {max_positions}" in proc.stderr, proc.stderr
    assert "listening" not in proc.stderr


def test_context_the_kv_budget_cannot_hold_is_refused(default_model, max_positions):
    proc = cedar("run", "--prompt", "hi", "--kv-cache-mb", "1", "--context", str(max_positions))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "KV budget of 1.0 MiB" in proc.stderr, proc.stderr
    proc = cedar("serve", "--port", "0", "--kv-bytes", "1000000", "--context", str(max_positions))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "KV budget" in proc.stderr, proc.stderr


def test_fake_backend_refuses_context():
    proc = cedar("serve", "--fake-backend", "--port", "0", "--context", "64")
    assert proc.returncode == 2
    assert "--context needs a model backend" in proc.stderr and "--context-length" in proc.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_documents_context(command):
    proc = cedar(COMMANDS[command][0], "--help")
    assert proc.returncode == 0
    assert "--context N" in proc.stdout, proc.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cuda_without_the_backend_is_refused_first(tmp_path, command):
    if is_cuda_build():
        pytest.skip("this binary is a CUDA build: --device cuda needs a GPU (the device batch runs it)")
    missing = tmp_path / "no-such-model"
    args = [COMMANDS[command][0], str(missing), *COMMANDS[command][1:], "--device", "cuda", "--context", "4096"]
    proc = cedar(*args, input_text="")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "built without the CUDA backend" in proc.stderr
    assert "no-such-model" not in proc.stderr  # refused before the model is looked for


def test_run_stops_where_the_context_ends(default_model, tmp_path):
    hf = Tokenizer.from_file(os.path.join(default_model, "tokenizer.json"))
    prompt = "one two three"
    prompt_tokens = 1 + len(hf.encode(prompt, add_special_tokens=False).ids)  # BOS first
    context = prompt_tokens + 5
    out = tmp_path / "stats.json"
    proc = cedar("run", "--threads", "2", "--prompt", prompt, "--max-tokens", "50", "--ignore-eos", "--context",
                 str(context), "--stats-json", str(out))
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(out.read_text())
    assert stats["prompt_tokens"] == prompt_tokens
    assert stats["context_length"] == context
    assert stats["output_tokens"] == context - prompt_tokens
    assert stats["finish_reason"] == "length"
    # A prompt that fills the context leaves no room: the server's message, exit 1.
    proc = cedar("run", "--threads", "2", "--prompt", prompt, "--context", str(prompt_tokens))
    assert proc.returncode == 1
    assert f"maximum context length is {prompt_tokens} tokens" in proc.stderr, proc.stderr


def test_run_cpu_default_is_max_position_embeddings(default_model, max_positions, tmp_path):
    out = tmp_path / "stats.json"
    proc = cedar("run", "--threads", "2", "--prompt", "hi", "--max-tokens", "2", "--stats-json", str(out))
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(out.read_text())
    assert stats["context_length"] == max_positions and stats["device"] == "cpu"


def test_chat_drops_a_message_that_fills_the_context(default_model):
    proc = cedar("chat", "--threads", "2", "--context", "8", "--max-tokens", "2",
                 input_text="a message much longer than eight tokens, surely\n")
    assert proc.returncode == 0, proc.stderr
    assert "maximum context length is 8 tokens" in proc.stderr and "dropped" in proc.stderr, proc.stderr


def post(server, path, body):
    req = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_context_caps_requests(default_model, max_positions):
    hf = Tokenizer.from_file(os.path.join(default_model, "tokenizer.json"))
    with CedarServer(["--threads", "2", "--context", "48"], timeout_s=300) as s:
        _, models = s.get("/v1/models")
        m = json.loads(models)["data"][0]
        assert m["context_length"] == 48 and m["max_model_len"] == 48
        prompt = "alpha beta gamma"
        prompt_tokens = 1 + len(hf.encode(prompt, add_special_tokens=False).ids)
        status, r = post(s, "/v1/completions", {"prompt": prompt, "max_tokens": 100000, "ignore_eos": True})
        assert status == 200, r
        assert r["usage"]["prompt_tokens"] == prompt_tokens
        assert r["usage"]["completion_tokens"] == 48 - prompt_tokens  # clamped to what the context leaves
        status, r = post(s, "/v1/completions", {"prompt": " ".join(f"w{i}" for i in range(100)), "max_tokens": 1})
        assert status == 400, r
        assert r["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 48" in r["error"]["message"]
    with CedarServer(["--threads", "2"], timeout_s=300) as s:  # the CPU default
        _, models = s.get("/v1/models")
        assert json.loads(models)["data"][0]["context_length"] == max_positions
