// `cedar chat`: an interactive conversation. Each user line is added to the history, the history is
// rendered by the prompt encoder (encoding.md §2), the reply streams through the output parser
// (§3): reasoning is shown apart from the answer, tool calls are printed. Reads stdin line by line,
// so it works as well from a pipe as from a terminal.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_runner.h"
#include "cli/generation_setup.h"
#include "engine/engine.h"
#include "server/wire_request.h"
#include "text/encoder.h"
#include "text/output_parser.h"
#include "text/prompt_tokens.h"

namespace cedar::cli {
namespace {

CommandSpec make_spec() {
  CommandSpec spec{
      "chat",
      "Chat with a model: type a message per line; /reset clears the conversation, /exit (or end of input)\n"
      "quits. MODEL is a checkpoint directory (default: the embedded tiny model). The reply is parsed as it\n"
      "streams: reasoning is printed under [reasoning], the answer under [answer], tool calls as [tool call].",
      {},
      {"MODEL"},
      {
          {"system", "a system prompt", true, "", "TEXT"},
          {"thinking", "thinking mode (the reply starts with reasoning)", false, "", ""},
          {"dialect", "prompt dialect: v4, v4-0731, v41-pre, v41, v41-1017", true, "v41", "NAME"},
          {"mode", "prefill mode: ced (default) or exact", true, "ced", "MODE"},
          {"exact", "same as --mode exact", false, "", ""},
          {"threads", "worker threads (0 = all cores)", true, "0", "N"},
      }};
  spec.options.push_back(kv_cache_option_spec());
  spec.options.push_back(context_option_spec());
  for (auto& o : sampling_option_specs("128")) spec.options.push_back(o);
  for (auto& o : prefix_cache_option_specs()) spec.options.push_back(o);
  for (auto& o : kv_disk_option_specs()) spec.options.push_back(o);
  spec.options.push_back(device_option_spec());
  return spec;
}

text::Message message_of(text::Role role, const std::string& content) {
  text::Message m;
  m.role = role;
  m.content = content;
  return m;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar chat: %s\n", message.c_str());
  return 1;
}

// Prints parser events, with a section header whenever the kind of output changes.
class ReplyPrinter {
 public:
  void print(const std::vector<text::ParseEvent>& events) {
    for (const auto& e : events) {
      switch (e.kind) {
        case text::ParseEvent::Kind::kReasoning: section("[reasoning] "); out(e.text); break;
        case text::ParseEvent::Kind::kContent: section("[answer] "); out(e.text); break;
        case text::ParseEvent::Kind::kToolCallStart:
          section_ = "";  // every call gets its own header
          section("[tool call] ");
          out(e.ns.empty() ? e.text : e.ns + "::" + e.text);
          out(" ");
          break;
        case text::ParseEvent::Kind::kToolCallArguments: out(e.text); break;
      }
    }
    std::fflush(stdout);
  }
  void end() {
    if (!section_.empty()) std::printf("\n");
    section_.clear();
    std::fflush(stdout);
  }

