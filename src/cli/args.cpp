#include "cli/args.h"

#include <charconv>
#include <sstream>

namespace cedar::cli {

std::string ParsedArgs::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return {};
}

std::optional<std::string> ParsedArgs::positional(size_t i) const {
  if (i < positionals_.size()) return positionals_[i];
  return std::nullopt;
}

Result<long long> ParsedArgs::get_int(const std::string& name) const {
  const std::string v = get(name);
  long long out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size())
    return make_error("--" + name + " expects an integer, got '" + v + "'");
  return out;
}

Result<ParsedArgs> parse_args(const CommandSpec& spec, const std::vector<std::string>& args) {
  ParsedArgs out;
  for (const auto& o : spec.options)
    if (o.takes_value && !o.default_value.empty()) out.defaults_[o.name] = o.default_value;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") return make_error("help");
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2);
      std::optional<std::string> inline_value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      const OptionSpec* spec_opt = nullptr;
      for (const auto& o : spec.options)
        if (o.name == name) spec_opt = &o;
      if (!spec_opt) return make_error("unknown option '--" + name + "' for 'cedar " + spec.name + "'");
      if (!spec_opt->takes_value) {
        if (inline_value) return make_error("option '--" + name + "' takes no value");
        out.values_[name] = "1";
        continue;
      }
      if (inline_value) {
        out.values_[name] = *inline_value;
      } else {
        if (i + 1 >= args.size()) return make_error("option '--" + name + "' needs a value");
        out.values_[name] = args[++i];
      }
      continue;
    }
    out.positionals_.push_back(a);
  }
  const size_t max_pos = spec.positionals.size() + spec.optional_positionals.size();
  if (out.positionals_.size() < spec.positionals.size())
    return make_error("'cedar " + spec.name + "' needs " + spec.positionals[out.positionals_.size()]);
  if (out.positionals_.size() > max_pos)
    return make_error("unexpected argument '" + out.positionals_[max_pos] + "' for 'cedar " + spec.name + "'");
  return out;
}

std::string usage(const CommandSpec& spec) {
  std::ostringstream os;
  os << "usage: cedar " << spec.name;
  for (const auto& p : spec.positionals) os << " " << p;
  for (const auto& p : spec.optional_positionals) os << " [" << p << "]";
  if (!spec.options.empty()) os << " [options]";
  os << "\n\n" << spec.summary << "\n";
  if (!spec.options.empty()) os << "\noptions:\n";
  for (const auto& o : spec.options) {
    std::string lhs = "  --" + o.name + (o.takes_value ? " " + o.value_name : "");
    if (lhs.size() < 28) lhs.resize(28, ' ');
    else lhs += "  ";
    os << lhs << o.help;
    if (o.takes_value && !o.default_value.empty()) os << " (default: " << o.default_value << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace cedar::cli
