"""`cedar doctor` end to end in a CPU-only build: the GPU checks are skipped with the reason, the model
checks run, the exit code follows the required checks, and the memory-plan verdict agrees with
`cedar inspect`'s plan for the same GPUs (the same plan_memory rules, docs/inspect.md).
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
V41 = ROOT / "tests" / "data" / "configs" / "deepseek_v41_flash"


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)


def doctor_json(*args):
    proc = run("doctor", "--json", *args)
    return proc, json.loads(proc.stdout)


def checks_by_name(report):
    return {c["name"]: c for c in report["checks"]}


def require_cpu_build(report):
    if checks_by_name(report)["cuda build"]["outcome"] != "skip":
        pytest.skip("this binary is a CUDA build: its GPU checks need a GPU (run cedar_cuda_tests on the device)")


def test_cpu_build_skips_gpu_checks_and_passes_model_checks():
    proc, report = doctor_json(str(V41), "--gpus", "8", "--gpu-mem-gib", "140")
    require_cpu_build(report)
    checks = checks_by_name(report)
    assert "built without CUDA" in checks["cuda build"]["detail"]
    assert checks["model"]["outcome"] == "pass"
    assert checks["model"]["data"]["arch"] == "deepseek_v41"
    assert checks["memory plan"]["outcome"] == "pass"
    assert report["ok"] is True and proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("gpus,mem", [("8", "140"), ("1", "140"), ("1", "20")])
def test_memory_plan_verdict_matches_inspect(gpus, mem):
    proc, report = doctor_json(str(V41), "--gpus", gpus, "--gpu-mem-gib", mem)
    require_cpu_build(report)
    ins = run("inspect", str(V41), "--json", "--gpus", gpus, "--gpu-mem-gib", mem)
    assert ins.returncode == 0, ins.stderr
    inspected = json.loads(ins.stdout)
    scenarios = inspected["memory_plan"]["scenarios"]
    fits = any(s["fits"] for s in scenarios)
    plan = checks_by_name(report)["memory plan"]
    assert plan["outcome"] == ("pass" if fits else "FAIL")
    assert [s["fits"] for s in plan["data"]["scenarios"]] == [s["fits"] for s in scenarios]
    # A failed required check makes the exit code 1.
    assert proc.returncode == (0 if fits else 1)


def test_text_report_and_usage_errors():
    proc = run("doctor", str(V41))
    assert "memory plan" in proc.stdout and "doctor:" in proc.stdout
    assert run("doctor", "--gpus", "0").returncode == 2
    assert run("doctor", "--bogus").returncode == 2
    assert run("doctor", "--help").returncode == 0
