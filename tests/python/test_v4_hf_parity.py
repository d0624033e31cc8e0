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
    compressed KV), the indexer's q / k (Hadamard rotation + FP4 blocks of 32) and, with FP8/MXFP4 weights,
    every GEMM input (FP8 blocks of 128; a whole row when the row is narrower, as in the tiny models). HF
    quantizes nothing, so the test puts these quantization points into HF with hooks
    (emulate_reference_quantization); HF still multiplies with fp32 inputs. FP8 activation quantization is
    discontinuous, so the quantized configs keep a larger residual difference and a looser tolerance.
  * The reference's indexer scores are bf16 tensors (HF: fp32); see the discrete decisions below.
  * Smaller order-of-operation differences (HF normalizes the mHC input before the projection, applies
    the routing weight after the expert's down projection, computes the q norm in fp32) are rounding-level.
  * Discrete decisions: the MoE router's top-k (layers past num_hash_layers) and the indexer's top-k pick
    among near-ties differently under these roundings (the tiny random routers often have gaps of ~1e-2
    between the 2nd and 3rd expert), and one flipped expert changes that token's output completely. So HF
    runs twice: free (its own decisions; reported, loose bound, and the number of flipped decisions is
    printed) and pinned (its router / indexer take cedar's selections: the router's from cedar's dumped
    `ffn_in` by the same formula in numpy, the indexer's from cedar's `topk` dump; every value is
    still computed by HF). The pinned run isolates the numerics.
Thresholds on the pinned run: logits cosine >= 0.999 and top-1 agreement >= 99% (issue 3; top-1 counted
tie-robustly, see tie_robust_top1) on the BF16-weight configs, looser ones on the quantized configs (see
LIMITS), relative L2 bounds and per-layer stream cosines. Achieved values are printed (pytest -s).
"""
from __future__ import annotations

import json
import pathlib
import struct
import subprocess
import types

import numpy as np
import pytest

from cedar_cli import cedar_binary
from safetensors_dir_reader import read_checkpoint, unpack_e2m1

try:
    import torch
    import torch.nn.functional as F
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4
except Exception as exc:  # pragma: no cover - exercised only where the parity extras are missing
    pytest.skip(f"torch/transformers unavailable ({exc!r}); install requirements-parity.txt", allow_module_level=True)


# name, seed, bf16 weights, prompt length, config.json overrides that keep every tensor shape, factor on the
# compressors' learned position bias `ape` and the final `hc_head_fn` / `hc_head_base` (make-tiny draws them
# ≈ N(0, 0.01²) / N(0, 0.02²): too small for a wrong use of them to show)
CONFIGS = [
    ("bf16-seed1", 1, True, 23, {}, 1.0),
    ("bf16-seed2-window16-top2-scaled", 2, True, 37, {"sliding_window": 16, "index_topk": 2}, 100.0),
    ("bf16-seed4-hca131-scaled", 4, True, 131, {}, 100.0),
    ("fp8-seed0", 0, False, 29, {}, 1.0),
    ("fp8-seed5-window5-top3-scaled", 5, False, 19, {"sliding_window": 5, "index_topk": 3}, 100.0),
]

# Issue 3's thresholds (logits cosine >= 0.999, top-1 >= 99%) hold for the BF16-weight configs. The FP8 /
# MXFP4 configs quantize every GEMM input to FP8: a discontinuous function, so the bf16-vs-fp32 input
# differences flip e4m3 codes and the tiny random model amplifies them. Measured on fp8-seed0 with the
# quantization emulated in HF: HF's own bf16 run reaches only cosine 0.980 against HF fp32 (routing free),
# and the quantization itself moves HF's logits to cosine 0.987; cedar (decisions pinned) reaches 0.994.
# Those configs get the looser tolerance below; the printed values are the achieved ones.
TOP1_MIN = 0.99
LIMITS = {
    "bf16": {"logits_cosine": 0.999, "logits_rel_l2": 0.05, "stream_cosine": 0.999, "stream_min_row": 0.995},
    "quantized": {"logits_cosine": 0.99, "logits_rel_l2": 0.15, "stream_cosine": 0.99, "stream_min_row": 0.98},
}


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


def tie_robust_top1(ours: np.ndarray, ref: np.ndarray) -> float:
    """Share of rows whose top-1 token agrees with the reference's, counting a row as agreeing when the
    reference's logit of our top-1 token is within 3 × that row's RMS logit difference of the reference's
    maximum (a near-tie; spec §6 item 4). The tiny random models have top-1/top-2 gaps far below bf16
    noise: HF's own bf16 mode agrees with HF fp32 on only ~83% of rows strictly (23-token seed-1 config)."""
    rows = np.arange(ours.shape[0])
    tol = 3.0 * np.sqrt(((ours.astype(np.float64) - ref) ** 2).mean(1))
    return float((ref[rows, ours.argmax(1)] >= ref.max(1) - tol).mean())


def cedar_routing(ckpt: pathlib.Path, dump: pathlib.Path, cfg: dict) -> dict[int, np.ndarray]:
    """The experts cedar's router selects on every non-hash layer, recomputed from cedar's `ffn_in` by the
    reference formula (fp64 here; cedar fp32): top-k of sqrt(softplus(x·Wᵀ)) + bias, lower id on ties."""
    _, tensors = read_checkpoint(ckpt)
    out = {}
    for layer in range(cfg["num_hash_layers"], cfg["num_hidden_layers"]):
        x = np.load(dump / f"layers.{layer}.ffn_in.npy").astype(np.float64)
        w = tensors[f"layers.{layer}.ffn.gate.weight"].decode().astype(np.float64)
        scores = np.sqrt(np.logaddexp(0.0, x @ w.T)) + tensors[f"layers.{layer}.ffn.gate.bias"].decode()
        out[layer] = np.argsort(-scores, axis=1, kind="stable")[:, : cfg["num_experts_per_tok"]]
    return out


def pin_decisions(model, routing: dict[int, np.ndarray], index_topk: dict[int, np.ndarray]):
    """Makes HF's routers and indexers use cedar's selections (HF still computes every value)."""
    def pinned_router(pinned):
        def forward(self, hidden_states):
            logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
            scores = self.score_fn(logits)
            indices = torch.from_numpy(pinned).long()
            weights = scores.gather(1, indices)
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            return logits, weights * self.routed_scaling_factor, indices
        return forward

    def pinned_indexer(original, pinned):
        def forward(*args, **kwargs):
            k = original(*args, **kwargs).shape[-1]  # HF's own pass (k = min(index_topk, entries))
            return torch.from_numpy(pinned[:, :k]).long().unsqueeze(0)  # cedar's ids, −1 = none
        return forward

    for layer, block in enumerate(model.model.layers):
        if layer in routing and isinstance(block.mlp.gate, hf_v4.DeepseekV4TopKRouter):
            block.mlp.gate.forward = types.MethodType(pinned_router(routing[layer]), block.mlp.gate)
        compressor = block.self_attn.compressor
        if isinstance(compressor, hf_v4.DeepseekV4CSACompressor):
            compressor.indexer.forward = pinned_indexer(compressor.indexer.forward, index_topk[layer])


# ---- the reference's quantization points, emulated on HF's modules ---------------------------------

def _pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(v)) exactly, for v > 0 (frexp: v = m·2^e with m in [0.5, 1))."""
    m, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), torch.where(m == 0.5, e - 1, e))


def fp8_qdq(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP8 e4m3 QDQ of the last dim in blocks (a shorter row is one block), UE8M0 scale from amax ≥ 1e-4."""
    block = min(block, x.shape[-1])
    xb = x.float().unflatten(-1, (-1, block))
    s = _pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp_min(1e-4) * (1.0 / 448.0))
    q = (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return (q * s).flatten(-2).to(x.dtype)


E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """FP4 e2m1 QDQ in blocks of 32, UE8M0 scale from amax ≥ 6·2^-126; round to nearest, ties to the even
    code (ties at 0.25, 1.25, 2.5, 5 round down, at 0.75, 1.75, 3.5 up)."""
    xb = x.float().unflatten(-1, (-1, 32))
    s = _pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -126) * (1.0 / 6.0))
    a = (xb / s).clamp(-6.0, 6.0)
    m = a.abs()
    idx = sum((m > b).long() for b in (0.25, 1.25, 2.5, 5.0)) + sum((m >= b).long() for b in (0.75, 1.75, 3.5))
    return (torch.sign(a) * E2M1_GRID[idx] * s).flatten(-2).to(x.dtype)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return x @ (h / n ** 0.5).T.to(x.dtype)


