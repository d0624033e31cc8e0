// cuda_kernels_bench: FP8 / MXFP4 GEMVs (plain and grouped), the fused mHC and the site norms, wq_a + wkv
// as one launch, wo_a (kbench_common.h).
#include "kbench_common.h"

namespace cedar::cuda::kbench {

void bench_gemv(const GemvShape& s, const std::vector<int64_t>& ns, double copy_gbps, cudaStream_t stream,
                std::vector<Row>& rows) {
  const bool fp4 = s.format == QuantWeightFormat::MXFP4;
  const size_t w_bytes = fp4 ? s.out * s.in / 2 : s.out * s.in;
  const size_t s_bytes = fp4 ? s.out * s.in / 32 : ((s.out + 31) / 32) * (s.in / 32);
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / (w_bytes + s_bytes) + 1));
  auto w = random_bytes(w_bytes * copies, 1, 0, 0, fp4 ? 0xFF : 0x7E);  // & 0x7E: no NaN codes
  auto sc = random_bytes(s_bytes * copies, 2, 118, 8);
  auto view = [&](int i) {
    return QuantWeightView{s.format, s.out, s.in, w.get() + i * w_bytes, sc.get() + i * s_bytes, 32, 32};
  };
  for (const int64_t n : ns) {
    auto x = random_floats(n * s.in, 3, 1.0f);
    auto codes = must(DeviceBuffer<uint16_t>::allocate(n * s.in));
    auto ascales = must(DeviceBuffer<float>::allocate(n * s.in / 32));
    auto y = must(DeviceBuffer<float>::allocate(n * s.out));
    const SplitKSize split = splitk_workspace_size(view(0));
    auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
    auto counters = must(DeviceBuffer<unsigned>::allocate(split.counters));
    must(counters.zero());
    const SplitKWorkspace splitk{part.get(), counters.get(), split.partial_floats, split.counters};
    must(quantize_act_fp8(x.get(), n, s.in, codes.get(), ascales.get(), stream));
    const double act_bytes = static_cast<double>(n * s.in) * (2.0 + 4.0 / 32.0);
    const double bytes = static_cast<double>(w_bytes + s_bytes) + act_bytes + 4.0 * n * s.out;
    const double us = time_graph_us(stream, copies, [&](int i) {
      must(gemv_quantized(view(i), codes.get(), ascales.get(), n, y.get(), true, stream, splitk));
    });
    const Row r0{fp4 ? "gemv_mxfp4" : "gemv_fp8",
                 std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, 0.0, 0.0};
    // The row of one variant: its name suffix, time and bytes (negative time: the launch was refused, no row).
    auto add = [&](const char* suffix, double t, double b) {
      if (t <= 0) return;
      Row v = r0;
      v.kernel += suffix;
      v.us = t;
      v.bytes = b;
      v.gbps = b / (t * 1e-6) / 1e9;
      v.pct_copy = 100.0 * v.gbps / copy_gbps;
      rows.push_back(v);
    };
    add("", us, bytes);
    // The whole linear(): activation quantization + GEMV (two graph nodes).
    const double us2 = time_graph_us(stream, copies, [&](int i) {
      must(linear_quantized(view(i), x.get(), n, ActWorkspace{codes.get(), ascales.get(), n * s.in, splitk}, y.get(), true,
                            stream));
    });
    add("+quant", us2, bytes + 4.0 * n * s.in);
    if (n == 1) {  // back-to-back with programmatic dependent launch: the next GEMV's launch and first
                   // weight lines overlap the previous one (what a PDL decode graph gets)
      add("_pdl", try_time_graph_us(stream, copies, [&](int i) {
            return gemv_quantized(view(i), codes.get(), ascales.get(), n, y.get(), true, stream, splitk, true);
          }),
          bytes);
      // The same weights every call (L2-resident when they fit, ~50 MB): what a GEMV whose weights were
      // prefetched into L2 beforehand would take — the ceiling of an L2 weight prefetch.
      add("_pdl_l2hot", try_time_graph_us(stream, copies, [&](int) {
            return gemv_quantized(view(0), codes.get(), ascales.get(), n, y.get(), true, stream, splitk, true);
          }),
          bytes);
    }
  }
}

