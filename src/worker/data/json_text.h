// One JSON Lines line -> the document text in it. The whole line is checked against the JSON
// grammar (RFC 8259: one object, any nesting, whitespace around it), but only the value of the
// text key is decoded; the other members are skipped without building anything.
//
// Text handling is that of a JSON parser followed by a UTF-8 encoder in a browser or node:
// escapes are decoded, a surrogate pair becomes one code point, and an ill-formed piece
// becomes U+FFFD under InvalidUtf8::kReplace — a lone surrogate escape (\ud800 alone) once,
// and raw bytes that are not UTF-8 once per maximal subpart (common/utf8.h), as the WHATWG
// decoder repairs them. Under kReject either is an error, wherever in the line it is. When
// the key occurs more than once the last occurrence counts (as JSON.parse does).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace forge {

enum class InvalidUtf8 { kReplace, kReject };
const char* InvalidUtf8Name(InvalidUtf8 p);  // "replace" / "reject"
StatusOr<InvalidUtf8> ParseInvalidUtf8(const std::string& name);

struct JsonTextResult {
  bool repaired = false;  // some ill-formed text was replaced by U+FFFD
};

// Replaces *text with the decoded value of the line's top-level `key`. Errors are
// InvalidArgument with a message that starts with the 1-based byte column where that is
// useful ("column 17: expected ',' or '}'", "no \"text\" key", "\"text\" is a number, not a
// string"); the caller adds the file and line.
Status ExtractJsonText(std::string_view line, std::string_view key, InvalidUtf8 policy,
                       std::string* text, JsonTextResult* result);

}  // namespace forge
