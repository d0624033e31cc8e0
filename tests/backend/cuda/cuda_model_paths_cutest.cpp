// The CUDA model's kernel-path switches (CudaKernelPaths, wo_a_fp8) on make-tiny checkpoints (profiles tiny and
// small): those that change launches only must give every logit bit for bit (LaunchOnlySwitchesAreBitIdentical,
// the concurrent branches, wo_a as FP8); those that change a summation order meet the CPU model's parity bounds
// (cuda_model_cutest.cpp explains them).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_model_test_util.h"

namespace cedar::cuda {
namespace {

using namespace model_testing;

class CudaModelPaths : public ::testing::TestWithParam<std::string> {};


TEST_P(CudaModelPaths, LaunchOnlySwitchesAreBitIdentical) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  CudaModel& g = *m->gpu;
  PathsGuard guard(g);
  const std::vector<int64_t> ids = prompt(77, 31);
  const int64_t V = g.config().vocab_size;
  // PDL changes when kernels start, never what they read: on top of the new defaults and of the legacy
  // loop. The sized mHC workspace runs the same decode kernel for all tiles in one launch (< 128 rows).
  const CudaKernelPaths fast = CudaKernelPaths(), old = with(CudaKernelPaths::legacy(), "mhc_cluster=0");
  struct Case {
    std::string name;
    CudaKernelPaths a, b;
    // Decode-graph nodes b has more than a at batch 1 (launches removed by a), or -1: not checked.
    int64_t fewer_nodes = -1;
    // a fuses q_norm with the SWA KV encode: b has one node more per layer a fused (q_norm_kv_layers > 0).
    bool q_norm_kv = false;
  };
  // fused_act_quant removes a quantize launch per layer (qr), site_act_quant two (the attention and the
  // ffn site's x); swa_commit_aside moves a launch to another stream (events add no nodes).
  const int64_t L = g.plan().num_layers(), site_nodes = 2 * L;
  // site_combine: every layer after the first combines in its attention site, but the Engram layers (their
  // expand runs alone before Engram, after a combine launch).
  int64_t combine_sites = L - 1;
  for (const int64_t e : g.config().engram_layer_ids) combine_sites -= e > 0 ? 1 : 0;
  // scale_exp_add below is a real comparison wherever the experts are packed: their scales passed the check.
  const DeviceExperts& experts0 = g.weights().layers()[0].experts;
  if (experts0.repacked) {
    EXPECT_TRUE(experts0.scales_checked) << GetParam() << ": expert scales outside 9..127";
    // routed_tiles below is a real comparison wherever the experts are packed (the small profile): the tile
    // copy was uploaded too.
    EXPECT_NE(experts0.tile_table[DeviceExperts::kW1], nullptr) << GetParam() << ": packed experts without tiles";
  }
  const CudaKernelPaths legacy_cluster = CudaKernelPaths::legacy();  // the cluster kernel + rms_norm at 5..127 rows
  const Case cases[] = {
      {"defaults: programmatic_launch 1 vs 0", fast, with(fast, "programmatic_launch=0")},
      {"legacy: programmatic_launch 1 vs 0", with(old, "programmatic_launch=1"), old},
      {"legacy: mhc_batched 1 vs 0", with(old, "mhc_batched=1"), old},
      // The input norm fused into mhc_fused's decode kernel repeats rms_norm's arithmetic op for op.
      {"defaults: mhc_fused_norm 1 vs 0", fast, with(fast, "mhc_fused_norm=0")},
      // The split site runs the same expand / collapse / norm / coefficient arithmetic in other launches.
      {"defaults: mhc_split 1 vs 0", fast, with(fast, "mhc_split=0")},
      // The split site's norm in its expand / collapse launch repeats rms_norm's arithmetic op for op.
      {"defaults: mhc_split_norm 1 vs 0", fast, with(fast, "mhc_split_norm=0")},
      // The Engram gathers + wkv GEMVs on their own stream from the step's start: the same kernels on
      // the same inputs into other buffers (the workload's decode steps run batch 2 and 1, both Engram
      // layers, on the GEMV path with concurrent branches).
      {"defaults: engram_ahead 1 vs 0", fast, with(fast, "engram_ahead=0")},
      {"legacy: engram_ahead 1 vs 0", with(old, "engram_ahead=1"), old},
      // The FP8 codes of xn / qr written by the kernels that write xn / qr (act_quant.cuh: quantize_act_fp8's
      // operations), on each kernel path that writes the site norm: the split site (one launch / two at
      // batch > 4), the decode kernel's fused norm (mhc_split=0, and the serial run below), rms_norm after
      // the mHC (mhc_fused_norm=0 in prefill, legacy), the cluster kernel + rms_norm (legacy).
      {"defaults: fused_act_quant 1 vs 0", fast, with(fast, "fused_act_quant=0"), L},
      // site_cluster implies the site codes where its kernel runs, so site_act_quant is compared without it.
      {"site_cluster=0: site_act_quant 1 vs 0", with(fast, "site_cluster=0,site_act_quant=1"),
       with(fast, "site_cluster=0"), site_nodes},
      // The split site as one thread-block cluster where it fits (the small profile's d = 512; tiny's 64 keeps
      // the ticket kernel), with the site codes it implies there: the quantize launches after the sites are gone.
      {"defaults: site_cluster 1 vs 0", fast, with(fast, "site_cluster=0"),
       mhc_site_cluster_fits(1, g.config().hidden_size) ? site_nodes : 0},
      {"mhc_split=0: site_act_quant 1 vs 0", with(fast, "mhc_split=0,site_act_quant=1"), with(fast, "mhc_split=0"),
       site_nodes},
      {"mhc_fused_norm=0: site_act_quant 1 vs 0", with(fast, "mhc_fused_norm=0,site_cluster=0,site_act_quant=1"),
       with(fast, "mhc_fused_norm=0,site_cluster=0"), site_nodes},
      {"legacy: fused + site act quant 1 vs 0", with(old, "fused_act_quant=1,site_act_quant=1"), old, L + site_nodes},
      {"legacy + mhc_cluster: fused + site act quant 1 vs 0",
       with(legacy_cluster, "fused_act_quant=1,site_act_quant=1"), legacy_cluster, L + site_nodes},
      // The router + dispatch before the fork instead of in the routed branch: with the unsplit logits on
      // both sides (router_splitk=0) only the placement differs.
      {"router_splitk=0: router_ahead 1 vs 0", with(fast, "router_splitk=0,router_ahead=1"), with(fast, "router_splitk=0")},
      // The items built by the fused router's last block instead of moe_build_items (one launch less per
      // layer); the main stream's first kernel after a fork on a programmatic edge (no node added).
      {"router_ahead=1: dispatch_in_router 1 vs 0", with(fast, "router_ahead=1,dispatch_in_router=1"),
       with(fast, "router_ahead=1,dispatch_in_router=0"), L},
      {"defaults: dispatch_in_router 1 vs 0", fast, with(fast, "dispatch_in_router=0"), L},
      // The fused router's batch-1 selection by every warp (select_one_token_block): the same launches and bits.
      {"defaults: router_one_token 1 vs 0", fast, with(fast, "router_one_token=0"), 0},
      {"defaults: fork_pdl 1 vs 0", fast, with(fast, "fork_pdl=0"), 0},
      // The compressor layers' query head on a programmatic edge too: the same launches.
      {"defaults: fork_pdl_compressor 1 vs 0", with(fast, "fork_pdl_compressor=1"), fast, 0},
      // q_norm and the SWA KV encode in one launch where the keys branch is the encode alone (no fork there).
      {"defaults: q_norm_kv_encode 1 vs 0", fast, with(fast, "q_norm_kv_encode=0"), -1, true},
      // The merge triggering its dependents at its start: the same launches, the same bits.
      {"defaults: attn_merge_trigger 1 vs 0", fast, with(fast, "attn_merge_trigger=0"), 0},
      // The routed w1 / w3 on a full edge after the router: the same launches.
      {"defaults: routed_full_edge 1 vs 0", fast, with(fast, "routed_full_edge=0"), 0},
      // wo_a's f16 staging written by the attention's merge (stage_act_f16's bits): a stage launch less per
      // layer whose attention merges (not checked: the tiny model's layers split their keys or not).
      {"defaults: attn_stage_wo_a 1 vs 0", fast, with(fast, "attn_stage_wo_a=0")},
      // The MoE combine done by the next attention site's kernel (moe_combine's bits): one launch less per
      // such site (the last layer's combine runs before the final expand).
      {"defaults: site_combine 1 vs 0", fast, with(fast, "site_combine=0"), combine_sites},
      // The routed GEMVs' scale product as an exponent add (the packed experts of the small profile, whose
      // scale bytes pass the upload check): the same bits, the same launches.
      {"defaults: scale_exp_add 1 vs 0", fast, with(fast, "scale_exp_add=0"), 0},
      // The routed GEMVs over the tile layout (TMA-fed rings, the balanced packed kernel's arithmetic): the
      // same bits, the same launches; with and without the exponent add.
      {"defaults: routed_tiles 1 vs 0", fast, with(fast, "routed_tiles=0"), 0},
      {"scale_exp_add=0: routed_tiles 1 vs 0", with(fast, "scale_exp_add=0"),
       with(fast, "scale_exp_add=0,routed_tiles=0"), 0},
      // The routed w2's weights requested into L2 by the w1 / w3 launch (a hint): the same launches and bits.
      {"defaults: routed_w2_prefetch 1 vs 0", with(fast, "routed_w2_prefetch=1"), fast, 0},
      {"defaults: routed_w2_prefetch 2 vs 0", with(fast, "routed_w2_prefetch=2"), fast, 0},
      // The shared expert's w2 after the routed w1 / w3 (an event across the branches): the same launches.
      {"defaults: shared_w2_late 1 vs 0", with(fast, "shared_w2_late=1"), fast, 0},
      {"shared_splitk=0: shared_w2_late 1 vs 0", with(fast, "shared_splitk=0,shared_w2_late=1"),
       with(fast, "shared_splitk=0"), 0},
      // The mHC decode kernel with one token's registers in one-row launches: the same launches and bits.
      {"defaults: mhc_one_token 1 vs 0", with(fast, "mhc_one_token=1"), fast, 0},
      {"mhc_split=0: mhc_one_token 1 vs 0", with(fast, "mhc_split=0,mhc_one_token=1"), with(fast, "mhc_split=0"), 0},
      {"router_ahead + dispatch_in_router: fork_pdl 1 vs 0", with(fast, "router_ahead=1,dispatch_in_router=1,fork_pdl=1"),
       with(fast, "router_ahead=1,dispatch_in_router=1,fork_pdl=0"), 0},
      // The split-K router beside the shared expert vs before the fork: the same launches, placed.
      {"dispatch_in_router=1: router_splitk_beside 1 vs router_ahead 1",
       with(fast, "dispatch_in_router=1,router_splitk_beside=1"),
       with(fast, "dispatch_in_router=1,router_splitk_beside=0,router_ahead=1"), 0},
      // The ring commit on the aux stream after the attention, joined at the ffn site.
      {"defaults: swa_commit_aside 1 vs 0", fast, with(fast, "swa_commit_aside=0"), 0},
      {"legacy: swa_commit_aside 1 vs 0", with(old, "swa_commit_aside=1"), old, 0},
      // One shared-memory carveout on every decode graph node: where kernels run, not what they compute.
      {"defaults: graph_carveout 100 vs 0", with(fast, "graph_carveout=100"), fast, 0},
      {"defaults: graph_carveout 72 vs 0", with(fast, "graph_carveout=72"), fast, 0},
  };
  const int64_t engram_layers = static_cast<int64_t>(g.config().engram_layer_ids.size());
  ASSERT_GT(engram_layers, 0) << GetParam() << ": no Engram layers, engram_ahead is not exercised";
  for (const Case& c : cases) {
    g.set_paths(c.a);
    const std::vector<float> a = gpu_workload(g, ids);
    const int64_t ahead_a = g.engram_ahead_layers();
    const size_t nodes_a = g.decode_graph_nodes(1);
    const int64_t q_norm_kv_a = g.q_norm_kv_layers();
    g.set_paths(c.b);
    const std::vector<float> b = gpu_workload(g, ids);
    expect_bitwise(GetParam() + " " + c.name, a, b, V);
    if (c.fewer_nodes >= 0) {
      const size_t nodes_b = g.decode_graph_nodes(1);
      std::printf("MODEL %-60s decode graph (batch 1): %zu vs %zu nodes\n", (GetParam() + " " + c.name).c_str(),
                  nodes_a, nodes_b);
      ASSERT_GT(nodes_a, 0u) << GetParam() << " " << c.name << ": no decode graph at batch 1";
      EXPECT_EQ(static_cast<int64_t>(nodes_b) - static_cast<int64_t>(nodes_a), c.fewer_nodes)
          << GetParam() << " " << c.name << ": decode graph nodes " << nodes_a << " vs " << nodes_b;
    }
    if (c.q_norm_kv) {
      EXPECT_EQ(g.q_norm_kv_layers(), 0) << GetParam() << " " << c.name << " (b fused q_norm with the encode)";
      const size_t nodes_b = g.decode_graph_nodes(1);
      std::printf("MODEL %-60s decode graph (batch 1): %zu vs %zu nodes, %ld layers fused\n",
                  (GetParam() + " " + c.name).c_str(), nodes_a, nodes_b, static_cast<long>(q_norm_kv_a));
      EXPECT_GT(q_norm_kv_a, 0) << GetParam() << " " << c.name << ": no layer fused q_norm with the encode";
      EXPECT_LE(q_norm_kv_a, L) << GetParam() << " " << c.name;
      EXPECT_EQ(static_cast<int64_t>(nodes_b) - static_cast<int64_t>(nodes_a), q_norm_kv_a)
          << GetParam() << " " << c.name << ": decode graph nodes " << nodes_a << " vs " << nodes_b;
    }
    // The last call of the workload is a decode step (batch 1, captured): every Engram layer ahead or none.
    EXPECT_EQ(ahead_a, c.a.engram_ahead ? engram_layers : 0) << GetParam() << " " << c.name << " (a)";
    EXPECT_EQ(g.engram_ahead_layers(), c.b.engram_ahead ? engram_layers : 0) << GetParam() << " " << c.name << " (b)";
  }
  // Serial without concurrent branches (the path the A/B baseline and profiling take).
  g.set_paths(fast);
  g.use_concurrent_branches(false);
  (void)gpu_workload(g, ids);
  g.use_concurrent_branches(m->options.concurrent_branches);
  EXPECT_EQ(g.engram_ahead_layers(), 0) << GetParam() << ": engram_ahead ran without concurrent branches";
}

// The concurrent branches above one GEMV tile (branches_above_tile): a decode batch of 12 with the query beside the
// keys, the routed experts beside the shared expert and the ring commit aside, against the same batch on one stream
// (concurrent branches off). Each branch runs the same kernels on the same inputs into its own buffers, so every
// logit must be the same bits, over the direct first step of the shape, its capture and the replays.
TEST_P(CudaModelPaths, BranchesAboveTheTileAreBitwise) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  CudaModel& g = *m->gpu;
  PathsGuard guard(g);
  const CudaKernelPaths fast = g.options().paths;
  constexpr int64_t kBatch = 12;
  ASSERT_TRUE(fast.branches_above_tile && fast.gemv_max_rows >= kBatch && fast.moe_items_max_rows >= kBatch &&
              m->options.concurrent_branches)
      << GetParam() << ": the default paths do not fork at batch " << kBatch << "; nothing is compared";
  auto run = [&](bool concurrent) {
    g.use_concurrent_branches(concurrent);
    g.set_paths(fast);  // drops the graphs captured with the other setting
    std::vector<CudaSequence> seqs;
    for (int64_t i = 0; i < kBatch; ++i) {
      auto s = g.new_sequence({});
      EXPECT_TRUE(s.ok()) << s.error().message;
      if (!s.ok()) return std::vector<float>{};
      CudaStepOutput out;
      EXPECT_TRUE(g.prefill(*s, prompt(6 + 3 * i, 40 + i), LogitRows::None, out).ok());
      seqs.push_back(std::move(*s));
    }
    std::vector<float> all;
    for (int step = 0; step < 4; ++step) {  // direct, capture, replays
      const StepInputs in = step_inputs(seqs, kBatch, 300, 17, step);
      CudaStepOutput out;
      EXPECT_TRUE(g.decode_step(in.ptrs, in.toks, out).ok());
      const Logits l = gpu_logits(g, out);
      all.insert(all.end(), l.values.begin(), l.values.end());
    }
    return all;
  };
  const std::vector<float> forked = run(true);
  EXPECT_TRUE(g.has_decode_graph(kBatch)) << GetParam() << ": no decode graph was captured for batch " << kBatch;
  const std::vector<float> serial = run(false);
  g.use_concurrent_branches(m->options.concurrent_branches);
  ASSERT_EQ(forked.size(), serial.size());
  ASSERT_FALSE(forked.empty());
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < forked.size(); ++i)
    if (std::memcmp(&forked[i], &serial[i], sizeof(float)) != 0 && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0u) << GetParam() << ": " << diff << " of " << forked.size()
                      << " logits differ with the branches forked above the tile; first at " << first << ": "
                      << (diff ? forked[first] : 0.0f) << " vs " << (diff ? serial[first] : 0.0f);
}

