// Status and StatusOr: every fallible call in Forge returns one, and every error carries its
// context (which file, key, rank) in the message. Modelled on LevelDB/Abseil, kept small.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace forge {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // bad config or request: names the key / line
  kNotFound,
  kDataLoss,  // checksum mismatch, truncated file, wrong magic
  kIoError,
  kFailedPrecondition,
  kUnavailable,
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}

  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status DataLoss(std::string m) { return {Code::kDataLoss, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status Precondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;

  // Prefixes context ("loading shard x: ") to an error; a no-op on Ok.
  Status Annotate(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + msg_);
  }

 private:
  Code code_ = Code::kOk;
  std::string msg_;
};

const char* CodeName(Code code);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status s) : status_(std::move(s)) {}  // NOLINT: implicit by design
  StatusOr(T v) : value_(std::move(v)) {}        // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace forge

#define FORGE_CONCAT_INNER(a, b) a##b
#define FORGE_CONCAT(a, b) FORGE_CONCAT_INNER(a, b)

#define FORGE_RETURN_IF_ERROR(expr)              \
  do {                                           \
    ::forge::Status _forge_st = (expr);          \
    if (!_forge_st.ok()) return _forge_st;       \
  } while (0)

#define FORGE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define FORGE_ASSIGN_OR_RETURN(lhs, expr) \
  FORGE_ASSIGN_OR_RETURN_IMPL(FORGE_CONCAT(_forge_so_, __LINE__), lhs, expr)
