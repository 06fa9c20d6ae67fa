// Short human-readable numbers for progress lines: the trainer's and forgectl's watch line
// print the same way.
#pragma once

#include <cstdint>
#include <string>

namespace forge {

// "1.23M", "456.7k", "89" (tokens/s and the like).
std::string FormatRate(double per_second);
// "1h05m" from an hour up, else "3m07s" (rounded to the second).
std::string FormatDuration(double seconds);
// "2025-01-31 08:49:05Z" for milliseconds since the Unix epoch; "-" for <= 0 (unknown).
std::string FormatUtcTime(int64_t unix_ms);

}  // namespace forge
