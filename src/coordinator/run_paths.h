// Paths that come in requests (spec keys, checkpoint names, export file names) are resolved
// here and must stay inside the directory they are relative to: no absolute paths, no ".."
// components, no empty components. Input data may live anywhere under the roots the
// coordinator was given (--data-root).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace forge::coord {

// root/relative, or InvalidArgument naming `what` when `relative` is absolute, empty or has a
// "..", "." or empty component.
StatusOr<std::string> ResolveInside(const std::string& root, std::string_view relative,
                                    std::string_view what);

// `path` when, with "..", "." and the symbolic links of its existing part resolved, it lies
// inside one of `roots` (themselves resolved the same way): as written when absolute, under
// roots[0] when relative; InvalidArgument naming `what` and the roots otherwise, and when
// there are none.
StatusOr<std::string> ResolveUnderRoots(const std::vector<std::string>& roots,
                                        std::string_view path, std::string_view what);

// "" and "latest" (-> -1) or "step_<N>" (-> N); anything else is InvalidArgument.
StatusOr<int64_t> ParseCheckpointName(std::string_view name, std::string_view what);

}  // namespace forge::coord
