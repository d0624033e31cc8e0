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
  friend class DeepseekV4Model;
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

}  // namespace cedar