def emulate_reference_quantization(model, cfg: dict, quantized: bool):
    """Forward hooks that put the official reference's fake quantization into HF's modules (HF has none):
      * SWA KV and the main compressors' entries: FP8 QDQ (blocks of 64) of the nope channels. RoPE only
        touches the trailing rope channels, so quantizing the nope channels at the kv_norm output (before
        HF's RoPE) is the same as after it (the reference's order);
      * the indexer's q and k (as its scorer receives them, after RoPE): Hadamard rotation, FP4 QDQ;
      * FP8 / MXFP4 weights (quantized configs): the FP8 activation QDQ (blocks of 128) of every input of a
        linear whose weight is quantized, incl. the experts' inputs and the SwiGLU output before the down
        projection (HF applies the routing weight after it, the reference before: rounding-level)."""
    rd = cfg["qk_rope_head_dim"]

    def nope_fp8(module, args, out):
        return torch.cat([fp8_qdq(out[..., :-rd], 64), out[..., -rd:]], dim=-1)

    def indexer_inputs(module, args):
        q, k, hidden = args
        return fp4_qdq(hadamard(q)), fp4_qdq(hadamard(k)), hidden

    def act_fp8(module, args):
        return (fp8_qdq(args[0], 128),) + tuple(args[1:])

    for block in model.model.layers:
        attn = block.self_attn
        attn.kv_norm.register_forward_hook(nope_fp8)
        if attn.compressor is not None:
            attn.compressor.kv_norm.register_forward_hook(nope_fp8)
            if isinstance(attn.compressor, hf_v4.DeepseekV4CSACompressor):
                attn.compressor.indexer.scorer.register_forward_pre_hook(indexer_inputs)
                if quantized:
                    attn.compressor.indexer.q_b_proj.register_forward_pre_hook(act_fp8)
        if quantized:
            for lin in (attn.q_a_proj, attn.q_b_proj, attn.kv_proj, attn.o_b_proj, block.mlp.shared_experts.gate_proj,
                        block.mlp.shared_experts.up_proj, block.mlp.shared_experts.down_proj):
                lin.register_forward_pre_hook(act_fp8)
            experts = block.mlp.experts
            experts.register_forward_pre_hook(act_fp8)
            gate = experts._apply_gate
            experts._apply_gate = lambda gate_up, _gate=gate: fp8_qdq(_gate(gate_up), 128)


