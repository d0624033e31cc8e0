"""DeepSeek Harness (DSH) headless run against `cedar serve` (serving.md §4c).

DSH comes from PyPI (deepseek-harness-sdk / deepseek-harness-runtime-bin 0.2.1rc2, pinned in
requirements-test.txt); its `dsh` CLI runs offline against DEEPSEEK_BASE_URL. That runtime's
deepseek-official route speaks DeepSeek's Anthropic-compatible Messages wire (POST {base}/v1/messages,
thinking / output_config.effort, message_* SSE events), so this run exercises cedar's /v1/messages.
The server runs the scripted backend with a known prefix-cache hit count, and the test reads DSH's own
session log (zstd JSONL) to check that DSH recorded cedar's usage and cache numbers.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serve_util import CedarServer

CACHED = 7


def find_dsh():
    exe = os.environ.get("DSH_BINARY") or shutil.which("dsh") or str(Path(sys.executable).parent / "dsh")
    return exe if Path(exe).exists() else None


def read_session_log(path: Path) -> list:
    try:
        import zstandard  # noqa: F401
        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
    except ImportError:
        if shutil.which("zstd") is None:
            pytest.skip("cannot read DSH's session log: neither the zstandard module nor the zstd CLI is installed")
        raw = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def find_usage(obj, out):
    if isinstance(obj, dict):
        if "cacheReadTokens" in obj and "inputTokens" in obj:
            out.append(obj)
        for v in obj.values():
            find_usage(v, out)
    elif isinstance(obj, list):
        for v in obj:
            find_usage(v, out)


def test_dsh_headless_run_completes_and_logs_cedar_usage(tmp_path):
    dsh = find_dsh()
    if dsh is None:
        pytest.skip("DSH's `dsh` CLI not found (pip install deepseek-harness-sdk==0.2.1rc2 "
                    "deepseek-harness-runtime-bin==0.2.1rc2, or set DSH_BINARY)")
    with CedarServer(["--fake-backend", "--context-length", "1048576", "--fake-cached-tokens", str(CACHED),
                      "--api-key", "local-test-key"]) as server:
        base = server.base_url + "/v1"
        patch = tmp_path / "dsh-local.cordis.yml"
        patch.write_text(f"""- id: agent-default-model
  config:
    provider: deepseek-official
    model: deepseek-v4.1-flash
- id: llm-deepseek
  config:
    apiKeyEnv: DEEPSEEK_API_KEY
    baseURL: {base}
    thinking: enabled
    reasoningEffort: high
    maxTokens: 32768
    streamIdleTimeoutMs: 900000
    defaultContextWindow: 1048576
    models:
      - id: deepseek-v4.1-flash
        contextWindow: 1048576
- id: tool-web
  disabled: true
""")
        home, ws = tmp_path / "dsh-home", tmp_path / "workspace"
        home.mkdir()
        ws.mkdir()
        env = dict(os.environ, DSH_HOME=str(home), DEEPSEEK_BASE_URL=base, DEEPSEEK_API_KEY="local-test-key",
                   DSH_TELEMETRY_DISABLED="1")
        proc = subprocess.run([dsh, "--profile", "headless", "--patch", str(patch), "Say hello"], cwd=ws, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # The final answer is the scripted backend's text, so it came through cedar.
        assert "Answer for seed none:" in proc.stdout
        logs = list((home / "sessions").rglob("session*.jsonl*"))
        assert logs, f"no session log under {home / 'sessions'}"
        usages = []
        for log in logs:
            records = read_session_log(log) if log.suffix == ".zstd" else [
                json.loads(x) for x in log.read_text().splitlines() if x.strip()]
            find_usage(records, usages)
        assert usages, "the session log has no usage record"
        u = usages[-1]
        assert u["cacheReadTokens"] == CACHED
        assert u["inputTokens"] > 0 and u["outputTokens"] > 0
        assert u["totalTokens"] == u["inputTokens"] + u["outputTokens"] + u["cacheReadTokens"] + u["cacheWriteTokens"]
