#include "text/encoder.h"

#include <algorithm>
#include <map>

#include "text/replay.h"
#include "text/special_tokens.h"
#include "text/tools.h"

namespace cedar::text {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kDeveloper: return "developer";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
    case Role::kLatestReminder: return "latest_reminder";
  }
  return "?";
}

namespace {

constexpr std::string_view kResponseFormatHeader =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

// --- step 1 (V4.1): images become placeholders; literal placeholders in text are rejected ----------
Status process_blocks(std::vector<Block>& blocks, size_t msg_index) {
  for (auto& b : blocks) {
    if (b.kind == Block::Kind::kImage) {
      Json record = b.image;
      b = Block{};
      b.kind = Block::Kind::kText;
      b.text = std::string(tok::kImage);
      b.is_placeholder = true;
      b.image = std::move(record);
    } else if (b.kind == Block::Kind::kToolResult && b.result_is_list) {
      CEDAR_RETURN_IF_ERROR(process_blocks(b.result_items, msg_index));
    } else if (b.kind == Block::Kind::kText && !b.is_placeholder && contains(b.text, tok::kImage)) {
      return make_error("messages[" + std::to_string(msg_index) + "]: a text block contains the image placeholder " +
                        std::string(tok::kImage) + "; send images as image content blocks");
    }
  }
  return Status::Ok();
}

Status process_images(std::vector<Message>& msgs, size_t first_index) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    auto& m = msgs[i];
    const size_t idx = first_index + i;
    if (m.content && contains(*m.content, tok::kImage)) {
      return make_error("messages[" + std::to_string(idx) + "].content contains the image placeholder " +
                        std::string(tok::kImage) + "; send images as image content blocks");
    }
    if (m.reasoning_content && contains(*m.reasoning_content, tok::kImage)) {
      return make_error("messages[" + std::to_string(idx) + "].reasoning_content contains the image placeholder " +
                        std::string(tok::kImage));
    }
    if (m.blocks && !m.blocks->empty()) {
      CEDAR_RETURN_IF_ERROR(process_blocks(*m.blocks, idx));
      if (m.role == Role::kTool) {
        // The official encoder keeps only the joined text of a tool message's list content.
        std::vector<Block> texts;
        for (auto& b : *m.blocks) if (b.kind == Block::Kind::kText) texts.push_back(std::move(b));
        m.blocks = std::move(texts);
      }
    }
  }
  return Status::Ok();
}

