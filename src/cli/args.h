// A small declarative argument parser: each command declares its options once (name, help,
// whether it takes a value, default), and gets --help and unknown-option errors for free.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::cli {

struct OptionSpec {
  std::string name;           // long name without dashes, e.g. "arch"
  std::string help;
  bool takes_value = true;    // false: a flag
  std::string default_value;  // used when takes_value and absent ("" = no default)
  std::string value_name = "VALUE";
};

struct CommandSpec {
  std::string name;
  std::string summary;
  std::vector<std::string> positionals;           // names of required positionals, in order
  std::vector<std::string> optional_positionals;  // names of optional trailing positionals
  std::vector<OptionSpec> options;
};

class ParsedArgs {
 public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool flag(const std::string& name) const { return has(name); }
  // Value of an option (or its default); empty when absent without default.
  std::string get(const std::string& name) const;
  std::optional<std::string> positional(size_t i) const;
  Result<long long> get_int(const std::string& name) const;

  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
  std::vector<std::string> positionals_;
};

// Returns nullopt-like error with message "help" when --help was asked (caller prints usage).
Result<ParsedArgs> parse_args(const CommandSpec& spec, const std::vector<std::string>& args);
std::string usage(const CommandSpec& spec);

}  // namespace cedar::cli
