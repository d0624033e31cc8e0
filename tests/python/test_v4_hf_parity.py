"""Parity of cedar's DeepSeek-V4 CPU forward with Hugging Face transformers' `DeepseekV4ForCausalLM`.

For several tiny V4 checkpoints written by `cedar make-tiny --arch deepseek_v4` (seeds, BF16 and FP8/MXFP4
weights, window / top-k variants; odd prompt lengths that cross CSA windows of 4 and, in one config, the
HCA window of 128; layers 0-2 hash-routed) this test loads the very same files into HF's model (names
mapped and FP8 / MXFP4 weights dequantized here, with numpy), runs the same token ids, and compares the
logits of every position and the residual streams after every layer (`--dump-tensors 'layers.N.out'`
against HF's per-layer hidden states).

Where HF differs from the official V4 reference (which cedar follows; spec §5, §6), the comparison
accounts for it instead of hiding it:
  * HF runs here in fp32 with the dequantized weights, i.e. the exact math without any of the reference's
    roundings. cedar stores bf16 activations (the reference's `default_dtype`), so every config carries
    bf16 rounding noise.
  * The reference fake-quantizes the cached KV (FP8 blocks of 64 on the nope channels of the SWA and
    compressed KV) and the indexer's q / k (Hadamard rotation + FP4 blocks of 32); HF quantizes nothing.
    The Hadamard rotation itself is orthogonal, so without quantization it would not change any score.
  * The reference's indexer scores are bf16 tensors (HF: fp32), and its top-k picks among near-ties can
    differ from HF's: a different compressed entry in the top-k changes a row noticeably. The tiny configs
    have few compressed entries, so this is visible in the per-row minimum and is part of the tolerance.
  * FP8/MXFP4 configs: the reference quantizes every GEMM input to FP8 (blocks of 128; a whole row when
    the row is narrower, cedar's tiny models); HF multiplies the dequantized weights with fp32 inputs.
    These configs get the looser "quantized" tolerance below.
  * Smaller order-of-operation differences (HF normalizes the mHC input before the projection, applies
    the routing weight after the expert's down projection, computes the q norm in fp32) are rounding-level.
Thresholds: logits cosine >= 0.999 and top-1 agreement >= 99% (issue 3) for every config; the bf16
configs additionally need a small relative L2 error. Achieved values are printed (pytest -s).
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest

from cedar_cli import cedar_binary
from safetensors_dir_reader import read_checkpoint, unpack_e2m1

try:
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
except Exception as exc:  # pragma: no cover - exercised only where the parity extras are missing
    pytest.skip(f"torch/transformers unavailable ({exc!r}); install requirements-parity.txt", allow_module_level=True)


# name, seed, bf16 weights, prompt length, config.json overrides that keep every tensor shape
CONFIGS = [
    ("bf16-seed1", 1, True, 23, {}),
    ("bf16-seed2-window16-top2", 2, True, 37, {"sliding_window": 16, "index_topk": 2}),
    ("bf16-seed4-hca131", 4, True, 131, {}),
    ("fp8-seed0", 0, False, 29, {}),
    ("fp8-seed5-window5-top3", 5, False, 19, {"sliding_window": 5, "index_topk": 3}),
]

LOGITS_COSINE_MIN = 0.999
TOP1_MIN = 0.99
REL_L2_MAX = {"bf16": 0.03, "quantized": 0.06}


def prompt(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(1000 + seed)
    return [int(v) for v in rng.integers(3, 128000, size=n)]


# ---- checkpoint → HF state dict --------------------------------------------------------------------

def dequantize(tensors, name: str, block: tuple[int, int]) -> np.ndarray:
    """Exact fp32 values of `name`: BF16/F32 as stored; FP8 e4m3 × 2^(e8m0 − 127) per weight block;
    MXFP4 (I8, two E2M1 codes per byte, low nibble first) × one e8m0 scale per 32 inputs."""
    t = tensors[name]
    if t.dtype in ("BF16", "F32"):
        return t.decode().astype(np.float32)
    scale = tensors[name[: -len(".weight")] + ".scale"].decode()
    if t.dtype == "F8_E4M3":
        w = t.decode()
        s = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[: w.shape[0], : w.shape[1]]
        return (w * s).astype(np.float32)
    if t.dtype == "I8":
        w = unpack_e2m1(t)
        return (w * np.repeat(scale, 32, axis=1)).astype(np.float32)
    raise AssertionError(f"{name}: unexpected dtype {t.dtype}")


def hf_name(name: str) -> str:
    """Released V4 tensor name → HF parameter name (the renames of transformers' deepseek_v4 conversion
    mapping, written out for the tensors a backbone has)."""
    if name == "embed.weight":
        return "model.embed_tokens.weight"
    if name == "head.weight":
        return "lm_head.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    if name.startswith("hc_head_"):
        return "model.hc_head.hc_" + name[len("hc_head_"):]
    layer, rest = name.split(".", 2)[1], name.split(".", 2)[2]
    local = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn.attn_sink": "self_attn.sinks",
        "attn.wq_a.weight": "self_attn.q_a_proj.weight",
        "attn.q_norm.weight": "self_attn.q_a_norm.weight",
        "attn.wq_b.weight": "self_attn.q_b_proj.weight",
        "attn.wkv.weight": "self_attn.kv_proj.weight",
        "attn.kv_norm.weight": "self_attn.kv_norm.weight",
        "attn.wo_a.weight": "self_attn.o_a_proj.weight",
        "attn.wo_b.weight": "self_attn.o_b_proj.weight",
        "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
        "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
        "attn.compressor.ape": "self_attn.compressor.position_bias",
        "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
        "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
        "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
        "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
        "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
        "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
        "ffn.gate.weight": "mlp.gate.weight",
        "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
        "ffn.gate.tid2eid": "mlp.gate.tid2eid",
        "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
        "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
        "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    }
    for site in ("attn", "ffn"):
        for part in ("fn", "base", "scale"):
            local[f"hc_{site}_{part}"] = f"{site}_hc.{part}"
    return f"model.layers.{layer}.{local[rest]}"


def hf_state_dict(ckpt: pathlib.Path, cfg: dict) -> dict[str, torch.Tensor]:
    _, tensors = read_checkpoint(ckpt)
    q = cfg.get("quantization_config") or {}
    block = tuple(q.get("weight_block_size", (128, 128)))
    sd: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, int, str], np.ndarray] = {}
    for name, t in tensors.items():
        if name.startswith("mtp.") or name.endswith(".scale"):
            continue  # HF does not instantiate the NextN block; scales are folded in by dequantize()
        if ".ffn.experts." in name:
            parts = name.split(".")  # layers.L.ffn.experts.E.wK.weight
            experts[(int(parts[1]), int(parts[4]), parts[5])] = dequantize(tensors, name, block)
            continue
        if t.dtype == "I64":
            sd[hf_name(name)] = torch.from_numpy(t.decode().copy())
        else:
            sd[hf_name(name)] = torch.from_numpy(dequantize(tensors, name, block))
    n_experts = cfg["n_routed_experts"]
    for layer in range(cfg["num_hidden_layers"]):
        gate_up = [np.concatenate([experts[(layer, e, "w1")], experts[(layer, e, "w3")]], axis=0) for e in range(n_experts)]
        sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.from_numpy(np.stack(gate_up))
        sd[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.from_numpy(
            np.stack([experts[(layer, e, "w2")] for e in range(n_experts)]))
    return sd


def hf_model(ckpt: pathlib.Path) -> tuple[DeepseekV4ForCausalLM, dict]:
    cfg = json.loads((ckpt / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    rs = cfg["rope_scaling"]
    config = DeepseekV4Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], moe_intermediate_size=cfg["moe_intermediate_size"],
        num_hidden_layers=n, num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=1,
        head_dim=cfg["head_dim"], q_lora_rank=cfg["q_lora_rank"], num_experts_per_tok=cfg["num_experts_per_tok"],
        n_routed_experts=cfg["n_routed_experts"], n_shared_experts=cfg["n_shared_experts"],
        scoring_func=cfg["scoring_func"], norm_topk_prob=cfg["norm_topk_prob"],
        routed_scaling_factor=cfg["routed_scaling_factor"], max_position_embeddings=cfg["max_position_embeddings"],
        rope_theta=cfg["rope_theta"], compress_rope_theta=cfg["compress_rope_theta"],
        compress_ratios=cfg["compress_ratios"][:n], num_hash_layers=cfg["num_hash_layers"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], hc_mult=cfg["hc_mult"], hc_sinkhorn_iters=cfg["hc_sinkhorn_iters"],
        hc_eps=cfg["hc_eps"], swiglu_limit=cfg["swiglu_limit"], sliding_window=cfg["sliding_window"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], index_n_heads=cfg["index_n_heads"],
        index_head_dim=cfg["index_head_dim"], index_topk=cfg["index_topk"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_parameters={"rope_type": "yarn", "factor": rs["factor"], "beta_fast": rs["beta_fast"],
                         "beta_slow": rs["beta_slow"],
                         "original_max_position_embeddings": rs["original_max_position_embeddings"]},
        pad_token_id=cfg.get("pad_token_id"), bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"],
        tie_word_embeddings=False, attn_implementation="eager")
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config)
    model = model.to_empty(device="cpu").float()
    missing, unexpected = model.load_state_dict(hf_state_dict(ckpt, cfg), strict=False, assign=True)
    # Non-persistent buffers (rotary inverse frequencies) are rebuilt by the modules, not loaded.
    assert not unexpected, unexpected
    assert not [k for k in missing if "inv_freq" not in k], missing
    for module in model.modules():
        if hasattr(module, "layer_types") and hasattr(module, "rope_type"):  # rotary embeddings
            for lt in module.layer_types:
                fn = module.compute_default_rope_parameters
                if module.rope_type[lt] != "default":
                    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
                    fn = ROPE_INIT_FUNCTIONS[module.rope_type[lt]]
                inv_freq, scaling = fn(module.config, None, layer_type=lt)
                setattr(module, f"{lt}_inv_freq", inv_freq.float())
                setattr(module, f"{lt}_original_inv_freq", inv_freq.float())
                setattr(module, f"{lt}_attention_scaling", scaling)
    model.eval()
    return model, cfg


# ---- metrics ----------------------------------------------------------------------------------------

def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm((a - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("v4_parity")


@pytest.mark.parametrize("name,seed,bf16,length,overrides", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_v4_forward_matches_hf(work, name, seed, bf16, length, overrides):
    ckpt = work / name
    cmd = [cedar_binary(), "make-tiny", "--arch", "deepseek_v4", "--seed", str(seed), str(ckpt)]
    if bf16:
        cmd.insert(-1, "--bf16")
    subprocess.run(cmd, check=True, capture_output=True)
    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(overrides)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    assert cfg["num_hash_layers"] >= 1 and 4 in cfg["compress_ratios"]

    ids = prompt(length, seed)
    logits_path, dump = work / f"{name}.npy", work / f"{name}-dump"
    proc = subprocess.run([cedar_binary(), "forward", str(ckpt), "--ids", ",".join(map(str, ids)),
                           "--positions", "all", "--threads", "2", "--logits-out", str(logits_path),
                           "--dump-tensors", r"^layers\.\d+\.out$", str(dump)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cedar_logits = np.load(logits_path)

    model, cfg = hf_model(ckpt)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    hf_logits = out.logits[0].float().numpy()
    assert cedar_logits.shape == hf_logits.shape == (length, cfg["vocab_size"])

    # Per-layer residual streams: HF records each decoder layer's output [B, S, hc, d] (preceded by the
    # expanded embedding when it records the first layer's input too).
    n_layers, hc, d = cfg["num_hidden_layers"], cfg["hc_mult"], cfg["hidden_size"]
    hidden = [h[0].float().numpy().reshape(length, hc * d) for h in out.hidden_states if h.dim() == 4]
    layer_outputs = hidden[-n_layers:]
    assert len(layer_outputs) == n_layers
    kind = "bf16" if bf16 else "quantized"
    print(f"\n[{name}] {kind}, {length} tokens")
    for layer in range(n_layers):
        ours = np.load(dump / f"layers.{layer}.out.npy")
        ref = layer_outputs[layer]
        print(f"  layer {layer}: cosine {cosine(ours, ref):.6f}  rel-L2 {rel_l2(ours, ref):.4f}  "
              f"min row cosine {row_cosines(ours, ref).min():.5f}")
        assert cosine(ours, ref) >= 0.995, f"layer {layer} streams diverge"

    cos = cosine(cedar_logits, hf_logits)
    err = rel_l2(cedar_logits, hf_logits)
    top1 = float((cedar_logits.argmax(1) == hf_logits.argmax(1)).mean())
    min_row = float(row_cosines(cedar_logits, hf_logits).min())
    print(f"  logits: cosine {cos:.6f}  rel-L2 {err:.4f}  top-1 {top1 * 100:.1f}%  min row cosine {min_row:.5f}")
    assert cos >= LOGITS_COSINE_MIN
    assert top1 >= TOP1_MIN
    assert err <= REL_L2_MAX[kind]
