// Types shared by the CPU forward of both architectures (DeepseekV41Model, DeepseekV4Model): forward
// options and outputs, the named intermediate tensors, and the per-sequence state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/threads.h"
#include "model/attention_state.h"
#include "model/engram.h"

namespace cedar {

enum class ForwardMode { Exact, Ced };
std::string_view forward_mode_name(ForwardMode m);                // "exact" / "ced"
Result<ForwardMode> parse_forward_mode(std::string_view text);

enum class CedBoundary { ExactSource, GlobalKvOnly };

// A named intermediate tensor of one forward call: `rows` rows of `width` floats for the absolute
// positions [pos0, pos0 + rows). Names: "embed", "layers.{L}.engram_out" [hc·d], "layers.{L}.attn_in"
// (normed collapsed attention input) [d], "layers.{L}.attn_out" [d], "layers.{L}.ffn_in" [d],
// "layers.{L}.ffn_out" [d], "layers.{L}.out" (streams after the block) [hc·d], "layers.{L}.topk" (index
// sources: the selected compressed-entry ids, ascending, -1 = empty) [index_topk], "hc_head" (V4: streams
// collapsed by the learned hc_head) [d], "final_norm" [d], "logits" [vocab] (only the requested rows: pos0 =
// their first position).
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
  // Extra SWA ring slots beyond the window (ring slots = sliding_window + swa_history), so that a
  // snapshot taken at length L can restore the sequence at any R in [L − swa_history, L]. No effect
  // on the numerics.
  int64_t swa_history = 0;
};

// Copies of a sequence's SWA rings (layers [0, exact_layers)) at length `length` (DeepseekV41Model::
// snapshot_swa; docs/prefix_cache.md).
struct SwaSnapshot {
  int64_t length = 0;
  int64_t exact_layers = 0;  // rings captured: layers [0, exact_layers); 0 = nothing usable
  int64_t slots = 0;         // ring slots (window + swa_history of the sequence it came from)
  // Every ring holds the keys of positions [held_from, length): max(0, length − slots), or later when
  // the sequence was itself resumed at a point before the snapshot it came from.
  int64_t held_from = 0;
  std::vector<SwaRing> rings;  // [exact_layers]

  int64_t bytes() const;  // host memory it holds
  // The earliest length the snapshot restores a sequence at: max(0, length − (slots − window)) for a
  // ring that has wrapped (held_from = length − slots); 0 when it holds every position (held_from = 0).
  int64_t earliest_restore(int64_t window) const { return held_from > 0 ? held_from + window : 0; }
};

// Resume a sequence from a cached prefix (DeepseekV41Model::resume_sequence).
struct ResumeSpec {
  int64_t cached_tokens = 0;  // P, a multiple of options.kv.tokens_per_block (and of every compress ratio)
  // Per global-KV stream (global_kv_streams order): the full blocks covering floor(P / ratio) entries,
  // blocks of options.kv.pool; the new state retains them (shared, never written). May be empty when P = 0.
  std::vector<std::vector<BlockId>> blocks;
  int64_t restart = 0;  // R <= P: the state starts at length R; the caller feeds tokens[R..]
  // Restore rings at R (R in [earliest_restore, length]); null: SWA bounded replay, every layer's SWA
  // keys start at R — exact when R == 0 or R <= t − exact_replay_rows (t = P; ced: min(P, N − tail)),
  // else approximate (refused in exact mode).
  const SwaSnapshot* swa = nullptr;
  std::span<const int64_t> history;  // the sequence's tokens [0, R) (Engram history needs the last few)
  // Whether the cached global KV equals the reference's (false: it came from a sequence that went
  // through an approximate replay). Exact mode refuses an approximate prefix; ced mode carries it on
  // (global_kv_exact() false).
  bool prefix_exact = true;
};

// Everything one sequence carries from one forward call to the next.
class SequenceState {
 public:
  int64_t length() const { return length_; }              // tokens processed so far
  int64_t replay_start() const { return replay_start_; }  // 0 in exact mode
  const SequenceOptions& options() const { return options_; }
  const AttentionState& attention() const { return attention_; }
  // Rows below this position are replay rows of a resumed sequence (the global caches already cover
  // them); 0 for a new sequence.
  int64_t cached_end() const { return cached_end_; }
  // False once the sequence — or the prefix it resumed from — went through an approximate SWA replay
  // (one shorter than exact_replay_rows): its later global KV differs from the reference's.
  bool global_kv_exact() const { return global_kv_exact_; }
  // Rings [0, exact_swa_layers()) equal those of an uncached run of the same mode: exact mode every
  // layer; ced mode the encoder layers + the boundary layer when CedBoundary::ExactSource; 0 after an
  // approximate replay. After an exact bounded replay from R their keys are exact from
  // R + (exact_swa_layers − 1)·(W − 1) on (what snapshot_swa's held_from says).
  int64_t exact_swa_layers() const { return global_kv_exact_ ? exact_swa_layers_ : 0; }

 private:
  friend class DeepseekV41Model;
  friend class DeepseekV4Model;
  SequenceOptions options_;
  AttentionState attention_;
  EngramHistory engram_;
  int64_t length_ = 0;
  int64_t replay_start_ = 0;
  int64_t cached_end_ = 0;       // P of a resumed sequence
  int64_t swa_floor_ = 0;        // every layer's swa_start is at least this (R of an SWA replay)
  int64_t swa_held_from_ = 0;    // the rings never held positions before this
  int64_t exact_swa_layers_ = 0;
  bool global_kv_exact_ = true;
  bool failed_ = false;  // a forward failed midway: the state is inconsistent
};

struct LoadOptions {
  // Engram token map (.npy int32 [vocab]); empty: <model>/engram_token_map.npy if present, else the
  // frozen map built into cedar (model/engram_token_map.h).
  std::filesystem::path engram_map;
  ThreadPool* pool = nullptr;  // parallelizes load-time conversions
};

}  // namespace cedar
