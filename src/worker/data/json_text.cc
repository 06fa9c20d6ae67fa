// A validating JSON scanner that decodes a single top-level string member (json_text.h).
#include "worker/data/json_text.h"

#include <cstdint>

#include "common/named_values.h"
#include "common/utf8.h"

namespace forge {
namespace {

constexpr int kMaxDepth = 1000;
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::array<NamedValue<InvalidUtf8>, 2> kInvalidUtf8Names{
    {{"replace", InvalidUtf8::kReplace}, {"reject", InvalidUtf8::kReject}}};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

const char* TypeName(char first) {
  switch (first) {
    case '{': return "an object";
    case '[': return "an array";
    case 't':
    case 'f': return "a boolean";
    case 'n': return "null";
    default: return "a number";
  }
}

class Scanner {
 public:
  Scanner(std::string_view s, InvalidUtf8 policy, JsonTextResult* result)
      : s_(s), policy_(policy), result_(result) {}

  Status Line(std::string_view key, std::string* text) {
    SkipSpace();
    if (i_ >= s_.size()) return Error("empty line, expected a JSON object");
    if (s_[i_] != '{') return Error(std::string("expected a JSON object, found ") +
                                    (s_[i_] == '"' ? "a string" : TypeName(s_[i_])));
    FORGE_RETURN_IF_ERROR(Object(0, key, text));
    SkipSpace();
    if (i_ < s_.size()) return Error("unexpected text after the JSON object");
    std::string quoted = "\"";
    quoted.append(key);
    quoted += '"';
    if (found_ == Found::kNone) return Status::Invalid("no " + quoted + " key");
    if (found_ == Found::kOther) {
      return Status::Invalid(quoted + " is " + other_type_ + ", not a string");
    }
    return Status::Ok();
  }

 private:
  enum class Found { kNone, kString, kOther };

  Status Error(const std::string& what) const {
    return Status::Invalid("column " + std::to_string(i_ + 1) + ": " + what);
  }
  Status Unexpected(const char* expected) const {
    if (i_ >= s_.size()) return Error(std::string("unexpected end of line, expected ") + expected);
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    std::string found = c >= 0x20 && c < 0x7F ? std::string("'") + s_[i_] + "'"
                                               : "byte 0x" + std::string(1, "0123456789abcdef"[c >> 4]) +
                                                     "0123456789abcdef"[c & 15];
    return Error("expected " + std::string(expected) + ", found " + found);
  }

  void SkipSpace() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }

