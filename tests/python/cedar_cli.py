"""Helpers to run the cedar binary from pytest (CEDAR_BINARY, default <repo>/build/release/cedar)."""
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cedar_binary() -> str:
    return os.environ.get("CEDAR_BINARY", str(REPO / "build" / "release" / "cedar"))


def run_cedar(args, input_text: str) -> subprocess.CompletedProcess:
    return subprocess.run([cedar_binary(), *args], input=input_text.encode("utf-8"), capture_output=True, check=False)


def encode_many(requests, dialect="v41", extra=()):
    """Encodes a list of request dicts in one process; returns one dict per request."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests)
    proc = run_cedar(["encode", "--jsonl", "--dialect", dialect, *extra], text)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode("utf-8").splitlines()
    assert len(lines) == len(requests)
    return [json.loads(line) for line in lines]
