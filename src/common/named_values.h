// Names of enum values: one table per enum serves both directions (value -> name for printing,
// name -> value for parsing) and the error that lists the accepted names.
//
//   constexpr std::array<NamedValue<Link>, 3> kLinkNames{{
//       {"nvlink", Link::kNvlink}, {"ib400", Link::kIb400}, {"eth100", Link::kEth100}}};
//   NameOf(kLinkNames, Link::kIb400)       // "ib400"
//   ValueOf(kLinkNames, "ib4", "--link")   // Invalid "--link: must be one of nvlink|ib400|eth100,
//                                          //   got ib4"
//
// A value may have several names (aliases, e.g. "true" for "full"): the first one is printed.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace forge {

template <typename E>
struct NamedValue {
  const char* name;
  E value;
};

// The first name of `value` in table, or null for a value it lacks.
template <typename E, size_t N>
const char* FindName(const std::array<NamedValue<E>, N>& table, E value) {
  for (const auto& nv : table) {
    if (nv.value == value) return nv.name;
  }
  return nullptr;
}

// The same, "?" for a value the table lacks.
template <typename E, size_t N>
const char* NameOf(const std::array<NamedValue<E>, N>& table, E value) {
  const char* name = FindName(table, value);
  return name != nullptr ? name : "?";
}

// "a|b|c".
template <typename E, size_t N>
std::string AllNames(const std::array<NamedValue<E>, N>& table) {
  std::string out;
  for (const auto& nv : table) {
    if (!out.empty()) out += "|";
    out += nv.name;
  }
  return out;
}

// The value `name` spells in table, or null.
template <typename E, size_t N>
const E* LookUp(const std::array<NamedValue<E>, N>& table, std::string_view name) {
  for (const auto& nv : table) {
    if (name == nv.name) return &nv.value;
  }
  return nullptr;
}

// The value `name` spells, or Invalid "<what>: must be one of a|b|c, got <name>".
template <typename E, size_t N>
StatusOr<E> ValueOf(const std::array<NamedValue<E>, N>& table, std::string_view name,
                    std::string_view what) {
  if (const E* v = LookUp(table, name)) return *v;
  return Status::Invalid(std::string(what) + ": must be one of " + AllNames(table) + ", got " +
                         std::string(name));
}

// The same into *out, for callers that collect Statuses.
template <typename E, size_t N>
Status ValueOf(const std::array<NamedValue<E>, N>& table, std::string_view name,
               std::string_view what, E* out) {
  FORGE_ASSIGN_OR_RETURN(*out, ValueOf(table, name, what));
  return Status::Ok();
}

}  // namespace forge