// --- step 2: tool messages and consecutive user messages merge into one user turn -----------------
std::vector<Message> merge_tool_messages(std::vector<Message> msgs, const DialectSpec& spec) {
  std::vector<Message> merged;
  for (auto& m : msgs) {
    const bool prev_user = !merged.empty() && merged.back().role == Role::kUser && merged.back().blocks.has_value();
    if (m.role == Role::kTool) {
      Block b;
      b.kind = Block::Kind::kToolResult;
      b.tool_use_id = m.tool_call_id;
      if (m.blocks) {
        b.result_is_list = true;
        b.result_items = std::move(*m.blocks);
      } else {
        b.result_text = m.content.value_or("");
      }
      if (prev_user) {
        merged.back().blocks->push_back(std::move(b));
      } else {
        Message u;
        u.role = Role::kUser;
        u.blocks = std::vector<Block>{std::move(b)};
        merged.push_back(std::move(u));
      }
    } else if (m.role == Role::kUser) {
      std::vector<Block> blocks;
      if (m.blocks && spec.image_blocks) {
        blocks = std::move(*m.blocks);
      } else {
        Block t;
        t.text = m.content.value_or("");
        blocks.push_back(std::move(t));
      }
      if (prev_user && !merged.back().task) {
        auto& dst = *merged.back().blocks;
        for (auto& b : blocks) dst.push_back(std::move(b));
      } else {
        m.blocks = std::move(blocks);
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

// --- step 3: tool results follow the order of the calls of the latest assistant turn --------------
void sort_tool_results(std::vector<Message>& msgs) {
  std::map<std::string, size_t> order;
  for (auto& m : msgs) {
    if (m.role == Role::kAssistant && !m.tool_calls.empty()) {
      order.clear();
      // Python assigns each id in turn, so a repeated id keeps its last index.
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
      }
    } else if (m.role == Role::kUser && m.blocks && !m.blocks->empty()) {
      std::vector<Block> results;
      for (auto& b : *m.blocks) if (b.kind == Block::Kind::kToolResult) results.push_back(b);
      if (results.size() <= 1 || order.empty()) continue;
      auto key = [&](const Block& b) {
        auto it = order.find(b.tool_use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) { return key(a) < key(b); });
      size_t k = 0;
      for (auto& b : *m.blocks) if (b.kind == Block::Kind::kToolResult) b = results[k++];
    }
  }
}

bool is_user_like(const DialectSpec& spec, Role role, size_t index) {
  if (role == Role::kUser) return true;
  if (role == Role::kDeveloper) return spec.developer_role;
  if (role == Role::kSystem) return spec.system_token && index > 0;
  return false;
}

long last_user_index(const DialectSpec& spec, const std::vector<Message>& msgs) {
  for (size_t i = msgs.size(); i-- > 0;) {
    if (is_user_like(spec, msgs[i].role, i)) return static_cast<long>(i);
  }
  return -1;
}

// --- step 5: drop reasoning (and any non-kept role) before the last user turn ---------------------
std::vector<Message> drop_thinking_messages(const DialectSpec& spec, const std::vector<Message>& msgs,
                                            bool header_after_end = false) {
  const long last = header_after_end ? static_cast<long>(msgs.size()) : last_user_index(spec, msgs);
  std::vector<Message> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Role r = msgs[i].role;
    const bool kept_role = r == Role::kUser || r == Role::kSystem || r == Role::kTool || r == Role::kLatestReminder;
    if (kept_role || static_cast<long>(i) >= last) {
      out.push_back(msgs[i]);
    } else if (r == Role::kAssistant) {
      out.push_back(msgs[i]);
      out.back().reasoning_content.reset();
    }  // anything else (V4 `developer`) before the last user turn disappears, as in the official code
  }
  return out;
}

void render_text_block(Prompt& p, const Block& b) {
  if (b.is_placeholder) {
    p.control(tok::kImage);
    p.images.push_back(b.image);
  } else {
    p.text(b.text);
  }
}

// Content of a system / assistant / latest_reminder message: the string, or its text blocks joined.
void render_plain_content(Prompt& p, const Message& m) {
  if (m.content) { p.text(*m.content); return; }
  if (!m.blocks) return;
  bool first = true;
  for (const auto& b : *m.blocks) {
    if (b.kind != Block::Kind::kText) continue;
    if (!first) p.text("\n\n");
    first = false;
    render_text_block(p, b);
  }
}

void render_user_blocks(Prompt& p, const Message& m) {
  if (!m.blocks || m.blocks->empty()) { p.text(m.content.value_or("")); return; }
  bool first = true;
  for (const auto& b : *m.blocks) {
    if (!first) p.text("\n\n");
    first = false;
    switch (b.kind) {
      case Block::Kind::kText: render_text_block(p, b); break;
      case Block::Kind::kToolResult: {
        p.text("<tool_result>");
        if (!b.result_is_list) {
          p.text(b.result_text);
        } else {
          bool first_item = true;
          for (const auto& item : b.result_items) {
            if (!first_item) p.text("\n\n");
            first_item = false;
            if (item.kind == Block::Kind::kText) render_text_block(p, item);
            else p.text("[Unsupported " + (item.kind == Block::Kind::kOther ? item.text : std::string("image")) + "]");
          }
        }
        p.text("</tool_result>");
        break;
      }
      case Block::Kind::kImage: p.text("[Unsupported image]"); break;  // V4 has no image support
      case Block::Kind::kOther: p.text("[Unsupported " + b.text + "]"); break;
    }
  }
}

Status render_system_extras(Prompt& p, const Message& m, const DialectSpec& spec, size_t index) {
  if (!m.tools.empty()) {
    p.text("\n\n");
    auto tools = render_tools(m.tools, spec);
    if (!tools.ok()) return tools.error().with_context("messages[" + std::to_string(index) + "].tools");
    p.append(*tools);
  }
  if (!m.response_format.is_null() && !(m.response_format.is_object() && m.response_format.empty())) {
    p.text("\n\n");
    p.text(kResponseFormatHeader);
    p.text(py_json_dumps(m.response_format));
  }
  return Status::Ok();
}

struct RenderContext {
  const DialectSpec& spec;
  const EncodeOptions& opt;
  const std::vector<Message>& msgs;
  const std::string& effort_text;  // "" when none
  bool drop;                       // effective drop_thinking
  long last_user;
};

Status render_message(Prompt& p, const RenderContext& ctx, size_t i) {
  const auto& spec = ctx.spec;
  const Message& m = ctx.msgs[i];
  const bool thinking = ctx.opt.thinking;
  const std::string effort = (i == 0 && thinking) ? ctx.effort_text : std::string();
  const std::string where = "messages[" + std::to_string(i) + "]";

  if (spec.system_token) {
    if (i == 0 && (!effort.empty() || m.role == Role::kSystem)) p.control(tok::kSystem);
  }
  p.text(effort);

  switch (m.role) {
    case Role::kSystem:
      if (spec.system_token && i > 0) p.control(tok::kSystem);
      render_plain_content(p, m);
      CEDAR_RETURN_IF_ERROR(render_system_extras(p, m, spec, i));
      break;
    case Role::kDeveloper:
      if (!spec.developer_role) return make_error(where + ": unknown role 'developer' for dialect " + std::string(spec.name));
      if (!m.content || m.content->empty()) return make_error(where + ": a developer message needs non-empty content");
      p.control(tok::kUser);
      p.text(*m.content);
      CEDAR_RETURN_IF_ERROR(render_system_extras(p, m, spec, i));
      break;
    case Role::kUser:
      p.control(tok::kUser);
      render_user_blocks(p, m);
      break;
    case Role::kLatestReminder:
      p.control(tok::kLatestReminder);
      render_plain_content(p, m);
      break;
    case Role::kTool:
      return make_error(where + ": tool message was not merged (internal error)");
    case Role::kAssistant: {
      const bool prev_has_task = i > 0 && ctx.msgs[i - 1].task.has_value();
      const bool with_thinking = thinking && !prev_has_task && (!ctx.drop || static_cast<long>(i) > ctx.last_user);
      const Prompt* replayed = nullptr;
      if (ctx.opt.replay && (!thinking || with_thinking)) replayed = ctx.opt.replay->restore(m, thinking);
      if (replayed) {
        p.append(*replayed);
      } else {
        if (with_thinking) {
          p.text(m.reasoning_content.value_or(""));
          p.control(tok::kThinkEnd);
        }
        render_plain_content(p, m);
        if (!m.tool_calls.empty()) {
          auto block = render_tool_calls_block(m.tool_calls, spec.dialect);
          if (!block.ok()) return block.error().with_context(where + ".tool_calls");
          p.append(*block);
        }
      }
      if (!m.wo_eos) p.control(tok::kEos);
      break;
    }
  }

  // Transition: the generation header belongs to the turn before the assistant's answer.
  if (i + 1 < ctx.msgs.size()) {
    const Role next = ctx.msgs[i + 1].role;
    if (next != Role::kAssistant && next != Role::kLatestReminder) return Status::Ok();
  }
  if (m.task) {
    std::string_view token;
    for (const auto& t : tok::kTaskTokens) if (t.task == *m.task) token = t.token;
    if (token.empty()) {
      return make_error(where + ".task: invalid task '" + *m.task +
                        "' (valid: action, query, authority, domain, title, read_url)");
    }
    if (*m.task != "action") {
      p.control(token);
    } else {
      p.control(tok::kAssistant);
      p.control(thinking ? tok::kThinkStart : tok::kThinkEnd);
      p.control(token);
    }
  } else if (is_user_like(spec, m.role, i)) {
    p.control(tok::kAssistant);
    const bool open_thinking = thinking && (!ctx.drop || static_cast<long>(i) >= ctx.last_user);
    p.control(open_thinking ? tok::kThinkStart : tok::kThinkEnd);
  }
  return Status::Ok();
}

}  // namespace

Result<Prompt> render_tool_calls_block(const std::vector<ToolCall>& calls, Dialect dialect) {
  const auto& spec = dialect_spec(dialect);
  Prompt p;
  p.text("\n\n<");
  p.control(tok::kDsml);
  p.text(std::string(spec.calls_tag) + ">\n");
  for (size_t c = 0; c < calls.size(); ++c) {
    const auto& call = calls[c];
    if (c) p.text("\n");
    const std::string name = call.ns.empty() ? call.name : call.ns + "::" + call.name;
    p.text("<");
    p.control(tok::kDsml);
    p.text(std::string(spec.invoke_tag) + " name=\"");
    p.text(name);
    p.text("\">\n");
    auto params = tool_arguments_for_dsml(call.arguments, spec.arguments_policy);
    if (!params.ok()) return params.error().with_context("call " + std::to_string(c) + " (" + call.name + ")");
    for (size_t k = 0; k < params->size(); ++k) {
      const auto& [key, value, is_string] = (*params)[k];
      if (k) p.text("\n");
      p.text("<");
      p.control(tok::kDsml);
      p.text(std::string(spec.parameter_tag) + " name=\"");
      p.text(key);
      p.text(std::string("\" string=\"") + (is_string ? "true" : "false") + "\">");
      p.text(value);
      p.text("</");
      p.control(tok::kDsml);
      p.text(std::string(spec.parameter_tag) + ">");
    }
    p.text("\n</");
    p.control(tok::kDsml);
    p.text(std::string(spec.invoke_tag) + ">");
  }
  p.text("\n</");
  p.control(tok::kDsml);
  p.text(std::string(spec.calls_tag) + ">");
  return p;
}

Result<Prompt> encode_messages(const std::vector<Message>& messages, const EncodeOptions& options) {
  const DialectSpec& spec = dialect_spec(options.dialect);
  if (options.context_messages > messages.size()) {
    return make_error("context_messages (" + std::to_string(options.context_messages) + ") exceeds the " +
                      std::to_string(messages.size()) + " messages given");
  }
  auto effort = effort_prefix(spec, options.effort);
  if (!effort.ok()) return effort.error();

  const auto split = messages.begin() + static_cast<long>(options.context_messages);
  std::vector<Message> context(messages.begin(), split), current(split, messages.end());
  if (spec.image_blocks) {
    CEDAR_RETURN_IF_ERROR(process_images(context, 0));
    CEDAR_RETURN_IF_ERROR(process_images(current, options.context_messages));
  }
  std::vector<Message> ctx_merged = merge_tool_messages(std::move(context), spec);
  std::vector<Message> full = ctx_merged;
  for (auto& m : merge_tool_messages(std::move(current), spec)) full.push_back(std::move(m));
  const size_t current_merged = full.size() - ctx_merged.size();
  sort_tool_results(full);

  bool drop = options.drop_thinking;
  for (const auto& m : full) if (!m.tools.empty()) drop = false;

  // A final assistant message followed by a new generation header (serving mode, not a prefix).
  const bool trailing_header = options.header_after_final_assistant && !full.empty() &&
                               full.back().role == Role::kAssistant && !full.back().wo_eos;

  size_t first = ctx_merged.size(), count = current_merged;
  if (options.thinking && drop) {
    full = drop_thinking_messages(spec, full, trailing_header);
    count = full.size() - drop_thinking_messages(spec, ctx_merged).size();
    first = full.size() - count;
  }

  Prompt prompt;
  if (options.add_bos && options.context_messages == 0) prompt.control(tok::kBos);
  const long last_user = trailing_header ? static_cast<long>(full.size()) : last_user_index(spec, full);
  const RenderContext ctx{spec, options, full, *effort, drop, last_user};
  for (size_t i = first; i < first + count; ++i) CEDAR_RETURN_IF_ERROR(render_message(prompt, ctx, i));
  if (trailing_header) {
    prompt.control(tok::kAssistant);
    prompt.control(options.thinking ? tok::kThinkStart : tok::kThinkEnd);
  }
  return prompt;
}

}  // namespace cedar::text
