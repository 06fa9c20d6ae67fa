#include "cli/tokenize_command.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli/tokenizer_flag.h"
#include "common/flags.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"
#include "worker/data/corpus.h"

namespace forge {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "forge data tokenize: %s\n", msg.c_str());
  return 1;
}

StatusOr<std::string> ReadInput(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  ss << in.rdbuf();
  if (in.bad()) return Status::DataLoss(path + ": read error");
  return ss.str();
}

// Ids written as text (whitespace-separated), JSON (an array) or u32 (little-endian).
StatusOr<std::vector<int32_t>> ParseIds(const std::string& in, const std::string& format,
                                        const std::string& path) {
  std::vector<int32_t> ids;
  if (format == "u32") {
    if (in.size() % 4 != 0) {
      return Status::DataLoss(path + ": " + std::to_string(in.size()) + " bytes is not a whole number of u32 ids");
    }
    ids.resize(in.size() / 4);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto* b = reinterpret_cast<const uint8_t*>(in.data() + 4 * i);
      ids[i] = static_cast<int32_t>(b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24));
    }
    return ids;
  }
  const bool json = format == "json";
  size_t i = 0, line = 1;
  if (json) {
    while (i < in.size() && std::isspace(static_cast<unsigned char>(in[i]))) line += in[i++] == '\n';
    if (i == in.size() || in[i] != '[') return Status::DataLoss(path + ": expected a JSON array of ids");
    ++i;
  }
  while (i < in.size()) {
    const char c = in[i];
    if (c == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(c)) || (json && c == ',')) {
      ++i;
      continue;
    }
    if (json && c == ']') return ids;
    size_t j = i;
    while (j < in.size() && std::isdigit(static_cast<unsigned char>(in[j]))) ++j;
    if (j == i || j - i > 10) {
      return Status::DataLoss(path + ":" + std::to_string(line) + ": expected a token id, found '" +
                              in.substr(i, std::min<size_t>(20, in.size() - i)) + "'");
    }
    const long long v = std::stoll(in.substr(i, j - i));
    if (v > INT32_MAX) return Status::DataLoss(path + ":" + std::to_string(line) + ": id " + in.substr(i, j - i) + " too large");
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  if (json) return Status::DataLoss(path + ": the JSON array is not closed");
  return ids;
}

std::string FormatIds(const std::vector<int32_t>& ids, const std::string& format) {
  std::string out;
  if (format == "u32") {
    out.resize(ids.size() * 4);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto v = static_cast<uint32_t>(ids[i]);
      for (int k = 0; k < 4; ++k) out[4 * i + k] = static_cast<char>((v >> (8 * k)) & 0xFF);
    }
    return out;
  }
  const bool json = format == "json";
  out.reserve(ids.size() * 6 + 2);
  if (json) out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += json ? "," : " ";
    out += std::to_string(ids[i]);
  }
  if (json) out += ']';
  out += '\n';
  return out;
}

}  // namespace

int RunDataTokenize(int argc, char** argv) {
  FlagParser flags("forge data tokenize", "",
                   "Encodes text to token ids, or with --decode ids back to text.");
  AddTokenizerFlag(&flags);
  flags.Value("--input", "FILE", "text to encode, or ids to decode ('-' = standard input, the default)");
  flags.Value("--out", "FILE", "where to write (default standard output)");
  flags.Value("--format", "text|json|u32",
              "ids as whitespace-separated numbers (default), a JSON array, or little-endian uint32");
  flags.Bool("--decode", "read ids, write the text they stand for");
  flags.Bool("--specials", "encode the exact text of a special token (e.g. <|endoftext|>) as its id");
  flags.Bool("--strict-utf8", "reject input that is not valid UTF-8 instead of replacing ill-formed "
                              "bytes with U+FFFD");
  flags.Bool("--info", "print the tokenizer's name, identity, vocabulary size and special ids");
  if (int rc; flags.ParseOrExit(argc, argv, 3, &rc)) return rc;
  const std::string format = flags.Get("--format", "text");
  if (format != "text" && format != "json" && format != "u32") {
    return Fail("--format must be text, json or u32, not '" + format + "'");
  }
  auto tok = LoadTokenizer(TokenizerFlag(flags), DefaultDataDir());
  if (!tok.ok()) return Fail(tok.status().ToString());
  if (flags.Has("--info")) {
    std::printf("name %s\nidentity %s\nvocab_size %d\neot %d\nbos %d\nspecial_tokens %zu\n",
                (*tok)->name().c_str(), (*tok)->identity().c_str(), (*tok)->vocab_size(),
                (*tok)->eot_id(), (*tok)->bos_id(), (*tok)->special_tokens().size());
    return 0;
  }
  const std::string input = flags.Get("--input", "-");
  auto data = ReadInput(input);
  if (!data.ok()) return Fail(data.status().ToString());

  std::string out;
  if (flags.Has("--decode")) {
    auto ids = ParseIds(*data, format, input == "-" ? "<stdin>" : input);
    if (!ids.ok()) return Fail(ids.status().ToString());
    auto text = (*tok)->Decode(*ids);
    if (!text.ok()) return Fail(text.status().ToString());
    out = std::move(*text);
  } else {
    std::string text = std::move(*data);
    if (const size_t bad = FindInvalidUtf8(text); bad != kUtf8Valid) {
      if (flags.Has("--strict-utf8")) {
        return Fail((input == "-" ? std::string("<stdin>") : input) + ": invalid UTF-8 at byte " +
                    std::to_string(bad));
      }
      text = SanitizeUtf8(text);
    }
    std::vector<int32_t> ids;
    if (flags.Has("--specials")) {
      (*tok)->EncodeWithSpecials(text, &ids);
    } else {
      (*tok)->EncodeOrdinary(text, &ids);
    }
    out = FormatIds(ids, format);
  }
  const std::string out_path = flags.Get("--out", "-");
  if (out_path == "-") {
    std::fwrite(out.data(), 1, out.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : Fail("cannot write standard output");
  }
  std::ofstream f(out_path, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return Fail(out_path + ": cannot write");
  return 0;
}

}  // namespace forge
