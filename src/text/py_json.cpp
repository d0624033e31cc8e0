#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cedar::text {
namespace {

void append_hex4(std::string& out, unsigned value) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", value & 0xFFFFu);
  out += buf;
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i. Invalid bytes decode as
// themselves (U+0080..U+00FF) so that nothing is lost; Python strings cannot hold them anyway.
unsigned decode_utf8(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) -> int {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    return (b & 0xC0) == 0x80 ? (b & 0x3F) : -1;
  };
  if (b0 < 0x80) { ++i; return b0; }
  if ((b0 & 0xE0) == 0xC0) {
    const int c1 = cont(1);
    if (c1 >= 0) { i += 2; return ((b0 & 0x1Fu) << 6) | static_cast<unsigned>(c1); }
  } else if ((b0 & 0xF0) == 0xE0) {
    const int c1 = cont(1), c2 = c1 >= 0 ? cont(2) : -1;
    if (c2 >= 0) { i += 3; return ((b0 & 0x0Fu) << 12) | (static_cast<unsigned>(c1) << 6) | static_cast<unsigned>(c2); }
  } else if ((b0 & 0xF8) == 0xF0) {
    const int c1 = cont(1), c2 = c1 >= 0 ? cont(2) : -1, c3 = c2 >= 0 ? cont(3) : -1;
    if (c3 >= 0) {
      i += 4;
      return ((b0 & 0x07u) << 18) | (static_cast<unsigned>(c1) << 12) | (static_cast<unsigned>(c2) << 6) |
             static_cast<unsigned>(c3);
    }
  }
  ++i;
  return b0;
}

struct Writer {
  const PyDumpOptions& opt;
  std::string& out;
  std::string item_sep;

  void newline_indent(int level) {
    out += '\n';
    out.append(static_cast<size_t>(*opt.indent) * static_cast<size_t>(level), ' ');
  }

  void write(const Json& v, int level) {
    switch (v.type()) {
      case Json::value_t::null: out += "null"; return;
      case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
      case Json::value_t::number_integer: out += std::to_string(v.get<std::int64_t>()); return;
      case Json::value_t::number_unsigned: out += std::to_string(v.get<std::uint64_t>()); return;
      case Json::value_t::number_float: out += py_float_repr(v.get<double>()); return;
      case Json::value_t::string: py_json_append_string(out, v.get_ref<const std::string&>(), opt.ensure_ascii); return;
      case Json::value_t::array: {
        if (v.empty()) { out += "[]"; return; }
        out += '[';
        bool first = true;
        for (const auto& item : v) {
          if (!first) out += item_sep;
          first = false;
          if (opt.indent) newline_indent(level + 1);
          write(item, level + 1);
        }
        if (opt.indent) newline_indent(level);
        out += ']';
        return;
      }
      case Json::value_t::object: {
        if (v.empty()) { out += "{}"; return; }
        out += '{';
        bool first = true;
        for (const auto& [key, item] : v.items()) {
          if (!first) out += item_sep;
          first = false;
          if (opt.indent) newline_indent(level + 1);
          py_json_append_string(out, key, opt.ensure_ascii);
          out += opt.key_separator;
          write(item, level + 1);
        }
        if (opt.indent) newline_indent(level);
        out += '}';
        return;
      }
      case Json::value_t::binary:
      case Json::value_t::discarded: out += "null"; return;
    }
  }
};

}  // namespace

void py_json_append_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20) { append_hex4(out, c); ++i; continue; }
    if (!ensure_ascii) {
      if (c < 0x80) { out += static_cast<char>(c); ++i; continue; }
      // Copy a whole multi-byte sequence at once (raw, as Python writes non-ASCII).
      const size_t start = i;
      decode_utf8(s, i);
      out.append(s.substr(start, i - start));
      continue;
    }
    // ensure_ascii: everything outside ' '..'~' is \uXXXX (Python's ESCAPE_ASCII), astral as a pair.
    if (c >= 0x20 && c < 0x7F) { out += static_cast<char>(c); ++i; continue; }
    const unsigned cp = decode_utf8(s, i);
    if (cp >= 0x10000) {
      const unsigned v = cp - 0x10000;
      append_hex4(out, 0xD800 | (v >> 10));
      append_hex4(out, 0xDC00 | (v & 0x3FF));
    } else {
      append_hex4(out, cp);
    }
  }
  out += '"';
}

std::string py_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // e.g. "-1.2345e+02"
  std::string out;
  if (!sci.empty() && sci[0] == '-') { out += '-'; sci.remove_prefix(1); }
  const size_t e = sci.find('e');
  std::string digits;
  for (char ch : sci.substr(0, e)) if (ch != '.') digits += ch;
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) { out += '.'; out += digits.substr(1); }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  out += ebuf;
  return out;
}

std::string py_json_dumps(const Json& value, const PyDumpOptions& options) {
  std::string out;
  Writer w{options, out, options.item_separator ? *options.item_separator : (options.indent ? "," : ", ")};
  w.write(value, 0);
  return out;
}

Result<Json> parse_json(std::string_view text, std::string_view what) {
  Json value = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    // Re-parse with exceptions off but a diagnostic: nlohmann reports the byte position in its message.
    try {
      const Json again = Json::parse(text.begin(), text.end());
      (void)again;
    } catch (const std::exception& e) {
      return make_error(std::string(what) + ": invalid JSON (" + e.what() + ")");
    }
    return make_error(std::string(what) + ": invalid JSON");
  }
  return value;
}

}  // namespace cedar::text
