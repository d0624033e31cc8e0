// Device layout and upload of BoundWeights (device_weights.h). One walk over the bound tensors runs
// twice: planning (offsets and bytes per component, nothing allocated) and uploading (one device slab
// and, for host-resident Engram tables, one pinned mapped host slab; copies into the planned offsets).
#include "backend/cuda/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "core/numeric.h"

namespace cedar::cuda {

std::string_view device_format_name(DeviceFormat f) {
  switch (f) {
    case DeviceFormat::Bf16:
      return "bf16";
    case DeviceFormat::F32:
      return "f32";
    case DeviceFormat::Fp8Block:
      return "fp8_block";
    case DeviceFormat::Mxfp4:
      return "mxfp4";
  }
  return "?";
}

uint64_t DeviceMatrix::data_bytes() const {
  const auto n = static_cast<uint64_t>(out) * static_cast<uint64_t>(in);
  switch (format) {
    case DeviceFormat::Bf16:
      return 2 * n;
    case DeviceFormat::F32:
      return 4 * n;
    case DeviceFormat::Fp8Block:
      return n;
    case DeviceFormat::Mxfp4:
      return n / 2;
  }
  return 0;
}

uint64_t DeviceMatrix::scale_bytes() const {
  if (format == DeviceFormat::Fp8Block)
    return static_cast<uint64_t>((out + block_out - 1) / block_out) *
           static_cast<uint64_t>((in + block_in - 1) / block_in);
  if (format == DeviceFormat::Mxfp4) return static_cast<uint64_t>(out) * static_cast<uint64_t>(in / 32);
  return 0;
}

QuantWeightView DeviceMatrix::quant() const {
  QuantWeightView v;
  v.format = format == DeviceFormat::Mxfp4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block;
  v.out = out;
  v.in = in;
  v.data = data;
  v.scales = scales;
  v.block_out = block_out;
  v.block_in = block_in;
  return v;
}

DeviceMatrix DeviceExperts::matrix(int64_t expert, Kind kind) const {
  DeviceMatrix m = first[kind];
  m.data += expert * data_stride[kind];
  m.scales += expert * scale_stride[kind];
  return m;
}

uint64_t DeviceMemoryPlan::device_bytes() const {
  uint64_t n = 0;
  for (const auto& e : entries) n += e.in_host ? 0 : e.bytes;
  return n;
}

uint64_t DeviceMemoryPlan::host_bytes() const {
  uint64_t n = 0;
  for (const auto& e : entries) n += e.in_host ? e.bytes : 0;
  return n;
}

uint64_t DeviceMemoryPlan::per_step_bytes() const {
  uint64_t n = 0;
  for (const auto& e : entries) n += e.read_per_step == "all" ? e.bytes : 0;
  return n;
}

MemoryPlanEntry* DeviceMemoryPlan::find(const std::string& component) {
  for (auto& e : entries)
    if (e.component == component) return &e;
  return nullptr;
}

const MemoryPlanEntry* DeviceMemoryPlan::find(const std::string& component) const {
  for (const auto& e : entries)
    if (e.component == component) return &e;
  return nullptr;
}

void DeviceMemoryPlan::add(const std::string& component, uint64_t bytes, bool in_host, const std::string& read) {
  if (MemoryPlanEntry* e = find(component)) {
    e->bytes += bytes;
    return;
  }
  entries.push_back({component, bytes, in_host, read});
}

std::string DeviceMemoryPlan::table() const {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "  %-24s %12s  %-5s  %s\n", "component", "GB", "where", "read per decode step");
  out += line;
  for (const auto& e : entries) {
    std::snprintf(line, sizeof line, "  %-24s %12.3f  %-5s  %s\n", e.component.c_str(),
                  static_cast<double>(e.bytes) / 1e9, e.in_host ? "host" : "hbm", e.read_per_step.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-24s %12.3f  hbm\n", "total", static_cast<double>(device_bytes()) / 1e9);
  out += line;
  if (host_bytes() > 0) {
    std::snprintf(line, sizeof line, "  %-24s %12.3f  host\n", "total (pinned host)",
                  static_cast<double>(host_bytes()) / 1e9);
    out += line;
  }
  return out;
}

struct DeviceWeights::Storage {
  DeviceBuffer<uint8_t> device;
  void* host = nullptr;  // cudaHostAlloc (mapped)
  ~Storage() {
    if (host) cudaFreeHost(host);
  }
};

DeviceWeights::DeviceWeights() : storage_(std::make_unique<Storage>()) {}
DeviceWeights::DeviceWeights(DeviceWeights&&) noexcept = default;
DeviceWeights& DeviceWeights::operator=(DeviceWeights&&) noexcept = default;
DeviceWeights::~DeviceWeights() = default;

namespace {

constexpr uint64_t kAlign = 256;  // every tensor starts 256-byte aligned (vector loads, TMA)
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

DeviceFormat device_format_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::FP8Block:
      return DeviceFormat::Fp8Block;
    case WeightFormat::MXFP4:
      return DeviceFormat::Mxfp4;
    case WeightFormat::F32:
      return DeviceFormat::F32;
    default:
      return DeviceFormat::Bf16;
  }
}

}  // namespace

