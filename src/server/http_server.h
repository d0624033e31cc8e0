// `cedar serve`'s HTTP layer (cpp-httplib): OpenAI / DeepSeek endpoints over a GenerationBackend.
//   POST /v1/chat/completions, POST /v1/completions (stream and not), GET /v1/models,
//   POST /tokenize, POST /detokenize, GET /health, GET /metrics.
// Each HTTP worker thread serves one connection; a generation request only waits on its own event
// queue, which the backend's loop fills without ever blocking. Robustness (docs/server.md): bodies
// over max_body_bytes get 413, bad JSON / fields 400 (message names the field), a prompt that fills
// the context 400 context_length_exceeded, a missing or wrong key 401, more than max_inflight
// generations 429 with Retry-After, a client that disconnects mid-stream cancels its generation,
// and stop() drains in-flight requests before closing.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/backend.h"
#include "server/metrics.h"
#include "text/request_mapping.h"

namespace cedar::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                           // 0: any free port (bind() returns it)
  std::string api_key;                       // empty: no authentication
  std::vector<std::string> served_model_names;  // empty: default_served_model_names()
  text::RequestPolicy policy;
  size_t max_body_bytes = 16u << 20;
  int64_t max_inflight = 128;                // generation requests at once; more get 429
  int http_threads = 192;                    // connections served at once (> max_inflight)
  std::chrono::milliseconds keepalive_interval{5000};  // SSE ": keep-alive" while no token arrives
  int read_timeout_s = 30;
  int write_timeout_s = 60;
  std::chrono::milliseconds drain_timeout{10000};  // stop(): wait this long for in-flight requests
};

// DSH sends the model name verbatim (serving.md §4c).
std::vector<std::string> default_served_model_names();

class Server {
 public:
  Server(GenerationBackend& backend, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port.
  Result<int> bind();
  // Serves until stop() (call bind() first). Blocks.
  Status serve();
  // Refuses new generations (503), waits up to drain_timeout for in-flight ones, cancels the rest,
  // and makes serve() return. Safe from any thread; idempotent.
  void stop();
  int64_t inflight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cedar::server
