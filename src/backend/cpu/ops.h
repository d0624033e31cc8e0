// Reference CPU ops: simple, obviously right loops that reproduce the official reference's numerics
// (../shared/spec/architecture.md §3.1). This backend is the oracle every CUDA kernel is tested against.
//
// Activation convention: activations are fp32 arrays; where the reference holds a bf16 tensor, the
// values are bf16-rounded (round_to_bf16) so they are exactly what the reference stores.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/weights.h"

namespace cedar::cpu {

// A borrowed view of one linear layer's weight (logical shape [out, in]) in its stored format.
struct LinearWeight {
  WeightFormat format = WeightFormat::BF16;  // BF16, F32, FP8Block or MXFP4
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;   // BF16: uint16 bits; F32: floats; FP8Block: e4m3 [out,in]; MXFP4: [out,in/2]
  const uint8_t* scale = nullptr;  // FP8Block: [ceil(out/bo), ceil(in/bi)] e8m0; MXFP4: [out, in/32] e8m0
  int64_t block_out = 32, block_in = 32;  // FP8Block weight block (V4.1: 32×32; V4: 128×128)
};

struct LinearOptions {
  // Output rounding: true → bf16-rounded (reference `linear` returns bf16); false → raw fp32.
  bool bf16_output = true;
  // FP8/MXFP4: activation block size along K (V4.1: 32; V4: 128). Scales are UE8M0 powers of two. A row
  // narrower than the block is one block (tiny V4 models; released shapes are multiples of the block).
  int64_t act_block = 32;
};

// y[n, out] = x[n, in] · Wᵀ with the stored format's reference numerics:
//   BF16 / F32 weights: fp32 products and accumulation (no activation quantization).
//   FP8Block / MXFP4: per-token activation quantization in blocks of act_block (UE8M0 scale,
//   e4m3 codes), y = Σ_kblocks (Σ q_a·q_w) · s_a · s_w, accumulated in fp32.
Status linear(const LinearWeight& w, std::span<const float> x, int64_t n, std::span<float> y,
              const LinearOptions& opt, ThreadPool* pool);

// y = bf16( weight ⊙ (x · rsqrt(mean(x²) + eps)) ) per row of `dim`; weight given as fp32 values
// (bf16-exact). weight may be empty: then the unweighted normalization (still bf16-rounded).
void rms_norm(std::span<const float> x, int64_t dim, std::span<const float> weight, double eps, std::span<float> y);

// RoPE frequency table for one rope configuration (§3.1): interleaved pairs on the last `rope_dim`
// channels; base θ; optional YaRN (factor, beta_fast, beta_slow, original_max_position_embeddings).
struct RopeConfig {
  int64_t rope_dim = 64;
  double base = 10000.0;
  double yarn_factor = 1.0;             // 1 = no YaRN
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_position = 0;    // 0 = no YaRN
};

class RopeTable {
 public:
  explicit RopeTable(const RopeConfig& cfg);
  int64_t rope_dim() const { return rope_dim_; }
  std::span<const float> inv_freq() const { return inv_freq_; }
  // Rotates the last rope_dim channels of each of `n_vec` vectors of width `width` at position `pos`
  // (inverse = conjugate rotation). Values are bf16-rounded after rotation, as the reference writes bf16.
  void apply(std::span<float> x, int64_t n_vec, int64_t width, int64_t pos, bool inverse = false) const;

 private:
  int64_t rope_dim_;
  std::vector<float> inv_freq_;  // rope_dim/2 frequencies (fp32, as the reference computes them)
};

// In-place bf16 rounding of every element.
void round_bf16(std::span<float> x);

}  // namespace cedar::cpu
