// The attention kernels of this build (attention_kernels.h), for kernel_catalog() / `cedar doctor`, and
// the check that each has device code the current GPU can load.
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

// Defined next to each kernel (their symbols stay file-local there).
const void* gemv_bf16_kernel_ptr();
const void* rope_apply_kernel_ptr();
const void* swa_kv_encode_kernel_ptr();
const void* swa_ring_commit_kernel_ptr();

namespace {
struct Entry {
  const char* name;
  const char* what;
  const void* (*ptr)();
};
const Entry kEntries[] = {
    {"gemv_bf16", "BF16 GEMV / skinny GEMM (bf16 HMMA, 16-byte loads, <=64 tokens/pass, split-K, grouped)",
     gemv_bf16_kernel_ptr},
    {"rope_apply", "RoPE/YaRN (forward / inverse) with host-computed angles, bf16 output", rope_apply_kernel_ptr},
    {"swa_kv_encode", "SWA KV: exact RMSNorm_kv + RoPE + FP8 QDQ (32, UE8M0) -> 528-B records",
     swa_kv_encode_kernel_ptr},
    {"swa_ring_commit", "SWA ring write of a chunk's last window positions", swa_ring_commit_kernel_ptr},
};
}  // namespace

std::vector<KernelInfo> attention_kernel_catalog() {
  std::vector<KernelInfo> out;
  for (const Entry& e : kEntries) out.push_back(KernelInfo{e.name, e.what});
  return out;
}

Status check_attention_kernels_loadable() {
  for (const Entry& e : kEntries) {
    cudaFuncAttributes attr{};
    if (cudaError_t err = cudaFuncGetAttributes(&attr, e.ptr()); err != cudaSuccess)
      return cuda_status(err, (std::string("cudaFuncGetAttributes(") + e.name + ")").c_str());
  }
  return Status::Ok();
}

}  // namespace cedar::cuda
