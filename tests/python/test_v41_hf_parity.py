"""cedar's exact-mode DeepSeek-V4.1 forward vs the Hugging Face port `deepseek_v41` (huggingface/transformers
@0a2080b4, not in any PyPI release: see hf_v41_port.import_hf_port and docs/forward.md "Parity with the HF port").

Each case writes a tiny checkpoint in the released format (cedar make-tiny or the independent Python writer
tools/tiny_checkpoint.py; bf16-weight and FP8/MXFP4 ones, several seeds and shapes, all with Engram, the
ratio-2 encoder groups, the CED ratio-1 decoder with the candidate pool, and odd prompt lengths), loads the
same files into DeepseekV41ForCausalLM (hf_v41_port.load_hf_model: exact dequantized values), runs the same
ids through both and compares logits and every per-layer tensor cedar dumps.

Known differences between the port and the official reference (which cedar's exact mode follows; spec §6),
and how each is accounted for (hf_v41_port.align_to_reference changes only where the port rounds or breaks
ties, never its math):
  * FP8 activation quantization (§3.1, §6 item 5 for the clamp): the port runs FP8/MXFP4 linears on the
    unquantized bf16 input; R-model quantizes it per 32 channels (amax clamp 1e-4, UE8M0 scale). Aligned.
  * indexer score precision (§6 item 4): port fp32, R-model bf16 tensors, and torch.topk leaves the order
    of ties open. Not aligned: the checks below use cedar's dumped selection (layers.L.topk) after verifying
    that it is a top-k of fp32 scores up to near-ties of 4 bf16 ulps (hf_v41_port.index_scores).
  * sink in the softmax max (§6 item 15): same value in exact arithmetic; the aligned attention keeps it out
    of the max like R-kernel, together with fp32 scores and bf16 numerators (the port: bf16 score matmul,
    bf16 normalized probabilities).
  * hc-mix normalization order (§6 item 14): fp32 either way, not changed (the mHC check below bounds it).
  * not listed in §6, found here: the port's RMSNorm rounds twice (bf16(x̂)·w in bf16; R-model one rounding
    of the fp32 product), its RoPE cos/sin are cast to bf16 (R-model: complex64), its LM head is a bf16
    linear (R-model: fp32 logits), and its no-cache path concatenates every KV source's compressed KV and
    indexer keys onto the previous source's (the test runs with a cache, as generate() does). All aligned.
Remaining differences are fp32 summation order, i.e. single bf16 ulps, which the discrete choices (MoE
expert top-k, indexer top-k, candidate blocks) amplify chaotically in random tiny models. So the test checks:
  1. modules, teacher-forced: every attention / MoE layer of the port fed cedar's dumped inputs (in layer
     order, so the port builds its compressed caches from cedar's inputs) against cedar's outputs; the
     index-source layers use cedar's dumped selection after checking it is a top-k of the port's own
     scores up to near-ties (the number of rows whose selection differs only by a near-tie is printed);
  2. mHC / Engram / final norm / head: the port's blocks with attention and MoE outputs replaced by cedar's;
  3. end to end: the whole port forward on its own activations with only the discrete choices (expert ids
     from the port's router on cedar's MoE inputs, which the module check shows equal cedar's, and cedar's
     indexer selection) fixed — logits cosine >= 0.999 at every position and top-1 agreement >= 99%
     (issue 3 item 5), where a differing argmax counts as agreement only if cedar's token is within the
     logit noise of the port's best (random tiny models have near-equal top logits; the strict top-1 is
     printed too). The fully free-running comparison (no choice fixed) is printed for information.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from cedar_cli import REPO, cedar_binary
import hf_v41_port as hfp

PORT, PORT_WHY = hfp.import_hf_port()
if PORT is None:
    print(f"test_v41_hf_parity: skipped: {PORT_WHY}", file=sys.stderr)
pytestmark = pytest.mark.skipif(PORT is None, reason=PORT_WHY)


@dataclass(frozen=True)
class Case:
    name: str
    writer: str      # "cedar" (cedar make-tiny) or "python" (tools/tiny_checkpoint.py)
    profile: str
    seed: int
    bf16: bool
    n_tokens: int    # odd: ratio-2 groups end on a partial group


CASES = [
    Case("make-tiny seed 2 bf16", "cedar", "tiny", 2, True, 21),
    Case("make-tiny seed 1 fp8+mxfp4", "cedar", "tiny", 1, False, 21),
    Case("python small seed 5 bf16", "python", "small", 5, True, 23),
    Case("python tiny seed 7 fp8+mxfp4", "python", "tiny", 7, False, 19),
]

# Issue 3 item 5 thresholds (end to end, choices fixed).
LOGITS_MIN_COSINE = 0.999
TOP1_MIN_AGREEMENT = 0.99
# Module checks. bf16 weights: only summation order differs, i.e. bf16 ulps (2^-8 relative) on some
# elements. FP8/MXFP4: an ulp difference in a linear's input can move the FP8 activation code by one step
# (2^-3 relative on that element), so the bounds are looser.
MODULE_REL_L2 = {True: 1e-2, False: 6e-2}
MODULE_MIN_COSINE = {True: 0.9999, False: 0.998}
MHC_REL_L2 = 2e-3  # streams rebuilt from cedar's module outputs: bf16 rounding of the same fp32 sums
# A selection that differs from the port's own top-k must be a near-tie: within 4 bf16 ulps of the
# boundary score. At most this fraction of (layer, row) selections may be such tie flips.
TIE_ULPS = 4
MAX_TIE_FLIP_FRACTION = 0.1


def token_ids(seed: int, n: int) -> list[int]:
    rng = np.random.default_rng(1000 + seed)
    ids = [int(x) for x in rng.integers(3, 129000, n)]
    ids[0] = 0  # BOS
    ids[n // 2] = ids[n // 2 - 2]  # a repeated token: the same n-gram prefix hashes alike
    return ids


def write_checkpoint(case: Case, out: pathlib.Path) -> None:
    if case.writer == "cedar":
        cmd = [cedar_binary(), "make-tiny", str(out), "--seed", str(case.seed), "--profile", case.profile, "--force"]
    else:
        cmd = [sys.executable, str(REPO / "tools" / "tiny_checkpoint.py"), str(out), "--arch", "deepseek_v41",
               "--seed", str(case.seed), "--profile", case.profile, "--overwrite"]
    if case.bf16:
        cmd.append("--bf16")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def cedar_forward(model: pathlib.Path, ids: list[int], out: pathlib.Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [cedar_binary(), "forward", str(model), "--ids", ",".join(map(str, ids)), "--mode", "exact",
           "--positions", "all", "--logits-out", str(out / "logits.npy"), "--dump-tensors", ".", str(out / "dump"),
           "--threads", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    index = json.loads((out / "dump" / "index.json").read_text())
    dumps = {name: np.load(out / "dump" / f"{name}.npy") for name in index}
    dumps["logits"] = np.load(out / "logits.npy")
    return dumps


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-300))


def row_min_cosine(a, b) -> float:
    return min(cosine(x, y) for x, y in zip(a, b))


def layer_key(name: str):
    return (int(name.split(".")[1]), name) if name.startswith("layers.") else (1 << 30, name)


def compare_all(hf: dict, cd: dict) -> dict:
    """name -> (cosine, rel L2, worst-row cosine) for every tensor both sides have."""
    return {n: (cosine(hf[n], cd[n]), rel_l2(hf[n], cd[n]), row_min_cosine(hf[n], cd[n]))
            for n in sorted(set(hf) & set(cd), key=layer_key) if not n.endswith(".topk")}


def logits_summary(hf_logits, cd_logits) -> dict:
    """top1: argmax agreement over positions. top1_ties: a differing argmax still counts when cedar's token
    is within the logit noise of the port's best (hf[cedar's argmax] >= max(hf) − 2·RMS(hf − cedar) at that
    position): random tiny models have near-equal top logits (margins of 1e-2), where any noise picks
    either."""
    hf_arg, cd_arg = hf_logits.argmax(-1), cd_logits.argmax(-1)
    noise = np.sqrt(np.mean((hf_logits.astype(np.float64) - cd_logits) ** 2, axis=-1))
    gap = hf_logits.max(-1) - hf_logits[np.arange(len(cd_arg)), cd_arg]
    return {"cos_min": row_min_cosine(hf_logits, cd_logits), "cos": cosine(hf_logits, cd_logits),
            "rel_l2": rel_l2(hf_logits, cd_logits), "top1": float(np.mean(hf_arg == cd_arg)),
            "top1_ties": float(np.mean((hf_arg == cd_arg) | (gap <= 2 * noise)))}


def fmt_logits(s: dict) -> str:
    return (f"logits min-cos {s['cos_min']:.6f} cos {s['cos']:.6f} rel-L2 {s['rel_l2']:.2e} top-1 {s['top1']:.1%} "
            f"(near-ties counted: {s['top1_ties']:.1%})")


def worst_layer(metrics: dict) -> tuple[str, tuple]:
    layers = {n: v for n, v in metrics.items() if n.startswith("layers.")}
    return min(layers.items(), key=lambda kv: kv[1][2])


class TeacherForced:
    """Runs the port's attention and MoE modules of every layer on cedar's dumped inputs (layer order, one
    cache), with cedar's indexer selection forced after checking it against the port's own scores."""

    def __init__(self, model, dumps: dict, n: int):
        import torch
        from transformers.masking_utils import create_sliding_window_causal_mask

        self.model, self.dumps, self.n = model, dumps, n
        self.pos = torch.arange(n)[None]
        emb = torch.zeros(1, n, model.config.hidden_size, dtype=torch.bfloat16)
        self.mask = create_sliding_window_causal_mask(config=model.config, inputs_embeds=emb, attention_mask=None,
                                                      past_key_values=None, position_ids=self.pos)
        self.pe = {t: model.model.rotary_emb(emb, position_ids=self.pos, layer_type=t) for t in ("main", "compress")}

    def run(self):
        import torch

        bf = lambda name: torch.from_numpy(self.dumps[name]).to(torch.bfloat16)[None]  # noqa: E731
        cache, shared, pool = hfp.new_cache(PORT, self.model), {}, None
        modules, experts, selections = {}, {}, {"rows": 0, "tie_flips": 0, "bad": []}
        for L, layer in enumerate(self.model.model.layers):
            ix = layer.attn.indexer
            if ix is not None:
                ix.cedar_forced_topk = self.dumps[f"layers.{L}.topk"].astype(np.int64)
            with torch.no_grad():
                out, _ = layer.attn(bf(f"layers.{L}.attn_in"), position_embeddings=self.pe, attention_mask=self.mask,
                                    past_key_values=cache, shared=shared, position_ids=self.pos)
                x_ffn = bf(f"layers.{L}.ffn_in")
                ffn = layer.ffn(x_ffn)
                experts[L] = layer.ffn.gate(x_ffn)[1].numpy()
            if ix is not None:
                ix.cedar_forced_topk = None
                cfg = self.model.config
                source = max(s for s in cfg.kv_source_layer_ids if s <= L)
                scores = hfp.index_scores(PORT, layer, bf(f"layers.{L}.attn_in"), cache, source, self.pos)
                if L == cfg.candidate_source_layer_id:
                    pool = hfp.candidate_pool(scores, cfg.candidate_block_size, cfg.candidate_topk_blocks)
                elif 0 <= cfg.candidate_source_layer_id < L:
                    scores = np.where(pool, scores, -np.inf)
                self.check_selection(L, scores, self.dumps[f"layers.{L}.topk"], selections)
            modules[f"layers.{L}.attn_out"] = out[0].float().numpy()
            modules[f"layers.{L}.ffn_out"] = ffn[0].float().numpy()
        return modules, experts, selections

    @staticmethod
    def check_selection(L, scores, picks, tally):
        """cedar's picks must be a top-k of the fp32 scores (−inf = not visible / outside the candidate pool),
        allowing near-ties at the boundary: cedar scores in bf16 like R-model (spec §6 item 4)."""
        for t, row in enumerate(picks.astype(np.int64)):
            chosen = row[row >= 0]
            tally["rows"] += 1
            s = scores[t]
            visible = np.isfinite(s)
            k = min(len(row), int(visible.sum()))
            if len(chosen) != k or not visible[chosen].all():
                tally["bad"].append((L, t, "count/visibility", chosen.tolist(), k))
                continue
            rest = np.setdiff1d(np.flatnonzero(visible), chosen)
            if len(rest) == 0:
                continue
            low, high = s[chosen].min(), s[rest].max()
            if low >= high:
                continue
            tol = TIE_ULPS * 2.0 ** -8 * max(abs(low), abs(high), 2.0 ** -20)
            if high - low <= tol:
                tally["tie_flips"] += 1
            else:
                tally["bad"].append((L, t, f"picked {low} < unpicked {high}", chosen.tolist(), k))


def forced_attention_ffn_outputs(model, dumps):
    import torch

    for L, layer in enumerate(model.model.layers):
        a = torch.from_numpy(dumps[f"layers.{L}.attn_out"]).to(torch.bfloat16)[None]
        f = torch.from_numpy(dumps[f"layers.{L}.ffn_out"]).to(torch.bfloat16)[None]
        layer.attn.forward = lambda *args, a=a, **kw: (a, None)
        layer.ffn.forward = lambda *args, f=f, **kw: f


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cedar_matches_hf_port(case: Case, tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(case, ckpt)
    ids = token_ids(case.seed, case.n_tokens)
    cd = cedar_forward(ckpt, ids, tmp_path / "cedar")
    report = [f"\n[{case.name}] {PORT_WHY}; {case.n_tokens} tokens"]

    # 0. Fully free-running (information only): the port as published (no-cache path bug avoided), and
    #    aligned to the reference.
    model, ck = hfp.load_hf_model(PORT, ckpt)
    as_is = logits_summary(hfp.run_with_dumps(PORT, model, ids)["logits"], cd["logits"])
    report.append(f"  port as published, free-running: {fmt_logits(as_is)}")
    changes = hfp.align_to_reference(PORT, model, ck.quantized_linears)
    report.append("  alignments: " + "; ".join(changes))
    free = hfp.run_with_dumps(PORT, model, ids)
    fs = logits_summary(free["logits"], cd["logits"])
    report.append(f"  aligned, free-running: {fmt_logits(fs)}")

    # 1. Modules, teacher-forced.
    modules, experts, sel = TeacherForced(model, cd, len(ids)).run()
    tol_rel, tol_cos = MODULE_REL_L2[case.bf16], MODULE_MIN_COSINE[case.bf16]
    worst_mod = max(((n, rel_l2(v, cd[n]), cosine(v, cd[n])) for n, v in modules.items()), key=lambda x: x[1])
    report.append(f"  modules (teacher-forced): worst {worst_mod[0]} rel-L2 {worst_mod[1]:.2e} cos {worst_mod[2]:.6f}; "
                  f"indexer rows {sel['rows']}, near-tie flips {sel['tie_flips']}")
    bad_modules = [(n, rel_l2(v, cd[n]), cosine(v, cd[n])) for n, v in modules.items()
                   if rel_l2(v, cd[n]) > tol_rel or cosine(v, cd[n]) < tol_cos]

    # 3. End to end with the discrete choices fixed.
    for L, layer in enumerate(model.model.layers):
        layer.ffn.gate.cedar_forced_experts = experts[L]
        if layer.attn.indexer is not None:
            layer.attn.indexer.cedar_forced_topk = cd[f"layers.{L}.topk"].astype(np.int64)
    fixed = hfp.run_with_dumps(PORT, model, ids)
    e2e = logits_summary(fixed["logits"], cd["logits"])
    metrics = compare_all(fixed, cd)
    wl = worst_layer(metrics)
    report.append(f"  end to end, choices fixed: {fmt_logits(e2e)}; worst layer tensor {wl[0]} cos {wl[1][0]:.6f} "
                  f"rel-L2 {wl[1][1]:.2e} worst-row cos {wl[1][2]:.6f}")

    # 2. mHC / Engram / final norm / head on cedar's module outputs.
    forced_attention_ffn_outputs(model, cd)
    blocks = compare_all(hfp.run_with_dumps(PORT, model, ids), cd)
    worst_block = max(((n, v[1]) for n, v in blocks.items() if "attn_out" not in n and "ffn_out" not in n),
                      key=lambda x: x[1])
    report.append(f"  mHC/Engram/norm/head on cedar's module outputs: worst {worst_block[0]} rel-L2 {worst_block[1]:.2e}")
    print("\n".join(report))

    assert not sel["bad"], f"cedar's indexer selection is not a top-k of the port's scores: {sel['bad'][:5]}"
    assert sel["tie_flips"] <= MAX_TIE_FLIP_FRACTION * sel["rows"], sel
    assert not bad_modules, f"modules beyond rel-L2 {tol_rel} / cos {tol_cos}: {bad_modules}"
    bad_blocks = [(n, v[1]) for n, v in blocks.items()
                  if "attn_out" not in n and "ffn_out" not in n and n != "logits" and v[1] > MHC_REL_L2]
    assert not bad_blocks, bad_blocks
    assert blocks["logits"][1] <= MHC_REL_L2, blocks["logits"]
    assert e2e["cos_min"] >= LOGITS_MIN_COSINE, e2e
    assert e2e["top1_ties"] >= TOP1_MIN_AGREEMENT, e2e
