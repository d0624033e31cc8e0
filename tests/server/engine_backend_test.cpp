// EngineBackend (the engine behind the HTTP server) on the engine's deterministic FakeModelRunner:
// requests stream to the end, cancels free the sequence, stats return to zero, and a streamed chat
// equals the non-streamed one for the same seed.
#include "server/engine_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/fake_model.h"
#include "engine/pool_cache_budget.h"
#include "server/http_server.h"
#include "server_test_util.h"

namespace cedar::server {
namespace {

using text::Json;

struct EngineServer {
  engine::FakeModelRunner runner;
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;
  static engine::FakeModelOptions model_options() {
    engine::FakeModelOptions o;
    o.vocab = testing::v41_tokenizer()->vocab_size();  // the chat prompt ids must be in range
    o.eos = 1;
    return o;
  }
  EngineServer() : runner(model_options()) {
    EngineBackendOptions eo;
    eo.kv_capacity_bytes = int64_t{1} << 30;
    eo.context_length = 512;
    eo.bos_token = 0;
    backend = std::make_unique<EngineBackend>(runner, *testing::v41_tokenizer(), eo);
    ServerOptions so;
    so.port = 0;
    server = std::make_unique<Server>(*backend, so);
    port = *server->bind();
    thread = std::thread([this] { (void)server->serve(); });
  }
  ~EngineServer() {
    server->stop();
    thread.join();
  }
};

// A small paged KV pool (8-token blocks, one stream) under a PoolCacheBudget, the fake runner on it
// and an EngineBackend on that budget (as `cedar serve` runs with a prefix cache), served on a port.
struct PooledEngineServer {
  engine::PoolCacheLayout layout;
  std::unique_ptr<engine::PoolCacheBudget> budget;
  std::unique_ptr<engine::FakeModelRunner> runner;
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;
  PooledEngineServer() {
    layout.tokens_per_block = 8;
    layout.streams = {{1, 8, 8 * 16}};
    layout.bytes_per_sequence = 64;
    auto b = engine::PoolCacheBudget::create(layout, int64_t{1} << 24);
    if (!b.ok()) return;  // budget_ok() is false
    budget = std::move(*b);
    engine::FakeModelOptions fo = EngineServer::model_options();
    fo.pool = budget->pool();
    fo.layout = layout;
    runner = std::make_unique<engine::FakeModelRunner>(fo);
  }
  bool budget_ok() const { return budget != nullptr; }
  // Starts the backend (`eo` with this budget and a 4096-token context) and the server.
  void start(EngineBackendOptions eo) {
    eo.budget = budget.get();
    eo.context_length = 4096;
    backend = std::make_unique<EngineBackend>(*runner, *testing::v41_tokenizer(), eo);
    ServerOptions so;
    so.port = 0;
    server = std::make_unique<Server>(*backend, so);
    port = *server->bind();
    thread = std::thread([this] { (void)server->serve(); });
  }
  void stop() {
    server->stop();
    thread.join();
    backend->shutdown();
  }
  ~PooledEngineServer() {
    if (thread.joinable()) stop();
  }
};

TEST(EngineBackend, StreamEqualsNonStreamAndCancelFrees) {
  CEDAR_REQUIRE_TOKENIZER();
  EngineServer es;
  httplib::Client c("127.0.0.1", es.port);
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}],"seed":5,"max_tokens":20,
                               "thinking":{"type":"disabled"},"temperature":1.0})";
  auto whole = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const Json w = Json::parse(whole->body);
  Json sb = Json::parse(body);
  sb["stream"] = true;
  auto streamed = c.Post("/v1/chat/completions", sb.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string content;
  size_t pos = 0;
  while ((pos = streamed->body.find("data: {", pos)) != std::string::npos) {
    const size_t end = streamed->body.find("\n\n", pos);
    const Json ch = Json::parse(streamed->body.substr(pos + 6, end - pos - 6));
    if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("content"))
      content += ch["choices"][0]["delta"]["content"].get<std::string>();
    pos = end;
  }
  EXPECT_EQ(content, w["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_GT(w["usage"]["completion_tokens"].get<int>(), 0);
  // The response ends with the final event; the loop frees the sequence right after.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (es.backend->stats().running > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(es.backend->stats().running, 0);
  EXPECT_EQ(es.runner.live_sequences(), 0);
}

TEST(EngineBackend, CancelEndsTheStreamAndFreesTheSequence) {
  CEDAR_REQUIRE_TOKENIZER();
  EngineServer es;
  std::mutex mu;
  std::condition_variable cv;
  int tokens = 0;
  BackendFinish finish = BackendFinish::kNone;
  BackendRequest req;
  req.prompt = {0, 100, 200, 300};
  req.sampling.max_tokens = 100000;
  req.sampling.ignore_eos = true;
  auto id = es.backend->submit(req, [&](const BackendEvent& e) {
    std::lock_guard lock(mu);
    if (e.token) ++tokens;
    if (e.finish != BackendFinish::kNone) finish = e.finish;
    cv.notify_all();
  });
  ASSERT_TRUE(id.ok()) << id.error().message;
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return tokens >= 2; });
  }
  es.backend->cancel(*id);
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return finish != BackendFinish::kNone; });
  }
  EXPECT_EQ(finish, BackendFinish::kCancelled);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (es.backend->stats().running > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(es.backend->stats().running, 0);
  EXPECT_EQ(es.runner.live_sequences(), 0);
  EXPECT_EQ(es.backend->stats().kv_used_bytes, 0);
}

