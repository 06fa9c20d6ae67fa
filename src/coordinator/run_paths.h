// Paths that come in requests (spec keys, checkpoint names, export file names) are resolved
// here and must stay inside the directory they are relative to: no absolute paths, no ".."
// components, no empty components.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace forge::coord {

// root/relative, or InvalidArgument naming `what` when `relative` is absolute, empty or has a
// "..", "." or empty component.
StatusOr<std::string> ResolveInside(const std::string& root, std::string_view relative,
                                    std::string_view what);

// "" and "latest" (-> -1) or "step_<N>" (-> N); anything else is InvalidArgument.
StatusOr<int64_t> ParseCheckpointName(std::string_view name, std::string_view what);

}  // namespace forge::coord
