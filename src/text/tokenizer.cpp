#include "text/tokenizer.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace cedar::text {

namespace {

using json = nlohmann::json;

bool is_null_or(const json& j, const char* key, const json& expected) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || *it == expected;
}

// The component types cedar implements; anything else in tokenizer.json is an explicit error.
Status check_normalizer(const json& root) {
  auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return Status::Ok();
  if (it->value("type", "") == "Sequence" && it->contains("normalizers") && (*it)["normalizers"].empty())
    return Status::Ok();
  return make_error("normalizer " + it->dump() + " is not supported (only none / empty Sequence)");
}

Result<std::vector<SplitPattern>> parse_pre_tokenizer(const json& root) {
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || !it->is_object()) return make_error("pre_tokenizer is missing");
  std::vector<json> steps;
  if (it->value("type", "") == "Sequence") {
    auto list = it->find("pretokenizers");
    if (list == it->end() || !list->is_array())
      return make_error("pre_tokenizer Sequence without a pretokenizers list");
    for (const json& s : *list) steps.push_back(s);
  } else {
    steps.push_back(*it);
  }
  if (steps.empty() || steps.back().value("type", "") != "ByteLevel")
    return make_error("pre_tokenizer must end with ByteLevel");
  const json& bl = steps.back();
  if (bl.value("add_prefix_space", false) || bl.value("use_regex", true))
    return make_error("ByteLevel pre-tokenizer with add_prefix_space or use_regex is not supported: " + bl.dump());
  steps.pop_back();
  std::vector<SplitPattern> patterns;
  for (const json& s : steps) {
    if (s.value("type", "") != "Split" || s.value("behavior", "") != "Isolated" || s.value("invert", false) ||
        !s.contains("pattern") || !s["pattern"].contains("Regex"))
      return make_error("pre-tokenizer step " + s.dump() + " is not supported (only Split(Regex, Isolated))");
    CEDAR_ASSIGN_OR_RETURN(SplitPattern p, split_pattern_from_regex(s["pattern"]["Regex"].get<std::string>()));
    patterns.push_back(p);
  }
  return patterns;
}

Status check_model(const json& model) {
  if (model.value("type", "") != "BPE") return make_error("model.type must be BPE");
  if (!is_null_or(model, "dropout", json()) || !is_null_or(model, "unk_token", json()) ||
      !is_null_or(model, "continuing_subword_prefix", "") || !is_null_or(model, "end_of_word_suffix", "") ||
      model.value("byte_fallback", false) || model.value("ignore_merges", false))
    return make_error("BPE options dropout/unk_token/subword affixes/byte_fallback/ignore_merges are not supported");
  return Status::Ok();
}

Result<std::vector<BpeMergeSpec>> parse_merges(const json& merges) {
  std::vector<BpeMergeSpec> out;
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // "left right" (older tokenizers)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return make_error("merge " + std::to_string(i) + " '" + s + "' is not two space-separated tokens");
      out.push_back({s.substr(0, sp), s.substr(sp + 1)});
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      out.push_back({m[0].get<std::string>(), m[1].get<std::string>()});
    } else {
      return make_error("merge " + std::to_string(i) + " " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return out;
}

Result<std::vector<AddedToken>> parse_added_tokens(const json& root) {
  std::vector<AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  for (const json& t : *it) {
    if (!t.contains("id") || !t.contains("content")) return make_error("added token " + t.dump() + " lacks id/content");
    if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false))
      return make_error("added token " + t.dump() + ": lstrip/rstrip/single_word are not supported");
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id > std::numeric_limits<TokenId>::max()) return make_error("added token id out of range: " + t.dump());
    out.push_back({static_cast<TokenId>(id), t["content"].get<std::string>(), t.value("special", false),
                   t.value("normalized", false)});
  }
  return out;
}