  // At '{'. At depth 0, the member named `key` is decoded into *text.
  Status Object(int depth, std::string_view key, std::string* text) {
    if (depth >= kMaxDepth) return Error("nested deeper than " + std::to_string(kMaxDepth));
    ++i_;
    if (Take('}')) return Status::Ok();
    std::string name;
    for (;;) {
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] != '"') return Unexpected("a member name in double quotes");
      name.clear();
      FORGE_RETURN_IF_ERROR(String(&name));
      if (!Take(':')) return Unexpected("':'");
      SkipSpace();
      if (depth == 0 && name == key) {
        if (i_ < s_.size() && s_[i_] == '"') {
          text->clear();
          FORGE_RETURN_IF_ERROR(String(text));
          found_ = Found::kString;
        } else {
          if (i_ < s_.size()) other_type_ = TypeName(s_[i_]);
          FORGE_RETURN_IF_ERROR(Value(depth + 1));
          found_ = Found::kOther;
        }
      } else {
        FORGE_RETURN_IF_ERROR(Value(depth + 1));
      }
      bool done = false;
      FORGE_RETURN_IF_ERROR(Separator('}', &done));
      if (done) return Status::Ok();
    }
  }

  Status Array(int depth) {
    if (depth >= kMaxDepth) return Error("nested deeper than " + std::to_string(kMaxDepth));
    ++i_;
    if (Take(']')) return Status::Ok();
    for (bool done = false; !done;) {
      FORGE_RETURN_IF_ERROR(Value(depth + 1));
      FORGE_RETURN_IF_ERROR(Separator(']', &done));
    }
    return Status::Ok();
  }

  // Skips white space, then consumes `c` if it comes next.
  bool Take(char c) {
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  // After a member or element: a ',' (another follows) or the container's `close` (*done).
  Status Separator(char close, bool* done) {
    *done = Take(close);
    if (*done || Take(',')) return Status::Ok();
    return Unexpected(close == '}' ? "',' or '}'" : "',' or ']'");
  }

  Status Value(int depth) {
    SkipSpace();
    if (i_ >= s_.size()) return Unexpected("a value");
    switch (s_[i_]) {
      case '{': return Object(depth, {}, nullptr);
      case '[': return Array(depth);
      case '"': return String(nullptr);
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default:
        if (s_[i_] == '-' || (s_[i_] >= '0' && s_[i_] <= '9')) return Number();
        return Unexpected("a value");
    }
  }

  Status Literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return Unexpected("a value");
    i_ += word.size();
    return Status::Ok();
  }

  Status Number() {
    const size_t start = i_;
    if (s_[i_] == '-') ++i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (digits() == 0) {
      i_ = start;
      return Error("invalid number");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) return Error("invalid number: no digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) return Error("invalid number: no digits in the exponent");
    }
    return Status::Ok();
  }

  // At '"'. Decodes into *out when out is not null, else only checks.
  Status String(std::string* out) {
    ++i_;
    for (;;) {
      // The plain run up to the next quote, escape, control or non-ASCII byte.
      const size_t run = i_;
      while (i_ < s_.size()) {
        const unsigned char c = static_cast<unsigned char>(s_[i_]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++i_;
      }
      if (out != nullptr) out->append(s_.data() + run, i_ - run);
      if (i_ >= s_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return Status::Ok();
      }
      if (c < 0x20) return Error("control character in a string (must be escaped)");
      if (c >= 0x80) {
        const size_t len = Utf8CharLength(s_, i_);
        if (len > 0) {
          if (out != nullptr) out->append(s_.data() + i_, len);
          i_ += len;
          continue;
        }
        if (policy_ == InvalidUtf8::kReject) return Error("invalid UTF-8");
        if (out != nullptr) out->append(kReplacement);
        result_->repaired = true;
        i_ += Utf8MaximalSubpartLength(s_, i_);
        continue;
      }
      FORGE_RETURN_IF_ERROR(Escape(out));
    }
  }

  // At '\\'.
  Status Escape(std::string* out) {
    if (i_ + 1 >= s_.size()) return Error("unterminated string");
    const char e = s_[i_ + 1];
    char plain = 0;
    switch (e) {
      case '"': plain = '"'; break;
      case '\\': plain = '\\'; break;
      case '/': plain = '/'; break;
      case 'b': plain = '\b'; break;
      case 'f': plain = '\f'; break;
      case 'n': plain = '\n'; break;
      case 'r': plain = '\r'; break;
      case 't': plain = '\t'; break;
      case 'u': break;
      default: return Error(std::string("invalid escape '\\") + e + "'");
    }
    if (e != 'u') {
      if (out != nullptr) out->push_back(plain);
      i_ += 2;
      return Status::Ok();
    }
    uint32_t unit = 0;
    FORGE_RETURN_IF_ERROR(Hex4(&unit));
    if (unit >= 0xD800 && unit <= 0xDBFF && i_ + 1 < s_.size() && s_[i_] == '\\' &&
        s_[i_ + 1] == 'u') {
      const size_t save = i_;
      uint32_t low = 0;
      FORGE_RETURN_IF_ERROR(Hex4(&low));
      if (low >= 0xDC00 && low <= 0xDFFF) {
        if (out != nullptr) AppendUtf8(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), out);
        return Status::Ok();
      }
      i_ = save;  // the second escape stands on its own
    }
    if (unit >= 0xD800 && unit <= 0xDFFF) {
      if (policy_ == InvalidUtf8::kReject) {
        i_ -= 6;
        return Error("lone surrogate escape (not a character)");
      }
      if (out != nullptr) out->append(kReplacement);
      result_->repaired = true;
      return Status::Ok();
    }
    if (out != nullptr) AppendUtf8(unit, out);
    return Status::Ok();
  }

  // At "\\u": reads the four hex digits and moves past them.
  Status Hex4(uint32_t* unit) {
    *unit = 0;
    for (size_t k = 0; k < 4; ++k) {
      const size_t at = i_ + 2 + k;
      const int d = at < s_.size() ? HexDigit(s_[at]) : -1;
      if (d < 0) {
        i_ = at;
        return Error("invalid \\u escape (four hex digits expected)");
      }
      *unit = *unit * 16 + static_cast<uint32_t>(d);
    }
    i_ += 6;
    return Status::Ok();
  }

  std::string_view s_;
  InvalidUtf8 policy_;
  JsonTextResult* result_;
  size_t i_ = 0;
  Found found_ = Found::kNone;
  const char* other_type_ = "";
};

}  // namespace

const char* InvalidUtf8Name(InvalidUtf8 p) { return NameOf(kInvalidUtf8Names, p); }
StatusOr<InvalidUtf8> ParseInvalidUtf8(const std::string& name) {
  return ValueOf(kInvalidUtf8Names, name, "--invalid-utf8");
}

Status ExtractJsonText(std::string_view line, std::string_view key, InvalidUtf8 policy,
                       std::string* text, JsonTextResult* result) {
  *result = JsonTextResult{};
  Scanner scanner(line, policy, result);
  return scanner.Line(key, text);
}

}  // namespace forge