// One launch for `count` matrices of one shape (a token's routed experts): weights rotate as above.
void bench_grouped(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                   std::vector<Row>& rows) {
  const bool fp4 = s.format == QuantWeightFormat::MXFP4;
  GroupedGemvInputs g = grouped_gemv_inputs(s, count, n, 11, stream);
  const QuantWeightView shape{s.format, s.out, s.in, g.w.get(), g.sc.get(), 32, 32};
  const SplitKSize split = splitk_workspace_size(shape, count);
  auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
  auto counters = must(DeviceBuffer<unsigned>::allocate(split.counters));
  must(counters.zero());
  const double us = time_graph_us(stream, g.copies, [&](int c) {
    must(gemv_quantized_grouped(shape, g.items_of(c), count, n, true, stream,
                                SplitKWorkspace{part.get(), counters.get(), split.partial_floats, split.counters}));
  });
  const double bytes = g.bytes();
  Row r{std::string(fp4 ? "gemv_mxfp4" : "gemv_fp8") + " x" + std::to_string(count),
        std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, us, bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  rows.push_back(r);
}

namespace {

// sinkhorn_iters = 20 is the model's; 1 isolates how much of the time the serial Sinkhorn tail costs.
// cluster: mhc_fused_cluster (ffn_kernels.h) instead of mhc_fused.
struct MhcMode {
  bool cluster = false, pdl = false;
  bool sized_ws = false;     // partial_floats / counter_count given: decode tiles in one launch, streaming path
  bool expand = true;        // y given (expand)
  bool coefficients = true;  // fn given
  bool collapse = true;
  bool legacy = false;         // MhcFusedArgs::legacy_decode (the session-3 decode kernel)
  bool legacy_stream = false;  // MhcFusedArgs::legacy_stream (the session-4 streaming kernel: FMA dot products)
  bool stream_c32 = false;     // MhcFusedArgs::stream_c32 (the s6 tensor-core kernel, 32-channel chunks)
  bool serial_finish = false;  // MhcFusedArgs::stream_serial_finish (the s6 finish: one thread per token)
  bool norm = false;           // + the RMSNorm of collapsed (normed): fused, or rms_norm after the legacy kernel
  bool norm_counter = false;   // MhcWorkspace::norm_counter (fn = null + norm: one launch up to 4 rows)
  int64_t stream_blocks = 0;   // MhcFusedArgs::stream_blocks (0: the default plan)
  // With norm, the FP8 codes of normed: 1 = written by the kernel that writes normed (normed_quant),
  // 2 = a quantize_act_fp8 launch after it (the path before s8-quantfold).
  int quant = 0;
  bool site_cluster = false;   // MhcFusedArgs::site_cluster (the split site as one thread-block cluster)
  const char* name = nullptr;  // row name override
};
void bench_mhc(int64_t n, int64_t d, int64_t sinkhorn_iters, double copy_gbps, cudaStream_t stream,
               std::vector<Row>& rows, MhcMode mode = {}) {
  if (mode.cluster) {
    if (Status s = mhc_cluster_supported(d); !s.ok()) {
      std::printf("mhc_fused_cluster not benchmarked: %s\n", s.error().message.c_str());
      return;
    }
  }
  const int64_t hc = 4, width = hc * d, mix = (2 + hc) * hc;
  const size_t fn_count = static_cast<size_t>(mix * width);
  const size_t x_bytes = static_cast<size_t>(n * width) * 4;
  // Weights (fn) rotate through HBM-sized copies at decode sizes; at prefill sizes X itself is far
  // larger than L2 and two calls alternate between two X buffers.
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / (fn_count * 4 + x_bytes) + 1));
  auto fn = random_floats(fn_count * copies, 4, 0.02f);
  auto X = tiled_floats(n * width * (x_bytes > (size_t{64} << 20) ? 2 : 1), 5, 1.0f);
  auto Xo = must(DeviceBuffer<float>::allocate(n * width));
  auto y = tiled_floats(n * d, 6, 1.0f);
  auto coeff = tiled_floats(n * mix, 7, 0.3f);  // post / comb / collapse weights (values irrelevant)
  auto base = random_floats(mix, 8, 1.0f);
  auto scale = random_floats(3, 9, 1.0f);
  auto col = must(DeviceBuffer<float>::allocate(n * d));
  auto mix_out = must(DeviceBuffer<float>::allocate(n * mix));
  auto norm_w = tiled_floats(d, 10, 1.0f);
  auto normed = must(DeviceBuffer<float>::allocate(n * d));
  // A forced block target may split the channels up to d / 32 ways: room for every split.
  const int64_t ws_floats = std::max(mhc_workspace_floats(n, d), mode.stream_blocks > 0 ? (d / 32) * n * 25 : 0);
  const int64_t ws_counters = mhc_workspace_counters(n);
  auto part = must(DeviceBuffer<float>::allocate(ws_floats));
  auto counter = must(DeviceBuffer<unsigned>::allocate(ws_counters));
  must(counter.zero());
  auto norm_counter = must(DeviceBuffer<unsigned>::allocate(kMhcNormCounters));
  must(norm_counter.zero());
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * d));
  auto code_scales = must(DeviceBuffer<float>::allocate(n * d / 32));
  const bool two_x = x_bytes > (size_t{64} << 20);
  auto launch = [&](int i) {
    MhcFusedArgs a;
    a.n = n;
    a.hc = hc;
    a.d = d;
    a.X = X.get() + (two_x ? (i % 2) * n * width : 0);
    a.y = mode.expand ? y.get() : nullptr;
    a.post = coeff.get();
    a.comb = coeff.get() + n * hc;
    a.X_out = Xo.get();
    a.collapse_w = mode.collapse ? coeff.get() : nullptr;
    a.collapsed = col.get();
    a.fn = mode.coefficients ? fn.get() + (i % copies) * fn_count : nullptr;
    a.base = base.get();
    a.scale = scale.get();
    a.mix_out = mix_out.get();
    a.sinkhorn_iters = sinkhorn_iters;
    a.programmatic_launch = mode.pdl && !mode.cluster;
    a.legacy_decode = mode.legacy;
    a.legacy_stream = mode.legacy_stream;
    a.stream_c32 = mode.stream_c32;
    a.stream_serial_finish = mode.serial_finish;
    a.stream_blocks = mode.stream_blocks;
    a.site_cluster = mode.site_cluster;
    if (mode.norm) {
      a.norm_weight = norm_w.get();
      a.normed = normed.get();
      if (mode.quant == 1) a.normed_quant = ActQuantOut{codes.get(), code_scales.get()};
    }
    MhcWorkspace ws{part.get(), counter.get()};
    if (mode.sized_ws) {
      ws.partial_floats = ws_floats;
      ws.counter_count = ws_counters;
    }
    if (mode.norm_counter) ws.norm_counter = norm_counter.get();
    const Status st = mode.cluster ? mhc_fused_cluster(a, stream, mode.pdl) : mhc_fused(a, ws, stream);
    if (!st.ok() || !mode.norm || mode.quant != 2) return st;
    return quantize_act_fp8(normed.get(), n, d, codes.get(), code_scales.get(), stream, a.programmatic_launch);
  };
  // PDL may be unsupported inside graphs on some drivers: that row is skipped instead of ending the run.
  const int calls = two_x ? 2 : copies;
  const double us = mode.pdl ? try_time_graph_us(stream, calls, launch)
                             : time_graph_us(stream, calls, [&](int i) { must(launch(i)); });
  if (us < 0) {
    std::printf("mHC with programmatic dependent launch: not supported here (skipped)\n");
    return;
  }
  // fn + X read + y read + X_out written + collapsed written (+ tiny coefficient traffic).
  const double bytes = 4.0 * ((mode.coefficients ? static_cast<double>(fn_count) : 0.0) + n * width +
                              (mode.expand ? n * d + n * width : 0.0) + (mode.collapse ? n * d : 0.0) +
                              (mode.norm ? d + n * d : 0.0)) +
                       (mode.quant ? 2.0 * n * d + 4.0 * n * d / 32 : 0.0);
  std::string name = mode.name ? mode.name
                     : mode.cluster ? (mode.pdl ? "mhc_fused_cluster_pdl" : "mhc_fused_cluster")
                                    : "mhc_fused";
  Row r{sinkhorn_iters == 20 ? name : name + "_sk" + std::to_string(sinkhorn_iters), "4x" + std::to_string(d), n, us,
        bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  rows.push_back(r);
}

