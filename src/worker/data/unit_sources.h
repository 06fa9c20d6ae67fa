// The documents of one work unit, bound for their splits: the files (or chunk) a planned
// unit names, or the bundled corpus as a single unit.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "worker/data/corpus.h"
#include "worker/data/documents.h"
#include "worker/data/prepare_pipeline.h"
#include "worker/data/prepare_plan.h"

namespace forge {

// Reads the unit's files in order. A document goes to validation when its file is a
// validation input, or when IsHeldOut(its hash, val_fraction).
std::unique_ptr<UnitSource> MakeFilesUnitSource(const PlannedUnit& unit,
                                                const std::vector<InputFile>& files,
                                                const DocumentOptions& options,
                                                double val_fraction,
                                                std::atomic<int64_t>* progress);

// The bundled corpus's documents in corpus order with the corpus's splits; item.file is the
// index of the document's source in `source_names` (sorted source names).
std::unique_ptr<UnitSource> MakeCorpusUnitSource(Corpus corpus,
                                                 const std::vector<std::string>& source_names,
                                                 std::atomic<int64_t>* progress);

}  // namespace forge