def run_hf(model, ids: list[int]):
    """Logits [S, vocab] and the residual streams after each layer but the last ([S, hc·d]; HF's
    hidden_states are the expanded embedding, the outputs of layers 0..L−2, and the final normed state)."""
    record = {}
    hooks = [block.mlp.gate.register_forward_hook(
        lambda mod, args, out, layer=layer: record.__setitem__(layer, out[2].numpy().copy()))
        for layer, block in enumerate(model.model.layers)]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    for h in hooks:
        h.remove()
    streams = [h[0].float().numpy().reshape(len(ids), -1) for h in out.hidden_states[1:-1]]
    return out.logits[0].float().numpy(), streams, out.hidden_states[-1][0].float().numpy(), record


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("v4_parity")


def scale_ape(ckpt: pathlib.Path, factor: float):
    """Multiplies every F32 `*.ape` tensor by `factor` and `hc_head_fn` / `hc_head_base` by factor / 2, in
    place (same bytes, same header)."""
    for shard in sorted(ckpt.glob("*.safetensors")):
        data = bytearray(shard.read_bytes())
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for name, h in header.items():
            scale = factor if name.endswith(".ape") else factor / 2 if name in ("hc_head_fn", "hc_head_base") else None
            if scale is not None:
                assert h["dtype"] == "F32", name
                begin, end = (8 + n + o for o in h["data_offsets"])
                values = np.frombuffer(bytes(data[begin:end]), "<f4") * np.float32(scale)
                data[begin:end] = values.astype("<f4").tobytes()
        shard.write_bytes(bytes(data))