// HF ignores the ids written in added_tokens: on load, a token whose content is already known keeps that id, any
// other gets max(assigned so far)+1, or the vocab size if that is larger (AddedVocabulary::add_tokens). cedar uses
// the written ids, so it insists they are the ones HF derives.
Status check_added_token_ids(const std::vector<AddedToken>& added,
                             const std::vector<std::pair<std::string, TokenId>>& vocab) {
  std::unordered_map<std::string_view, TokenId> known;
  for (const auto& [s, id] : vocab) known.emplace(s, id);
  const auto model_size = static_cast<int64_t>(vocab.size());
  int64_t max_added = -1;
  for (const AddedToken& a : added) {
    if (a.content.empty()) return make_error("added token " + std::to_string(a.id) + " has empty content");
    int64_t id;
    if (auto it = known.find(a.content); it != known.end()) id = it->second;
    else if (max_added < 0) id = model_size;
    else id = (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
    if (id != a.id)
      return make_error("added token '" + a.content + "' has id " + std::to_string(a.id) + " but HF tokenizers would give it " +
                        std::to_string(id) + " (ids must follow the vocab in file order)");
    known.emplace(a.content, a.id);
    max_added = std::max<int64_t>(max_added, a.id);
  }
  return Status::Ok();
}

// HF's ByteLevel decoder: a token whose characters are all in the byte-level alphabet decodes to those bytes;
// any other token (e.g. "<｜User｜>") decodes to its own UTF-8.
std::string token_to_bytes(const std::string& token) {
  std::string bytes;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    int len;
    const int b = unicode_to_byte(decode_utf8(p + i, len));
    if (b < 0) return token;
    bytes.push_back(static_cast<char>(b));
    i += static_cast<size_t>(len);
  }
  return bytes;
}

}  // namespace

Tokenizer::Tokenizer(BpeModel bpe, PreTokenizer pre, std::vector<AddedToken> added)
    : bpe_(std::move(bpe)), pre_(std::move(pre)), added_(std::move(added)), added_matcher_(added_) {}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open tokenizer file '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  try {
    return from_json_unchecked(json_text, origin);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    return make_error("tokenizer '" + origin + "': unexpected JSON structure: " + e.what());
  }
}

Result<Tokenizer> Tokenizer::from_json_unchecked(std::string_view json_text, const std::string& origin) {
  auto fail = [&](const Error& e) { return e.with_context("tokenizer '" + origin + "'"); };
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return fail(make_error("not valid JSON"));
  if (auto st = check_normalizer(root); !st) return fail(st.error());
  auto dec = root.find("decoder");
  if (dec == root.end() || !dec->is_object() || dec->value("type", "") != "ByteLevel")
    return fail(make_error("decoder must be ByteLevel"));
  auto patterns = parse_pre_tokenizer(root);
  if (!patterns) return fail(patterns.error());
  if (!root.contains("model") || !root["model"].is_object()) return fail(make_error("model is missing"));
  const json& model = root["model"];
  if (auto st = check_model(model); !st) return fail(st.error());
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges"))
    return fail(make_error("model.vocab / model.merges missing"));

  std::vector<std::pair<std::string, TokenId>> vocab;
  vocab.reserve(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > std::numeric_limits<TokenId>::max())
      return fail(make_error("vocab entry '" + it.key() + "' has an invalid id"));
    vocab.emplace_back(it.key(), it.value().get<TokenId>());
  }
  auto merges = parse_merges(model["merges"]);
  if (!merges) return fail(merges.error());
  auto bpe = BpeModel::build(vocab, *merges);
  if (!bpe) return fail(bpe.error());
  auto added = parse_added_tokens(root);
  if (!added) return fail(added.error());

  if (auto st = check_added_token_ids(*added, vocab); !st) return fail(st.error());

  // The tables below are indexed by id: an id space with holes (a largest id far past the number of
  // entries) would make a small file allocate without bound. HF's files number their tokens densely.
  int64_t size = 0;
  for (const auto& [s, id] : vocab) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const AddedToken& a : *added) size = std::max<int64_t>(size, int64_t{a.id} + 1);
  const auto entries = static_cast<int64_t>(vocab.size() + added->size());
  if (size > entries)
    return fail(make_error("token ids run to " + std::to_string(size - 1) + " for " + std::to_string(entries) +
                           " vocab and added entries: cedar reads tokenizers whose ids leave no holes"));
  Tokenizer tok(std::move(bpe).value(), PreTokenizer(std::move(patterns).value()), std::move(added).value());
  tok.tokens_.assign(static_cast<size_t>(size), {});
  tok.known_.assign(static_cast<size_t>(size), false);
  tok.special_.assign(static_cast<size_t>(size), false);
  tok.vocab_.reserve(vocab.size() * 2);
  for (auto& [s, id] : vocab) {
    tok.tokens_[static_cast<size_t>(id)] = s;
    tok.known_[static_cast<size_t>(id)] = true;
    tok.vocab_.emplace(std::move(s), id);
  }
  for (size_t i = 0; i < tok.added_.size(); ++i) {  // an added token shadows a vocab entry with its id
    const AddedToken& a = tok.added_[i];
    tok.tokens_[static_cast<size_t>(a.id)] = a.content;
    tok.known_[static_cast<size_t>(a.id)] = true;
    tok.special_[static_cast<size_t>(a.id)] = a.special;
    tok.added_by_content_[a.content] = a.id;
    tok.added_index_[a.id] = i;
  }
  tok.bytes_offset_.assign(static_cast<size_t>(size) + 1, 0);
  for (size_t id = 0; id < tok.tokens_.size(); ++id) {
    tok.bytes_offset_[id] = static_cast<uint32_t>(tok.bytes_.size());
    if (tok.known_[id]) tok.bytes_ += token_to_bytes(tok.tokens_[id]);
  }
  tok.bytes_offset_[tok.tokens_.size()] = static_cast<uint32_t>(tok.bytes_.size());
  return tok;
}