// The engine's prefix cache behind the server: a re-sent conversation reports its cached prompt tokens in
// every usage dialect (OpenAI, DeepSeek, Anthropic) and in /metrics.
TEST(EngineBackend, RepeatedPromptsReportCachedTokensInUsage) {
  CEDAR_REQUIRE_TOKENIZER();
  PooledEngineServer es;
  ASSERT_TRUE(es.budget_ok());
  es.start({});
  EngineBackend& backend = *es.backend;
  httplib::Client c("127.0.0.1", es.port);
  const std::string text(400, 'a');  // a long user message: several cache blocks
  const Json body = {{"messages", Json::array({Json{{"role", "user"}, {"content", "Summarize: " + text}}})},
                     {"max_tokens", 3},
                     {"seed", 1},
                     {"thinking", Json{{"type", "disabled"}}}};
  std::vector<Json> usage;
  for (int i = 0; i < 2; ++i) {
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    usage.push_back(Json::parse(r->body)["usage"]);
  }
  const int64_t prompt = usage[1]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(usage[0]["prompt_tokens_details"]["cached_tokens"], 0);
  // All full blocks but the one holding the last prompt token.
  const int64_t expected = (prompt - 1) / 8 * 8;
  ASSERT_GT(expected, 0);
  EXPECT_EQ(usage[1]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), expected) << usage[1].dump();
  EXPECT_EQ(usage[1]["prompt_cache_hit_tokens"].get<int64_t>(), expected);
  EXPECT_EQ(usage[1]["prompt_cache_miss_tokens"].get<int64_t>(), prompt - expected);
  // Streamed usage (DSH's stream_options.include_usage) carries it too.
  Json sb = body;
  sb["stream"] = true;
  sb["stream_options"] = Json{{"include_usage", true}};
  auto streamed = c.Post("/v1/chat/completions", sb.dump(), "application/json");
  ASSERT_TRUE(streamed);
  const size_t at = streamed->body.find("\"prompt_cache_hit_tokens\":");
  ASSERT_NE(at, std::string::npos) << streamed->body;
  EXPECT_EQ(std::stoll(streamed->body.substr(at + 26)), expected);
  // Anthropic: input_tokens excludes the cache reads.
  const Json msg = {{"model", "deepseek-v4.1-flash"},
                    {"max_tokens", 3},
                    {"messages", Json::array({Json{{"role", "user"}, {"content", "Summarize: " + text}}})}};
  Json anthropic;
  for (int i = 0; i < 2; ++i) {
    auto r = c.Post("/v1/messages", msg.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    anthropic = Json::parse(r->body)["usage"];
  }
  EXPECT_GT(anthropic["cache_read_input_tokens"].get<int64_t>(), 0) << anthropic.dump();
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("cedar_prefix_cache_enabled 1"), std::string::npos);
  EXPECT_EQ(metrics->body.find("cedar_prefix_cache_hit_tokens_total 0\n"), std::string::npos) << metrics->body;
  EXPECT_EQ(metrics->body.find("cedar_prefix_cache_index_blocks 0\n"), std::string::npos);
  EXPECT_EQ(metrics->body.find("cedar_swa_pool_entries 0\n"), std::string::npos);
  // Hits restore from snapshots or replay exactly (the default --swa-replay exact): none approximate.
  EXPECT_NE(metrics->body.find("# TYPE cedar_prefix_cache_snapshot_restores_total counter"), std::string::npos);
  EXPECT_NE(metrics->body.find("cedar_prefix_cache_approximate_restores_total 0\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("cedar_prefix_cache_window_replay_restores_total 0\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("cedar_kv_disk_enabled 0\n"), std::string::npos);  // no SSD tier
  EXPECT_EQ(metrics->body.find("cedar_kv_disk_files"), std::string::npos);
  es.stop();
  EXPECT_EQ(backend.stats().kv_used_bytes, 0);  // the sequences are gone; the cached prefixes stay
  EXPECT_GT(backend.stats().prefix_cache_index_bytes, 0);
}

