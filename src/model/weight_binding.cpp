#include "model/weight_binding.h"

#include <cstring>
#include <map>
#include <string_view>

#include "core/numeric.h"
#include "model/weights.h"

namespace cedar {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr size_t kMaxListedProblems = 20;

}  // namespace

std::vector<uint16_t> dequantize_fp8_block_to_bf16(const cpu::LinearWeight& w, ThreadPool* pool) {
  std::vector<uint16_t> out(static_cast<size_t>(w.out * w.in));
  const int64_t scale_cols = (w.in + w.block_in - 1) / w.block_in;
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* s = w.scale + (r / w.block_out) * scale_cols;
      for (int64_t c = 0; c < w.in; ++c) {
        const float v = e4m3_to_f32(w.data[r * w.in + c]) * ue8m0_to_f32(s[c / w.block_in]);
        out[static_cast<size_t>(r * w.in + c)] = f32_to_bf16(v);
      }
    }
  };
  if (pool) pool->parallel_for(w.out, rows, 16);
  else rows(0, w.out);
  return out;
}

uint64_t BoundWeights::converted_bytes() const {
  uint64_t n = 0;
  for (const auto& v : f32_storage_) n += v.size() * sizeof(float);
  for (const auto& v : bf16_storage_) n += v.size() * sizeof(uint16_t);
  for (const auto& v : i64_storage_) n += v.size() * sizeof(int64_t);
  return n;
}

// Walks expected_weights() and places every backbone tensor; problems are collected and reported together.
class WeightBinder {
 public:
  WeightBinder(BoundWeights& out, const ModelConfig& c, const LayerPlan& plan, ThreadPool* pool)
      : out_(out), c_(c), plan_(plan), pool_(pool) {}

