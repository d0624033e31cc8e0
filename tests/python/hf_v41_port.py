"""Runs a released-format DeepSeek-V4.1 checkpoint through the Hugging Face port `deepseek_v41`
(huggingface/transformers src/transformers/models/deepseek_v41/, commit 0a2080b4) for parity tests.

The port is not in any transformers release on PyPI. It is imported from
  1. the installed transformers, if a future release ships `transformers.models.deepseek_v41`; else
  2. env CEDAR_HF_V41_DIR: a directory containing the `deepseek_v41` package (the upstream files with
     their relative `from ...x import` lines rewritten to `from transformers.x import`), imported on top of
     the installed transformers.
`import_hf_port()` says why when neither works; callers skip with that reason.

Loading: the port has no loader for the released format (its `from_pretrained` expects `model.`-prefixed
names, `lm_head`, and a float or FP8-quantizer weight layout), so `load_hf_model` builds the model from
`config.json` and fills it from the shards itself:
  * names: `embed/norm/layers.*` -> `model.*`, `head.weight` -> `lm_head.weight`; `mtp.*` (DSpark) is not in
    the port and is skipped;
  * block FP8 weights: e4m3 · 2^(scale − 127) per weight_block_size block; MXFP4 experts: e2m1 (low nibble =
    even element) · 2^(scale − 127) per 32 inputs; FP8 Engram rows: e4m3 · 2^(scale − 127) per 32 channels.
    All of these are exact in bf16, so the bf16 model holds exactly the checkpoint's values (the port's
    `engram.embed.scale` is then unused: it only applies to float8 tables; it is set to 1);
  * dtypes: bf16 model, except the parameters the port keeps in fp32 (`_keep_in_fp32_modules_strict`).
Decoding uses tests/python/safetensors_dir_reader.py (independent of cedar's reader).
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import sys
from dataclasses import dataclass

import numpy as np

from safetensors_dir_reader import read_checkpoint, unpack_e2m1

ENV_DIR = "CEDAR_HF_V41_DIR"
HF_COMMIT = "0a2080b43eb64e6d448186a4f3f0bc9c618f4797"


def import_hf_port():
    """(module with DeepseekV41ForCausalLM & co., description) or (None, reason it is unavailable). Decides
    from package metadata before importing torch (slow) when the port cannot be found anyway."""
    import importlib.metadata
    import importlib.util

    how = (f"the HF port exists only in huggingface/transformers@{HF_COMMIT[:8]} "
           f"(src/transformers/models/deepseek_v41). To run: copy that package to DIR/deepseek_v41 (relative "
           f"imports made absolute) and set {ENV_DIR}=DIR, e.g. {ENV_DIR}=DIR pytest -s "
           f"tests/python/test_v41_hf_parity.py (see docs/forward.md, Parity with the HF port)")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return None, ("torch/transformers are not installed (pip install -r requirements-parity.txt); "
                      "transformers on PyPI (5.24.0) has no deepseek_v41 model either: " + how)
    version = importlib.metadata.version("transformers")
    builtin = importlib.util.find_spec("transformers.models.deepseek_v41") is not None
    root = os.environ.get(ENV_DIR)
    if not builtin:
        how = f"transformers {version} (PyPI) has no deepseek_v41 model; " + how
        if not root:
            return None, how + f"; {ENV_DIR} is not set"
        if not (pathlib.Path(root) / "deepseek_v41" / "modeling_deepseek_v41.py").is_file():
            return None, how + f"; {ENV_DIR}={root} has no deepseek_v41/modeling_deepseek_v41.py"
    try:
        if builtin:
            return importlib.import_module("transformers.models.deepseek_v41.modeling_deepseek_v41"), \
                f"transformers {version} (built in)"
        if root not in sys.path:
            sys.path.insert(0, root)
        module = importlib.import_module("deepseek_v41.modeling_deepseek_v41")
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run", with the reason
        return None, how + f"; importing it failed: {type(e).__name__}: {e}"
    return module, f"deepseek_v41 from {root} on transformers {version}"


# ---- checkpoint -> HF state dict ----------------------------------------------------------------


def _dequant_block_fp8(w, scale, block):
    br, bc = block
    s = np.repeat(np.repeat(scale.decode(), br, 0), bc, 1)[: w.shape[0], : w.shape[1]]
    return w.decode() * s


def _dequant_mxfp4(w, scale):
    return unpack_e2m1(w) * np.repeat(scale.decode(), 32, axis=1)


def _dequant_rows(w, scale):
    return w.decode() * np.repeat(scale.decode(), 32, axis=1)


@dataclass
class LoadedCheckpoint:
    config: dict                 # config.json
    text: dict                   # its text_config
    values: dict                 # HF parameter name -> float64/float32 numpy array (exact values)
    quantized_linears: set       # HF module names whose checkpoint weight is FP8/MXFP4 (reference: act-quant)


def read_as_hf(directory: pathlib.Path) -> LoadedCheckpoint:
    config = json.loads((directory / "config.json").read_text())
    text = config.get("text_config", config)
    block = tuple((config.get("quantization_config") or {}).get("weight_block_size", (32, 32)))
    _, tensors = read_checkpoint(directory)
    values, quantized = {}, set()
    for name, t in tensors.items():
        if name.endswith(".scale") or name.startswith("mtp."):
            continue
        scale = tensors.get(name[: -len(".weight")] + ".scale") if name.endswith(".weight") else None
        if scale is None:
            v = t.decode()
        elif ".engram.embed." in name:
            v = _dequant_rows(t, scale)
        elif t.dtype == "I8":
            v = _dequant_mxfp4(t, scale)
        else:
            v = _dequant_block_fp8(t, scale, block)
        hf = "lm_head.weight" if name == "head.weight" else "model." + name
        if scale is not None and ".engram.embed." not in name and not name.endswith("attn.wo_a.weight"):
            # R-model: every FP8/MXFP4 linear quantizes its activations; wo_a is converted to BF16 at load
            # (spec §2.3) and runs as a plain bf16 einsum.
            quantized.add(hf[: -len(".weight")])
        values[hf] = v
    return LoadedCheckpoint(config, text, values, quantized)


def load_hf_model(port, directory: pathlib.Path):
    """DeepseekV41ForCausalLM (bf16, eager, eval) holding exactly the checkpoint's values, plus the
    LoadedCheckpoint it came from. Engram models get their hash state bound to the checkpoint's tokenizer."""
    import torch
    from transformers import PreTrainedTokenizerFast

    ck = read_as_hf(directory)
    config_module = importlib.import_module(port.__name__.rsplit(".", 1)[0] + ".configuration_deepseek_v41")
    text = dict(ck.text)
    # The released HF config.json spells the Engram pad id `engram_pad_token_id`; the port's config class
    # field is `engram_pad_id` (spec §6 item 1). Same value either way.
    if "engram_pad_token_id" in text:
        text.setdefault("engram_pad_id", text.pop("engram_pad_token_id"))
    text.pop("model_type", None)
    config = config_module.DeepseekV41TextConfig(**text)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = port.DeepseekV41ForCausalLM(config)
    # Only the parameters become bf16: the RoPE inverse-frequency buffers stay fp32 as the port computes
    # them (Module.to(bf16) would round them, e.g. 0.1 -> 0.10009766, and shift every rotation).
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to(torch.bfloat16)
    for name, b in model.named_buffers():
        b.data = buffers[name]
    keep_fp32 = set(port.DeepseekV41PreTrainedModel._keep_in_fp32_modules_strict)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(ck.values) - {n for n in params if n.endswith("engram.embed.scale")})
    unexpected = sorted(set(ck.values) - set(params))
    if missing or unexpected:
        raise ValueError(f"{directory}: checkpoint/HF name mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")
    with torch.no_grad():
        for name, p in params.items():
            dtype = torch.float32 if name.rsplit(".", 1)[-1] in keep_fp32 else torch.bfloat16
            if name.endswith("engram.embed.scale"):
                v = torch.ones(p.shape, dtype=dtype)
            else:
                v = torch.from_numpy(np.ascontiguousarray(ck.values[name], dtype=np.float32)).to(dtype)
                if dtype == torch.bfloat16 and not torch.equal(v.float(), torch.from_numpy(
                        np.ascontiguousarray(ck.values[name], dtype=np.float32))):
                    raise ValueError(f"{name}: checkpoint values are not bf16-exact")
            if tuple(v.shape) != tuple(p.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(v.shape)}, HF parameter {tuple(p.shape)}")
            p.data = v
    model.eval()
    if config.engram_layer_ids:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
        # The port's own normalization map, built once per tokenizer file (it decodes all 129 280 ids).
        key = (directory / "tokenizer.json").read_bytes()
        if key not in _TOKEN_MAPS:
            _TOKEN_MAPS[key] = port.build_compressed_token_map(tokenizer)
        saved = port.build_compressed_token_map
        port.build_compressed_token_map = lambda _tokenizer: _TOKEN_MAPS[key]
        try:
            model.model.bind_tokenizer(tokenizer)
        finally:
            port.build_compressed_token_map = saved
    return model, ck


