// Shared by the server tests: the real V4.1 tokenizer (skip with the reason when the file is missing)
// and an in-process server over a FakeBackend on a free loopback port.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "model/tokenizer_source.h"
#include "server/fake_backend.h"
#include "server/http_server.h"

namespace cedar::server::testing {

// nullptr when the tokenizer file is absent (the caller skips, saying why).
inline const text::Tokenizer* v41_tokenizer() {
  static std::unique_ptr<text::Tokenizer> tok = [] {
    const std::string path = std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::unique_ptr<text::Tokenizer>();
    std::stringstream ss;
    ss << in.rdbuf();
    auto json = tokenizer_json_for(Arch::DeepseekV41, ss.str(), path);
    if (!json.ok()) return std::unique_ptr<text::Tokenizer>();
    auto t = text::Tokenizer::from_json(*json, path);
    return t.ok() ? std::make_unique<text::Tokenizer>(std::move(*t)) : std::unique_ptr<text::Tokenizer>();
  }();
  return tok.get();
}

#define CEDAR_REQUIRE_TOKENIZER()                                                                       \
  if (::cedar::server::testing::v41_tokenizer() == nullptr)                                             \
  GTEST_SKIP() << "third_party/downloads/deepseek-v4/tokenizer.json missing: run tools/fetch_tokenizer.py"

struct TestServer {
  std::unique_ptr<FakeBackend> backend;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;

  explicit TestServer(FakeBackendOptions fo, ServerOptions so = {}) {
    fo.tokenizer = v41_tokenizer();
    backend = std::make_unique<FakeBackend>(fo);
    so.port = 0;
    so.http_threads = std::max(so.http_threads, 16);
    server = std::make_unique<Server>(*backend, so);
    auto p = server->bind();
    EXPECT_TRUE(p.ok());
    port = p.ok() ? *p : 0;
    thread = std::thread([this] { (void)server->serve(); });
  }
  ~TestServer() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c;
  }
};

}  // namespace cedar::server::testing