// Places every tensor: in planning mode it only advances the offsets and counts bytes per component;
// in upload mode the slabs exist and each placement copies its bytes and returns the device pointer.
class DeviceWeightPlacer {
 public:
  DeviceWeightPlacer(const ModelConfig& c, const BoundWeights& w, const DeviceWeightOptions& o) : c_(c), w_(w), o_(o) {}

  Status run(DeviceWeights& out, uint8_t* device_base, uint8_t* host_base) {
    device_base_ = device_base;
    host_base_ = host_base;
    device_offset_ = host_offset_ = 0;
    DeviceMemoryPlan& plan = out.plan_;
    plan = DeviceMemoryPlan{};
    plan_ = &plan;
    const ModelWeights& t = w_.tensors();
    CEDAR_ASSIGN_OR_RETURN(out.embed_, matrix("embedding", t.embed, "rows"));
    CEDAR_ASSIGN_OR_RETURN(out.head_, matrix("head", t.head, "all"));
    CEDAR_ASSIGN_OR_RETURN(out.final_norm_, vec("head", t.final_norm, "all"));
    out.layers_.assign(t.layers.size(), DeviceLayer{});
    for (size_t l = 0; l < t.layers.size(); ++l) {
      Status st = layer(static_cast<int64_t>(l), t.layers[l], out.layers_[l]);
      if (!st.ok()) return st.error().with_context("layer " + std::to_string(l));
    }
    device_total_ = device_offset_;
    host_total_ = host_offset_;
    return Status::Ok();
  }

  uint64_t device_total() const { return device_total_; }
  uint64_t host_total() const { return host_total_; }