TEST_P(CudaModelPaths, Fp8WoAEqualsBf16WoABitwise) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  std::string error;
  CudaModel* bf16 = variant_for(*m, &error);
  ASSERT_NE(bf16, nullptr) << error;
  ASSERT_TRUE(m->gpu->wo_a_fp8()) << "the default load kept wo_a as BF16: wo_a_fp8 is not exercised";
  ASSERT_FALSE(bf16->wo_a_fp8()) << "wo_a_fp8 = false still uploaded FP8";
  PathsGuard g1(*m->gpu), g2(*bf16);
  // The FP8 GEMV dequantizes in registers to the bf16 values of the load-time conversion and runs the
  // same MMAs; above 64 rows dequant_weight_bf16 + the same cuBLASLt GEMM: identical on every path.
  CudaKernelPaths p;
  p.moe_items_max_rows = kGemvMaxRows;  // the variant's item tables are larger: keep its routing paths equal
  // The staged FP8 GEMV (wo_a_f16) sums per 32-block, so it is not bitwise gemv_bf16: this test is about
  // the weight as stored read by gemv_bf16 (StagedWoAIsTakenAndMatchesCpu covers the staged path).
  p.wo_a_f16 = false;
  m->gpu->set_paths(p);
  bf16->set_paths(p);
  const std::vector<int64_t> ids = prompt(77, 32);
  expect_bitwise(GetParam() + " wo_a FP8 vs BF16", gpu_workload(*m->gpu, ids), gpu_workload(*bf16, ids),
                 m->gpu->config().vocab_size);
}

