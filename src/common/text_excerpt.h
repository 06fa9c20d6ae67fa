// Untrusted text in error messages: a value from a config or a request is quoted as a bounded,
// printable excerpt (a 100 KB value must not make a 100 KB error, nor a gRPC status too large
// to send), and text that must be UTF-8 is located at its first ill-formed byte by line and
// column (common/utf8.h decides what is ill-formed).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace forge {

// `text` as it reads in a message: control characters, backslashes and bytes that are not
// UTF-8 written as \xNN (backslash as \\), cut after about max_bytes at a character boundary
// with "... (N bytes)" saying how long it was.
std::string TextExcerpt(std::string_view text, size_t max_bytes = 64);

// Where `text` first stops being well-formed UTF-8; none when it is UTF-8 throughout.
struct Utf8ErrorPlace {
  size_t offset = 0;       // of the first byte of the ill-formed sequence
  int line = 1;            // 1-based, counting '\n'
  int column = 1;          // 1-based, in bytes from the line start
  unsigned char byte = 0;  // the byte at offset
};
std::optional<Utf8ErrorPlace> LocateInvalidUtf8(std::string_view text);

// "column 7 (byte offset 40): ill-formed UTF-8 at byte 0xff" (the line is the caller's to say).
std::string DescribeUtf8Error(const Utf8ErrorPlace& e);

}  // namespace forge