 private:
  // Reserves `bytes` (in the host slab when `in_host`) and copies `src` there in upload mode.
  Result<const uint8_t*> place(const std::string& component, const void* src, uint64_t bytes, const std::string& read,
                               bool in_host = false) {
    plan_->add(component, bytes, in_host, read);
    uint64_t& offset = in_host ? host_offset_ : device_offset_;
    uint8_t* base = in_host ? host_base_ : device_base_;
    const uint64_t at = offset;
    offset = align_up(offset + bytes);
    if (!base) return static_cast<const uint8_t*>(nullptr);
    if (bytes > 0) {
      if (!src) return make_error(component + ": a tensor has no host data");
      if (in_host)
        std::memcpy(base + at, src, bytes);
      else
        CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(base + at, src, bytes, cudaMemcpyHostToDevice));
    }
    if (in_host) {
      void* dev = nullptr;
      CEDAR_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, base + at, 0));
      return static_cast<const uint8_t*>(dev);
    }
    return static_cast<const uint8_t*>(base + at);
  }

  Result<DeviceVector> vec(const std::string& component, std::span<const float> v, const std::string& read) {
    DeviceVector d;
    d.size = static_cast<int64_t>(v.size());
    if (v.empty()) return d;
    CEDAR_ASSIGN_OR_RETURN(const uint8_t* p, place(component, v.data(), v.size_bytes(), read));
    d.data = reinterpret_cast<const float*>(p);
    return d;
  }

  // A linear weight as bound (FP8 / MXFP4 with their scales, BF16 or F32 as stored).
  Result<DeviceMatrix> matrix(const std::string& component, const cpu::LinearWeight& w, const std::string& read) {
    DeviceMatrix m;
    if (!w.data) return m;
    m.format = device_format_of(w.format);
    m.out = w.out;
    m.in = w.in;
    m.block_out = w.block_out;
    m.block_in = w.block_in;
    CEDAR_ASSIGN_OR_RETURN(m.data, place(component, w.data, m.data_bytes(), read));
    if (m.scale_bytes() > 0) {
      CEDAR_ASSIGN_OR_RETURN(m.scales, place(component, w.scale, m.scale_bytes(), read));
    }
    return m;
  }

  // BF16 values of a bf16-exact fp32 array (the router) or of an F32 LinearWeight holding bf16 values.
  Result<DeviceMatrix> bf16_from_f32(const std::string& component, const float* values, int64_t out, int64_t in,
                                     const std::string& read) {
    DeviceMatrix m;
    m.format = DeviceFormat::Bf16;
    m.out = out;
    m.in = in;
    std::vector<uint16_t> bits;
    if (device_base_ && values) {
      bits.resize(static_cast<size_t>(out * in));
      for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    }
    CEDAR_ASSIGN_OR_RETURN(m.data, place(component, bits.empty() ? nullptr : bits.data(), m.data_bytes(), read));
    return m;
  }

  // wo_a: BF16 values (as bound), or the checkpoint's FP8 blocks when asked for.
  Result<DeviceMatrix> wo_a(int64_t l, const cpu::LinearWeight& bound) {
    if (bound.format == WeightFormat::F32)
      return bf16_from_f32("attention", reinterpret_cast<const float*>(bound.data), bound.out, bound.in, "all");
    if (!o_.wo_a_fp8 || !c_.quant.quantized()) return matrix("attention", bound, "all");
    const std::string base = "layers." + std::to_string(l) + ".attn.wo_a.";
    CEDAR_ASSIGN_OR_RETURN(const io::TensorView data, w_.checkpoint().tensor(base + "weight"));
    CEDAR_ASSIGN_OR_RETURN(const io::TensorView scale, w_.checkpoint().tensor(base + "scale"));
    cpu::LinearWeight fp8 = bound;
    fp8.format = WeightFormat::FP8Block;
    fp8.data = data.bytes.data();
    fp8.scale = scale.bytes.data();
    fp8.block_out = c_.quant.weight_block_rows;
    fp8.block_in = c_.quant.weight_block_cols;
    DeviceMatrix m;
    CEDAR_ASSIGN_OR_RETURN(m, matrix("attention", fp8, "all"));
    if (m.bytes() != data.bytes.size() + scale.bytes.size())
      return make_error(base + "weight: stored FP8 bytes do not match its [" + std::to_string(m.out) + ", " +
                        std::to_string(m.in) + "] shape");
    if (device_base_)
      m.fp8_fast = fp8_weight_fast(data.bytes.data(), static_cast<int64_t>(data.bytes.size()), scale.bytes.data(),
                                 static_cast<int64_t>(scale.bytes.size()));
    return m;
  }

  Result<DeviceHc> hc(const HcWeights& w) {
    DeviceHc h;
    CEDAR_ASSIGN_OR_RETURN(h.fn, vec("mhc + norms", w.fn, "all"));
    CEDAR_ASSIGN_OR_RETURN(h.base, vec("mhc + norms", w.base, "all"));
    CEDAR_ASSIGN_OR_RETURN(h.scale, vec("mhc + norms", w.scale, "all"));
    return h;
  }

  // Every expert's matrix of one kind converted (`convert(e, out)`, `bytes` each) and placed in expert order. A
  // batch of experts converts on the pool at a time (each expert's bytes are its own, so the threads change
  // nothing); the batch bounds the host staging memory. Planning (no device) converts nothing.
  Result<std::vector<const uint8_t*>> convert_experts(size_t count, uint64_t bytes, const std::string& component,
                                                       const std::string& what,
                                                       const std::function<Status(size_t, uint8_t*)>& convert) {
    std::vector<const uint8_t*> ptrs;
    const size_t batch = std::max<size_t>(1, 2 * static_cast<size_t>(o_.pool ? o_.pool->size() : 1));
    std::vector<uint8_t> staging;
    for (size_t e0 = 0; e0 < count; e0 += batch) {
      const size_t n = std::min(batch, count - e0);
      if (device_base_) {
        staging.resize(n * bytes);
        std::vector<Status> status(n, Status::Ok());
        auto run = [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i)
            status[static_cast<size_t>(i)] = convert(e0 + static_cast<size_t>(i), staging.data() + i * bytes);
        };
        if (o_.pool)
          o_.pool->parallel_for(static_cast<int64_t>(n), run);
        else
          run(0, static_cast<int64_t>(n));
        for (size_t i = 0; i < n; ++i)
          if (!status[i].ok()) return status[i].error().with_context(what + " routed expert " + std::to_string(e0 + i));
      }
      for (size_t i = 0; i < n; ++i) {
        CEDAR_ASSIGN_OR_RETURN(const uint8_t* p,
                               place(component, device_base_ ? staging.data() + i * bytes : nullptr, bytes, "top-k"));
        ptrs.push_back(p);
      }
    }
    return ptrs;
  }

  // All experts of a layer, one contiguous run per matrix kind and part (data, scales), then the
  // per-expert pointer tables of each kind.
  Status experts(const std::vector<ExpertWeights>& ex, DeviceExperts& d) {
    d.count = static_cast<int64_t>(ex.size());
    if (ex.empty()) return Status::Ok();
    auto pick = [](const ExpertWeights& e, int k) -> const cpu::LinearWeight& {
      return k == DeviceExperts::kW1 ? e.w1 : (k == DeviceExperts::kW3 ? e.w3 : e.w2);
    };
    d.scales_checked = o_.mxfp4_scale_check && device_base_;  // checked as the scales are placed
    for (int k = 0; k < 3; ++k) {
      const cpu::LinearWeight& w0 = pick(ex[0], k);
      DeviceMatrix m;
      m.format = device_format_of(w0.format);
      m.out = w0.out;
      m.in = w0.in;
      m.block_out = w0.block_out;
      m.block_in = w0.block_in;
      const bool repack = o_.repack_mxfp4 && m.format == DeviceFormat::Mxfp4;
      d.repacked = repack;
      const uint64_t data_bytes = m.data_bytes(), scale_bytes = m.scale_bytes();
      std::vector<const uint8_t*> data_ptrs, scale_ptrs;
      for (size_t e = 0; e < ex.size(); ++e) {
        const cpu::LinearWeight& w = pick(ex[e], k);
        if (w.out != m.out || w.in != m.in || device_format_of(w.format) != m.format)
          return make_error("routed expert " + std::to_string(e) + " differs in shape or format from expert 0");
      }
      if (repack) {
        CEDAR_ASSIGN_OR_RETURN(data_ptrs, convert_experts(ex.size(), data_bytes, "routed experts", "repacking",
                                                          [&](size_t e, uint8_t* out) {
                                                            const cpu::LinearWeight& w = pick(ex[e], k);
                                                            return o_.repack_mxfp4(w.data, w.out, w.in, out);
                                                          }));
      } else {
        for (size_t e = 0; e < ex.size(); ++e) {
          CEDAR_ASSIGN_OR_RETURN(const uint8_t* p, place("routed experts", pick(ex[e], k).data, data_bytes, "top-k"));
          data_ptrs.push_back(p);
        }
      }
      for (size_t e = 0; e < ex.size() && scale_bytes > 0; ++e) {
        const uint8_t* scales = pick(ex[e], k).scale;
        if (d.scales_checked)
          d.scales_checked = m.format == DeviceFormat::Mxfp4 && o_.mxfp4_scale_check(scales, scale_bytes);
        CEDAR_ASSIGN_OR_RETURN(const uint8_t* p, place("routed experts", scales, scale_bytes, "top-k"));
        scale_ptrs.push_back(p);
      }
      if (o_.tile_mxfp4 && m.format == DeviceFormat::Mxfp4) {
        CEDAR_ASSIGN_OR_RETURN(const std::vector<const uint8_t*> tile_ptrs,
                               convert_experts(ex.size(), data_bytes + scale_bytes, "routed experts (tiles)", "tiling",
                                               [&](size_t e, uint8_t* out) {
                                                 const cpu::LinearWeight& w = pick(ex[e], k);
                                                 return o_.tile_mxfp4(w.data, w.scale, w.out, w.in, out);
                                               }));
        CEDAR_ASSIGN_OR_RETURN(const uint8_t* tt, place("routed experts (tiles)", tile_ptrs.data(),
                                                        tile_ptrs.size() * sizeof(const uint8_t*), "top-k"));
        d.tile_table[k] = reinterpret_cast<const uint8_t* const*>(tt);
      }
      if (repack && o_.keep_plain_mxfp4) {
        std::vector<const uint8_t*> plain_ptrs;
        for (size_t e = 0; e < ex.size(); ++e) {
          CEDAR_ASSIGN_OR_RETURN(const uint8_t* p,
                                 place("routed experts (plain)", pick(ex[e], k).data, data_bytes, "prefill"));
          plain_ptrs.push_back(p);
        }
        CEDAR_ASSIGN_OR_RETURN(const uint8_t* pt, place("routed experts (plain)", plain_ptrs.data(),
                                                        plain_ptrs.size() * sizeof(const uint8_t*), "prefill"));
        d.plain_data_table[k] = reinterpret_cast<const uint8_t* const*>(pt);
      }
      m.data = data_ptrs[0];
      m.scales = scale_ptrs.empty() ? nullptr : scale_ptrs[0];
      d.first[k] = m;
      d.data_stride[k] = static_cast<int64_t>(align_up(data_bytes));
      d.scale_stride[k] = static_cast<int64_t>(align_up(scale_bytes));
      CEDAR_ASSIGN_OR_RETURN(const uint8_t* dt, place("routed experts", data_ptrs.data(),
                                                      data_ptrs.size() * sizeof(const uint8_t*), "top-k"));
      d.data_table[k] = reinterpret_cast<const uint8_t* const*>(dt);
      if (!scale_ptrs.empty()) {
        CEDAR_ASSIGN_OR_RETURN(const uint8_t* st, place("routed experts", scale_ptrs.data(),
                                                        scale_ptrs.size() * sizeof(const uint8_t*), "top-k"));
        d.scale_table[k] = reinterpret_cast<const uint8_t* const*>(st);
      }
    }
    return Status::Ok();
  }

  Status layer(int64_t l, const LayerWeights& w, DeviceLayer& d) {
    const AttentionWeights& a = w.attn;
    CEDAR_ASSIGN_OR_RETURN(d.attn_norm, vec("mhc + norms", w.attn_norm, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.ffn_norm, vec("mhc + norms", w.ffn_norm, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.hc_attn, hc(w.hc_attn));
    CEDAR_ASSIGN_OR_RETURN(d.hc_ffn, hc(w.hc_ffn));
    CEDAR_ASSIGN_OR_RETURN(d.wq_a, matrix("attention", a.wq_a, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wq_b, matrix("attention", a.wq_b, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wkv, matrix("attention", a.wkv, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wo_a, wo_a(l, a.wo_a));
    CEDAR_ASSIGN_OR_RETURN(d.wo_b, matrix("attention", a.wo_b, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.q_norm, vec("attention", a.q_norm, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.kv_norm, vec("attention", a.kv_norm, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.attn_sink, vec("attention", a.attn_sink, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wkv_c, matrix("compressor", a.wkv_c, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wgate_c, matrix("compressor", a.wgate_c, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.norm_c, vec("compressor", a.norm_c, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wk, matrix("indexer", a.wk, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.k_norm, vec("indexer", a.k_norm, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.wq_b_i, matrix("indexer", a.wq_b_i, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.weights_proj, matrix("indexer", a.weights_proj, "all"));

    const MoeWeights& f = w.ffn;
    const int64_t experts_n = static_cast<int64_t>(f.experts.size());
    if (!f.gate.empty()) {
      if (static_cast<int64_t>(f.gate.size()) != experts_n * c_.hidden_size)
        return make_error("router weight has " + std::to_string(f.gate.size()) + " values, expected " +
                          std::to_string(experts_n) + " × " + std::to_string(c_.hidden_size));
      CEDAR_ASSIGN_OR_RETURN(d.gate, bf16_from_f32("router", f.gate.data(), experts_n, c_.hidden_size, "all"));
    }
    CEDAR_ASSIGN_OR_RETURN(d.gate_bias, vec("router", f.bias, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.shared_w1, matrix("shared expert", f.shared.w1, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.shared_w3, matrix("shared expert", f.shared.w3, "all"));
    CEDAR_ASSIGN_OR_RETURN(d.shared_w2, matrix("shared expert", f.shared.w2, "all"));
    CEDAR_RETURN_IF_ERROR(experts(f.experts, d.experts));

    if (w.engram) {
      const EngramWeights& e = *w.engram;
      DeviceEngram g;
      g.table_fp8 = e.table_format == WeightFormat::FP8Rows;
      g.table_in_host = o_.engram_tables_in_host;
      g.rows = e.rows;
      g.head_dim = e.head_dim;
      const uint64_t row_bytes = static_cast<uint64_t>(e.head_dim) * (g.table_fp8 ? 1 : 2);
      CEDAR_ASSIGN_OR_RETURN(
          g.table, place("engram tables", e.table, row_bytes * static_cast<uint64_t>(e.rows), "rows", g.table_in_host));
      if (g.table_fp8) {
        CEDAR_ASSIGN_OR_RETURN(g.table_scale,
                               place("engram tables", e.table_scale, static_cast<uint64_t>(e.rows * (e.head_dim / 32)),
                                     "rows", g.table_in_host));
      }
      CEDAR_ASSIGN_OR_RETURN(g.wkv, matrix("engram projections", e.wkv, "all"));
      if (e.q_weight.size() != e.k_weight.size()) return make_error("Engram q_weight and k_weight differ in size");
      std::vector<float> qk(e.q_weight.size());
      for (size_t i = 0; i < qk.size() && i < e.k_weight.size(); ++i) qk[i] = e.q_weight[i] * e.k_weight[i];
      CEDAR_ASSIGN_OR_RETURN(g.qk, vec("engram projections", qk, "all"));
      d.engram = g;
    }
    return Status::Ok();
  }

  const ModelConfig& c_;
  const BoundWeights& w_;
  const DeviceWeightOptions& o_;
  DeviceMemoryPlan* plan_ = nullptr;
  uint8_t* device_base_ = nullptr;
  uint8_t* host_base_ = nullptr;
  uint64_t device_offset_ = 0, host_offset_ = 0;
  uint64_t device_total_ = 0, host_total_ = 0;
};

Result<DeviceMemoryPlan> DeviceWeights::plan(const ModelConfig& c, const BoundWeights& w,
                                             const DeviceWeightOptions& options) {
  DeviceWeights scratch;
  DeviceWeightPlacer placer(c, w, options);
  CEDAR_RETURN_IF_ERROR(placer.run(scratch, nullptr, nullptr));
  return scratch.plan_;
}

Result<DeviceWeights> DeviceWeights::upload(const ModelConfig& c, const BoundWeights& w,
                                            const DeviceWeightOptions& options, const DeviceMemoryPlan& other,
                                            uint64_t headroom_bytes) {
  DeviceWeights out;
  DeviceWeightPlacer placer(c, w, options);
  CEDAR_RETURN_IF_ERROR(placer.run(out, nullptr, nullptr));  // sizes only

  DeviceMemoryPlan all = out.plan_;
  for (const MemoryPlanEntry& e : other.entries) all.add(e.component, e.bytes, e.in_host, e.read_per_step);
  size_t free_bytes = 0, total_bytes = 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const uint64_t need = placer.device_total() + other.device_bytes() + headroom_bytes;
  if (need > free_bytes) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "the model does not fit on this GPU: %.2f GB needed (%.2f GB of it headroom) but %.2f GB of %.2f GB "
                  "are free; memory plan:\n",
                  static_cast<double>(need) / 1e9, static_cast<double>(headroom_bytes) / 1e9,
                  static_cast<double>(free_bytes) / 1e9, static_cast<double>(total_bytes) / 1e9);
    return make_error(buf + all.table());
  }
  CEDAR_ASSIGN_OR_RETURN(out.storage_->device, DeviceBuffer<uint8_t>::allocate(placer.device_total()));
  if (placer.host_total() > 0)
    CEDAR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&out.storage_->host, placer.host_total(), cudaHostAllocMapped));
  CEDAR_RETURN_IF_ERROR(placer.run(out, out.storage_->device.get(), static_cast<uint8_t*>(out.storage_->host)));
  return out;
}

}  // namespace cedar::cuda