TEST_P(CudaModelPaths, StagedWoAIsTakenAndMatchesCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  CudaModel& g = *m->gpu;
  PathsGuard guard(g);
  // The defaults run wo_a through gemv_fp8_staged (o staged as exact f16 blocks + the FP8 grouped GEMV)
  // at every GEMV row count — so the default parity tests (chunks of <= 8 rows, decode, the batched decode
  // above 8 rows) check it against the CPU; above gemv_max_rows rows, and with wo_a_f16 = 0, gemv_bf16 (or
  // cuBLASLt) as before.
  ASSERT_TRUE(g.wo_a_fp8()) << GetParam() << ": wo_a is not FP8 on the device: the staged path cannot run";
  const int64_t gemv_rows = g.options().paths.gemv_max_rows;
  for (int64_t n = 1; n <= gemv_rows; ++n)
    ASSERT_TRUE(g.wo_a_f16_active(n)) << GetParam() << ": " << n << " rows do not take the staged wo_a path "
                                      << "(fp8_fast failed at upload, the group height is not whole scale blocks, "
                                      << "or act_capacity is too small)";
  EXPECT_FALSE(g.wo_a_f16_active(gemv_rows + 1));
  g.set_paths(with(CudaKernelPaths(), "wo_a_f16=0"));
  EXPECT_FALSE(g.wo_a_f16_active(1)) << "wo_a_f16=0 still takes the staged path";
  // The switch's other side (gemv_bf16 over the FP8 weight) within the same CPU bounds, then the staged
  // path on the same prompt: the two scenarios differ only in the switch.
  const Scenario off = run_scenario(*m, prompt(77, 36), {}, 4, false);
  check_scenario(GetParam() + " wo_a_f16=0 77", off);
  g.set_paths(CudaKernelPaths());
  const Scenario on = run_scenario(*m, prompt(77, 36), {}, 4, false);
  check_scenario(GetParam() + " wo_a_f16=1 77", on);
}