_TOKEN_MAPS: dict = {}


def fake_quant_act_fp8(port, x):
    """R-model `act_quant` of a linear's bf16 input (spec §3.1: blocks of 32, amax clamp 1e-4, UE8M0
    scale 2^ceil(log2(amax/448)), e4m3 RNE) = the port's `_fake_quant_fp8_block` (the same recipe the port
    applies to the window KV)."""
    return port._fake_quant_fp8_block(x, block_size=32)


def enable_reference_activation_quant(port, model, module_names):
    """Makes every FP8/MXFP4 linear of the port compute like R-model's `linear()`: the bf16 input is
    FP8-quantized per token in blocks of 32, the product of the dequantized operands is accumulated in
    fp32 and stored as bf16. The port itself feeds the unquantized bf16 input (spec §6: FP8 activation
    quant). Returns the number of patched modules."""
    import torch
    import torch.nn.functional as F

    modules = dict(model.named_modules())
    for name in module_names:
        lin = modules[name]

        def forward(x, lin=lin):
            xq = fake_quant_act_fp8(port, x)
            return F.linear(xq.float(), lin.weight.float()).to(x.dtype)

        lin.forward = forward
    return len(module_names)


def new_cache(port, model):
    """A DynamicCache with the port's DeepseekV41CSACache on the KV-source layers.

    Why not `use_cache=False`: on the port's no-cache path every KV source *appends* its compressed KV and
    indexer keys to the previous source's (`shared["compress_kv"]` / `shared["index_k"]` are concatenated,
    never reset), so from the second KV source on the layers attend and index over the wrong entries. With
    a cache (the path `generate()` takes) each source publishes its own running cache.
    Why the explicit build: transformers 5.24 constructs cache layers from `config.layer_types` but passes
    `config` only to the layer types it knows, and DeepseekV41CSACache needs it."""
    from transformers import cache_utils

    kind = "shared_compressed_attention"
    saved = cache_utils.DYNAMIC_LAYER_TYPE_MAPPING.get(kind)
    cache_utils.DYNAMIC_LAYER_TYPE_MAPPING[kind] = lambda **_: port.DeepseekV41CSACache(model.config)
    try:
        return cache_utils.DynamicCache(config=model.config)
    finally:
        if saved is None:
            del cache_utils.DYNAMIC_LAYER_TYPE_MAPPING[kind]
        else:
            cache_utils.DYNAMIC_LAYER_TYPE_MAPPING[kind] = saved