@pytest.mark.parametrize("name,seed,bf16,length,overrides,ape_factor", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_v4_forward_matches_hf(work, name, seed, bf16, length, overrides, ape_factor):
    ckpt = work / name
    cmd = [cedar_binary(), "make-tiny", "--arch", "deepseek_v4", "--seed", str(seed), str(ckpt)]
    if bf16:
        cmd.insert(-1, "--bf16")
    subprocess.run(cmd, check=True, capture_output=True)
    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(overrides)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    if ape_factor != 1.0:
        scale_ape(ckpt, ape_factor)
    assert cfg["num_hash_layers"] >= 1 and 4 in cfg["compress_ratios"]

    ids = prompt(length, seed)
    logits_path, dump = work / f"{name}.npy", work / f"{name}-dump"
    proc = subprocess.run([cedar_binary(), "forward", str(ckpt), "--ids", ",".join(map(str, ids)),
                           "--positions", "all", "--threads", "2", "--logits-out", str(logits_path),
                           "--dump-tensors", r"^(layers\.\d+\.(out|ffn_in|topk)|final_norm)$", str(dump)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cedar_logits = np.load(logits_path)

    model, cfg = hf_model(ckpt)
    emulate_reference_quantization(model, cfg, quantized=not bf16)
    n_layers = cfg["num_hidden_layers"]
    free_logits, _, _, free_experts = run_hf(model, ids)
    routing = cedar_routing(ckpt, dump, cfg)
    index_topk = {layer: np.load(dump / f"layers.{layer}.topk.npy").astype(np.int64)
                  for layer in range(n_layers) if cfg["compress_ratios"][layer] == 4}
    flips = sum(int((np.sort(free_experts[layer], 1) != np.sort(routing[layer], 1)).any(1).sum()) for layer in routing)
    pin_decisions(model, routing, index_topk)
    hf_logits, streams, hf_final, _ = run_hf(model, ids)
    assert cedar_logits.shape == hf_logits.shape == (length, cfg["vocab_size"])

    kind = "bf16" if bf16 else "quantized"
    print(f"\n[{name}] {kind} weights, {length} tokens")
    for layer in range(n_layers - 1):
        ours = np.load(dump / f"layers.{layer}.out.npy")
        c, e, m = cosine(ours, streams[layer]), rel_l2(ours, streams[layer]), row_cosines(ours, streams[layer]).min()
        print(f"  layer {layer} streams: cosine {c:.6f}  rel-L2 {e:.4f}  min row cosine {m:.5f}")
        assert c >= LIMITS[kind]["stream_cosine"] and m >= LIMITS[kind]["stream_min_row"], f"layer {layer} diverges"
    ours = np.load(dump / "final_norm.npy")
    print(f"  final norm: cosine {cosine(ours, hf_final):.6f}  rel-L2 {rel_l2(ours, hf_final):.4f}")

    def report(label, ref):
        cos, err = cosine(cedar_logits, ref), rel_l2(cedar_logits, ref)
        strict = float((cedar_logits.argmax(1) == ref.argmax(1)).mean())
        top1 = tie_robust_top1(cedar_logits, ref)
        print(f"  logits ({label}): cosine {cos:.6f}  rel-L2 {err:.4f}  top-1 {top1 * 100:.1f}% "
              f"(strict {strict * 100:.1f}%)  min row cosine {row_cosines(cedar_logits, ref).min():.5f}")
        return cos, err, top1

    free_cos, _, _ = report(f"HF free, {flips} token-layer routing flips", free_logits)
    cos, err, top1 = report("HF pinned to cedar's decisions", hf_logits)
    limits = LIMITS[kind]
    assert free_cos >= 0.95
    assert cos >= limits["logits_cosine"]
    assert top1 >= TOP1_MIN
    assert err <= limits["logits_rel_l2"]