TEST_P(CudaModelPaths, CublasPrefillAndStreamingMhcMatchCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  PathsGuard guard(*m->gpu);
  // 128 rows in one call (max_chunk): the streaming mHC kernel (>= kMhcStreamMinTokens rows) and, with
  // blas_min_rows = 9, every FP8 / MXFP4 linear and the shared expert through exact bf16 + cuBLASLt —
  // summation orders differ from the tile kernels', so the CPU oracle's bounds apply.
  CudaKernelPaths p;
  p.blas_min_rows = 9;
  m->gpu->set_paths(p);
  const Scenario sc = run_scenario(*m, prompt(128, 33), {}, 4, false);
  check_scenario(GetParam() + " cublas + streaming mhc 128", sc);
  if (!m->gpu->has_cublas()) GTEST_SKIP() << "cuBLASLt did not load: only the streaming mHC path was checked";
}

TEST_P(CudaModelPaths, UnsplitSharedExpertMatchesCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  PathsGuard guard(*m->gpu);
  // shared_splitk = 0: the shared expert's GEMVs one block per row tile (other sums than the split ones): the
  // decode steps and the GEMV-sized prefill chunks within the CPU bounds.
  CudaKernelPaths p;
  p.shared_splitk = false;
  m->gpu->set_paths(p);
  const Scenario sc = run_scenario(*m, prompt(21, 36), {}, 4, false);
  check_scenario(GetParam() + " unsplit shared expert 21", sc);
}

