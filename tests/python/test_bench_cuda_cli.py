"""`cedar bench --device cuda` in a CPU-only build: it exits non-zero with a message that names the cause
(built without CUDA) and the way out (the `cuda` preset), before loading any model; an unknown device is
a usage error (exit 2). In a CUDA build the command needs a GPU: the test skips, saying so (the GPU run
is part of the device batch, docs/cuda.md); an unknown --cuda-options name is a usage error there, before
any device work.
Binary: $CEDAR_BINARY, default <repo>/build/release/cedar.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("CEDAR_BINARY", str(ROOT / "build" / "release" / "cedar"))


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)


def is_cuda_build():
    proc = run("doctor", "--json", str(ROOT / "tests" / "data" / "configs" / "deepseek_v41_flash"))
    report = json.loads(proc.stdout)
    build = next(c for c in report["checks"] if c["name"] == "cuda build")
    return build["outcome"] != "skip"


def test_cpu_build_refuses_cuda_device_with_a_clear_message(tmp_path):
    if is_cuda_build():
        pytest.skip("this binary is a CUDA build: `bench --device cuda` needs a GPU (run it on the device)")
    missing_model = tmp_path / "no-such-model"
    proc = run("bench", str(missing_model), "--device", "cuda", "--json", str(tmp_path / "out.json"))
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "built without CUDA" in proc.stderr
    assert "cuda" in proc.stderr and "preset" in proc.stderr
    # The refusal comes first: no model was looked for (its path would be named) and nothing was written.
    assert "no-such-model" not in proc.stderr
    assert not (tmp_path / "out.json").exists()
    assert proc.stdout == ""


def test_unknown_device_is_a_usage_error():
    proc = run("bench", "--device", "tpu")
    assert proc.returncode == 2
    assert "--device" in proc.stderr and "tpu" in proc.stderr


def test_cuda_build_rejects_an_unknown_cuda_option_before_any_device_work():
    if not is_cuda_build():
        pytest.skip("this binary is a CPU build: it refuses --device cuda before reading --cuda-options")
    # prefetch_attention was removed (the sparse attention has one tile loader): naming it is an error
    # that lists the known names, a usage error (exit 2) before any model or GPU is touched.
    proc = run("bench", "--device", "cuda", "--cuda-options", "prefetch_attention=1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "CUDA option 'prefetch_attention' is unknown" in proc.stderr
    assert "concurrent_branches" in proc.stderr and "cuda_graphs" in proc.stderr


def test_help_documents_the_cuda_options():
    proc = run("bench", "--help")
    assert proc.returncode == 0
    for option in ("--device", "--batches", "--prefill-lens", "--context"):
        assert option in proc.stdout, option
    # The switch names are not listed by hand (they went stale): the help says where the run prints them.
    assert "CUDA model options:" in proc.stdout


def test_cuda_build_checks_every_ab_spec_before_any_device_work():
    if not is_cuda_build():
        pytest.skip("this binary is a CPU build: it refuses --device cuda before reading --ab-specs")
    # --ab-specs: ';'-separated --cuda-options specs; a bad one is named, a usage error before any GPU work.
    proc = run("bench", "--device", "cuda", "--ab-specs", "attn_merge_trigger=0;routed_warps=1,attn_merge_trigger=1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "--ab-specs 'routed_warps=1,attn_merge_trigger=1'" in proc.stderr
    assert "routed_warps" in proc.stderr
    assert "--ab-specs" in run("bench", "--help").stdout
