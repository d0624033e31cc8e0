// EngineBackend (the engine behind the HTTP server) on the engine's deterministic FakeModelRunner:
// requests stream to the end, cancels free the sequence, stats return to zero, and a streamed chat
// equals the non-streamed one for the same seed.
#include "server/engine_backend.h"

#include <gtest/gtest.h>

#include "engine/fake_model.h"
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

}  // namespace
}  // namespace cedar::server