// With an SSD tier (--kv-cache-dir), /metrics exports its stats (cedar_kv_disk_*), equal to the store's;
// without SWA snapshots the repeated prompt is a replay restore (the exact bounded replay).
TEST(EngineBackend, MetricsExportTheSsdTierAndReplayCounters) {
  CEDAR_REQUIRE_TOKENIZER();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("cedar-backend-kv-disk-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  KvDiskStoreOptions ko;
  ko.dir = dir;
  ko.budget_bytes = int64_t{1} << 24;
  ko.model_fingerprint = "fake-model";
  ko.layout.tokens_per_block = 8;
  ko.layout.streams = {{16, 8}};
  ko.log = [](const std::string&) {};
  auto store = KvDiskStore::open(ko);
  ASSERT_TRUE(store.ok()) << store.error().message;
  PooledEngineServer es;  // after the store: the backend goes first
  ASSERT_TRUE(es.budget_ok());
  EngineBackendOptions eo;
  eo.prefix_cache.store = store->get();
  eo.prefix_cache.swa_pool_bytes = 0;  // no snapshots: hits replay
  eo.kv_disk = store->get();
  es.start(eo);
  EngineBackend& backend = *es.backend;
  httplib::Client c("127.0.0.1", es.port);
  const Json body = {{"messages", Json::array({Json{{"role", "user"}, {"content", std::string(300, 'b')}}})},
                     {"max_tokens", 2},
                     {"thinking", Json{{"type", "disabled"}}}};
  int64_t cached = 0;
  for (int i = 0; i < 2; ++i) {
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    cached = Json::parse(r->body)["usage"]["prompt_cache_hit_tokens"].get<int64_t>();
    // The finish event goes out before the engine records the finished sequence: wait for it to settle.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (backend.stats().running > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(cached, 0);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const KvDiskStoreStats st = (*store)->stats();
  ASSERT_GT(st.files, 0);
  auto value = [&](const std::string& name) -> int64_t {
    const size_t at = metrics->body.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(metrics->body.substr(at + name.size() + 2));
  };
  EXPECT_EQ(value("cedar_kv_disk_enabled"), 1) << metrics->body;
  EXPECT_EQ(value("cedar_kv_disk_files"), st.files);
  EXPECT_EQ(value("cedar_kv_disk_bytes"), st.bytes);
  EXPECT_EQ(value("cedar_kv_disk_budget_bytes"), int64_t{1} << 24);
  EXPECT_EQ(value("cedar_kv_disk_puts_total"), st.puts);
  EXPECT_EQ(value("cedar_kv_disk_written_bytes_total"), st.bytes_written);
  EXPECT_EQ(value("cedar_kv_disk_corrupt_total"), 0);
  EXPECT_NE(metrics->body.find("# TYPE cedar_kv_disk_hits_total counter"), std::string::npos);
  EXPECT_EQ(value("cedar_prefix_cache_replay_restores_total"), 1);
  EXPECT_EQ(value("cedar_prefix_cache_snapshot_restores_total"), 0);
  EXPECT_EQ(value("cedar_prefix_cache_window_replay_restores_total"), 0);
  EXPECT_EQ(value("cedar_prefix_cache_approximate_restores_total"), 0);
  EXPECT_GT(value("cedar_prefix_cache_replayed_tokens_total"), 0);
  EXPECT_LT(value("cedar_prefix_cache_replayed_tokens_total"), cached);  // bounded: not the whole prefix
  es.stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace cedar::server
