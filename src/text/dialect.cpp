#include "text/dialect.h"

namespace cedar::text {
namespace {

constexpr std::string_view kAbsoluteMaximum =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr std::string_view kBeyondMaximum =
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

const DialectSpec kSpecs[] = {
    {Dialect::kV4, "v4", "tool_calls", "invoke", "parameter", false, true, false,
     {{"high", 0, ""}, {"max", 0, kAbsoluteMaximum}}, "", false, false, ArgumentsPolicy::kParseOnceFallbackRaw},
    {Dialect::kV4_0731, "v4-0731", "tool_calls", "invoke", "parameter", false, true, false,
     {{"low", 0, ""}, {"high", 0, kAbsoluteMaximum}, {"max", 0, kBeyondMaximum}}, "low", false, false,
     ArgumentsPolicy::kParseOnceFallbackRaw},
    {Dialect::kV41Pre, "v41-pre", " calls", " invoke", " parameter", true, true, true,
     {{"low", 25, ""}, {"high", 50, ""}, {"xhigh", 75, ""}, {"max", 100, ""}}, "high", true, false,
     ArgumentsPolicy::kParseOnceStrict},
    {Dialect::kV41, "v41", " calls", " invoke", " parameter", true, false, true,
     {{"low", 50, ""}, {"high", 75, ""}, {"max", 100, ""}}, "high", true, false,
     ArgumentsPolicy::kParseTwiceFallbackRaw},
    {Dialect::kV41_1017, "v41-1017", " calls", " invoke", " parameter", true, false, true,
     {{"low", 50, ""}, {"high", 75, ""}, {"max", 100, ""}}, "high", true, true,
     ArgumentsPolicy::kParseTwiceFallbackRaw},
};

std::string accepted_efforts(const DialectSpec& spec) {
  std::string s = spec.numeric_effort ? "an integer 1..100 or one of " : "one of ";
  for (size_t i = 0; i < spec.efforts.size(); ++i) s += (i ? ", \"" : "\"") + std::string(spec.efforts[i].name) + "\"";
  return s;
}

}  // namespace

const DialectSpec& dialect_spec(Dialect dialect) {
  for (const auto& s : kSpecs) if (s.dialect == dialect) return s;
  return kSpecs[3];
}

Result<Dialect> parse_dialect(std::string_view name) {
  for (const auto& s : kSpecs) if (s.name == name) return s.dialect;
  return make_error("unknown dialect '" + std::string(name) + "' (known: " + dialect_names() + ")");
}

std::string dialect_names() {
  std::string s;
  for (const auto& d : kSpecs) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

Result<std::string> effort_prefix(const DialectSpec& spec, const ReasoningEffort& effort) {
  if (effort.number) {
    if (!spec.numeric_effort || *effort.number < 1 || *effort.number > 100) {
      return make_error("reasoning_effort " + std::to_string(*effort.number) + " is not valid for dialect " +
                        std::string(spec.name) + " (expected " + accepted_efforts(spec) + ")");
    }
    return "Reasoning Effort: " + std::to_string(*effort.number) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  }
  const std::string_view name = effort.name ? std::string_view(*effort.name) : spec.default_effort;
  if (name.empty() && !effort.name) return std::string();  // V4: no default effort, nothing rendered
  for (const auto& level : spec.efforts) {
    if (level.name != name) continue;
    if (!spec.numeric_effort) return std::string(level.paragraph);
    return "Reasoning Effort: " + std::to_string(level.budget) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  }
  return make_error("reasoning_effort \"" + std::string(name) + "\" is not valid for dialect " +
                    std::string(spec.name) + " (expected " + accepted_efforts(spec) + ")");
}

}  // namespace cedar::text
