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
#include "model/layer_plan.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/weight_binding.h"

namespace cedar {

enum class ForwardMode { Exact, Ced };
std::string_view forward_mode_name(ForwardMode m);                // "exact" / "ced"
Result<ForwardMode> parse_forward_mode(std::string_view text);

enum class CedBoundary { ExactSource, GlobalKvOnly };

// A named intermediate tensor of one forward call: `rows` rows of `width` floats for the absolute
// positions [pos0, pos0 + rows). Names: "embed", "layers.{L}.engram_out" [hc·d], "layers.{L}.attn_in"
// (normed collapsed attention input) [d], "layers.{L}.attn_out" [d], "layers.{L}.ffn_in" [d],
// "layers.{L}.ffn_out" [d], "layers.{L}.out" (streams after the block) [hc·d], "final_norm" [d],
// "logits" [vocab] (only the requested rows: pos0 = their first position).
struct TensorRecord {
  std::string_view name;
  int64_t pos0 = 0, rows = 0, width = 0;
  std::span<const float> data;
};
using TensorSink = std::function<void(const TensorRecord&)>;

enum class LogitRows { None, Last, All };

struct ForwardOptions {
  LogitRows logits = LogitRows::Last;  // Last: the chunk's last row (when that row is computed)
  TensorSink sink;                     // receives named intermediates when set
  ThreadPool* pool = nullptr;          // null: single-threaded
};

struct ForwardOutput {
  int64_t vocab = 0;
  std::vector<int64_t> positions;  // absolute positions of the logit rows
  std::vector<float> logits;       // [positions.size(), vocab], fp32
};

struct SequenceOptions {
  ForwardMode mode = ForwardMode::Exact;
  int64_t prompt_length = 0;  // ced: number of prompt tokens (> 0)
  int64_t ced_tail = 0;       // ced: replayed decoder rows; 0 = sliding_window
  CedBoundary ced_boundary = CedBoundary::ExactSource;
  KvCacheOptions kv = {};     // cache formats / shared block pool (kv/kv_layout.h)
};

// Everything one sequence carries from one forward call to the next.
class SequenceState {
 public:
  int64_t length() const { return length_; }              // tokens processed so far
  int64_t replay_start() const { return replay_start_; }  // 0 in exact mode
  const SequenceOptions& options() const { return options_; }
  const AttentionState& attention() const { return attention_; }

 private:
  friend class DeepseekV41Model;
  SequenceOptions options_;
  AttentionState attention_;
  EngramHistory engram_;
  int64_t length_ = 0;
  int64_t replay_start_ = 0;
  bool failed_ = false;  // a forward failed midway: the state is inconsistent
};

struct LoadOptions {
  // Engram token map (.npy int32 [vocab]); empty: <model>/engram_token_map.npy if present, else the
  // frozen map shipped with cedar (assets/engram/deepseek_v41_token_map.npy).
  std::filesystem::path engram_map;
  ThreadPool* pool = nullptr;  // parallelizes load-time conversions
};

class DeepseekV41Model {
 public:
  // `path`: a checkpoint directory with config.json (or any path io::Checkpoint::open accepts whose
  // directory holds config.json).
  static Result<DeepseekV41Model> load(const std::filesystem::path& path, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LayerPlan& plan() const { return plan_; }
  const BoundWeights& weights() const { return weights_; }

  Result<SequenceState> new_sequence(const SequenceOptions& options = {}) const;

  // Processes `tokens` at positions [state.length(), state.length() + n) and advances the state.
  // Token ids must be in [0, vocab). After an error the state must be discarded.
  Result<ForwardOutput> forward(std::span<const int64_t> tokens, SequenceState& state,
                                const ForwardOptions& options) const;

 private:
  struct Rows;     // one contiguous run of rows of a chunk, all at the same depth (deepseek_v41.cpp)
  struct Buffers;  // activations of those rows

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
  std::vector<int64_t> engram_slot_;  // per layer: Engram layout slot, -1 without Engram
};

}  // namespace cedar