TEST_P(CudaModelPaths, LegacyPathsMatchCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  PathsGuard guard(*m->gpu);
  // The loop before the performance pass (the A/B baseline of cedar bench): still within the CPU bounds.
  m->gpu->set_paths(CudaKernelPaths::legacy());
  const Scenario sc = run_scenario(*m, prompt(77, 34), {}, 4, false);
  check_scenario(GetParam() + " legacy paths 77", sc);
}

TEST_P(CudaModelPaths, GemvPathsAboveTheGemvTileMatchCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  std::string error;
  CudaModel* v = variant_for(*m, &error);
  ASSERT_NE(v, nullptr) << error;
  PathsGuard guard(*v);
  // A 77-row call with moe_items_max_rows = 128: the routed experts through the item GEMVs (each expert read
  // once per 8 of its rows), and the FP8 linears and the shared expert through quant_gemm / swiglu_gemm, or
  // (gemv_max_rows = 128) through the GEMVs in 8-token tiles. Other summation orders: the CPU bounds apply.
  struct Case {
    const char* what;
    int64_t gemv_max_rows;
    uint64_t seed;
  };
  for (const Case& c : {Case{"item tables to 128 rows", kGemvMaxRows, 35}, Case{"dense GEMVs to 128 rows", 128, 37}}) {
    CudaKernelPaths p;
    p.moe_items_max_rows = 128;
    p.gemv_max_rows = c.gemv_max_rows;
    v->set_paths(p);
    EXPECT_EQ(v->options().paths.moe_items_max_rows, 128) << "the variant's item tables were not sized for 128 rows";
    EXPECT_EQ(v->options().paths.gemv_max_rows, c.gemv_max_rows) << "the variant's GEMV scratch was not sized for it";
    const Scenario sc = run_scenario(*m, prompt(77, c.seed), {}, 4, false, v);
    check_scenario(GetParam() + " " + c.what + " 77", sc);
  }
}