def run_with_dumps(port, model, ids):
    """One no-cache forward over `ids`; returns {name: float32 [rows, width]} named like cedar's
    --dump-tensors (docs/forward.md): layers.L.{engram_out, attn_in, attn_out, ffn_in, ffn_out, out},
    final_norm, logits."""
    import torch

    got, hooks = {}, []

    def keep(name, index=None):
        def hook(_module, _inputs, output):
            t = output[index] if index is not None else output
            got[name] = t.detach().float().reshape(t.shape[1], -1).numpy()
        return hook

    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(keep(f"layers.{i}.out", 0)))
        hooks.append(layer.attn_norm.register_forward_hook(keep(f"layers.{i}.attn_in")))
        hooks.append(layer.attn.register_forward_hook(keep(f"layers.{i}.attn_out", 0)))
        hooks.append(layer.ffn_norm.register_forward_hook(keep(f"layers.{i}.ffn_in")))
        hooks.append(layer.ffn.register_forward_hook(keep(f"layers.{i}.ffn_out")))
        if layer.engram is not None:
            hooks.append(layer.engram.register_forward_hook(keep(f"layers.{i}.engram_out")))
    hooks.append(model.model.norm.register_forward_hook(keep("final_norm")))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), past_key_values=new_cache(port, model), use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    got["logits"] = out.logits[0].float().numpy()
    return got


