// Work units of a prepare: the input files, in path order, cut into pieces of about
// `chunk_bytes` of input that one thread reads in order. A plain JSONL file larger than
// chunk_bytes becomes one unit per line-aligned chunk (documents.h); smaller files (and
// compressed ones, which must be read from their start, and text files, one document each)
// are grouped with their neighbours until a group reaches chunk_bytes (a compressed file
// weighs 4x its size, about what it expands to).
//
// The plan depends only on the files (paths, sizes, modification times) and chunk_bytes, so
// a rerun over the same inputs makes the same units with the same ids, which is what lets a
// killed prepare continue: a unit's key says exactly what it reads, and a journal record
// whose key matches its unit's is that unit's finished output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/input_files.h"

namespace forge {

struct PlannedUnit {
  std::vector<int> files;    // indices into the planned file list
  uint64_t chunk = 0;        // chunk index of files[0] when chunk_bytes > 0
  uint64_t chunk_bytes = 0;  // 0: whole files
  uint64_t bytes = 0;        // input bytes it reads (for progress)
  std::string key;           // what it reads: files (path, size, mtime) and chunk
};

std::vector<PlannedUnit> PlanUnits(const std::vector<InputFile>& files, uint64_t chunk_bytes);

}  // namespace forge
