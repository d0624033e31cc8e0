// cuda_kernels_bench: the FFN side — packed MXFP4 experts, the routed path as the model runs it, the
// router and its stamps, Engram, the head and the samplers (kbench_common.h).
#include "kbench_common.h"

namespace cedar::cuda::kbench {

// Packed-layout MXFP4 GEMV next to the plain rows above (same shapes, same byte accounting). Weight
// values do not change the timing; the packed kernel reads the same bytes in another order.
void bench_packed(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                  std::vector<Row>& rows, bool balanced) {
  const GemvShape fp4{s.name, QuantWeightFormat::MXFP4, s.out, s.in};
  GroupedGemvInputs g = grouped_gemv_inputs(fp4, count, n, 21, stream);
  const QuantWeightView shape{QuantWeightFormat::MXFP4, s.out, s.in, g.w.get(), g.sc.get(), 32, 32};
  const double us = time_graph_us(stream, g.copies, [&](int c) {
    must(gemv_mxfp4_packed_grouped(shape, g.items_of(c), count, n, true, stream, balanced));
  });
  const double bytes = g.bytes();
  rows.push_back(make_row(std::string(balanced ? "gemv_mxfp4_packbal" : "gemv_mxfp4_packed") +
                              (count > 1 ? " x" + std::to_string(count) : ""),
                          std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, us, bytes,
                          copy_gbps));
}

// The routed experts of a decode step as the CUDA model runs them: n tokens × top-6 of 384 experts
// (random routing per graph node, so weights come from HBM), device item tables, one launch for w1+w3
// and one for w2; plain and packed layouts; and the whole routed path (items + w1/w3 + SwiGLU + w2).
// Bytes: the distinct experts' weights and scales + activations + outputs.
// `pool` holds the 384 experts' weights (7.2 GB), allocated by the first call.
void bench_moe_items(int64_t n, DeviceBuffer<uint8_t>& pool, double copy_gbps, cudaStream_t stream,
                     std::vector<Row>& rows) {
  constexpr int64_t E = 384, K = 6, d = 5120, inter = 2304;
  constexpr int kSteps = 8;  // routings in the graph
  const size_t w13 = inter * d / 2, s13 = inter * d / 32, w2 = d * inter / 2, s2 = d * inter / 32;
  const size_t per_expert = 2 * (w13 + s13) + w2 + s2;
  if (pool.empty()) {
    pool = must(DeviceBuffer<uint8_t>::allocate(per_expert * E));
    must(cuda_status(cudaMemset(pool.get(), 0x3B, pool.bytes()), "cudaMemset(experts)"));  // finite codes and scales
  }
  std::vector<const uint8_t*> p1(E), q1(E), p3(E), q3(E), p2(E), q2(E);
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* b = pool.get() + e * per_expert;
    p1[e] = b;
    q1[e] = b + w13;
    p3[e] = b + w13 + s13;
    q3[e] = p3[e] + w13;
    p2[e] = q3[e] + s13;
    q2[e] = p2[e] + w2;
  }
  auto t1 = must(DeviceBuffer<const uint8_t*>::from_host(p1)), u1 = must(DeviceBuffer<const uint8_t*>::from_host(q1));
  auto t3 = must(DeviceBuffer<const uint8_t*>::from_host(p3)), u3 = must(DeviceBuffer<const uint8_t*>::from_host(q3));
  auto t2 = must(DeviceBuffer<const uint8_t*>::from_host(p2)), u2 = must(DeviceBuffer<const uint8_t*>::from_host(q2));
  const int64_t P = n * K;
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> routing(kSteps * P);
  std::vector<int64_t> distinct(kSteps);
  for (int c = 0; c < kSteps; ++c) {
    std::vector<int32_t> used;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> sel;
      while (static_cast<int64_t>(sel.size()) < K) {
        const auto e = static_cast<int32_t>(rng() % E);
        if (std::find(sel.begin(), sel.end(), e) == sel.end()) sel.push_back(e);
      }
      for (int64_t k = 0; k < K; ++k) routing[c * P + t * K + k] = sel[k];
      used.insert(used.end(), sel.begin(), sel.end());
    }
    std::sort(used.begin(), used.end());
    distinct[c] = std::unique(used.begin(), used.end()) - used.begin();
  }
  double mean_distinct = 0;
  for (int64_t v : distinct) mean_distinct += static_cast<double>(v) / kSteps;
  auto experts = must(DeviceBuffer<int32_t>::from_host(routing));
  auto x = random_floats(n * d, 31, 1.0f);
  auto xc = must(DeviceBuffer<uint16_t>::allocate(n * d));
  auto xs = must(DeviceBuffer<float>::allocate(n * d / 32));
  must(quantize_act_fp8(x.get(), n, d, xc.get(), xs.get(), stream));
  auto g = must(DeviceBuffer<float>::allocate(P * inter)), u = must(DeviceBuffer<float>::allocate(P * inter));
  auto hcodes = must(DeviceBuffer<uint16_t>::allocate(P * inter));
  auto hscales = must(DeviceBuffer<float>::allocate(P * inter / 32));
  auto out = must(DeviceBuffer<float>::allocate(P * d));
  auto weights = random_floats(P, 32, 0.3f);
  auto items13 = must(DeviceBuffer<DeviceGemvItem>::allocate(kSteps * 2 * P));
  auto items2 = must(DeviceBuffer<DeviceGemvItem>::allocate(kSteps * P));
  auto counts = must(DeviceBuffer<int32_t>::allocate(kSteps * 2));
  auto dispatch = [&](int c) {
    MoeDispatchArgs a;
    a.experts = experts.get() + c * P;
    a.n = n;
    a.topk = K;
    a.n_experts = E;
    a.n_tables = 2;
    a.tables[0] = MoeItemTable{2, {{t1.get(), u1.get()}, {t3.get(), u3.get()}}, {g.get(), u.get()}, xc.get(), xs.get(),
                               false, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P};
    a.tables[1] = MoeItemTable{1, {{t2.get(), u2.get()}, {}}, {out.get(), nullptr}, hcodes.get(), hscales.get(), true,
                               items2.get() + c * P, counts.get() + 2 * c + 1, P};
    must(moe_build_items(a, stream));
  };
  for (int c = 0; c < kSteps; ++c) dispatch(c);
  must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  const QuantWeightView shape13{QuantWeightFormat::MXFP4, inter, d, nullptr, nullptr, 32, 32};
  const QuantWeightView shape2{QuantWeightFormat::MXFP4, d, inter, nullptr, nullptr, 32, 32};
  const double act13 = static_cast<double>(n * d) * (2.0 + 4.0 / 32.0), act2 = static_cast<double>(P * inter) * (2.0 + 4.0 / 32.0);
  const double bytes13 = mean_distinct * 2 * (w13 + s13) + act13 + 4.0 * 2 * P * inter;
  const double bytes2 = mean_distinct * (w2 + s2) + act2 + 4.0 * P * d;
  const std::string shape = "top6/384 n=" + std::to_string(n) + " (" + std::to_string(static_cast<int>(mean_distinct + 0.5)) +
                            " experts)";
  for (const Mxfp4Layout packed : {Mxfp4Layout::Plain, Mxfp4Layout::Packed, Mxfp4Layout::PackedBalanced}) {
    const std::string tag = packed == Mxfp4Layout::Plain ? "" : packed == Mxfp4Layout::Packed ? "_packed" : "_packbal";
    double us = time_graph_us(stream, kSteps, [&](int c) {
      must(gemv_quantized_items(shape13, packed, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream));
    });
    rows.push_back(make_row("moe_items_w13" + tag, shape, n, us, bytes13, copy_gbps));
    us = time_graph_us(stream, kSteps, [&](int c) {
      must(gemv_quantized_items(shape2, packed, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_items_w2" + tag, shape, n, us, bytes2, copy_gbps));
    // The routed path of one layer: dispatch + w1/w3 + SwiGLU/quant + w2 (4 graph nodes).
    us = time_graph_us(stream, kSteps, [&](int c) {
      dispatch(c);
      must(gemv_quantized_items(shape13, packed, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream));
      must(swiglu(SwigluArgs{P, inter, g.get(), u.get(), weights.get(), 10.0f, nullptr, hcodes.get(), hscales.get()}, stream));
      must(gemv_quantized_items(shape2, packed, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_routed_path" + tag, shape, n, us, bytes13 + bytes2, copy_gbps));
  }
  // The model's chain: the same 4 nodes with programmatic (PDL) edges after the dispatch, and the GEMVs'
  // units taken from work counters; at the default split and forced to 2 and 4 warps (`routed_warps`).
  // -1: the tile layout; -2 / -3: with w1/w3 requesting w2's weights into L2 before / after each block's units
  // (`routed_w2_prefetch` 1 / 2).
  for (const int warps : {0, 2, 4, -1, -2, -3}) {
    const Mxfp4Layout bal = warps < 0 ? Mxfp4Layout::Tiles : Mxfp4Layout::PackedBalanced;
    auto work = must(DeviceBuffer<unsigned>::allocate(4));
    must(work.zero());
    const double us = time_graph_us(stream, kSteps, [&](int c) {
      dispatch(c);
      const int split = warps < 0 ? 0 : warps;
      GemvItemsOptions o13{.programmatic_launch = true, .work = work.get(), .packed_warps = split};
      if (warps < -1)
        o13.l2_prefetch = TilesL2Prefetch{.items = items2.get() + c * P,
                                          .count = counts.get() + 2 * c + 1,
                                          .capacity = P,
                                          .out = d,
                                          .in = inter,
                                          .after_units = warps == -3};
      must(gemv_quantized_items(shape13, bal, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream,
                                o13));
      SwigluArgs sw{P, inter, g.get(), u.get(), weights.get(), 10.0f, nullptr, hcodes.get(), hscales.get()};
      sw.programmatic_launch = true;
      must(swiglu(sw, stream));
      must(gemv_quantized_items(shape2, bal, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream,
                                {.programmatic_launch = true, .work = work.get() + 2, .packed_warps = split}));
    });
    const std::string tag = warps == 0    ? ""
                            : warps == -1 ? "_tiles"
                            : warps < -1  ? "_tiles_w2pf" + std::to_string(-1 - warps)
                                          : "_w" + std::to_string(warps);
    rows.push_back(make_row("moe_routed_path_packbal_pdl" + tag, shape, n, us, bytes13 + bytes2, copy_gbps));
  }
  // The balanced packed kernel at every forced split (2..8 warps per block, a wave of resident blocks
  // each): the sweep behind gemv_quantized_items' default split (4 warps).
  if (n <= 8) {
    // w1/w3 and w2 rows of the balanced packed kernel under `opt`, named moe_items_w13 / _w2 + tag.
    auto balanced_rows = [&](const std::string& tag, const GemvItemsOptions& opt,
                             Mxfp4Layout layout = Mxfp4Layout::PackedBalanced) {
      double us = time_graph_us(stream, kSteps, [&](int c) {
        must(gemv_quantized_items(shape13, layout, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream,
                                  opt));
      });
      rows.push_back(make_row("moe_items_w13" + tag, shape, n, us, bytes13, copy_gbps));
      us = time_graph_us(stream, kSteps, [&](int c) {
        must(gemv_quantized_items(shape2, layout, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream, opt));
      });
      rows.push_back(make_row("moe_items_w2" + tag, shape, n, us, bytes2, copy_gbps));
    };
    for (int warps = 2; warps <= 8; ++warps) balanced_rows("_packbal_w" + std::to_string(warps), {.packed_warps = warps});
    // The model's option: the scale product as an exponent add (GemvItemsOptions::scale_exp_add). The bench's
    // random scale bytes are not range-checked: the rows time the kernel, their values are not used.
    balanced_rows("_packbal_expadd", {.scale_exp_add = true});
    // The tile layout (gemv_tiles.cu: the same arithmetic, weights streamed by TMA into per-warp rings). The
    // pool's experts are contiguous data + scales, which is the tile layout's size: the same bytes are read.
    balanced_rows("_tiles_expadd", {.scale_exp_add = true}, Mxfp4Layout::Tiles);
    // The same experts every call (w2: 38 MB at n = 1, L2-resident): the ceiling of an L2 weight prefetch.
    const double us = time_graph_us(stream, kSteps, [&](int) {
      must(gemv_quantized_items(shape2, Mxfp4Layout::PackedBalanced, items2.get(), counts.get() + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_items_w2_packbal_l2hot", shape, n, us, bytes2, copy_gbps));
    // The tile kernel's too: what w2 could take if w1/w3's prefetch of its weights stayed in L2.
    const double us_tiles = time_graph_us(stream, kSteps, [&](int) {
      must(gemv_quantized_items(shape2, Mxfp4Layout::Tiles, items2.get(), counts.get() + 1, P, true, stream,
                                {.scale_exp_add = true}));
    });
    rows.push_back(make_row("moe_items_w2_tiles_expadd_l2hot", shape, n, us_tiles, bytes2, copy_gbps));
  }
}

// The router rows' V4.1 gate (copies rotated so every call reads it from HBM), bias and split-K workspace.
struct RouterBenchGate {
  static constexpr int64_t d = 5120, E = 384, K = 6;
  static constexpr size_t gate_bytes = E * d * 2;
  int copies = static_cast<int>(kRotateBytes / gate_bytes + 1);
  DeviceBuffer<uint8_t> gate = random_bytes(gate_bytes * copies, 41, 0x30, 16);  // small bf16 values
  DeviceBuffer<float> bias = random_floats(E, 42, 0.1f);
  SplitKSize rws = router_workspace_size(E, d);
  DeviceBuffer<float> part = must(DeviceBuffer<float>::allocate(rws.partial_floats));
  DeviceBuffer<unsigned> cnt = must(DeviceBuffer<unsigned>::allocate(rws.counters));
  RouterBenchGate() { must(cnt.zero()); }

  // Call c's arguments for n tokens (with the split-K workspace when `splitk`).
  RouterArgs args(int64_t n, int c, const float* x, float* logits, int32_t* experts, float* weights, bool splitk) {
    RouterArgs a;
    a.n = n;
    a.d = d;
    a.n_experts = E;
    a.topk = K;
    a.x = x;
    a.gate = reinterpret_cast<const uint16_t*>(gate.get() + (c % copies) * gate_bytes);
    a.bias = bias.get();
    a.route_scale = 1.5f;
    a.logits = logits;
    a.experts = experts;
    a.weights = weights;
    if (splitk) a.splitk = SplitKWorkspace{part.get(), cnt.get(), rws.partial_floats, rws.counters};
    return a;
  }
};

// The fused router as the model's decode runs it (moe_route with the expert dispatch: 2 item tables over
// 384 experts' pointer tables); then where one launch's time goes, from its stamps (RouterArgs::stamps;
// eager launches, medians).
void bench_router_tail(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  RouterBenchGate g;
  constexpr int64_t d = RouterBenchGate::d, E = RouterBenchGate::E, K = RouterBenchGate::K;
  const int copies = g.copies;
  // Pointer tables per layer copy (as the model's: one per layer, cold in L2 at each call); the pointers
  // name a dummy buffer (the items are written, never used).
  auto dummy = must(DeviceBuffer<uint8_t>::allocate(4096));
  const std::vector<const uint8_t*> names(E, dummy.get());
  std::vector<DeviceBuffer<const uint8_t*>> tables;
  for (int c = 0; c < copies * 6; ++c) tables.push_back(must(DeviceBuffer<const uint8_t*>::from_host(names)));
  const int64_t blocks = router_fused_blocks(E, d);
  auto stamps = must(DeviceBuffer<unsigned long long>::allocate(blocks * kRouterStampsPerBlock + kRouterTailStamps));
  for (const int64_t n : {1, 8}) {
    const int64_t P = n * K;
    auto x = random_floats(n * d, 43, 1.0f);
    auto logits = must(DeviceBuffer<float>::allocate(n * E));
    auto ex = must(DeviceBuffer<int32_t>::allocate(P));
    auto wt = must(DeviceBuffer<float>::allocate(P));
    auto items13 = must(DeviceBuffer<DeviceGemvItem>::allocate(2 * P));
    auto items2 = must(DeviceBuffer<DeviceGemvItem>::allocate(P));
    auto counts = must(DeviceBuffer<int32_t>::allocate(2));
    auto fp = must(DeviceBuffer<float>::allocate(P * d));
    auto codes = must(DeviceBuffer<uint16_t>::allocate(P * d));
    auto args = [&](int c, unsigned long long* st, bool block_build, bool one_token = true) {
      RouterArgs a = g.args(n, c, x.get(), logits.get(), ex.get(), wt.get(), true);
      a.stamps = st;
      a.one_token_select = one_token;
      MoeDispatchArgs m;
      m.block_build = block_build;
      m.experts = ex.get();
      m.n = n;
      m.topk = K;
      m.n_experts = E;
      m.n_tables = 2;
      const auto t = [&](int i) { return tables[static_cast<size_t>((c % copies) * 6 + i)].get(); };
      m.tables[0] = MoeItemTable{2, {{t(0), t(1)}, {t(2), t(3)}}, {fp.get(), fp.get()}, codes.get(), fp.get(), false,
                                 items13.get(), counts.get(), 2 * P};
      m.tables[1] = MoeItemTable{1, {{t(4), t(5)}, {}}, {fp.get(), nullptr}, codes.get(), fp.get(), true,
                                 items2.get(), counts.get() + 1, P};
      return std::make_pair(a, m);
    };
    // The decode's dispatch (one warp builds up to kMoeWarpBuildPairs pairs), the block-wide builder, and the
    // one-token selection by one warp (RouterArgs::one_token_select = false).
    struct Variant {
      const char* name;
      bool block_build, one_token;
    };
    for (const Variant& var : {Variant{"moe_route_ws_items", false, true},
                               Variant{"moe_route_ws_items_block", true, true},
                               Variant{"moe_route_ws_items_onewarp", false, false}}) {
      const bool block_build = var.block_build;
      if (!var.one_token && n != 1) continue;  // the same launch as the first row above one token
      const double us = time_graph_us(stream, copies, [&](int c) {
        const auto [a, m] = args(c, nullptr, block_build, var.one_token);
        must(moe_route(a, stream, &m));
      });
      rows.push_back(make_row(var.name, "384x5120 bf16 gate", n, us, g.gate_bytes + 4.0 * n * d, copy_gbps));
      if (launch_once() || n != 1) continue;
      // Stamps of 32 eager launches (each after a sync: no overlap), in µs from the first block's entry.
      constexpr int kRuns = 32;
      std::vector<double> spread, stored, ticket, tail_us, sums, select, build;
      for (int r = 0; r < kRuns; ++r) {
        must(stamps.zero());
        const auto [a, m] = args(r, stamps.get(), block_build, var.one_token);
        must(moe_route(a, stream, &m));
        must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
        std::vector<unsigned long long> st(static_cast<size_t>(blocks * kRouterStampsPerBlock + kRouterTailStamps));
        must(cuda_status(cudaMemcpy(st.data(), stamps.get(), st.size() * sizeof(st[0]), cudaMemcpyDeviceToHost),
                         "cudaMemcpy(stamps)"));
        unsigned long long first = ~0ull, last_entry = 0, last_stored = 0, last_ticket = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          const unsigned long long* v = st.data() + b * kRouterStampsPerBlock;
          first = std::min(first, v[0]);
          last_entry = std::max(last_entry, v[0]);
          last_stored = std::max(last_stored, v[2]);
          last_ticket = std::max(last_ticket, v[3]);
        }
        const unsigned long long* t = st.data() + blocks * kRouterStampsPerBlock;
        spread.push_back((last_entry - first) * 1e-3);
        stored.push_back((last_stored - first) * 1e-3);
        ticket.push_back((last_ticket - first) * 1e-3);
        tail_us.push_back((t[4] - last_ticket) * 1e-3);
        sums.push_back(static_cast<double>(t[1] - t[0]));
        select.push_back(static_cast<double>(t[2] - t[1]));
        build.push_back(static_cast<double>(t[3] - t[2]));
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      std::printf(
          "router stamps n=1 %s items, %s selection (%lld blocks, medians of %d launches): last block entry +%.2f "
          "us, all partials stored +%.2f, last ticket +%.2f, tail %.2f us (sums + scores %.0f cycles, selection %.0f, "
          "items %.0f)\n",
          block_build ? "block" : "warp", var.one_token ? "every-warp" : "one-warp", static_cast<long long>(blocks),
          kRuns, median(spread),
          median(stored), median(ticket), median(tail_us), median(sums), median(select), median(build));
    }
  }
}

// Router (logits + select) on the V4.1 gate, Engram gather (device and host-mapped table), the Engram
// update, the final head and the samplers: the small per-layer / per-step kernels and their latency.
void bench_ffn_small(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t d = 5120, E = 384, K = 6;
  {  // router: without a workspace (what callers that pass none get), with one (n <= 8: one fused
     // launch), and prefill sizes through cuBLASLt when it loads
    RouterBenchGate g;
    const int copies = g.copies;
    auto blas = BlasContext::create();
    if (!blas.ok()) std::printf("moe_route_blas not benchmarked: %s\n", blas.error().message.c_str());
    enum class Mode { Plain, Workspace, Blas };
    // select_only: router_select alone on given logits (the fused launch's selection tail, separately).
    auto route_rows = [&](int64_t n, Mode mode, bool logits_only, bool select_only = false) {
      auto x = random_floats(n * d, 43, 1.0f);
      auto xb = must(DeviceBuffer<uint16_t>::allocate(n * d));
      auto logits = random_floats(n * E, 44, 2.0f);
      auto ex = must(DeviceBuffer<int32_t>::allocate(n * K));
      auto wt = must(DeviceBuffer<float>::allocate(n * K));
      const int reps = n >= 1024 ? 4 : copies;
      const double us = time_graph_us(stream, reps, [&](int c) {
        RouterArgs a = g.args(n, c, x.get(), logits.get(), ex.get(), wt.get(), mode != Mode::Plain);
        if (mode == Mode::Blas) {
          a.blas = blas->get();
          a.x_bf16 = xb.get();
          a.x_bf16_elems = n * d;
        }
        must(select_only ? router_select(a, stream) : logits_only ? router_logits(a, stream) : moe_route(a, stream));
      });
      const char* name = select_only   ? "router_select"
                         : logits_only ? "router_logits_ws"
                         : mode == Mode::Plain ? "moe_route"
                         : mode == Mode::Workspace ? "moe_route_ws"
                                                   : "moe_route_blas";
      rows.push_back(make_row(name, "384x5120 bf16 gate", n, us, g.gate_bytes + 4.0 * n * d, copy_gbps));
    };
    for (int64_t n : {1, 8, 64}) route_rows(n, Mode::Plain, false);
    for (int64_t n : {1, 2, 8, 64, 1024}) route_rows(n, Mode::Workspace, false);
    route_rows(1, Mode::Workspace, true);
    for (int64_t n : {1, 8}) route_rows(n, Mode::Workspace, false, true);
    if (blas.ok())
      for (int64_t n : {1024, 8192}) route_rows(n, Mode::Blas, false);
  }
  {  // p-mhc: moe_combine (6 routed rows + the shared one per token; model stage moe.combine ~10 us before)
    for (int64_t n : {1, 8}) {
      std::vector<int32_t> ids(n * K);
      for (int64_t i = 0; i < n * K; ++i) ids[i] = static_cast<int32_t>((i * 37) % E);
      auto experts = must(DeviceBuffer<int32_t>::from_host(ids));
      auto routed = tiled_floats(n * K * d, 51, 1.0f);
      auto shared = tiled_floats(n * d, 52, 1.0f);
      auto y = must(DeviceBuffer<float>::allocate(n * d));
      const double us = time_graph_us(stream, 8, [&](int) {
        must(moe_combine(MoeCombineArgs{n, K, d, experts.get(), routed.get(), shared.get(), y.get()}, stream));
      });
      rows.push_back(make_row("moe_combine", "top6 x5120 + shared", n, us, 4.0 * n * d * (K + 2), copy_gbps));
    }
  }
  {  // Engram gather: 24 rows of 256 + 8 bytes per token from a 2 GiB table (device) or host-mapped
    constexpr int64_t cols = 24, hd = 256, table_rows = int64_t{1} << 23;  // 8 Mi rows
    auto table = must(DeviceBuffer<uint8_t>::allocate(table_rows * hd));
    auto tscale = must(DeviceBuffer<uint8_t>::allocate(table_rows * hd / 32));
    must(cuda_status(cudaMemset(table.get(), 0x30, table.bytes()), "cudaMemset(table)"));
    must(cuda_status(cudaMemset(tscale.get(), 118, tscale.bytes()), "cudaMemset(table scales)"));
    constexpr int64_t host_rows = int64_t{1} << 20;  // 256 MiB pinned
    uint8_t* host = nullptr;
    uint8_t* host_scale = nullptr;
    must(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&host), host_rows * hd, cudaHostAllocMapped), "cudaHostAlloc"));
    must(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&host_scale), host_rows * hd / 32, cudaHostAllocMapped),
                     "cudaHostAlloc"));
    std::memset(host, 0x30, host_rows * hd);
    std::memset(host_scale, 118, host_rows * hd / 32);
    uint8_t* host_dev = nullptr;
    uint8_t* host_scale_dev = nullptr;
    must(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0), "cudaHostGetDevicePointer"));
    must(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_scale_dev), host_scale, 0),
                     "cudaHostGetDevicePointer"));
    constexpr int kSteps = 16;
    for (int64_t n : {1, 64}) {
      for (const bool mapped : {false, true}) {
        const int64_t nrows = mapped ? host_rows : table_rows;
        std::mt19937_64 rng(51);
        std::vector<int64_t> r(kSteps * n * cols);
        for (auto& v : r) v = static_cast<int64_t>(rng() % nrows);
        auto drows = must(DeviceBuffer<int64_t>::from_host(r));
        auto codes = must(DeviceBuffer<uint16_t>::allocate(n * cols * hd));
        auto scales = must(DeviceBuffer<float>::allocate(n * cols * hd / 32));
        const double us = time_graph_us(stream, kSteps, [&](int c) {
          EngramGatherArgs a;
          a.n = n;
          a.cols = cols;
          a.head_dim = hd;
          a.rows = drows.get() + c * n * cols;
          a.table_rows = nrows;
          a.table = mapped ? host_dev : table.get();
          a.table_scale = mapped ? host_scale_dev : tscale.get();
          a.codes = codes.get();
          a.scales = scales.get();
          must(engram_gather_quant(a, stream));
        });
        const double bytes = static_cast<double>(n * cols) * (hd + hd / 32) + n * cols * hd * (2.0 + 4.0 / 32);
        rows.push_back(make_row(mapped ? "engram_gather_hostmap" : "engram_gather", "24 rows x 256 fp8", n, us, bytes,
                                copy_gbps));
      }
    }
    cudaFreeHost(host);
    cudaFreeHost(host_scale);
  }
  {  // Engram wkv (the largest GEMV of the model: 25600×6144 FP8, 157 MB) and the gated update
    const GemvShape wkv{"engram_wkv", QuantWeightFormat::FP8Block, 25600, 6144};
    bench_gemv(wkv, {1}, copy_gbps, stream, rows);
    for (int64_t n : {1, 8}) {
      auto X = random_floats(n * 4 * d, 61, 1.0f);
      auto kv = random_floats(n * 5 * d, 62, 1.0f);
      auto qk = random_floats(4 * d, 63, 1.0f);
      const double us = time_graph_us(stream, 8, [&](int) {
        EngramUpdateArgs a;
        a.n = n;
        a.hc = 4;
        a.d = d;
        a.X = X.get();
        a.kv = kv.get();
        a.qk = qk.get();
        must(engram_update(a, stream));
      });
      rows.push_back(make_row("engram_update", "4x5120", n, us, 4.0 * (2.0 * n * 4 * d + n * 5 * d + 4 * d), copy_gbps));
    }
  }
  {  // final collapse + RMSNorm + fp32 head (129280×5120 bf16, 1.3 GB: HBM every call)
    constexpr int64_t vocab = 129280;
    auto head = must(DeviceBuffer<uint16_t>::allocate(vocab * d));
    must(cuda_status(cudaMemset(head.get(), 0x3C, head.bytes()), "cudaMemset(head)"));
    auto normw = random_floats(d, 71, 1.0f);
    const SplitKSize split = gemv_bf16_splitk_size(vocab, d);
    auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
    auto cnt = must(DeviceBuffer<unsigned>::allocate(split.counters));
    must(cnt.zero());
    for (int64_t n : {1, 8}) {
      auto X = random_floats(n * 4 * d, 72, 1.0f);
      auto pre = random_floats(n * 4, 73, 0.5f);
      auto x = must(DeviceBuffer<float>::allocate(n * d));
      auto logits = must(DeviceBuffer<float>::allocate(n * vocab));
      auto tok = must(DeviceBuffer<int32_t>::allocate(n));
      const double us = time_graph_us(stream, 1, [&](int) {
        FinalHeadArgs a;
        a.n = n;
        a.d = d;
        a.vocab = vocab;
        a.X = X.get();
        a.pre = pre.get();
        a.norm_weight = normw.get();
        a.head = head.get();
        a.x = x.get();
        a.logits = logits.get();
        a.splitk = SplitKWorkspace{part.get(), cnt.get(), split.partial_floats, split.counters};
        must(final_head(a, stream));
      });
      rows.push_back(make_row("final_head", "129280x5120 bf16", n, us, 2.0 * vocab * d + 4.0 * n * (vocab + 5 * d), copy_gbps));
      const double us2 = time_graph_us(stream, 4, [&](int) { must(argmax_rows(logits.get(), n, vocab, tok.get(), stream)); });
      rows.push_back(make_row("argmax", "129280", n, us2, 4.0 * n * vocab, copy_gbps));
    }
  }
  {  // sampler: temperature only, top-k 50, top-p 0.9 (the radix passes), batch 1 and 64
    constexpr int64_t vocab = 129280;
    for (int64_t n : {1, 64}) {
      auto logits = random_floats(n * vocab, 81, 2.5f);
      auto ws = must(DeviceBuffer<double>::allocate(2 * n * vocab));
      auto tok = must(DeviceBuffer<int32_t>::allocate(n));
      auto rng = must(DeviceBuffer<Pcg32State>::from_host(std::vector<Pcg32State>(n, pcg32_seeded(1, kSamplerRngStream))));
      auto bias = must(DeviceBuffer<LogitBiasEntry>::allocate(1));
      auto pen = must(DeviceBuffer<PenaltyEntry>::allocate(1));
      struct Variant {
        const char* name;
        double temperature, top_p;
        int64_t top_k;
      };
      for (const Variant& v : {Variant{"sample_T0.8", 0.8, 1.0, 0}, Variant{"sample_topk50", 1.0, 1.0, 50},
                               Variant{"sample_topp0.9", 0.7, 0.9, 0}}) {
        std::vector<SamplingRowParams> p(n);
        for (auto& q : p) {
          q.temperature = v.temperature;
          q.top_p = v.top_p;
          q.top_k = v.top_k;
        }
        auto dp = must(DeviceBuffer<SamplingRowParams>::from_host(p));
        const double us = time_graph_us(stream, 4, [&](int) {
          must(sample_rows(SampleArgs{n, vocab, logits.get(), dp.get(), bias.get(), pen.get(), rng.get(), ws.get(), tok.get()},
                           stream));
        });
        rows.push_back(make_row(v.name, "129280", n, us, 4.0 * n * vocab, copy_gbps));
      }
    }
  }
}

}  // namespace cedar::cuda::kbench