# ---- aligning the port's rounding to the official reference -------------------------------------------
# Each function below replaces one piece of the port whose numerics differ from R-model (the official
# reference, which cedar's exact mode follows; spec §0 / §6). The math is unchanged; only where values are
# rounded (or how ties are broken) moves to the reference's choice, so cedar can be compared tightly.


def reference_rms_norm(norm, x):
    """R-model RMSNorm: y = bf16(w ⊙ (x·rsqrt(mean x² + eps))) with the product in fp32 (spec §3.1). The
    port rounds the normalized x to bf16 first and multiplies in bf16 (two roundings)."""
    import torch

    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return (norm.weight.float() * y).to(x.dtype)


def reference_rope_tables(rotary, original_forward, x, position_ids, layer_type=None):
    """R-model keeps freqs_cis in complex64: fp32 cos/sin (spec §3.1). The port casts them to the
    activation dtype (bf16)."""
    return original_forward(x.float(), position_ids, layer_type=layer_type)


def reference_sparse_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """R-kernel `sparse_attn` (spec §3.4): fp32 scores, M = max over the real keys (the sink is not in the
    max), numerators exp(s − M) rounded to bf16 for the P·V product, fp32 denominator Σ exp(s − M) +
    exp(sink − M), output bf16. The port computes the scores with a bf16 matmul, puts the sink into the max
    and rounds the normalized probabilities to bf16."""
    import torch

    s = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling
    if attention_mask is None:
        raise ValueError("reference_sparse_attention needs the port's additive (eager) mask")
    s = s + attention_mask.float()
    m = s.max(dim=-1, keepdim=True).values
    e = torch.exp(s - m)
    sink = module.attn_sink.float().reshape(1, -1, 1, 1)
    denominator = e.sum(-1, keepdim=True) + torch.exp(sink - m)
    out = torch.matmul(e.to(torch.bfloat16).float(), value.float()) / denominator
    return out.to(value.dtype).transpose(1, 2).contiguous(), e


def force_indexer_selection(port, model):
    """Lets a test fix an index source's top-k (indexer.cedar_forced_topk = [S, k] compressed-entry ids, −1 =
    empty): the port's indexer still runs (it appends the indexer keys and publishes the candidate pool),
    then the published per-query selection is replaced. The port's own scores stay fp32 (R-model: bf16,
    spec §6 item 4); check_selection() below tolerates that difference."""
    import torch

    def forward(args, ix):
        result = type(ix).forward(ix, *args)
        forced = getattr(ix, "cedar_forced_topk", None)
        shared = args[-1]
        if forced is not None and "topk_bias" in shared:
            bias = shared["topk_bias"]
            n_entries = bias.shape[-1]
            ids = torch.as_tensor(forced, dtype=torch.long)
            full = torch.full((*bias.shape[:-1], n_entries + 1), float("-inf"), dtype=bias.dtype)
            ids = torch.where(ids >= 0, ids, torch.full_like(ids, n_entries))
            full[0, 0].scatter_(-1, ids, 0.0)
            shared["topk_bias"] = full[..., :n_entries]
        return result

    for module in model.modules():
        if isinstance(module, port.DeepseekV41Indexer):
            module.forward = lambda *args, ix=module: forward(args, ix)


def index_scores(port, layer, x, cache, kv_source, position_ids):
    """Spec §3.6 index scores I[p, t] = Σ_h w_h·ReLU(qi_h·k_t) in fp32 for one layer on its attention input
    x [1, S, d], against the indexer keys that the KV source `kv_source` holds in `cache` (after the layer
    ran); entries not yet visible are −inf. Built from the port's modules (projections, RoPE, FP4 QDQ)."""
    import torch

    attn, ix = layer.attn, layer.attn.indexer
    with torch.no_grad():
        qr = attn.q_norm(attn.wq_a(x))
        n = x.shape[1]
        q = ix.wq_b(qr).view(1, n, ix.num_heads, ix.head_dim)
        cos, sin = ix.rotary_emb(x, position_ids=position_ids, layer_type="compress")
        q = port._fake_quant_fp4_block(port.apply_rotary_pos_emb(q, cos, sin), block_size=32)[0].float()
        keys = cache.layers[kv_source].compressed_kv["indexer"][0, 0].float()
        w = ix.weights_proj(x)[0].float() * (ix.num_heads ** -0.5 * ix.head_dim ** -0.5)
        scores = torch.einsum("shd,td->sht", q, keys).relu()
        total = (scores * w.unsqueeze(-1)).sum(1).numpy().astype(np.float64)
    visible = (np.arange(n)[:, None] + 1) // ix.compress_ratio
    total[np.arange(total.shape[1])[None, :] >= visible] = -np.inf
    return total


