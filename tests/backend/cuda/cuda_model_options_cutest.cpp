// The CUDA model's kernel-path switches (`--cuda-options`, CudaKernelPaths): names, values, errors, and each
// switch's default — the decision its device measurements took (docs/cuda.md) — and its legacy() value.
// Host-only: runs without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"

namespace cedar::cuda {
namespace {

TEST(CudaModelOptionsSpec, ParsesNamesAndRejectsUnknownOnes) {
  CudaModelOptions o;
  ASSERT_TRUE(apply_cuda_options("programmatic_launch=0,blas_min_rows=64,wo_a_fp8=0", o).ok());
  EXPECT_FALSE(o.paths.programmatic_launch);
  EXPECT_EQ(o.paths.blas_min_rows, 64);
  EXPECT_FALSE(o.wo_a_fp8);
  ASSERT_TRUE(apply_cuda_options("legacy", o).ok());
  EXPECT_FALSE(o.paths.router_splitk);
  EXPECT_FALSE(o.paths.mhc_batched);
  const Status bad = apply_cuda_options("router_split=1", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("router_split"), std::string::npos) << bad.error().message;
  // Removed switches are errors: prefetch_attention (one tile loader now), aux_priority (s10: slower).
  for (const char* removed : {"prefetch_attention", "aux_priority"}) {
    const Status st = apply_cuda_options(std::string(removed) + "=1", o);
    ASSERT_FALSE(st.ok()) << removed;
    EXPECT_NE(st.error().message.find("'" + std::string(removed) + "' is unknown"), std::string::npos)
        << st.error().message;
  }
  const Status val = apply_cuda_options("mhc_batched=2", o);
  ASSERT_FALSE(val.ok());
  EXPECT_NE(val.error().message.find("0 or 1"), std::string::npos) << val.error().message;
  EXPECT_NE(describe_cuda_options(CudaModelOptions()).find("router_splitk=1"), std::string::npos);
  CudaModelOptions q;
  ASSERT_TRUE(apply_cuda_options("fused_act_quant=0,site_act_quant=0,swa_commit_aside=0", q).ok());
  EXPECT_NE(describe_cuda_options(q).find("fused_act_quant=0,site_act_quant=0,site_cluster=1,swa_commit_aside=0"),
            std::string::npos)
      << describe_cuda_options(q);
}

// The ranged integer options: their defaults, every value in range set by name, and each value out of range an
// error that names the option.
// routed_warps forces the routed packed GEMVs' split: 0 (the default) or 2..8. graph_carveout: 0 (each kernel's
// own split, the default; measured slower in s32) or a percent 1..100 for every decode graph node.
// routed_w2_prefetch: 0 (off, the default; unmeasured, s35), 1 or 2 (before / after each block's units).
TEST(CudaModelOptionsSpec, RangedValuesTakeTheirRangeAndNameTheOptionOutsideIt) {
  struct Ranged {
    const char* name;
    int64_t CudaKernelPaths::*field;
    std::vector<int> good, bad;
  };
  const Ranged options[] = {
      {"routed_warps", &CudaKernelPaths::routed_warps, {2, 8, 0}, {1, 9}},
      {"graph_carveout", &CudaKernelPaths::graph_carveout, {100, 1, 72, 0}, {101}},
      {"routed_w2_prefetch", &CudaKernelPaths::routed_w2_prefetch, {1, 2, 0}, {3}},
  };
  for (const Ranged& r : options) {
    EXPECT_EQ(CudaKernelPaths().*r.field, 0) << r.name << ": default";
    CudaModelOptions o;
    for (const int v : r.good) {
      ASSERT_TRUE(apply_cuda_options(std::string(r.name) + "=" + std::to_string(v), o).ok()) << r.name << "=" << v;
      EXPECT_EQ(o.paths.*r.field, v) << r.name;
    }
    for (const int v : r.bad) {
      const Status st = apply_cuda_options(std::string(r.name) + "=" + std::to_string(v), o);
      ASSERT_FALSE(st.ok()) << r.name << "=" << v;
      EXPECT_NE(st.error().message.find("'" + std::string(r.name) + "'"), std::string::npos) << st.error().message;
    }
  }
  EXPECT_EQ(CudaKernelPaths::legacy().graph_carveout, 0);
}

// gemv_max_rows: the rows up to which the dense linears and the shared expert take the GEMVs; a value by name.
TEST(CudaModelOptionsSpec, GemvMaxRowsIsAValueByName) {
  CudaModelOptions o;
  ASSERT_TRUE(apply_cuda_options("gemv_max_rows=48", o).ok());
  EXPECT_EQ(o.paths.gemv_max_rows, 48);
  EXPECT_EQ(CudaKernelPaths::legacy().gemv_max_rows, kGemvMaxRows);
  // s27 run 2 (H200): batches 16 and 32 ran 2.1× and 1.4× faster on the GEMVs than on the GEMMs; s28 (H100):
  // batch 64 2.3 % faster with the one-launch FP8 GEMVs.
  EXPECT_EQ(CudaKernelPaths().gemv_max_rows, 64);
  EXPECT_EQ(CudaKernelPaths().moe_items_max_rows, 64);
  EXPECT_NE(describe_cuda_options(o).find("gemv_max_rows=48"), std::string::npos) << describe_cuda_options(o);
}

// The routed experts' device copies: plain + tiles by default; the packed copy (11.3 GB on the perf profile) only
// when asked, by name.
TEST(CudaModelOptionsSpec, ExpertCopiesArePlainAndTilesUnlessPackedIsAsked) {
  const CudaModelOptions defaults;
  EXPECT_FALSE(defaults.packed_experts);
  EXPECT_TRUE(defaults.tiled_experts);
  EXPECT_TRUE(defaults.paths.routed_tiles);
  EXPECT_NE(describe_cuda_options(defaults).find("tiled_experts=1,packed_experts=0"), std::string::npos)
      << describe_cuda_options(defaults);
  CudaModelOptions o;
  ASSERT_TRUE(apply_cuda_options("packed_experts=1,tiled_experts=0", o).ok());
  EXPECT_TRUE(o.packed_experts);
  EXPECT_FALSE(o.tiled_experts);
  EXPECT_TRUE(o.paths.routed_tiles);  // a load option: the kernel path stays as it was
}

// Every on / off switch: its default, its legacy() value, and NAME=0 / NAME=1 setting it (and nothing else).
TEST(CudaModelOptionsSpec, SwitchDefaultsAreTheMeasuredDecisions) {
  struct Switch {
    const char* name;
    bool CudaKernelPaths::*field;
    bool by_default, in_legacy;
  };
  const Switch switches[] = {
      {"programmatic_launch", &CudaKernelPaths::programmatic_launch, true, false},
      {"router_splitk", &CudaKernelPaths::router_splitk, true, false},
      {"mhc_batched", &CudaKernelPaths::mhc_batched, true, false},
      {"mhc_cluster", &CudaKernelPaths::mhc_cluster, false, true},
      {"mhc_fused_norm", &CudaKernelPaths::mhc_fused_norm, true, false},
      {"gemv_multi", &CudaKernelPaths::gemv_multi, true, false},
      {"fused_q_rope", &CudaKernelPaths::fused_q_rope, true, false},
      {"attn_head_split", &CudaKernelPaths::attn_head_split, true, false},
      {"mhc_split", &CudaKernelPaths::mhc_split, true, false},
      {"mhc_split_norm", &CudaKernelPaths::mhc_split_norm, true, false},
      {"engram_ahead", &CudaKernelPaths::engram_ahead, true, false},
      {"wo_a_f16", &CudaKernelPaths::wo_a_f16, true, false},
      {"fused_act_quant", &CudaKernelPaths::fused_act_quant, true, false},
      {"site_act_quant", &CudaKernelPaths::site_act_quant, false, false},  // s8 run 5: slower
      {"site_cluster", &CudaKernelPaths::site_cluster, true, false},
      {"swa_commit_aside", &CudaKernelPaths::swa_commit_aside, true, false},
      {"router_ahead", &CudaKernelPaths::router_ahead, false, false},  // s9: slower
      {"dispatch_in_router", &CudaKernelPaths::dispatch_in_router, true, false},
      {"router_splitk_beside", &CudaKernelPaths::router_splitk_beside, true, false},
      {"router_one_token", &CudaKernelPaths::router_one_token, true, false},
      {"shared_splitk", &CudaKernelPaths::shared_splitk, true, true},
      {"fork_pdl", &CudaKernelPaths::fork_pdl, true, false},
      {"fork_pdl_compressor", &CudaKernelPaths::fork_pdl_compressor, false, false},  // s10: slower
      {"q_norm_kv_encode", &CudaKernelPaths::q_norm_kv_encode, true, false},
      {"attn_merge_trigger", &CudaKernelPaths::attn_merge_trigger, true, false},
      {"routed_full_edge", &CudaKernelPaths::routed_full_edge, true, false},
      {"attn_stage_wo_a", &CudaKernelPaths::attn_stage_wo_a, true, false},
      {"site_combine", &CudaKernelPaths::site_combine, true, false},
      {"warp_items", &CudaKernelPaths::warp_items, true, false},
      {"scale_exp_add", &CudaKernelPaths::scale_exp_add, true, false},
      {"branches_above_tile", &CudaKernelPaths::branches_above_tile, true, false},
      {"mhc_one_token", &CudaKernelPaths::mhc_one_token, false, false},  // s34: unmeasured
      {"shared_w2_late", &CudaKernelPaths::shared_w2_late, false, false},  // s35: unmeasured
  };
  const CudaKernelPaths defaults, legacy = CudaKernelPaths::legacy();
  for (const Switch& s : switches) {
    EXPECT_EQ(defaults.*s.field, s.by_default) << s.name << ": default";
    EXPECT_EQ(legacy.*s.field, s.in_legacy) << s.name << ": legacy()";
    for (const bool value : {false, true}) {
      CudaModelOptions q;
      ASSERT_TRUE(apply_cuda_options(std::string(s.name) + (value ? "=1" : "=0"), q).ok()) << s.name;
      EXPECT_EQ(q.paths.*s.field, value) << s.name << "=" << value;
      for (const Switch& other : switches) {
        if (other.field == s.field) continue;
        EXPECT_EQ(q.paths.*other.field, defaults.*other.field) << s.name << " changed " << other.name;
      }
    }
  }
}

}  // namespace
}  // namespace cedar::cuda
