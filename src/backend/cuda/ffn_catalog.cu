// The cuda-ffn kernels this build carries (ffn_kernel_catalog, for `cedar doctor` once the lead wires
// it next to kernel_catalog()) and their loadability check.
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda {

// Defined next to each kernel (their symbols stay file-local there).
const void* embed_gather_kernel_ptr();
const void* router_logits_kernel_ptr();
const void* router_select_kernel_ptr();
const void* moe_build_items_kernel_ptr();
const void* swiglu_kernel_ptr();
const void* moe_combine_kernel_ptr();
const void* gemv_items_fp8_kernel_ptr();
const void* gemv_items_mxfp4_kernel_ptr();
const void* gemv_mxfp4_packed_kernel_ptr();
const void* gemv_mxfp4_packed_items_kernel_ptr();
const void* engram_hash_kernel_ptr();
const void* engram_gather_kernel_ptr();
const void* engram_update_kernel_ptr();
const void* argmax_kernel_ptr();
const void* sample_kernel_ptr();
const void* mhc_cluster_kernel_ptr();
const void* hc_collapse_kernel_ptr();

namespace {
struct Entry {
  const char* name;
  const char* what;
  const void* (*ptr)();
};
const Entry kEntries[] = {
    {"embed_gather", "embedding rows (bf16) expanded to the hc streams, pre_prev one-hot", embed_gather_kernel_ptr},
    {"router_logits", "MoE router logits: fp32 GEMV of the bf16 gate, fixed-order sums", router_logits_kernel_ptr},
    {"router_select", "sqrtsoftplus, biased top-k (CPU tie order) or tid2eid, routing weights",
     router_select_kernel_ptr},
    {"moe_build_items", "device-side grouped-GEMV items from the router's expert ids", moe_build_items_kernel_ptr},
    {"gemv_items_fp8", "FP8 GEMV over a device item table (gathered/scattered rows)", gemv_items_fp8_kernel_ptr},
    {"gemv_items_mxfp4", "MXFP4 GEMV over a device item table", gemv_items_mxfp4_kernel_ptr},
    {"gemv_mxfp4_packed", "MXFP4 GEMV, packed layout: 16-byte loads over 4 K blocks, 32 rows/warp",
     gemv_mxfp4_packed_kernel_ptr},
    {"gemv_mxfp4_packed_items", "packed MXFP4 GEMV over a device item table", gemv_mxfp4_packed_items_kernel_ptr},
    {"swiglu", "SwiGLU with clamps and routing weight, fused FP8 quantization for W2", swiglu_kernel_ptr},
    {"moe_combine", "routed sum in ascending expert order + shared expert, bf16", moe_combine_kernel_ptr},
    {"engram_hash", "Engram n-gram hash rows with the per-sequence history on the device", engram_hash_kernel_ptr},
    {"engram_gather", "Engram table rows (device or mapped host memory): dequant + FP8 quantization",
     engram_gather_kernel_ptr},
    {"engram_update", "Engram per-stream gate and stream update", engram_update_kernel_ptr},
    {"hc_collapse", "final collapse of the hc streams (then rms_norm + gemv_bf16 head: final_head)",
     hc_collapse_kernel_ptr},
    {"argmax", "greedy argmax per row, ties to the lowest id", argmax_kernel_ptr},
    {"sample", "sampler on the device: penalties, bias, temperature, min-p, top-k, top-p, PCG32 draw",
     sample_kernel_ptr},
    {"mhc_fused_cluster", "fused mHC, 16-block cluster: TMA fn slices, DSMEM reduction, register Sinkhorn",
     mhc_cluster_kernel_ptr},
};
}  // namespace

std::vector<KernelInfo> ffn_kernel_catalog() {
  std::vector<KernelInfo> out;
  for (const Entry& e : kEntries) out.push_back(KernelInfo{e.name, e.what});
  return out;
}

Status ffn_check_kernels_loadable() {
  for (const Entry& e : kEntries) {
    cudaFuncAttributes attr{};
    if (cudaError_t err = cudaFuncGetAttributes(&attr, e.ptr()); err != cudaSuccess)
      return cuda_status(err, (std::string("cudaFuncGetAttributes(") + e.name + ")").c_str());
  }
  return Status::Ok();
}

}  // namespace cedar::cuda