def candidate_pool(scores, block_size, topk_blocks):
    """Spec §3.6 level 1 per query: block score = max over its entries, the block of the newest visible
    entry pinned, the top blocks with a finite score kept (ties: lower block). Returns a bool mask."""
    pool = np.zeros(scores.shape, dtype=bool)
    for p, row in enumerate(scores):
        visible = int(np.isfinite(row).sum())
        if visible == 0:
            continue
        n_blocks = -(-visible // block_size)
        best = np.array([row[b * block_size:(b + 1) * block_size].max() for b in range(n_blocks)])
        best[(visible - 1) // block_size] = np.inf
        order = sorted(range(n_blocks), key=lambda b: (-best[b], b))[:topk_blocks]
        for b in order:
            pool[p, b * block_size:min((b + 1) * block_size, visible)] = True
    return pool


def _with_reference_attention(port, attn, args, kwargs):
    saved = port.eager_attention_forward
    port.eager_attention_forward = reference_sparse_attention
    try:
        return type(attn).forward(attn, *args, **kwargs)
    finally:
        port.eager_attention_forward = saved


def align_to_reference(port, model, quantized_linears):
    """Applies every alignment above to this model instance (other instances are untouched). Returns the
    list of what was changed, for the test's printout."""
    changed = []
    n = 0
    for module in model.modules():
        if isinstance(module, port.DeepseekV41RMSNorm):
            module.forward = lambda x, norm=module: reference_rms_norm(norm, x)
            n += 1
    changed.append(f"RMSNorm fp32 weight product ({n} norms)")
    n = 0
    for module in model.modules():
        if isinstance(module, port.DeepseekV41RotaryEmbedding):
            module.forward = (lambda x, position_ids, layer_type=None, r=module, f=module.forward:
                              reference_rope_tables(r, f, x, position_ids, layer_type))
            n += 1
    changed.append(f"fp32 RoPE cos/sin ({n} rotary tables)")
    # The port looks its attention function up by name (falling back to its own eager one); keeping the
    # name "eager" keeps the port's additive sliding-window mask, so the function is swapped per instance.
    for module in model.modules():
        if isinstance(module, port.DeepseekV41Attention):
            module.forward = (lambda *a, attn=module, **kw: _with_reference_attention(port, attn, a, kw))
    changed.append("sparse_attn numerics (fp32 scores, bf16 numerators, sink outside the max)")
    head = model.lm_head
    head.forward = lambda x, w=head.weight: __import__("torch").nn.functional.linear(x.float(), w.float())
    changed.append("fp32 LM head (R-model ParallelHead; the port's bf16 linear rounds the logits to bf16)")
    force_router(port, model)
    force_indexer_selection(port, model)
    if quantized_linears:
        enable_reference_activation_quant(port, model, quantized_linears)
        changed.append(f"FP8 activation quantization ({len(quantized_linears)} FP8/MXFP4 linears)")
    return changed


def force_router(port, model):
    """Lets a test fix each router's expert choice (router.cedar_forced_experts = [S, top_k] ids) while the
    routing weights still come from the router's own scores on its own input (R-model `Gate`: selection
    by biased scores, weights from the unbiased ones, renormalized, · route_scale)."""
    import torch

    def forward(hidden_states, image_mask=None, g=None):
        forced = getattr(g, "cedar_forced_experts", None)
        if forced is None:
            return type(g).forward(g, hidden_states, image_mask)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1]).float()
        scores = g.score_fn(torch.nn.functional.linear(flat, g.weight.float()) / g.gate_temp)
        indices = torch.as_tensor(forced, dtype=torch.long)
        weights = scores.gather(1, indices)
        if g.norm_topk_prob and g.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * g.routed_scaling_factor, indices

    for module in model.modules():
        if isinstance(module, port.DeepseekV41TopKRouter):
            module.forward = lambda x, image_mask=None, g=module: forward(x, image_mask, g)
