// Error handling for library code: functions that can fail on bad input return Result<T>;
// nothing in the library aborts or throws for a user's mistake. Messages name what is wrong
// (file, tensor, field) so a user can act on them without a debugger.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace cedar {

struct Error {
  std::string message;

  // Prepends context ("while loading X: ") so errors read outermost-first.
  Error with_context(const std::string& context) const { return Error{context + ": " + message}; }
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<Error>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  static Status Ok() { return Status(); }

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{};
  bool ok_ = true;
};

// Convenience for building messages.
inline Error make_error(std::string message) { return Error{std::move(message)}; }

}  // namespace cedar

// Propagate an error from an expression yielding Status or Result<T>.
#define CEDAR_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    auto&& cedar_status_ = (expr);                  \
    if (!cedar_status_.ok()) return cedar_status_.error(); \
  } while (0)

#define CEDAR_CONCAT_INNER(a, b) a##b
#define CEDAR_CONCAT(a, b) CEDAR_CONCAT_INNER(a, b)

// Binds `lhs` to the value of a Result<T> expression or returns its error.
#define CEDAR_ASSIGN_OR_RETURN(lhs, expr) \
  CEDAR_ASSIGN_OR_RETURN_IMPL(CEDAR_CONCAT(cedar_result_, __LINE__), lhs, expr)
#define CEDAR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.error();                \
  lhs = std::move(tmp).value()
