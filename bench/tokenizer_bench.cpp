// Tokenizer throughput, single thread: encode (MB/s and tokens/s), decode, streaming decode.
// Corpus: the JSON-lines file (one JSON string per line) that bench/tokenizer_vs_hf.py writes and times HF
// tokenizers on, so both numbers are for the same text. Path: $CEDAR_TOKENIZER_CORPUS, default
// build/tokenizer_corpus.jsonl. Tokenizer: $CEDAR_TOKENIZER, default the V4 tokenizer.json.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

using cedar::text::TokenId;
using cedar::text::Tokenizer;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Fixture {
  std::string error;
  const Tokenizer* tok = nullptr;
  std::vector<std::string> docs;
  std::vector<std::vector<TokenId>> ids;
  size_t bytes = 0, tokens = 0;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    static auto tok = Tokenizer::load(
        env_or("CEDAR_TOKENIZER", std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json"));
    if (!tok) {
      x.error = tok.error().message;
      return x;
    }
    x.tok = &tok.value();
    const std::string path = env_or("CEDAR_TOKENIZER_CORPUS", std::string(CEDAR_SOURCE_DIR) + "/build/tokenizer_corpus.jsonl");
    std::ifstream in(path);
    if (!in) {
      x.error = "no corpus at " + path + " (write it with: python bench/tokenizer_vs_hf.py --write-corpus " + path + ")";
      return x;
    }
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_string()) x.docs.push_back(j.get<std::string>());
    }
    for (const auto& d : x.docs) {
      x.ids.push_back(x.tok->encode(d).value());
      x.bytes += d.size();
      x.tokens += x.ids.back().size();
    }
    return x;
  }();
  return f;
}

void report(benchmark::State& state, const Fixture& f) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * f.tokens), benchmark::Counter::kIsRate);
}

void BM_Encode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  cedar::text::TokenizeOptions opts;
  opts.allow_added_tokens = state.range(0) != 0;
  for (auto _ : state)
    for (const auto& d : f.docs) benchmark::DoNotOptimize(f.tok->encode(d, opts));
  report(state, f);
}
BENCHMARK(BM_Encode)->Arg(0)->ArgName("added_tokens")->Arg(1)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  for (auto _ : state)
    for (const auto& ids : f.ids) benchmark::DoNotOptimize(f.tok->decode(ids));
  report(state, f);
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamDecode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::string out;
  for (auto _ : state) {
    for (const auto& ids : f.ids) {
      cedar::text::StreamDecoder dec(*f.tok);
      out.clear();
      for (TokenId id : ids) (void)dec.push(id, out);
      out += dec.finish();
      benchmark::DoNotOptimize(out.data());
    }
  }
  report(state, f);
}
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  const std::string path =
      env_or("CEDAR_TOKENIZER", std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json");
  for (auto _ : state) benchmark::DoNotOptimize(Tokenizer::load(path));
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
