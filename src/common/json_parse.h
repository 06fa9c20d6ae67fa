// JSON text parsed into an nlohmann::json, with the error a user reads: where the text came from
// (a file, or file:line) and the parser's own message.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace forge {

// Invalid "<where>: not JSON: <why>" when `text` does not parse.
inline StatusOr<nlohmann::json> ParseJson(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(where + ": not JSON: " + e.what());
  }
}

// ParseJson, and Invalid "<where>: expected a JSON object" unless the value is an object.
inline StatusOr<nlohmann::json> ParseJsonObject(const std::string& text, const std::string& where) {
  FORGE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, where));
  if (!j.is_object()) return Status::Invalid(where + ": expected a JSON object");
  return j;
}

}  // namespace forge
