#include "common/peak_flops.h"

#include <array>
#include <cctype>
#include <string>
#include <vector>

namespace forge {
namespace {

struct PeakEntry {
  const char* model;      // a whole word of the name
  const char* qualifier;  // a second word that must also appear ("" = none); first match wins
  double tflops;
};

// More specific entries (with a qualifier) come before the plain model.
constexpr std::array<PeakEntry, 15> kPeaks{{
    {"H100", "PCIe", 756.0},
    {"H100", "NVL", 835.5},
    {"H100", "", 989.4},  // SXM5 (HBM3)
    {"H200", "NVL", 835.5},
    {"H200", "", 989.4},
    {"GH200", "", 989.4},
    {"H800", "PCIe", 756.0},
    {"H800", "", 989.4},
    {"A100", "", 312.0},  // SXM4 and PCIe alike
    {"A800", "", 312.0},
    {"L40S", "", 362.05},
    {"L40", "", 181.05},
    {"L4", "", 121.0},
    {"A10", "", 125.0},
    {"B200", "", 2250.0},
}};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> Words(std::string_view name) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!cur.empty()) words.push_back(Lower(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) words.push_back(Lower(cur));
  return words;
}

bool HasWord(const std::vector<std::string>& words, const char* w) {
  const std::string want = Lower(w);
  for (const std::string& x : words)
    if (x == want) return true;
  return false;
}

}  // namespace

double DenseBf16PeakTflops(std::string_view device_name) {
  const std::vector<std::string> words = Words(device_name);
  for (const PeakEntry& e : kPeaks) {
    if (!HasWord(words, e.model)) continue;
    if (e.qualifier[0] != '\0' && !HasWord(words, e.qualifier)) continue;
    return e.tflops;
  }
  return 0.0;
}

double ModelFlopsUtilization(double tokens_per_s, double flops_per_token, double peak_tflops) {
  if (peak_tflops <= 0.0) return 0.0;
  return tokens_per_s * flops_per_token / (peak_tflops * 1e12);
}

}  // namespace forge