 private:
  void section(const std::string& name) {
    if (section_ == name) return;
    if (!section_.empty()) std::printf("\n");
    std::printf("%s", name.c_str());
    section_ = name;
  }
  static void out(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }
  std::string section_;
};

}  // namespace

int cmd_chat(const Args& args) {
  const CommandSpec spec = make_spec();
  auto parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar chat: %s\n%s", parsed.error().message.c_str(), usage(spec).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  auto params = sampling_from_args(a);
  auto mode = mode_from_args(a);
  auto dialect = text::parse_dialect(a.get("dialect"));
  auto threads = a.get_int("threads");
  if (!params.ok()) return std::fprintf(stderr, "cedar chat: %s\n", params.error().message.c_str()), 2;
  if (!mode.ok()) return std::fprintf(stderr, "cedar chat: --mode: %s\n", mode.error().message.c_str()), 2;
  if (!dialect.ok()) return std::fprintf(stderr, "cedar chat: --dialect: %s\n", dialect.error().message.c_str()), 2;
  if (!threads.ok() || *threads < 0) return std::fprintf(stderr, "cedar chat: --threads must be >= 0\n"), 2;
  const bool thinking = a.flag("thinking");
  const bool interactive = ::isatty(0) != 0;

  auto cuda = cuda_device_requested(a);
  if (!cuda.ok()) return std::fprintf(stderr, "cedar chat: %s\n", cuda.error().message.c_str()), 2;
  auto kv_bytes = kv_cache_bytes_from_args(a);
  if (!kv_bytes.ok()) return std::fprintf(stderr, "cedar chat: %s\n", kv_bytes.error().message.c_str()), 2;
  // --context is checked against the model's config before its weights load.
  auto head = read_model_head(a.positional(0));
  if (!head.ok()) return fail(head.error().message);
  auto context = context_from_args({&a, &*head, *cuda, *kv_bytes, engine::EngineOptions{}.max_running});
  if (!context.ok()) return std::fprintf(stderr, "cedar chat: %s\n", context.error().message.c_str()), 2;

  ThreadPool pool(static_cast<int>(*threads));
  auto loaded = load_for_generation(LoadRequest{head->path.string(), &pool, true, "chat"});
  if (!loaded.ok()) return fail(loaded.error().message);
  // Each turn re-sends the conversation: the prefix cache resumes it from the previous turn's KV (with
  // the SSD tier, from disk after a restart).
  int exit_code = 0;
  auto gen = generation_engine_from_args({&a, &*loaded, &pool, *mode, *context, "chat"}, exit_code);
  if (!gen) return exit_code;
  engine::Engine& eng = *gen->engine;
  if (interactive) std::fprintf(stderr, "cedar chat: %s (/reset, /exit)\n", loaded->path.string().c_str());

  std::vector<text::Message> history;
  auto reset = [&] {
    history.clear();
    if (a.has("system")) history.push_back(message_of(text::Role::kSystem, a.get("system")));
  };
  reset();
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      std::printf("[reset]\n");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    history.push_back(message_of(text::Role::kUser, line));

    text::EncodeOptions enc;
    enc.dialect = *dialect;
    enc.thinking = thinking;
    auto prompt = text::encode_messages(history, enc);
    if (!prompt.ok()) return fail(prompt.error().message);
    auto ids = text::prompt_token_ids(*prompt, *loaded->tokenizer);
    if (!ids.ok()) return fail(ids.error().message);

    text::ParserOptions po;
    po.dialect = *dialect;
    po.start = thinking ? text::ParseStart::kReasoning : text::ParseStart::kContent;
    text::StreamParser parser(po);
    ReplyPrinter printer;
    std::vector<text::ParseEvent> events;
    Status parse_status;
    // As the server does: the reply stops where the context ends; a conversation that fills it is refused.
    auto max_tokens =
        server::clamp_max_tokens(params->max_tokens, static_cast<int64_t>(ids->size()), gen->context_length);
    if (!max_tokens.ok()) {
      std::fprintf(stderr, "cedar chat: %s (the message is dropped; /reset starts over)\n",
                   max_tokens.error().message.c_str());
      history.pop_back();
      continue;
    }
    engine::GenerationRequest req;
    req.prompt.assign(ids->begin(), ids->end());
    req.params = *params;
    req.params.max_tokens = *max_tokens;
    req.on_event = [&](const engine::StreamEvent& ev) {
      if (ev.text.empty() || !parse_status.ok()) return;
      events.clear();
      parse_status = parser.feed(ev.text, events);
      printer.print(events);
    };
    auto id = eng.submit(std::move(req));
    if (!id.ok()) return fail(id.error().message);
    if (Status st = eng.run_until_idle(); !st.ok()) return fail(st.error().message);
    auto done = eng.take_finished();
    if (done.size() != 1) return fail("internal: the request did not finish");
    if (done[0].finish == engine::FinishReason::kError) return fail(done[0].error);
    if (!parse_status.ok()) return fail(parse_status.error().message);
    events.clear();
    const text::StopCause cause =
        done[0].finish == engine::FinishReason::kLength ? text::StopCause::kLength : text::StopCause::kEos;
    if (Status st = parser.finish(cause, events); !st.ok()) return fail(st.error().message);
    printer.print(events);
    printer.end();
    const text::ParsedCompletion& reply = parser.result();
    std::printf("[finish] %s\n", std::string(text::finish_reason_name(reply.finish)).c_str());
    std::fflush(stdout);
    history.push_back(reply.to_message());
  }
  return 0;
}

}  // namespace cedar::cli