// s8-quantfold: rms_norm writing the FP8 codes of its output (rms_norm_q) vs rms_norm + quantize_act_fp8
// (rms_norm+quant), each back to back with PDL (_pdl) and without.
void bench_norm_quant(int64_t n, int64_t dim, double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  auto x = tiled_floats(n * dim, 21, 1.0f);
  auto w = tiled_floats(dim, 22, 1.0f);
  auto y = must(DeviceBuffer<float>::allocate(n * dim));
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * dim));
  auto scales = must(DeviceBuffer<float>::allocate(n * dim / 32));
  const double bytes = 4.0 * (2.0 * n * dim + dim) + 2.0 * n * dim + 4.0 * n * dim / 32;
  for (const bool pdl : {false, true}) {
    for (const bool fused : {true, false}) {
      const double us = try_time_graph_us(stream, 8, [&](int) {
        if (fused)
          return rms_norm(x.get(), n, dim, w.get(), 1e-6f, y.get(), stream, pdl,
                          ActQuantOut{codes.get(), scales.get()});
        const Status st = rms_norm(x.get(), n, dim, w.get(), 1e-6f, y.get(), stream, pdl);
        return st.ok() ? quantize_act_fp8(y.get(), n, dim, codes.get(), scales.get(), stream, pdl) : st;
      });
      if (us < 0) {
        std::printf("rms_norm rows with programmatic dependent launch: not supported here (skipped)\n");
        continue;
      }
      Row r{std::string(fused ? "rms_norm_q" : "rms_norm+quant") + (pdl ? "_pdl" : ""), std::to_string(dim), n, us,
            bytes};
      r.gbps = bytes / (us * 1e-6) / 1e9;
      r.pct_copy = 100.0 * r.gbps / copy_gbps;
      rows.push_back(r);
    }
  }
}

}  // namespace