void Tokenizer::encode_text(std::string_view text, size_t begin, size_t end, std::vector<TokenId>& out,
                            BpeScratch& bpe_scratch, std::vector<Piece>& pieces,
                            PreTokenizer::Scratch& scratch) const {
  pieces.clear();
  pre_.split(text, begin, end, pieces, scratch);
  for (const Piece& p : pieces) bpe_.encode_piece(text.substr(p.begin, p.end - p.begin), out, bpe_scratch);
}

Result<std::vector<InputSpan>> Tokenizer::pre_tokenize(std::string_view text, const TokenizeOptions& options) const {
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos)
    return make_error("text is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  std::vector<InputSpan> spans, out;
  if (options.allow_added_tokens) added_matcher_.split(text, spans);
  else if (!text.empty()) spans.push_back({0, text.size(), -1});
  std::vector<Piece> pieces;
  PreTokenizer::Scratch scratch;
  for (const InputSpan& s : spans) {
    if (s.id >= 0) { out.push_back(s); continue; }
    pieces.clear();
    pre_.split(text, s.begin, s.end, pieces, scratch);
    for (const Piece& p : pieces) out.push_back({p.begin, p.end, -1});
  }
  return out;
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, const TokenizeOptions& options) const {
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos)
    return make_error("text is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  BpeScratch bpe_scratch;
  std::vector<Piece> pieces;
  PreTokenizer::Scratch scratch;
  if (!options.allow_added_tokens) {
    encode_text(text, 0, text.size(), ids, bpe_scratch, pieces, scratch);
    return ids;
  }
  std::vector<InputSpan> spans;
  added_matcher_.split(text, spans);
  for (const InputSpan& s : spans) {
    if (s.id >= 0) ids.push_back(s.id);
    else encode_text(text, s.begin, s.end, ids, bpe_scratch, pieces, scratch);
  }
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  std::string out;
  Utf8LossyDecoder utf8;
  for (TokenId id : ids) {
    auto bytes = token_bytes(id);
    if (!bytes) return make_error("cannot decode unknown token id " + std::to_string(id));
    // A skipped token contributes no bytes: a character split around it still joins (HF concatenates first).
    if (options.skip_special_tokens && is_special(id)) continue;
    utf8.feed(*bytes, out);
  }
  utf8.finish(out);
  return out;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_by_content_.find(key); it != added_by_content_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || id >= vocab_size() || !known_[static_cast<size_t>(id)]) return std::nullopt;
  return tokens_[static_cast<size_t>(id)];
}

std::optional<std::string_view> Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || id >= vocab_size() || !known_[static_cast<size_t>(id)]) return std::nullopt;
  const auto i = static_cast<size_t>(id);
  return std::string_view(bytes_).substr(bytes_offset_[i], bytes_offset_[i + 1] - bytes_offset_[i]);
}

const AddedToken* Tokenizer::added_token(TokenId id) const {
  auto it = added_index_.find(id);
  return it == added_index_.end() ? nullptr : &added_[it->second];
}

Status StreamDecoder::push(TokenId id, std::string& out) {
  auto bytes = tokenizer_->token_bytes(id);
  if (!bytes) return make_error("cannot decode unknown token id " + std::to_string(id));
  if (options_.skip_special_tokens && tokenizer_->is_special(id)) return Status::Ok();
  utf8_.feed(*bytes, out);
  return Status::Ok();
}

Result<std::string> StreamDecoder::push(TokenId id) {
  std::string out;
  CEDAR_RETURN_IF_ERROR(push(id, out));
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8_.finish(out);
  return out;
}

}  // namespace cedar::text
