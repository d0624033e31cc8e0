// `cedar engram-rows`: the Engram table rows of a token sequence for every Engram layer of a config
// (architecture.md §3.9 hash ids), through the frozen token-normalization map. A test aid: pytest compares
// them with a NumPy implementation of the spec.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/config.h"
#include "model/engram.h"
#include "text/engram_norm.h"
#include "text/frozen_engram_map.h"

namespace cedar::cli {

namespace {

const CommandSpec& spec() {
  static const CommandSpec s{
      "engram-rows",
      "Print the Engram table rows (hash ids + column offsets) of a token sequence for every Engram layer.\n"
      "Text: one line per (layer, position). --json: {\"pad\", \"layers\": [{\"layer\", \"multipliers\", \"primes\",\n"
      "\"offsets\", \"rows\": [[...] per position]}]}.",
      {},
      {},
      {{"config", "model directory or config.json", true, "", "DIR"},
       {"ids", "comma-separated raw token ids", true, "", "I,J,..."},
       {"image", "comma-separated 0/1 image-span flags, one per id (image tokens are DEAD)", true, "", "F,F,..."},
       {"chunk", "hash in chunks of this many tokens (history carried across chunks)", true, "", "N"},
       {"map", "token map (.npy int32; default: the frozen map built into cedar)", true, "", "FILE"},
       {"json", "print JSON", false, "", ""}},
  };
  return s;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar engram-rows: %s\n", message.c_str());
  return 1;
}

Result<std::vector<int64_t>> parse_list(const std::string& option, const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', start), text.size());
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(text.data() + start, text.data() + end, v);
    if (ec != std::errc() || ptr != text.data() + end || end == start)
      return make_error("--" + option + ": '" + text.substr(start, end - start) + "' is not an integer");
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

}  // namespace

int cmd_engram_rows(const Args& args) {
  auto parsed = parse_args(spec(), args);
  if (!parsed) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec()).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar engram-rows: %s\n%s", parsed.error().message.c_str(), usage(spec()).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  if (!a.has("config") || !a.has("ids")) return fail("--config and --ids are required");

  auto config = load_model_config(a.get("config"));
  if (!config) return fail(config.error().message);
  auto map = a.has("map") ? text::load_engram_map_npy(a.get("map")) : text::frozen_engram_map();
  if (!map) return fail(map.error().message);
  auto hasher = EngramHasher::create(*config, std::move(*map));
  if (!hasher) return fail(hasher.error().message);
  const EngramLayout& layout = hasher->layout();

  auto ids = parse_list("ids", a.get("ids"));
  if (!ids) return fail(ids.error().message);
  const int64_t n = static_cast<int64_t>(ids->size());
  std::vector<uint8_t> image;
  if (a.has("image")) {
    auto flags = parse_list("image", a.get("image"));
    if (!flags) return fail(flags.error().message);
    if (static_cast<int64_t>(flags->size()) != n) return fail("--image needs one flag per id");
    for (int64_t f : *flags) image.push_back(f != 0);
  }
  int64_t chunk = n;
  if (a.has("chunk")) {
    auto c = a.get_int("chunk");
    if (!c || *c <= 0) return fail("--chunk expects a positive integer");
    chunk = *c;
  }

  // rows[slot][pos][col], hashed chunk by chunk with one carried history.
  const int64_t slots = layout.n_slots(), cols = slots == 0 ? 0 : layout.cols();
  std::vector<int64_t> rows(static_cast<size_t>(slots * n * cols));
  EngramHistory hist;
  for (int64_t p0 = 0; p0 < n; p0 += chunk) {
    const int64_t m = std::min(chunk, n - p0);
    std::vector<int64_t> part(static_cast<size_t>(slots * m * cols));
    const std::span<const int64_t> tok(ids->data() + p0, static_cast<size_t>(m));
    const std::span<const uint8_t> img = image.empty() ? std::span<const uint8_t>() : std::span<const uint8_t>(image).subspan(static_cast<size_t>(p0), static_cast<size_t>(m));
    if (auto st = hasher->hash_chunk(p0, tok, img, hist, part); !st) return fail(st.error().message);
    for (int64_t s = 0; s < slots; ++s)
      std::copy(part.begin() + s * m * cols, part.begin() + (s + 1) * m * cols, rows.begin() + (s * n + p0) * cols);
  }

  std::string out;
  if (a.flag("json")) {
    nlohmann::json doc{{"pad", hasher->pad()}, {"layers", nlohmann::json::array()}};
    for (int64_t s = 0; s < slots; ++s) {
      auto span_json = [](std::span<const int64_t> v) { return nlohmann::json(std::vector<int64_t>(v.begin(), v.end())); };
      nlohmann::json per_pos = nlohmann::json::array();
      for (int64_t p = 0; p < n; ++p)
        per_pos.push_back(span_json(std::span<const int64_t>(rows).subspan(static_cast<size_t>((s * n + p) * cols), static_cast<size_t>(cols))));
      doc["layers"].push_back({{"layer", layout.layer_id(s)},
                               {"multipliers", span_json(layout.multipliers(s))},
                               {"primes", span_json(layout.primes(s))},
                               {"offsets", span_json(layout.offsets(s))},
                               {"rows", per_pos}});
    }
    out = doc.dump() + "\n";
  } else {
    for (int64_t s = 0; s < slots; ++s)
      for (int64_t p = 0; p < n; ++p) {
        out += "layer " + std::to_string(layout.layer_id(s)) + " pos " + std::to_string(p) + ":";
        for (int64_t c = 0; c < cols; ++c) out += " " + std::to_string(rows[static_cast<size_t>((s * n + p) * cols + c)]);
        out += "\n";
      }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace cedar::cli