// The mhc section: the fused mHC in every variant the model can run (decode, split site, streaming
// prefill, cluster), the site norms with and without their FP8 codes, back to back with PDL.
void bench_mhc_all(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows);
  bench_mhc(1, 5120, 1, copy_gbps, stream, rows);
  {  // cuda-perf: the sized workspace (decode tiles in one launch; streaming path for prefill sizes),
     // PDL back to back, and the split of a decode site: expand + collapse (critical path) and the
     // coefficients alone (which can run on a forked graph branch next to the sublayer)
    MhcMode ws;
    ws.sized_ws = true;
    ws.name = "mhc_fused_ws";
    for (int64_t n : {1, 4, 8, 20, 64}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, ws);
    MhcMode pdl = ws;
    pdl.pdl = true;
    pdl.name = "mhc_fused_ws_pdl";
    for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, pdl);
    MhcMode ec = ws;
    ec.coefficients = false;
    ec.name = "mhc_expand_collapse";
    for (int64_t n : {1, 8, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, ec);
    MhcMode co = ws;
    co.expand = co.collapse = false;
    co.name = "mhc_coefficients";
    for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, co);
    MhcMode st = ws;
    st.name = "mhc_stream";
    for (int64_t n : {128, 1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, st);
    // s6-mhc3: mhc_stream has its dot products on the tensor cores (3xTF32); _fma is the session-4 kernel.
    // The channel split's block target (c64 default: 6 per SM = 792 from 128 token tiles on, else 528): rows
    // mhc_stream_b<target>.
    static const int64_t kTargets[] = {264, 528, 1584};
    static std::string target_names[std::size(kTargets)];
    for (size_t i = 0; i < std::size(kTargets); ++i) {
      MhcMode sb = st;
      sb.stream_blocks = kTargets[i];
      target_names[i] = "mhc_stream_b" + std::to_string(kTargets[i]);
      sb.name = target_names[i].c_str();
      for (int64_t n : {4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, sb);
    }
    {  // s8-mhcstream: mhc_stream is the c64 kernel + the one-lane-per-token finish; _c32 is the s6 path
       // (the 32-channel tensor-core kernel + the serial finish), _c64_serialfin isolates the finish.
      MhcMode c32 = st;
      c32.stream_c32 = c32.serial_finish = true;
      c32.name = "mhc_stream_c32";
      for (int64_t n : {1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, c32);
      MhcMode sf = st;
      sf.serial_finish = true;
      sf.name = "mhc_stream_c64_serialfin";
      for (int64_t n : {1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, sf);
    }
    st.legacy_stream = true;
    st.serial_finish = true;
    st.name = "mhc_stream_fma";
    for (int64_t n : {1024, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, st);
  }
  {  // p-mhc: the session-3 decode kernel (_legacy: one thread per token's coefficients) vs the current
     // one (a warp per token, inline reciprocals), and a whole site with its RMSNorm: legacy kernel +
     // rms_norm launch vs the norm fused into the last block; _pdl back to back as in the model.
    for (const bool legacy : {true, false}) {
      MhcMode m;
      m.sized_ws = true;
      m.legacy = legacy;
      m.name = legacy ? "mhc_decode_legacy" : "mhc_decode";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
      bench_mhc(1, 5120, 1, copy_gbps, stream, rows, m);
      m.norm = true;
      m.name = legacy ? "mhc_norm_legacy" : "mhc_norm";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
      m.pdl = true;
      m.name = legacy ? "mhc_norm_legacy_pdl" : "mhc_norm_pdl";
      for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
    }
  }
  {  // s6-normfuse: the critical half of a split decode site (paths.mhc_split): expand + collapse + the
     // input RMSNorm in one launch (norm_counter; up to kMhcNormFuseMaxTokens = 4 rows, n = 8 falls
     // back to two) vs mhc_elementwise_kernel + rms_norm (_2l); _pdl back to back as in the model.
    for (const bool one : {true, false}) {
      MhcMode m;
      m.sized_ws = true;
      m.coefficients = false;
      m.norm = true;
      m.norm_counter = one;
      m.name = one ? "mhc_expand_collapse_norm" : "mhc_expand_collapse_norm_2l";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
      m.pdl = true;
      m.name = one ? "mhc_expand_collapse_norm_pdl" : "mhc_expand_collapse_norm_2l_pdl";
      for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
    }
  }
  {  // s8-quantfold: the site norm with the FP8 codes of normed — written by the kernel that writes
     // normed (_q) vs a quantize_act_fp8 launch after it (+quant, the path before); the split site's
     // critical kernel (one launch up to 4 rows, elementwise + rms_norm at 8) and the decode kernel's
     // fused norm (the unsplit site); _pdl back to back as in the model.
    static const char* kNames[2][2][2] = {
        {{"mhc_expand_collapse_norm_q", "mhc_expand_collapse_norm+quant"},
         {"mhc_expand_collapse_norm_q_pdl", "mhc_expand_collapse_norm+quant_pdl"}},
        {{"mhc_norm_q", "mhc_norm+quant"}, {"mhc_norm_q_pdl", "mhc_norm+quant_pdl"}}};
    for (const bool split : {true, false}) {
      for (const int quant : {1, 2}) {
        MhcMode m;
        m.sized_ws = true;
        m.coefficients = !split;
        m.norm = true;
        m.norm_counter = split;
        m.quant = quant;
        m.name = kNames[split ? 0 : 1][0][quant - 1];
        for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
        m.pdl = true;
        m.name = kNames[split ? 0 : 1][1][quant - 1];
        for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, m);
      }
    }
    // s20: the split site's critical kernel as one thread-block cluster with the codes (site_cluster), next to
    // mhc_expand_collapse_norm+quant(_pdl) (the model's default: the ticket kernel, then quantize_act_fp8).
    MhcMode sc;
    sc.sized_ws = true;
    sc.coefficients = false;
    sc.norm = sc.norm_counter = sc.site_cluster = true;
    sc.quant = 1;
    sc.name = "mhc_site_cluster_q";
    for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, sc);
    sc.pdl = true;
    sc.name = "mhc_site_cluster_q_pdl";
    for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, sc);
    // q_norm (q_lora_rank rows of 1280 at the perf profile, 1536 in V4.1-Flash) and a 5120-wide norm.
    for (const int64_t dim : {int64_t{1280}, int64_t{1536}, int64_t{5120}})
      for (const int64_t n : {int64_t{1}, int64_t{8}}) bench_norm_quant(n, dim, copy_gbps, stream, rows);
  }
  // cuda-ffn: the cluster mHC.
  MhcMode cl;
  cl.cluster = true;
  for (int64_t n : {1, 4, 8, 20}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, cl);
  bench_mhc(1, 5120, 1, copy_gbps, stream, rows, cl);
  cl.pdl = true;
  for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream, rows, cl);  // back-to-back, PDL
}

