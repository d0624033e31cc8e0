// The attention kernels of this build (attention_kernels.h), for kernel_catalog() / `cedar doctor`, and
// the check that each has device code the current GPU can load.
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

// Defined next to each kernel (their symbols stay file-local there).
const void* gemv_bf16_kernel_ptr();
const void* gemv_fp8w_kernel_ptr();
const void* rope_apply_kernel_ptr();
const void* swa_kv_encode_kernel_ptr();
const void* q_norm_swa_kv_encode_kernel_ptr();
const void* swa_ring_commit_kernel_ptr();
const void* compressor_entries_kernel_ptr();
const void* compressor_keep_pending_kernel_ptr();
const void* indexer_keys_store_kernel_ptr();
const void* indexer_queries_kernel_ptr();
const void* indexer_scores_kernel_ptr();
const void* indexer_select_kernel_ptr();
const void* sparse_attention_kernel_ptr();
const void* sparse_attention_decode_kernel_ptr();

namespace {
struct Entry {
  const char* name;
  const char* what;
  const void* (*ptr)();
};
const Entry kEntries[] = {
    {"gemv_bf16", "BF16 GEMV / skinny GEMM (bf16 HMMA, 16-byte loads, <=64 tokens/pass, split-K, grouped)",
     gemv_bf16_kernel_ptr},
    {"gemv_bf16_fp8w", "gemv_bf16 over an FP8 weight dequantized in registers to the exact bf16 values (wo_a)",
     gemv_fp8w_kernel_ptr},
    {"rope_apply", "RoPE/YaRN (forward / inverse) with host-computed angles, bf16 output", rope_apply_kernel_ptr},
    {"swa_kv_encode", "SWA KV: exact RMSNorm_kv + RoPE + FP8 QDQ (32, UE8M0) -> 528-B records",
     swa_kv_encode_kernel_ptr},
    {"q_norm_swa_kv_encode", "decode: q_norm (RMSNorm + FP8 codes) and swa_kv_encode of the same rows in one launch",
     q_norm_swa_kv_encode_kernel_ptr},
    {"swa_ring_commit", "SWA ring write of a chunk's last window positions", swa_ring_commit_kernel_ptr},
    {"compressor_entries",
     "CSA2 compressor (ratio 1 / pooled ratio r) + exact RMSNorm + RoPE + FP4 (16, E4M3) 288-B records",
     compressor_entries_kernel_ptr},
    {"compressor_keep_pending", "CSA2 compressor: the open group's fp32 projections kept on the device",
     compressor_keep_pending_kernel_ptr},
    {"indexer_keys_store", "indexer keys: exact k_norm + RoPE + FP4 (32, UE8M0) 68-B records",
     indexer_keys_store_kernel_ptr},
    {"indexer_queries", "indexer queries: RoPE + FP4 (32, UE8M0) QDQ, MMA operands, head weights",
     indexer_queries_kernel_ptr},
    {"indexer_scores", "indexer scores over visible / candidate entries: f16 HMMA on e2m1 codes, CPU head loop",
     indexer_scores_kernel_ptr},
    {"indexer_select", "exact top-k / candidate blocks: radix select + ordered compaction, two-stage segments",
     indexer_select_kernel_ptr},
    {"sparse_attention", "sparse MQA over window + top-k entries with sink: bf16 HMMA, exact-M key split, inverse RoPE",
     sparse_attention_kernel_ptr},
    {"sparse_attention_decode",
     "decode sparse MQA: keys split across blocks of 64 heads, each key dequantized once, bf16 HMMA, range merge",
     sparse_attention_decode_kernel_ptr},
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
