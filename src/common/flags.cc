#include "common/flags.h"

#include "common/closest_match.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#ifndef FORGE_VERSION
#define FORGE_VERSION "dev"
#endif
#ifndef FORGE_GIT_COMMIT
#define FORGE_GIT_COMMIT "unknown"
#endif

namespace forge {

std::string VersionString(std::string_view program) {
  return std::string(program) + " " + FORGE_VERSION + " (commit " + FORGE_GIT_COMMIT + ")";
}

Status UnknownCommand(std::string_view command, const std::vector<std::string_view>& known) {
  const std::string_view near = ClosestMatch(command, known);
  return Status::Invalid("unknown command '" + std::string(command) + "'" +
                         (near.empty() ? "" : " (did you mean '" + std::string(near) + "'?)"));
}

int UsageError(std::string_view program, const Status& s) {
  std::fprintf(stderr, "%.*s: %s\n(see '%.*s --help')\n", int(program.size()), program.data(),
               s.message().c_str(), int(program.size()), program.data());
  return 2;
}

FlagParser::FlagParser(std::string program, std::string positional, std::string description)
    : program_(std::move(program)),
      positional_desc_(std::move(positional)),
      description_(std::move(description)),
      max_positional_(positional_desc_.empty() ? 0 : -1) {}

void FlagParser::Add(std::string name, std::string value_name, std::string help, Kind kind) {
  specs_.push_back({std::move(name), std::move(value_name), std::move(help), kind});
}
void FlagParser::Value(std::string name, std::string value_name, std::string help) {
  Add(std::move(name), std::move(value_name), std::move(help), Kind::kValue);
}
void FlagParser::Bool(std::string name, std::string help) {
  Add(std::move(name), "", std::move(help), Kind::kBool);
}
void FlagParser::List(std::string name, std::string value_name, std::string help) {
  Add(std::move(name), std::move(value_name), std::move(help), Kind::kList);
}
void FlagParser::Alias(std::string alias, std::string name) {
  aliases_.emplace_back(std::move(alias), std::move(name));
}

const FlagParser::Spec* FlagParser::Find(std::string_view name) const {
  for (const auto& [alias, target] : aliases_)
    if (alias == name) name = target;
  for (const Spec& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

std::string FlagParser::Suggest(std::string_view name) const {
  std::vector<std::string_view> names{"--help", "--version"};
  for (const Spec& s : specs_) names.push_back(s.name);
  if (const std::string_view near = ClosestMatch(name, names); !near.empty())
    return std::string(near);
  // A flag that mistypes (or leaves out the rest of) one word of a longer name: --port or
  // --prot for --metrics-port. Only a near miss of one word (at most one edit, three letters
  // or more) names exactly one flag; otherwise nothing is suggested.
  const std::string_view word = name.substr(std::min(name.find_first_not_of('-'), name.size()));
  if (word.size() < 3 || word.find('-') != std::string_view::npos) return "";
  const Spec* found = nullptr;
  size_t best = 2;
  for (const Spec& s : specs_) {
    std::string_view rest = std::string_view(s.name).substr(2);
    while (!rest.empty()) {
      const size_t dash = rest.find('-');
      const size_t d = EditDistance(word, rest.substr(0, dash));
      if (d < best) best = d, found = &s;
      else if (d == best && found != &s) found = nullptr;  // two flags as near: say nothing
      rest = dash == std::string_view::npos ? "" : rest.substr(dash + 1);
    }
  }
  return found != nullptr ? found->name : "";
}

Status FlagParser::Parse(int argc, char** argv, int first) {
  bool flags_done = false;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg == "--version") {
      version_ = true;
      continue;
    }
    std::string inline_value;
    bool has_inline = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg.resize(eq);
      has_inline = true;
    }
    const Spec* spec = Find(arg);
    if (spec == nullptr) {
      const std::string near = Suggest(arg);
      return Status::Invalid("unknown flag " + arg +
                             (near.empty() ? "" : " (did you mean " + near + "?)"));
    }
    switch (spec->kind) {
      case Kind::kBool:
        if (has_inline && inline_value != "true" && inline_value != "false")
          return Status::Invalid(spec->name + ": takes no value (or =true/=false), got '" +
                                 inline_value + "'");
        // --flag=false is as if the flag were not given (Has() is false), whatever came before.
        std::erase_if(values_, [&](const auto& v) { return v.first == spec->name; });
        if (!has_inline || inline_value == "true") values_.emplace_back(spec->name, "true");
        break;
      case Kind::kValue:
        if (has_inline) {
          values_.emplace_back(spec->name, inline_value);
        } else {
          if (i + 1 >= argc) return Status::Invalid(spec->name + ": expects " + spec->value_name);
          values_.emplace_back(spec->name, argv[++i]);
        }
        break;
      case Kind::kList: {
        size_t n = 0;
        if (has_inline) values_.emplace_back(spec->name, inline_value), ++n;
        while (i + 1 < argc && argv[i + 1][0] != '-') values_.emplace_back(spec->name, argv[++i]), ++n;
        if (n == 0) return Status::Invalid(spec->name + ": expects " + spec->value_name);
        break;
      }
    }
  }
  if (help_ || version_) return Status::Ok();
  if (max_positional_ >= 0 && static_cast<int>(positional_.size()) > max_positional_) {
    return Status::Invalid("unexpected argument '" + positional_[max_positional_] + "'" +
                           (positional_desc_.empty() ? "" : " (usage: " + program_ + " " +
                                                                positional_desc_ + " [flags])"));
  }
  if (static_cast<int>(positional_.size()) < min_positional_)
    return Status::Invalid("expects " + positional_desc_);
  for (const std::string& name : required_)
    if (!Has(name)) return Status::Invalid(name + " is required");
  return Status::Ok();
}