// wq_a [1280, 5120] and wkv [512, 5120] (FP8) read the same normed input: two gemv_quantized calls
// (two graph nodes) next to one gemv_quantized_multi launch.
void bench_attn_input(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t in = 5120, outs[2] = {1280, 512};
  size_t wb[2], sb[2];
  for (int i = 0; i < 2; ++i) {
    wb[i] = outs[i] * in;
    sb[i] = (outs[i] / 32) * (in / 32);
  }
  const size_t pair = wb[0] + sb[0] + wb[1] + sb[1];
  const int copies = static_cast<int>(kRotateBytes / pair + 1);
  auto w = random_bytes(pair * copies, 95, 0, 0, 0x7E);  // scale bytes are random too: finite values
  auto x = random_floats(in, 96, 1.0f);
  auto codes = must(DeviceBuffer<uint16_t>::allocate(in));
  auto ascales = must(DeviceBuffer<float>::allocate(in / 32));
  must(quantize_act_fp8(x.get(), 1, in, codes.get(), ascales.get(), stream));
  auto y0 = must(DeviceBuffer<float>::allocate(outs[0])), y1 = must(DeviceBuffer<float>::allocate(outs[1]));
  auto base = [&](int c, int i) { return w.get() + c * pair + (i == 0 ? 0 : wb[0] + sb[0]); };
  QuantWeightView mats[2];
  for (int i = 0; i < 2; ++i) mats[i] = QuantWeightView{QuantWeightFormat::FP8Block, outs[i], in, nullptr, nullptr, 32, 32};
  SplitKSize need = splitk_workspace_size_multi(mats, 2);
  for (int i = 0; i < 2; ++i) {
    const SplitKSize one = splitk_workspace_size(mats[i]);
    need.partial_floats = std::max(need.partial_floats, one.partial_floats);
    need.counters = std::max(need.counters, one.counters);
  }
  auto part = must(DeviceBuffer<float>::allocate(std::max<int64_t>(need.partial_floats, 1)));
  auto cnt = must(DeviceBuffer<unsigned>::allocate(std::max<int64_t>(need.counters, 1)));
  must(cnt.zero());
  const SplitKWorkspace ws{part.get(), cnt.get(), need.partial_floats, need.counters};
  const double bytes = static_cast<double>(pair) + in * (2.0 + 4.0 / 32) + 4.0 * (outs[0] + outs[1]);
  double us = time_graph_us(stream, copies, [&](int c) {
    for (int i = 0; i < 2; ++i) {
      QuantWeightView v = mats[i];
      v.data = base(c, i);
      v.scales = base(c, i) + wb[i];
      must(gemv_quantized(v, codes.get(), ascales.get(), 1, i == 0 ? y0.get() : y1.get(), true, stream, ws));
    }
  });
  rows.push_back(make_row("gemv_fp8 wq_a, wkv", "1280+512 x5120 (2 calls)", 1, us, bytes, copy_gbps));
  us = time_graph_us(stream, copies, [&](int c) {
    GemvGroupItem items[2];
    for (int i = 0; i < 2; ++i)
      items[i] = GemvGroupItem{base(c, i), base(c, i) + wb[i], codes.get(), ascales.get(), i == 0 ? y0.get() : y1.get()};
    must(gemv_quantized_multi(mats, items, 2, 1, true, stream, ws));
  });
  rows.push_back(make_row("gemv_fp8_multi wq_a+wkv", "1280+512 x5120 (1 launch)", 1, us, bytes, copy_gbps));
}