  Status run() {
    CEDAR_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, expected_weights(c_, plan_));
    for (const WeightSpec& s : specs) by_name_[s.name] = &s;
    out_.tensors_.layers.resize(static_cast<size_t>(plan_.num_layers()));
    for (const LayerRole& role : plan_.layers)
      out_.tensors_.layers[static_cast<size_t>(role.layer)].ffn.experts.resize(
          static_cast<size_t>(c_.n_routed_experts));
    for (const WeightSpec& s : specs) {
      if (s.format == WeightFormat::Scale || s.draft_block >= 0) continue;  // scales go with their weight
      if (s.layer < 0) bind_global(s);
      else bind_layer(out_.tensors_.layers[static_cast<size_t>(s.layer)], s);
    }
    if (problems_.empty()) check_complete();
    if (problems_.empty()) return Status::Ok();
    std::string msg = checkpoint_label() + ": cannot bind the model weights (" + std::to_string(problems_.size()) +
                      " problem" + (problems_.size() == 1 ? "" : "s") + "):";
    for (size_t i = 0; i < problems_.size() && i < kMaxListedProblems; ++i) msg += "\n  " + problems_[i];
    if (problems_.size() > kMaxListedProblems)
      msg += "\n  ... and " + std::to_string(problems_.size() - kMaxListedProblems) + " more";
    return make_error(msg);
  }

 private:
  std::string checkpoint_label() const {
    const auto& shards = out_.checkpoint_->shard_paths();
    if (shards.empty()) return "checkpoint";
    return shards.size() == 1 ? shards[0].string() : shards[0].parent_path().string();
  }

  void problem(std::string p) { problems_.push_back(std::move(p)); }

  // The checkpoint bytes of an expected tensor after checking presence, dtype and shape.
  const uint8_t* bytes(const WeightSpec& spec) {
    const io::TensorEntry* e = out_.checkpoint_->find(spec.name);
    if (!e) {
      problem("missing tensor '" + spec.name + "' (expected " + std::string(dtype_name(spec.dtype)) + " " +
              shape_text(spec.shape) + ")");
      return nullptr;
    }
    if (e->dtype != spec.dtype || e->shape != spec.shape) {
      problem("tensor '" + spec.name + "' is " + std::string(dtype_name(e->dtype)) + " " + shape_text(e->shape) +
              ", expected " + std::string(dtype_name(spec.dtype)) + " " + shape_text(spec.shape));
      return nullptr;
    }
    // I64 (V4 tid2eid) is an index table, not a weight dtype: read it raw (dtype and shape checked above).
    auto view =
        spec.dtype == DType::I64 ? out_.checkpoint_->raw_tensor(spec.name) : out_.checkpoint_->tensor(spec.name);
    if (!view.ok()) {
      problem(view.error().message);
      return nullptr;
    }
    return view->bytes.data();
  }

  const uint8_t* scale_bytes(const WeightSpec& weight) {
    const std::string name = weight.name.substr(0, weight.name.size() - std::string_view(".weight").size()) + ".scale";
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      problem("tensor '" + weight.name + "' has no '.scale' in the expected inventory");
      return nullptr;
    }
    return bytes(*it->second);
  }

  cpu::LinearWeight linear(const WeightSpec& s) {
    cpu::LinearWeight w;
    w.format = s.format;
    if (s.shape.size() != 2) {
      problem("tensor '" + s.name + "' is not a matrix: " + shape_text(s.shape));
      return w;
    }
    w.out = s.shape[0];
    w.in = s.format == WeightFormat::MXFP4 ? s.shape[1] * 2 : s.shape[1];
    if (s.format == WeightFormat::F32) w.data = reinterpret_cast<const uint8_t*>(floats(s).data());  // aligned
    else w.data = bytes(s);
    switch (s.format) {
      case WeightFormat::BF16:
      case WeightFormat::F32:
        break;
      case WeightFormat::FP8Block:
        w.scale = scale_bytes(s);
        w.block_out = c_.quant.weight_block_rows;
        w.block_in = c_.quant.weight_block_cols;
        break;
      case WeightFormat::MXFP4:
        w.scale = scale_bytes(s);
        break;
      default:
        problem("tensor '" + s.name + "' has format " + std::string(weight_format_name(s.format)) +
                ", which is not a linear weight");
    }
    return w;
  }

  // wo_a: dequantized to BF16 values at load (§2.3); already BF16 in bf16-weight checkpoints.
  cpu::LinearWeight linear_as_bf16(const WeightSpec& s) {
    cpu::LinearWeight w = linear(s);
    if (w.format != WeightFormat::FP8Block || !w.data || !w.scale) return w;
    out_.bf16_storage_.push_back(dequantize_fp8_block_to_bf16(w, pool_));
    w.format = WeightFormat::BF16;
    w.data = reinterpret_cast<const uint8_t*>(out_.bf16_storage_.back().data());
    w.scale = nullptr;
    return w;
  }

  // fp32 values of a BF16 or F32 tensor.
  std::span<const float> floats(const WeightSpec& s) {
    const uint8_t* p = bytes(s);
    if (!p) return {};
    const size_t n = static_cast<size_t>(s.numel());
    if (s.dtype == DType::F32 && reinterpret_cast<uintptr_t>(p) % alignof(float) == 0)
      return {reinterpret_cast<const float*>(p), n};
    std::vector<float> v(n);
    if (s.dtype == DType::F32) {
      std::memcpy(v.data(), p, n * sizeof(float));
    } else if (s.dtype == DType::BF16) {
      for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
    } else {
      problem("tensor '" + s.name + "' is " + std::string(dtype_name(s.dtype)) + ", expected BF16 or F32 values");
      return {};
    }
    out_.f32_storage_.push_back(std::move(v));
    return out_.f32_storage_.back();
  }

  // The values of an I64 tensor (viewed in place when aligned, else copied).
  std::span<const int64_t> int64s(const WeightSpec& s) {
    const uint8_t* p = bytes(s);
    if (!p) return {};
    const size_t n = static_cast<size_t>(s.numel());
    if (s.dtype != DType::I64) {
      problem("tensor '" + s.name + "' is " + std::string(dtype_name(s.dtype)) + ", expected I64");
      return {};
    }
    if (reinterpret_cast<uintptr_t>(p) % alignof(int64_t) == 0) return {reinterpret_cast<const int64_t*>(p), n};
    out_.i64_storage_.emplace_back(n);
    std::memcpy(out_.i64_storage_.back().data(), p, n * sizeof(int64_t));
    return out_.i64_storage_.back();
  }

  void bind_global(const WeightSpec& s) {
    ModelWeights& t = out_.tensors_;
    if (s.name == "embed.weight") t.embed = linear(s);
    else if (s.name == "head.weight") t.head = linear(s);
    else if (s.name == "norm.weight") t.final_norm = floats(s);
    else if (s.name == "hc_head_fn") t.hc_head.fn = floats(s);
    else if (s.name == "hc_head_base") t.hc_head.base = floats(s);
    else if (s.name == "hc_head_scale") t.hc_head.scale = floats(s);
    else if (s.component == Component::Vision) return;
    else problem("no place for global tensor '" + s.name + "' in the CPU forward");
  }

  void bind_expert(MoeWeights& f, const std::string& local, const WeightSpec& s) {
    if (s.expert < 0 || s.expert >= static_cast<int64_t>(f.experts.size())) {
      problem("tensor '" + s.name + "': expert index " + std::to_string(s.expert) + " out of range");
      return;
    }
    ExpertWeights& e = f.experts[static_cast<size_t>(s.expert)];
    if (ends_with(local, ".w1.weight")) e.w1 = linear(s);
    else if (ends_with(local, ".w2.weight")) e.w2 = linear(s);
    else if (ends_with(local, ".w3.weight")) e.w3 = linear(s);
    else problem("no place for expert tensor '" + s.name + "'");
  }

  void bind_engram(LayerWeights& L, const std::string& local, const WeightSpec& s) {
    if (!L.engram) L.engram.emplace();
    EngramWeights& e = *L.engram;
    if (local == "engram.embed.weight") {
      L.engram_table_format = s.format == WeightFormat::FP8Rows ? WeightFormat::FP8Rows : WeightFormat::BF16;
      e.table_format = L.engram_table_format;
      e.table = bytes(s);
      if (s.format == WeightFormat::FP8Rows) e.table_scale = scale_bytes(s);
      e.rows = s.shape.size() == 2 ? s.shape[0] : 0;
      e.head_dim = s.shape.size() == 2 ? s.shape[1] : 0;
    } else if (local == "engram.wkv.weight") {
      e.wkv = linear(s);
    } else if (local == "engram.q_weight") {
      e.q_weight = floats(s);
    } else if (local == "engram.k_weight") {
      e.k_weight = floats(s);
    } else {
      problem("no place for Engram tensor '" + s.name + "'");
    }
  }

  void bind_layer(LayerWeights& L, const WeightSpec& s) {
    const std::string prefix = "layers." + std::to_string(s.layer) + ".";
    if (s.name.compare(0, prefix.size(), prefix) != 0) {
      problem("tensor '" + s.name + "' of layer " + std::to_string(s.layer) + " lacks the prefix '" + prefix + "'");
      return;
    }
    const std::string local = s.name.substr(prefix.size());
    AttentionWeights& a = L.attn;
    if (s.expert >= 0) return bind_expert(L.ffn, local, s);
    if (local.rfind("engram.", 0) == 0) return bind_engram(L, local, s);
    // Norms and mixes.
    if (local == "attn_norm.weight") L.attn_norm = floats(s);
    else if (local == "ffn_norm.weight") L.ffn_norm = floats(s);
    else if (local == "hc_attn_fn") L.hc_attn.fn = floats(s);
    else if (local == "hc_attn_base") L.hc_attn.base = floats(s);
    else if (local == "hc_attn_scale") L.hc_attn.scale = floats(s);
    else if (local == "hc_ffn_fn") L.hc_ffn.fn = floats(s);
    else if (local == "hc_ffn_base") L.hc_ffn.base = floats(s);
    else if (local == "hc_ffn_scale") L.hc_ffn.scale = floats(s);
    // Attention core.
    else if (local == "attn.attn_sink") a.attn_sink = floats(s);
    else if (local == "attn.wq_a.weight") a.wq_a = linear(s);
    else if (local == "attn.q_norm.weight") a.q_norm = floats(s);
    else if (local == "attn.wq_b.weight") a.wq_b = linear(s);
    else if (local == "attn.wkv.weight") a.wkv = linear(s);
    else if (local == "attn.kv_norm.weight") a.kv_norm = floats(s);
    else if (local == "attn.wo_a.weight") a.wo_a = linear_as_bf16(s);
    else if (local == "attn.wo_b.weight") a.wo_b = linear(s);
    // CSA2 pieces.
    else if (local == "attn.compressor.wkv.weight") a.wkv_c = linear(s);
    else if (local == "attn.compressor.wgate.weight") a.wgate_c = linear(s);
    else if (local == "attn.compressor.norm.weight") a.norm_c = floats(s);
    else if (local == "attn.indexer.wk.weight") a.wk = linear(s);
    else if (local == "attn.indexer.k_norm.weight") a.k_norm = floats(s);
    else if (local == "attn.indexer.wq_b.weight") a.wq_b_i = linear(s);
    else if (local == "attn.indexer.weights_proj.weight") a.weights_proj = linear(s);
    // V4 compressors.
    else if (local == "attn.compressor.ape") a.ape_c = floats(s);
    else if (local == "attn.indexer.compressor.wkv.weight") a.wkv_ic = linear(s);
    else if (local == "attn.indexer.compressor.wgate.weight") a.wgate_ic = linear(s);
    else if (local == "attn.indexer.compressor.ape") a.ape_ic = floats(s);
    else if (local == "attn.indexer.compressor.norm.weight") a.norm_ic = floats(s);
    else if (local == "ffn.gate.tid2eid") L.ffn.tid2eid = int64s(s);
    // MoE.
    else if (local == "ffn.gate.weight") L.ffn.gate = floats(s);
    else if (local == "ffn.gate.bias") L.ffn.bias = floats(s);
    else if (local == "ffn.gate.bias_vl") L.ffn.bias_vl = floats(s);
    else if (local == "ffn.shared_experts.w1.weight") L.ffn.shared.w1 = linear(s);
    else if (local == "ffn.shared_experts.w2.weight") L.ffn.shared.w2 = linear(s);
    else if (local == "ffn.shared_experts.w3.weight") L.ffn.shared.w3 = linear(s);
    else problem("no place for tensor '" + s.name + "' in the CPU forward");
  }

  // Every field the layer's role needs is bound (guards against the inventory listing fewer tensors
  // than the forward reads).
  void check_complete() {
    const ModelWeights& t = out_.tensors_;
    if (!t.embed.data || !t.head.data || t.final_norm.empty())
      problem("embed.weight, head.weight and norm.weight must all be present (tied embeddings are not supported)");
    const bool v4 = c_.arch == Arch::DeepseekV4;
    if (v4 && (t.hc_head.fn.empty() || t.hc_head.base.empty() || t.hc_head.scale.empty()))
      problem("hc_head_fn, hc_head_base and hc_head_scale must be present (DeepSeek-V4)");
    for (const LayerRole& role : plan_.layers) {
      const LayerWeights& L = t.layers[static_cast<size_t>(role.layer)];
      const AttentionWeights& a = L.attn;
      const std::string where = "layer " + std::to_string(role.layer) + ": ";
      const bool router = role.hash_routed ? !L.ffn.tid2eid.empty() : !L.ffn.bias.empty();
      const bool core = a.wq_a.data && a.wq_b.data && a.wkv.data && a.wo_a.data && a.wo_b.data && !a.q_norm.empty() &&
                        !a.kv_norm.empty() && !a.attn_sink.empty() && !L.attn_norm.empty() && !L.ffn_norm.empty() &&
                        !L.hc_attn.fn.empty() && !L.hc_ffn.fn.empty() && !L.ffn.gate.empty() && router;
      if (!core) problem(where + "attention / mHC / router tensors incomplete");
      if (role.owns_compressor && (!a.wkv_c.data || a.norm_c.empty() || (role.compressor_has_gate && !a.wgate_c.data)))
        problem(where + "KV source without its compressor tensors");
      if (v4 && role.owns_compressor && a.ape_c.empty()) problem(where + "compressor.ape missing");
      if (v4 && role.owns_indexer_keys && (!a.wkv_ic.data || !a.wgate_ic.data || a.ape_ic.empty() || a.norm_ic.empty()))
        problem(where + "indexer compressor tensors missing");
      if (!v4 && role.owns_indexer_keys && (!a.wk.data || a.k_norm.empty()))
        problem(where + "indexer keys missing");
      if (role.owns_indexer && (!a.wq_b_i.data || !a.weights_proj.data))
        problem(where + "index source without indexer.wq_b / weights_proj");
      if (role.has_engram != L.engram.has_value()) problem(where + "Engram tensors do not match the plan");
      if (c_.n_shared_experts > 0 && (!L.ffn.shared.w1.data || !L.ffn.shared.w2.data || !L.ffn.shared.w3.data))
        problem(where + "shared expert incomplete");
      for (size_t e = 0; e < L.ffn.experts.size(); ++e) {
        const ExpertWeights& x = L.ffn.experts[e];
        if (!x.w1.data || !x.w2.data || !x.w3.data) {
          problem(where + "routed expert " + std::to_string(e) + " incomplete");
          break;
        }
      }
    }
  }

  BoundWeights& out_;
  const ModelConfig& c_;
  const LayerPlan& plan_;
  ThreadPool* pool_;
  std::map<std::string, const WeightSpec*, std::less<>> by_name_;
  std::vector<std::string> problems_;
};

Result<BoundWeights> BoundWeights::bind(io::Checkpoint checkpoint, const ModelConfig& config, const LayerPlan& plan,
                                        ThreadPool* pool) {
  BoundWeights w;
  w.checkpoint_ = std::make_unique<io::Checkpoint>(std::move(checkpoint));
  WeightBinder binder(w, config, plan, pool);
  CEDAR_RETURN_IF_ERROR(binder.run());
  return w;
}

}  // namespace cedar
