// The list of CUDA kernels this build carries, and the check that each has device code the current
// GPU can load (`cedar doctor`, tests).
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemm_kernels.h"
#include "backend/cuda/kernels.h"

namespace cedar::cuda {

// Defined next to each kernel (their symbols stay file-local there).
const void* quantize_act_fp8_kernel_ptr();
const void* stage_act_f16_kernel_ptr();
const void* gemv_fp8_kernel_ptr();
const void* gemv_mxfp4_kernel_ptr();
const void* mhc_fused_kernel_ptr();
const void* mhc_stream_kernel_ptr();
const void* mhc_stream_finish_kernel_ptr();
const void* mhc_stream_c64_kernel_ptr();
const void* mhc_stream_finish_lanes_kernel_ptr();
const void* mhc_elementwise_kernel_ptr();
const void* mhc_expand_collapse_norm_kernel_ptr();
const void* rms_norm_kernel_ptr();
const void* rms_norm_quant_kernel_ptr();
const void* mhc_expand_collapse_norm_quant_kernel_ptr();
const void* mhc_site_cluster_kernel_ptr();
const void* copy_kernel_ptr();

namespace {
struct Entry {
  const char* name;
  const char* what;
  const void* (*ptr)();
};
const Entry kEntries[] = {
    {"rms_norm", "RMSNorm, bf16 output", rms_norm_kernel_ptr},
    {"rms_norm_quant", "RMSNorm, bf16 output and its FP8 block-32 codes (quantize_act_fp8's bits)",
     rms_norm_quant_kernel_ptr},
    {"quantize_act_fp8", "FP8 e4m3 activation quantization, 32-blocks, UE8M0 scales", quantize_act_fp8_kernel_ptr},
    {"stage_act_f16", "bf16 activations as exact f16 codes, power-of-two scale per 32-block (wo_a GEMV)",
     stage_act_f16_kernel_ptr},
    {"gemv_fp8_block", "FP8 block-scaled GEMV, <=8 tokens/tile, exact f16 HMMA, split-K, grouped", gemv_fp8_kernel_ptr},
    {"gemv_mxfp4", "MXFP4 expert GEMV: e2m1 dequantized in registers (exact), f16 HMMA, grouped", gemv_mxfp4_kernel_ptr},
    {"mhc_fused", "fused single-pass mHC: expand + collapse + coefficients + Sinkhorn", mhc_fused_kernel_ptr},
    {"mhc_stream", "fused mHC, prefill: 64-token tiles streamed per channel split, 3xTF32 tensor-core dot products",
     mhc_stream_kernel_ptr},
    {"mhc_stream_finish", "fused mHC, prefill: split sums in order, coefficients + Sinkhorn per token",
     mhc_stream_finish_kernel_ptr},
    {"mhc_stream_c64", "fused mHC, prefill: 32-token tiles x 64-channel chunks, 3xTF32 tensor-core dot products",
     mhc_stream_c64_kernel_ptr},
    {"mhc_stream_finish_lanes", "fused mHC, prefill: split sums in order, coefficients + Sinkhorn one lane per token",
     mhc_stream_finish_lanes_kernel_ptr},
    {"mhc_expand_collapse", "mHC expand and/or collapse without coefficients", mhc_elementwise_kernel_ptr},
    {"mhc_expand_collapse_norm", "mHC expand + collapse + the input RMSNorm in one launch (split decode site)",
     mhc_expand_collapse_norm_kernel_ptr},
    {"mhc_expand_collapse_norm_quant", "the same, and the FP8 block-32 codes of the normed rows",
     mhc_expand_collapse_norm_quant_kernel_ptr},
    {"mhc_site_cluster", "the same as one 8-block cluster: the row's norm in every block, no ticket (site_cluster)",
     mhc_site_cluster_kernel_ptr},
    {"copy", "vectorized device copy (bandwidth reference)", copy_kernel_ptr},
};
}  // namespace

std::vector<KernelInfo> kernel_catalog() {
  std::vector<KernelInfo> out;
  for (const Entry& e : kEntries) out.push_back(KernelInfo{e.name, e.what});
  // Each kernel family keeps its own list next to its kernels.
  for (auto family : {attention_kernel_catalog, ffn_kernel_catalog, gemm_kernel_catalog})
    for (KernelInfo& k : family()) out.push_back(std::move(k));
  return out;
}

Status check_kernels_loadable() {
  for (const Entry& e : kEntries) {
    cudaFuncAttributes attr{};
    if (cudaError_t err = cudaFuncGetAttributes(&attr, e.ptr()); err != cudaSuccess)
      return cuda_status(err, (std::string("cudaFuncGetAttributes(") + e.name + ")").c_str());
  }
  CEDAR_RETURN_IF_ERROR(check_attention_kernels_loadable());
  CEDAR_RETURN_IF_ERROR(ffn_check_kernels_loadable());
  return check_gemm_kernels_loadable();
}

}  // namespace cedar::cuda
