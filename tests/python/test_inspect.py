"""`cedar inspect` end to end, against published figures and independently written checkpoints.

References (none of them is cedar output):
* 890 B/token global KV for V4.1 (tech report abstract; architecture.md §3.12 derivation from the packed
  288 B / 68 B entries), 43 × 128 × 528 B of SWA rings per sequence (§3.12);
* V4: 584 B FlashMLA records per compressed entry + 68 B indexer keys at ratio-4 layers (§5, §6 item 7):
  21 × (584 + 68) / 4 + 20 × 584 / 128 = 3514.25 B/token;
* 7.89 B / 16.13 B active parameters per prefill (CED) / decode token (§3.10, S-profile), given with 10 M
  resolution: tolerance 10 M;
* 763 205 315 794 logical parameters of the released checkpoint (§2);
* full checkpoints are written by tools/tiny_checkpoint.py, the independent Python writer of the released
  format; byte counts come from its index json and the files on disk.
Binary: $CEDAR_BINARY, default <repo>/build/release/cedar.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("CEDAR_BINARY", str(ROOT / "build" / "release" / "cedar"))
CONFIGS = ROOT / "tests" / "data" / "configs"


def run_inspect(path, *extra):
    return subprocess.run([BINARY, "inspect", str(path), *extra], capture_output=True, text=True, timeout=120)


def inspect_json(path, *extra):
    proc = run_inspect(path, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_released_v41_config_only():
    doc = inspect_json(CONFIGS / "deepseek_v41_flash")
    assert doc["arch"] == "deepseek_v41"
    assert doc["checkpoint"] == {"present": False}
    assert doc["inventory"] == {"checked": False}
    assert doc["kv_bytes_per_token"] == 890
    assert doc["kv_bytes_per_token_measured"] == 890  # what the KV block pool allocates (dry run)
    assert doc["kv"]["main_bytes_per_token"] == 720 and doc["kv"]["indexer_bytes_per_token"] == 170
    assert doc["swa_bytes_per_sequence"] == 43 * 128 * 528
    assert abs(doc["params_active_prefill"] - 7.89e9) <= 1e7
    assert abs(doc["params_active_decode"] - 16.13e9) <= 1e7
    assert doc["params_total"] == 763_205_315_794
    assert doc["tensors_total"] == 96_085
    plan = doc["layer_plan"]
    assert plan["counts"] == {"swa": 2, "full": 4, "reindex": 4, "reuse": 30}
    assert plan["ced"] and plan["encoder_layers"] == 20 and plan["last_kv_source"] == 20


def test_inference_config_gives_the_same_numbers():
    hf = inspect_json(CONFIGS / "deepseek_v41_flash")
    ref = inspect_json(CONFIGS / "deepseek_v41_flash_inference")
    for key in ("kv_bytes_per_token", "swa_bytes_per_sequence", "params_total", "params_active_prefill",
                "params_active_decode", "bytes_total", "layer_plan"):
        assert hf[key] == ref[key], key


@pytest.mark.parametrize("name", ["deepseek_v4_flash", "deepseek_v4_flash_0731"])
def test_v4_config_only(name):
    doc = inspect_json(CONFIGS / name)
    assert doc["arch"] == "deepseek_v4"
    assert doc["kv_bytes_per_token"] == pytest.approx(21 * (584 + 68) / 4 + 20 * 584 / 128)
    assert abs(doc["kv_bytes_per_token"] - 3514) < 1
    assert doc["kv_bytes_per_token_measured"] == pytest.approx(21 * (584 + 68) / 4 + 20 * 584 / 128)
    assert doc["layer_plan"]["counts"] == {"swa": 2, "csa": 21, "hca": 20}
    assert not doc["layer_plan"]["ced"]
    assert abs(doc["params_active_decode"] - 13e9) < 0.5e9  # model card: 13 B activated


def test_text_output():
    proc = run_inspect(CONFIGS / "deepseek_v41_flash")
    assert proc.returncode == 0, proc.stderr
    assert "890.00 B/token" in proc.stdout
    assert "2 swa  4 full  4 reindex  30 reuse" in proc.stdout


def test_memory_plan_flags():
    doc = inspect_json(CONFIGS / "deepseek_v41_flash", "--gpus", "1", "--gpu-mem-gib", "80")
    scenarios = {s["name"]: s for s in doc["memory_plan"]["scenarios"]}
    assert doc["memory_plan"]["gpus"] == 1
    assert not scenarios["all-in-hbm"]["fits"]  # ~507 GB of text weights
    assert scenarios["experts-and-engram-in-host"]["fits"]
    assert scenarios["experts-and-engram-in-host"]["host_weight_bytes"] == (
        doc["by_group"]["routed_experts"]["bytes"] + doc["by_group"]["engram_tables"]["bytes"])


def write_bad_config(tmp_path, mutate):
    config = json.loads((CONFIGS / "deepseek_v41_flash" / "config.json").read_text())
    mutate(config["text_config"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


BAD_CONFIGS = [
    ("wrong type", lambda t: t.update(hidden_size="5120"),
     "text_config.hidden_size: expected an integer, got string \"5120\""),
    ("missing field", lambda t: t.pop("n_routed_experts"), "text_config.n_routed_experts: required field is missing"),
    ("out of range", lambda t: t.update(num_hidden_layers=0), "text_config.num_hidden_layers: must be >= 1, got 0"),
    ("orphaned compressed layer", lambda t: t.update(kv_source_layer_ids=[8, 14, 20]),
     "kv_source_layer_ids: layer 2 has compress ratio 2 but no KV source at or before it"),
    ("engram count", lambda t: t.update(engram_num_embeddings=[1]),
     "engram_num_embeddings: has 1 entries for 2 Engram layers"),
]


@pytest.mark.parametrize("what,mutate,message", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_config_errors_name_file_and_field(tmp_path, what, mutate, message):
    directory = write_bad_config(tmp_path, mutate)
    proc = run_inspect(directory, "--json")
    assert proc.returncode == 1, (what, proc.stdout[:500])
    assert f"{directory / 'config.json'}: " in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_usage_errors(tmp_path):
    assert run_inspect(CONFIGS / "deepseek_v41_flash", "--gpus", "0").returncode == 1
    proc = subprocess.run([BINARY, "inspect", "a", "b"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unexpected argument 'b'" in proc.stderr
    assert run_inspect(CONFIGS / "deepseek_v41_flash", "--bogus").returncode == 2
    proc = run_inspect(tmp_path)  # a directory without config.json
    assert proc.returncode == 1 and "cannot open config file" in proc.stderr


# ---- full checkpoints written by the independent Python writer ------------------------------------

@pytest.fixture(scope="module")
def tiny_v41(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_v41")
    subprocess.run([sys.executable, str(ROOT / "tools" / "tiny_checkpoint.py"), str(out), "--arch", "deepseek_v41",
                    "--seed", "5", "--overwrite"], check=True, capture_output=True, text=True)
    return out


def test_full_checkpoint_reports_disk_bytes_and_passes(tiny_v41):
    doc = inspect_json(tiny_v41)
    index = json.loads((tiny_v41 / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    ck = doc["checkpoint"]
    assert ck["present"] and ck["shards"] == len(shards)
    assert ck["tensors"] == len(index["weight_map"])
    assert ck["tensor_bytes"] == index["metadata"]["total_size"]
    assert ck["file_bytes"] == sum((tiny_v41 / s).stat().st_size for s in shards)
    inv = doc["inventory"]
    assert inv["ok"] and inv["matched_tensors"] == len(index["weight_map"]) == inv["expected_tensors"]
    assert doc["bytes_total"] == index["metadata"]["total_size"]


def edit_header(path: pathlib.Path, edit):
    """Rewrites a safetensors file's JSON header in place (data untouched, offsets stay valid)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def test_damaged_checkpoint_reports_every_problem(tiny_v41, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_v41, damaged)
    index_path = damaged / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = index["weight_map"]["layers.3.attn.wq_a.weight"]
    for name in ("layers.0.ffn.gate.bias", "layers.0.attn_norm.weight"):
        assert index["weight_map"][name] == shard, "test assumes one shard holds all damaged tensors"

    def damage(header):
        # renamed: one missing + one unexpected (and one wq_a short of the contract)
        header["layers.3.attn.wq.weight"] = header.pop("layers.3.attn.wq_a.weight")
        header["layers.0.ffn.gate.bias"]["dtype"] = "I32"  # same size as F32: a pure dtype mismatch
        header["layers.0.attn_norm.weight"]["shape"] = [32, 2]  # same numel: a pure shape mismatch

    edit_header(damaged / shard, damage)
    index["weight_map"]["layers.3.attn.wq.weight"] = index["weight_map"].pop("layers.3.attn.wq_a.weight")
    index_path.write_text(json.dumps(index))

    proc = run_inspect(damaged, "--json")
    assert proc.returncode == 1, proc.stderr
    inv = json.loads(proc.stdout)["inventory"]
    assert not inv["ok"]
    assert inv["missing"] == ["layers.3.attn.wq_a.weight"] and inv["missing_count"] == 1
    assert inv["unexpected"] == ["layers.3.attn.wq.weight"]
    assert inv["dtype_mismatches"] == [{"name": "layers.0.ffn.gate.bias", "expected": "F32", "found": "I32"}]
    assert inv["shape_mismatches"] == [{"name": "layers.0.attn_norm.weight", "expected": "[64]", "found": "[32, 2]"}]
    assert inv["count_contract_violations"] == [{"pattern": "layers.*.attn.wq_a.weight", "expected": 12, "found": 11}]
    for group in ("missing (1):", "unexpected (1):", "dtype mismatches (1):", "shape mismatches (1):",
                  "tensor-count contract violations (1):"):
        assert group in proc.stderr, proc.stderr
