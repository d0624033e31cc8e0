// cedar's tokenizer: loads an HF `tokenizer.json` of DeepSeek's kind (byte-level BPE, a Sequence of Split
// pre-tokenizers, ByteLevel decoder, added tokens) and encodes/decodes exactly as HF tokenizers 0.23 does.
//
// Contract (see docs in encoding.md §4):
// * encode() never adds BOS/EOS (HF add_special_tokens=False; the prompt encoder writes BOS itself).
// * By default added-token strings in the text are plain text (`<｜User｜>` becomes 5 BPE tokens): content must
//   not be able to create control tokens. TokenizeOptions::allow_added_tokens turns matching on.
// * Input must be valid UTF-8 (HF only accepts str); invalid input is an error naming the byte offset.
// * decode() follows HF decode(skip_special_tokens=False) by default — every token is kept, which is what the
//   output parser needs (`<think>`, `｜DSML｜` must survive): token bytes are concatenated and invalid UTF-8 becomes
//   U+FFFD (Rust from_utf8_lossy). DecodeOptions::skip_special_tokens drops added tokens flagged `special` (HF
//   semantics; on DeepSeek's file: BOS/EOS/pad, placeholders, grounding tokens — not the think/DSML markers).
//   Unknown ids are an error (HF silently drops them).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pretokenizer.h"
#include "text/unicode.h"

namespace cedar::text {

struct TokenizeOptions {
  bool allow_added_tokens = false;  // match added-token strings (control tokens) in the text
};

struct DecodeOptions {
  bool skip_special_tokens = false;  // drop added tokens whose `special` flag is set (HF skip_special_tokens)
};

class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& path);
  // `origin` names the source in error messages.
  static Result<Tokenizer> from_json(std::string_view json_text, const std::string& origin);

  Result<std::vector<TokenId>> encode(std::string_view text, const TokenizeOptions& options = {}) const;
  // The pieces encode() would run BPE on, as byte ranges of `text`; added-token matches appear with their id.
  Result<std::vector<InputSpan>> pre_tokenize(std::string_view text, const TokenizeOptions& options = {}) const;

  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // Added tokens first, then the BPE vocab (HF order). Token strings are in byte-level form ("Ġworld").
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(TokenId id) const;
  // The bytes a token contributes to decode() (before UTF-8 repair); nullopt for an unknown id.
  std::optional<std::string_view> token_bytes(TokenId id) const;
  // One past the largest id (129,280 for DeepSeek V4/V4.1).
  TokenId vocab_size() const { return static_cast<TokenId>(tokens_.size()); }
  // The added token with this id, or nullptr.
  const AddedToken* added_token(TokenId id) const;
  // True for an added token flagged `special` (what skip_special_tokens drops).
  bool is_special(TokenId id) const {
    return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
  }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  size_t merge_count() const { return bpe_.merge_count(); }

 private:
  Tokenizer(BpeModel bpe, PreTokenizer pre, std::vector<AddedToken> added);
  // from_json without the catch of nlohmann type errors (fields of the wrong JSON type).
  static Result<Tokenizer> from_json_unchecked(std::string_view json_text, const std::string& origin);
  void encode_text(std::string_view text, size_t begin, size_t end, std::vector<TokenId>& out,
                   BpeScratch& bpe_scratch, std::vector<Piece>& pieces, PreTokenizer::Scratch& scratch) const;

  BpeModel bpe_;
  PreTokenizer pre_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher added_matcher_;
  std::vector<std::string> tokens_;       // id -> token string (added content or byte-level vocab string)
  std::vector<uint32_t> bytes_offset_;    // id -> [offset, offset+1) into bytes_ of its decoded bytes
  std::string bytes_;
  std::vector<bool> known_;               // id is assigned
  std::vector<bool> special_;             // id is an added token with special: true
  std::unordered_map<std::string, TokenId> vocab_;
  std::unordered_map<std::string, TokenId> added_by_content_;
  std::unordered_map<TokenId, size_t> added_index_;
};

// Streaming detokenizer: push ids one at a time, get the text they complete. A UTF-8 character split across
// tokens is held back until complete; concatenating every push() and finish() gives exactly decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options = {})
      : tokenizer_(&tokenizer), options_(options) {}
  // Appends the newly completed text to `out` (nothing for a skipped special token).
  Status push(TokenId id, std::string& out);
  Result<std::string> push(TokenId id);
  // Flushes a held incomplete character as U+FFFD and resets for reuse.
  std::string finish();
  // Bytes of an incomplete character currently held back.
  size_t pending_bytes() const { return utf8_.pending(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  Utf8LossyDecoder utf8_;
};

}  // namespace cedar::text