bool FlagParser::ParseOrExit(int argc, char** argv, int first, int* rc,
                             const std::function<int(const Status&)>& on_error) {
  const Status s = Parse(argc, argv, first);
  if (help_) {
    std::fputs(Usage().c_str(), stdout);
    *rc = 0;
    return true;
  }
  if (version_) {
    // "forge train --version" answers as "forge --version" does.
    std::printf("%s\n", VersionString(program_.substr(0, program_.find(' '))).c_str());
    *rc = 0;
    return true;
  }
  if (!s.ok()) {
    *rc = on_error ? on_error(s) : UsageError(s);
    return true;
  }
  return false;
}

int FlagParser::UsageError(const Status& s) const { return forge::UsageError(program_, s); }

std::string FlagParser::Usage() const {
  std::string u = "usage: " + program_;
  if (!positional_desc_.empty()) u += " " + positional_desc_;
  if (!specs_.empty()) u += " [flags]";
  u += "\n";
  if (!description_.empty()) u += "\n" + description_ + "\n";
  u += "\nflags:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Spec& s : specs_) {
    std::string left = s.name;
    for (const auto& [alias, target] : aliases_)
      if (target == s.name) left = alias + ", " + left;
    if (!s.value_name.empty()) left += " " + s.value_name;
    rows.emplace_back(left, s.help);
  }
  rows.emplace_back("-h, --help", "print this help and exit");
  rows.emplace_back("--version", "print the version and exit");
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  width = std::min<size_t>(width, 32);
  for (const auto& [left, help] : rows) {
    u.append("  ").append(left);
    if (left.size() > width) u.append("\n").append(width + 2, ' ');
    else u.append(width - left.size(), ' ');
    u.append("  ").append(help).append("\n");
  }
  return u;
}

bool FlagParser::Has(std::string_view name) const {
  for (const auto& [k, v] : values_)
    if (k == name) return true;
  return false;
}

std::string FlagParser::Get(std::string_view name, std::string def) const {
  for (auto it = values_.rbegin(); it != values_.rend(); ++it)
    if (it->first == name) return it->second;
  return def;
}

std::vector<std::string> FlagParser::GetAll(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_)
    if (k == name) out.push_back(v);
  return out;
}

Status FlagParser::GetInt(std::string_view name, int64_t* out) const {
  if (!Has(name)) return Status::Ok();
  const std::string v = Get(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    return Status::Invalid(std::string(name) + ": expects an integer, got '" + v + "'");
  *out = x;
  return Status::Ok();
}

Status FlagParser::GetInt(std::string_view name, int* out) const {
  int64_t x = *out;
  FORGE_RETURN_IF_ERROR(GetInt(name, &x));
  if (x < INT32_MIN || x > INT32_MAX)
    return Status::Invalid(std::string(name) + ": out of range, got " + Get(name));
  *out = static_cast<int>(x);
  return Status::Ok();
}

Status FlagParser::GetInt(std::string_view name, int* out, int lo, int hi) const {
  int v = *out;
  FORGE_RETURN_IF_ERROR(GetInt(name, &v));
  if (Has(name) && (v < lo || v > hi))
    return Status::Invalid(std::string(name) + ": expects an integer in [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "], got " + Get(name));
  *out = v;
  return Status::Ok();
}

Status FlagParser::GetDouble(std::string_view name, double* out) const {
  if (!Has(name)) return Status::Ok();
  const std::string v = Get(name);
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    return Status::Invalid(std::string(name) + ": expects a number, got '" + v + "'");
  *out = x;
  return Status::Ok();
}

}  // namespace forge
