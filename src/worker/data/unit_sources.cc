// Unit sources over input files and over the bundled corpus (see unit_sources.h).
#include "worker/data/unit_sources.h"

#include <algorithm>

namespace forge {
namespace {

class FilesSource : public UnitSource {
 public:
  FilesSource(const PlannedUnit& unit, const std::vector<InputFile>& files,
              const DocumentOptions& options, double val_fraction,
              std::atomic<int64_t>* progress)
      : unit_(unit), files_(files), options_(options), val_fraction_(val_fraction),
        progress_(progress), reports_(unit.files.size()) {}

  StatusOr<bool> Next(UnitItem* item) override {
    for (;;) {
      if (reader_ == nullptr) {
        if (next_ >= unit_.files.size()) return false;
        const InputFile& f = files_[static_cast<size_t>(unit_.files[next_])];
        FORGE_ASSIGN_OR_RETURN(reader_, OpenDocuments(f, options_, unit_.chunk, unit_.chunk_bytes,
                                                      progress_));
        current_ = next_++;
      }
      FORGE_ASSIGN_OR_RETURN(bool more, reader_->Next(&item->piece));
      if (!more) {
        reports_[current_] = reader_->report();
        reader_.reset();
        continue;
      }
      const InputFile& f = files_[static_cast<size_t>(unit_.files[current_])];
      item->split = f.val || IsHeldOut(item->piece.doc_hash, val_fraction_) ? Split::kVal
                                                                             : Split::kTrain;
      item->file = static_cast<int>(current_);
      return true;
    }
  }

  std::vector<ReadReport> Reports() const override { return reports_; }

 private:
  const PlannedUnit& unit_;
  const std::vector<InputFile>& files_;
  DocumentOptions options_;
  double val_fraction_;
  std::atomic<int64_t>* progress_;
  std::vector<ReadReport> reports_;
  std::unique_ptr<DocumentReader> reader_;
  size_t next_ = 0, current_ = 0;
};

class CorpusSource : public UnitSource {
 public:
  CorpusSource(Corpus corpus, const std::vector<std::string>& names,
               std::atomic<int64_t>* progress)
      : corpus_(std::move(corpus)), names_(names), progress_(progress),
        reports_(names.size()) {}

  StatusOr<bool> Next(UnitItem* item) override {
    if (next_ >= corpus_.docs.size()) return false;
    Document& d = corpus_.docs[next_++];
    item->piece = DocPiece{};
    item->piece.text = std::move(d.text);
    item->split = d.split;
    const auto it = std::find(names_.begin(), names_.end(), d.source);
    item->file = static_cast<int>(it - names_.begin());
    ReadReport& r = reports_[static_cast<size_t>(item->file)];
    r.end += item->piece.text.size();
    if (progress_ != nullptr) progress_->fetch_add(static_cast<int64_t>(item->piece.text.size()));
    return true;
  }

  std::vector<ReadReport> Reports() const override { return reports_; }

 private:
  Corpus corpus_;
  std::vector<std::string> names_;
  std::atomic<int64_t>* progress_;
  std::vector<ReadReport> reports_;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<UnitSource> MakeFilesUnitSource(const PlannedUnit& unit,
                                                const std::vector<InputFile>& files,
                                                const DocumentOptions& options,
                                                double val_fraction,
                                                std::atomic<int64_t>* progress) {
  return std::make_unique<FilesSource>(unit, files, options, val_fraction, progress);
}

std::unique_ptr<UnitSource> MakeCorpusUnitSource(Corpus corpus,
                                                 const std::vector<std::string>& source_names,
                                                 std::atomic<int64_t>* progress) {
  return std::make_unique<CorpusSource>(std::move(corpus), source_names, progress);
}

}  // namespace forge