// The default load keeps two copies of the routed experts, not three: the plain bytes (the prefill GEMMs, and
// the decode GEMVs when routed_tiles is off) and the tiles; the packed copy comes only with packed_experts.
TEST_P(CudaModelPaths, DefaultExpertCopiesArePlainAndTiles) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  std::string error;
  CudaModel* v = variant_for(*m, &error);
  ASSERT_NE(v, nullptr) << error;
  const DeviceExperts& packed = m->gpu->weights().layers()[0].experts;
  const DeviceExperts& plain = v->weights().layers()[0].experts;
  EXPECT_FALSE(plain.repacked) << GetParam() << ": the default load repacked the experts";
  EXPECT_EQ(plain.plain_data_table[DeviceExperts::kW1], nullptr) << GetParam() << ": a second plain copy";
  EXPECT_EQ(plain.tile_table[DeviceExperts::kW1] != nullptr, packed.tile_table[DeviceExperts::kW1] != nullptr)
      << GetParam() << ": the tile copy depends on packed_experts";
  if (plain.tile_table[DeviceExperts::kW1]) {
    EXPECT_TRUE(plain.scales_checked) << GetParam() << ": tiles, but the scales were not checked";
  }
  auto bytes_of = [](const CudaModel& g, const std::string& component) {
    uint64_t b = 0;
    for (const auto& e : g.memory_plan().entries) b += e.component == component ? e.bytes : 0;
    return b;
  };
  if (packed.repacked) {  // the packed load's third copy is the plain one; the default has none of it
    EXPECT_GT(bytes_of(*m->gpu, "routed experts (plain)"), 0u) << GetParam();
    EXPECT_EQ(bytes_of(*v, "routed experts (plain)"), 0u) << GetParam();
    EXPECT_EQ(bytes_of(*v, "routed experts"), bytes_of(*m->gpu, "routed experts")) << GetParam();
  }
  // Without the packed copy, routed_tiles=0 decodes through the plain-layout item GEMVs: the CPU bounds apply.
  PathsGuard guard(*v);
  CudaKernelPaths p;
  p.routed_tiles = false;
  v->set_paths(p);
  const Scenario sc = run_scenario(*m, prompt(77, 36), {}, 4, false, v);
  check_scenario(GetParam() + " plain-layout routed GEMVs 77", sc);
}

INSTANTIATE_TEST_SUITE_P(Profiles, CudaModelPaths, ::testing::Values(std::string("tiny"), std::string("small")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace cedar::cuda
