// Throughput of the prompt encoder (to text, and to token ids with the real tokenizer), and of the
// streaming output parser (normal and JSON output mode).
#include <benchmark/benchmark.h>

#include <filesystem>

#include "text/encoder.h"
#include "text/output_parser.h"
#include "text/prompt_tokens.h"

namespace {
using namespace cedar::text;

std::vector<Message> conversation(int turns) {
  std::vector<Message> msgs;
  Message s;
  s.role = Role::kSystem;
  s.content = "You are a helpful assistant.";
  s.tools = Json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Get weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  msgs.push_back(s);
  for (int t = 0; t < turns; ++t) {
    Message u;
    u.content = "What is the weather in Paris for the next few days? " + std::string(200, 'x');
    Message a;
    a.role = Role::kAssistant;
    a.reasoning_content = std::string(400, 'r');
    a.tool_calls.push_back({"call_" + std::to_string(t), "get_weather", R"({"city": "Paris", "days": 3})", ""});
    Message tool;
    tool.role = Role::kTool;
    tool.tool_call_id = "call_" + std::to_string(t);
    tool.content = R"({"temp_c": 18, "sky": "clear"})";
    msgs.insert(msgs.end(), {u, a, tool});
  }
  return msgs;
}

void BM_Encode(benchmark::State& state) {
  const auto msgs = conversation(static_cast<int>(state.range(0)));
  EncodeOptions o;
  o.thinking = true;
  size_t bytes = 0;
  for (auto _ : state) {
    auto p = encode_messages(msgs, o);
    bytes += p->str().size();
    benchmark::DoNotOptimize(p);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Encode)->Arg(1)->Arg(16)->Arg(128);

// Encoder + tokenizer: a request to the ids the engine needs (the V4 tokenizer.json has every
// control token of a V4 prompt, so the V4 dialect is used).
void BM_EncodeToIds(benchmark::State& state) {
  static const std::string path = std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json";
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("tokenizer.json missing: run tools/fetch_tokenizer.py");
    return;
  }
  static const auto tok = Tokenizer::load(path);
  const auto msgs = conversation(static_cast<int>(state.range(0)));
  EncodeOptions o;
  o.dialect = Dialect::kV4;
  o.thinking = true;
  size_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    auto p = encode_messages(msgs, o);
    auto ids = prompt_token_ids(*p, *tok);
    bytes += p->str().size();
    tokens += ids->size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeToIds)->Arg(16);

void BM_StreamParse(benchmark::State& state) {
  std::string text = std::string(2000, 'r') + "</think>" + std::string(1000, 'c') +
                     "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">" +
                     std::string(500, 'v') + "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const size_t chunk = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    ParserOptions opt;
    opt.start = ParseStart::kReasoning;
    StreamParser p(opt);
    std::vector<ParseEvent> ev;
    for (size_t i = 0; i < text.size(); i += chunk) (void)p.feed(std::string_view(text).substr(i, chunk), ev);
    (void)p.finish(StopCause::kEos, ev);
    benchmark::DoNotOptimize(ev);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_StreamParse)->Arg(4)->Arg(64);

void BM_StreamParseJsonOutput(benchmark::State& state) {
  std::string text = "Here you go:\n```json\n{";
  for (int i = 0; i < 100; ++i) text += "\"key" + std::to_string(i) + "\": [1, 2.5, \"value\", null], ";
  text += "\"end\": true}\n```\nDone.";
  const size_t chunk = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    ParserOptions opt;
    opt.json_output = true;
    opt.stop = {"STOP"};
    StreamParser p(opt);
    std::vector<ParseEvent> ev;
    for (size_t i = 0; i < text.size(); i += chunk) (void)p.feed(std::string_view(text).substr(i, chunk), ev);
    (void)p.finish(StopCause::kEos, ev);
    benchmark::DoNotOptimize(ev);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_StreamParseJsonOutput)->Arg(4);

}  // namespace

BENCHMARK_MAIN();