// wo_a (8 groups of [1024, 4096] over o's slices): gemv_bf16 on the BF16 weight (67 MB, the reference's
// dequantized values) next to the same GEMV reading the weight as stored (FP8 + UE8M0 32×32: 34 MB),
// dequantized in registers — the same results bit for bit; at n <= 8 also the staged FP8 GEMV
// (stage_act_f16 + gemv_fp8_staged: the same exact products, summed per 32-block).
void bench_wo_a(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t groups = 8, out = 1024, in = 4096, total = groups * out;
  const size_t w8 = total * in, s8 = (total / 32) * (in / 32), w16 = 2 * w8;
  const int copies8 = static_cast<int>(kRotateBytes / (w8 + s8) + 1), copies16 = static_cast<int>(kRotateBytes / w16 + 1);
  auto wfp8 = random_bytes(w8 * copies8, 91, 0, 0, 0x7E);
  auto sfp8 = random_bytes(s8 * copies8, 92, 112, 8);
  auto wbf = random_bytes(w16 * copies16, 93, 0x30, 16);
  for (int64_t n : {1, 8, 64}) {
    auto x = random_floats(n * groups * in, 94, 1.0f);
    auto y = must(DeviceBuffer<float>::allocate(n * total));
    const double act = 4.0 * n * (groups * in + total);
    auto wo_a = [&]() {  // the GEMV's shape and operands, without the weight
      Bf16GemvArgs a;
      a.out = out;
      a.in = in;
      a.groups = groups;
      a.x = x.get();
      a.y = y.get();
      a.n = n;
      a.bf16_output = true;
      return a;
    };
    double us = time_graph_us(stream, copies16, [&](int c) {
      Bf16GemvArgs a = wo_a();
      a.w = reinterpret_cast<const uint16_t*>(wbf.get() + c * w16);
      must(gemv_bf16(a, stream));
    });
    rows.push_back(make_row("gemv_bf16 wo_a", "8x1024x4096 bf16", n, us, w16 + act, copy_gbps));
    // The weight as stored; `fast`: checked at upload as the model does (Bf16GemvArgs::w_fp8_fast, no
    // per-chunk check; the timing does not depend on the bytes).
    auto fp8w = [&](int c, bool pdl, bool fast) {
      Bf16GemvArgs a = wo_a();
      a.w_fp8 = wfp8.get() + c * w8;
      a.w_scales = sfp8.get() + c * s8;
      a.w_fp8_fast = fast;
      a.programmatic_launch = pdl;
      return a;
    };
    us = time_graph_us(stream, copies8, [&](int c) { must(gemv_bf16(fp8w(c, false, false), stream)); });
    rows.push_back(make_row("gemv_fp8w wo_a", "8x1024x4096 fp8", n, us, w8 + s8 + act, copy_gbps));
    for (const bool fast : {false, true}) {
      us = try_time_graph_us(stream, copies8, [&](int c) { return gemv_bf16(fp8w(c, true, fast), stream); });
      if (us > 0)
        rows.push_back(make_row(fast ? "gemv_fp8w_fast_pdl wo_a" : "gemv_fp8w_pdl wo_a", "8x1024x4096 fp8", n, us,
                                w8 + s8 + act, copy_gbps));
    }
    if (n > 8) continue;
    // paths.wo_a_f16 (s8-woa16): o staged as exact f16 blocks (stage_act_f16) + the FP8 grouped GEMV
    // (gemv_fp8_staged, two launches), and the GEMV alone on already staged codes — the model's decode
    // path at n <= 8. Bytes as above (the staging's own codes round trip is not counted).
    auto codes = must(DeviceBuffer<uint16_t>::allocate(n * groups * in));
    auto cscales = must(DeviceBuffer<float>::allocate(n * groups * in / 32));
    auto staged = [&](int c) {
      StagedGemvArgs a;
      a.w = QuantWeightView{QuantWeightFormat::FP8Block, total, in, wfp8.get() + c * w8, sfp8.get() + c * s8, 32, 32};
      a.groups = groups;
      a.x = x.get();
      a.y = y.get();
      a.n = n;
      a.codes = codes.get();
      a.scales = cscales.get();
      a.capacity_values = n * groups * in;
      a.programmatic_launch = true;
      return a;
    };
    us = try_time_graph_us(stream, copies8, [&](int c) { return gemv_fp8_staged(staged(c), stream); });
    if (us > 0)
      rows.push_back(make_row("stage_f16+gemv_fp8_pdl wo_a", "8x1024x4096 fp8", n, us, w8 + s8 + act, copy_gbps));
    must(stage_act_f16(x.get(), n, groups * in, codes.get(), cscales.get(), stream));
    us = try_time_graph_us(stream, copies8, [&](int c) {
      const StagedGemvArgs a = staged(c);
      std::vector<GemvGroupItem> items(groups);
      for (int64_t g = 0; g < groups; ++g)
        items[g] = GemvGroupItem{a.w.data + g * out * in, a.w.scales + g * (out / 32) * (in / 32),
                                 codes.get() + g * in,    cscales.get() + g * in / 32,
                                 y.get() + g * out,       groups * in,
                                 groups * in / 32,        groups * out};
      const QuantWeightView shape{QuantWeightFormat::FP8Block, out, in, nullptr, nullptr, 32, 32};
      return gemv_quantized_grouped(shape, items.data(), groups, n, true, stream, {}, true);
    });
    if (us > 0)
      rows.push_back(make_row("gemv_fp8_f16act_pdl wo_a", "8x1024x4096 fp8 (staged)", n, us,
                              w8 + s8 + n * groups * in * (2.0 + 4.0 / 32) + 4.0 * n * total, copy_gbps));
    us = try_time_graph_us(stream, copies8, [&](int) {
      return stage_act_f16(x.get(), n, groups * in, codes.get(), cscales.get(), stream, true);
    });
    if (us > 0)
      rows.push_back(
          make_row("stage_act_f16_pdl wo_a", "8x4096", n, us, n * groups * in * (4.0 + 2.0 + 4.0 / 32), copy_gbps));
  }
}

}  // namespace cedar::cuda::kbench
