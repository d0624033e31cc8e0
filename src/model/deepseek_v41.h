// The DeepSeek-V4.1 model on the CPU reference backend (../shared/spec/architecture.md §3, §4): load
// (config → layer plan → checkpoint → bound weights → module parameters) and the forward over a chunk
// of one sequence. The math lives in the modules (mhc, engram, attention, moe); this file is the layer
// loop, the per-sequence state and the prefill modes.
//
// Block order (§3.3, single-pass mHC): Engram before the block at Engram layers; the attention input is
// collapsed with the previous site's `pre` (one-hot e_0 before layer 0); the ffn input with the
// attention site's `pre`; after the last layer the streams are collapsed with the last ffn `pre`, then
// the final RMSNorm and the fp32 head.
//
// Modes of a sequence's prefill (SequenceOptions):
//   * exact — every layer on every token (the reference).
//   * ced — Decoder SWA Bounded Replay (§3.10–3.11). With the prompt length N and a tail of T tokens
//     (default sliding_window), replay_start s = max(0, N − T). Rows before s run the encoder layers
//     [0, plan.encoder_layers) and the boundary layer plan.last_kv_source (the CED decoder's KV
//     source); rows from s on run every layer, and decoder layers see SWA keys only from s on
//     (AttentionCall::swa_start = s, also for every later decode step). The boundary layer is either
//       - CedBoundary::ExactSource (default, ATOM's choice): its attention runs exactly on every row
//         (own SWA ring complete, no truncation); its FFN runs on the tail only, since no later layer
//         reads pre-tail rows; or
//       - CedBoundary::GlobalKvOnly (vLLM's choice): on pre-tail rows it only appends its global KV
//         and indexer keys (AttentionPass::GlobalKvOnly); on the tail it is truncated like the decoder.
//     Global KV of every prompt token is exact either way. Logits exist only for rows >= s.
// A chunk of any size gives the same result as one call over the whole sequence, and token-by-token
// decode the same as a one-shot prefill: all cross-chunk state lives in SequenceState.
//
// Prefix caching (docs/prefix_cache.md): resume_sequence starts a sequence at length R from cached
// global-KV blocks covering [0, P) (shared through the block pool, not copied) and either a snapshot of
// the SWA rings restorable at R (exact continuation) or nothing (SWA bounded replay from R, §3.11 use
// 2: every layer's SWA keys start at R; exact when R <= t − exact_replay_rows, else approximate). Rows
// [R, P) are replay rows: KV source layers run AttentionPass::SwaReplay (no global writes), everything
// else as usual; rows from P on are normal. The forward splits chunks at P as it does at the CED replay
// start, which becomes max(N − tail, R).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"
#include "model/attention.h"
#include "model/engram.h"
#include "model/forward_types.h"
#include "model/layer_plan.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/weight_binding.h"

