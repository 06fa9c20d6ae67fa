// GPT-2's reversible byte <-> printable character map ("byte-level"): vocabulary files of
// GPT-2 and of Hugging Face byte-level BPE models spell each token's bytes with these
// characters (printable Latin-1 bytes as themselves, the other 68 as U+0100..U+0143).
#pragma once

#include <string>
#include <string_view>

namespace forge {

// The raw bytes a byte-level vocabulary string stands for; false when `s` has a character
// outside the 256 of the map.
bool ByteLevelToBytes(std::string_view s, std::string* out);

}  // namespace forge