namespace cedar {

// SWA bounded replay that is exact (docs/prefix_cache.md "Exact bounded replay"): with the window
// truncated at R, layer l's outputs can differ from the uncached run only at rows [R, R + (l+1)·(W−1))
// (each window reads W − 1 rows back; compressed entries, the indexer, candidate blocks, Engram, mHC
// and MoE add no reach). A resume without a ring snapshot is therefore bitwise equal to the uncached run
// of the same mode when R == 0 or R <= t − exact_replay_rows, t = P in exact mode and min(P, N − tail)
// in ced mode. The rows: (layers that run the window on replay rows)·(W − 1) — exact mode every layer,
// ced mode the encoder + an ExactSource boundary (last_kv_source + 1), or the encoder alone with a
// GlobalKvOnly boundary (encoder_layers): the same layers SequenceState::exact_swa_layers() names.
int64_t exact_replay_rows(const LayerPlan& plan, int64_t sliding_window, ForwardMode mode, CedBoundary boundary);

class DeepseekV41Model {
 public:
  // `path`: a checkpoint directory with config.json (or any path io::Checkpoint::open accepts whose
  // directory holds config.json).
  static Result<DeepseekV41Model> load(const std::filesystem::path& path, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LayerPlan& plan() const { return plan_; }
  const BoundWeights& weights() const { return weights_; }
  // The Engram hasher (null without Engram layers): its layout and token map feed device-side hashing.
  const EngramHasher* engram_hasher() const { return hasher_ ? &*hasher_ : nullptr; }
  // The file the Engram token map was read from (model/engram_token_map.h); empty: the map built into
  // cedar, or no Engram layers.
  const std::filesystem::path& engram_map_file() const { return engram_map_file_; }

  Result<SequenceState> new_sequence(const SequenceOptions& options = {}) const;

  // A sequence of length resume.restart (R) whose global caches hold the cached prefix [0, P). Errors
  // name what is wrong: P not a multiple of tokens_per_block (or of a compress ratio), R outside [0, P],
  // a stream count or a stream's block count that does not match P, blocks not in use in
  // options.kv.pool (or no pool) or of the wrong size, history not of R valid tokens; with a snapshot:
  // slot count != window + swa_history, fewer layers than the mode needs (exact: all; ced: encoder +
  // ExactSource boundary), R outside [earliest_restore, length], rings of another format; exact mode
  // without a snapshot and 0 < R, R > P − exact_replay_rows (a replay too short to be exact), or from
  // a prefix that is not exact. Without a snapshot the state is exact (global_kv_exact(), exact_swa_layers()
  // as an uncached run) when R == 0 or R <= t − exact_replay_rows (t = P; ced: min(P, N − tail)), else
  // approximate (ced mode only).
  Result<SequenceState> resume_sequence(const SequenceOptions& options, const ResumeSpec& resume) const;
  // Replay rows that make a resume without a snapshot exact (the free function above, for this model).
  int64_t exact_replay_rows(ForwardMode mode, CedBoundary boundary = CedBoundary::ExactSource) const {
    return cedar::exact_replay_rows(plan_, config_.sliding_window, mode, boundary);
  }
  // Copies the rings of layers [0, state.exact_swa_layers()) at state.length().
  Result<SwaSnapshot> snapshot_swa(const SequenceState& state) const;
  // Block ids of every global-KV stream (global_kv_streams order) covering [0, tokens): tokens a
  // multiple of tokens_per_block (and of every compress ratio), <= what the caches hold. The ids stay
  // valid while the state (or anyone else who retained them) holds them.
  Result<std::vector<std::vector<BlockId>>> prefix_blocks(const SequenceState& state, int64_t tokens) const;

  // Processes `tokens` at positions [state.length(), state.length() + n) and advances the state.
  // Token ids must be in [0, vocab). After an error the state must be discarded.
  Result<ForwardOutput> forward(std::span<const int64_t> tokens, SequenceState& state,
                                const ForwardOptions& options) const;

 private:
  struct Rows;     // one contiguous run of rows of a chunk, all at the same depth (deepseek_v41.cpp)
  struct Buffers;  // activations of those rows

  Result<SequenceState> init_sequence(const SequenceOptions& options) const;
  int64_t ced_exact_layers(const SequenceOptions& options) const;
  Status run_rows(const Rows& rows, SequenceState& state, const ForwardOptions& options, ForwardOutput& out) const;
  Status run_layer(int64_t layer, const Rows& rows, Buffers& b, SequenceState& state, AttentionScratch& scratch,
                   const ForwardOptions& options) const;
  Status finish_rows(const Rows& rows, Buffers& b, const ForwardOptions& options, ForwardOutput& out) const;

  ModelConfig config_;
  LayerPlan plan_;
  BoundWeights weights_;
  HcParams hc_;
  AttentionParams attn_;
  MoeParams moe_;
  EngramParams engram_params_;
  std::optional<EngramHasher> hasher_;
  std::filesystem::path engram_map_file_;
  std::vector<int64_t> engram_slot_;  // per layer: Engram layout slot, -1 without Engram
};

}  // namespace cedar
