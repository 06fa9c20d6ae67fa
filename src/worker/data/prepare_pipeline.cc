// Work units -> shards on a thread pool (see prepare_pipeline.h).
#include "worker/data/prepare_pipeline.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/file_io.h"

namespace forge {
namespace {

// One unit's output: a shard sequence per split, the per-file statistics and the counts.
class UnitWriter {
 public:
  UnitWriter(const PipelineOptions& o, int64_t unit_id, int vocab, PipelineProgress* progress)
      : o_(o), unit_id_(unit_id), progress_(progress) {
    bos_ = o.tokenizer->bos_id();
    eot_ = o.tokenizer->eot_id();
    for (auto& c : counts_) c.assign(static_cast<size_t>(vocab), 0);
  }

  Status Add(const UnitItem& item, const std::vector<int32_t>& ids) {
    const int s = static_cast<int>(item.split);
    if (item.file >= static_cast<int>(files_.size())) files_.resize(static_cast<size_t>(item.file) + 1);
    UnitFileStats& f = files_[static_cast<size_t>(item.file)];
    int64_t n = 0;
    if (item.piece.begins && bos_ >= 0) {
      FORGE_RETURN_IF_ERROR(Append(s, {&bos_, 1}, &f));
      ++n;
    }
    FORGE_RETURN_IF_ERROR(Append(s, ids, &f));
    n += static_cast<int64_t>(ids.size());
    if (item.piece.ends) {
      FORGE_RETURN_IF_ERROR(Append(s, {&eot_, 1}, &f));
      ++n;
      f.docs[s] += 1;
      if (item.piece.repaired) {
        f.repaired += 1;
        progress_->repaired.fetch_add(1, std::memory_order_relaxed);
      }
      progress_->docs.fetch_add(1, std::memory_order_relaxed);
    }
    f.tokens[s] += n;
    f.text_bytes[s] += item.text_bytes;
    progress_->tokens.fetch_add(n, std::memory_order_relaxed);
    return Status::Ok();
  }

  StatusOr<UnitResult> Finish() {
    UnitResult r;
    for (int s = 0; s < 2; ++s) FORGE_RETURN_IF_ERROR(Close(s));
    for (int s = 0; s < 2; ++s) {
      for (ShardRecord& rec : shards_[s]) r.shards.push_back(std::move(rec));
    }
    if (!r.shards.empty()) FORGE_RETURN_IF_ERROR(SyncDirectory(o_.dir));
    r.files = std::move(files_);
    r.counts = std::move(counts_);
    return r;
  }

 private:
  Status Append(int s, std::span<const int32_t> tokens, UnitFileStats* f) {
    for (int32_t t : tokens) {
      if (t >= 0 && static_cast<size_t>(t) < counts_[s].size()) ++counts_[s][static_cast<size_t>(t)];
    }
    while (!tokens.empty()) {
      if (!open_[s].has_value()) {
        const std::string name =
            UnitShardName(static_cast<Split>(s), unit_id_, static_cast<int>(shards_[s].size()));
        FORGE_ASSIGN_OR_RETURN(ShardWriter w, ShardWriter::Create(o_.dir + "/" + name, o_.dtype));
        open_[s].emplace(std::move(w));
        names_[s] = name;
      }
      const int k = static_cast<int>(shards_[s].size());
      if (f->first_shard[s] < 0) f->first_shard[s] = k;
      f->last_shard[s] = k;
      ShardWriter& w = *open_[s];
      const size_t room = static_cast<size_t>(o_.shard_tokens) - static_cast<size_t>(w.tokens());
      const size_t take = std::min(room, tokens.size());
      FORGE_RETURN_IF_ERROR(w.Append(tokens.first(take)));
      tokens = tokens.subspan(take);
      if (w.tokens() == static_cast<uint64_t>(o_.shard_tokens)) FORGE_RETURN_IF_ERROR(Close(s));
    }
    return Status::Ok();
  }

  Status Close(int s) {
    if (!open_[s].has_value()) return Status::Ok();
    FORGE_ASSIGN_OR_RETURN(ShardInfo info, open_[s]->Finish());
    open_[s].reset();
    shards_[s].push_back(ShardRecord{static_cast<Split>(s), names_[s],
                                     static_cast<int64_t>(info.tokens), info.crc32c});
    return Status::Ok();
  }

  const PipelineOptions& o_;
  int64_t unit_id_;
  PipelineProgress* progress_;
  int32_t bos_ = -1, eot_ = -1;
  std::optional<ShardWriter> open_[2];
  std::string names_[2];
  std::vector<ShardRecord> shards_[2];
  std::vector<UnitFileStats> files_;
  std::array<std::vector<uint64_t>, 2> counts_;
};

struct Batch {
  std::vector<UnitItem> items;
  std::vector<std::vector<int32_t>> ids;
  bool done = false;  // tokenized (guarded by the engine's mutex)
};

class Engine {
 public:
  Engine(const PipelineOptions& o, const std::vector<int64_t>& ids,
         const std::function<StatusOr<std::unique_ptr<UnitSource>>(int64_t)>& open,
         const std::function<Status(UnitResult&&)>& done, PipelineProgress* progress)
      : o_(o), ids_(ids), open_(open), done_(done), progress_(progress) {
    permits_ = 2 * o.threads + 1;
  }

  Status Run() {
    std::vector<std::unique_ptr<Tokenizer>> toks;
    for (int t = 0; t < o_.threads; ++t) toks.push_back(o_.tokenizer->Clone());
    std::vector<std::thread> pool;
    for (int t = 1; t < o_.threads; ++t) pool.emplace_back([&, t] { Worker(toks[t].get()); });
    Worker(toks[0].get());
    for (std::thread& t : pool) t.join();
    return error_;
  }

 private:
  void Worker(Tokenizer* tok) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (failed_) return;
      if (!queue_.empty()) {
        TokenizeOne(tok, &lk);
        continue;
      }
      if (next_ < static_cast<int64_t>(ids_.size())) {
        const int64_t u = next_++;
        ++active_;
        lk.unlock();
        Status st = RunUnit(u, tok);
        lk.lock();
        --active_;
        if (!st.ok()) Fail(st);
        cv_.notify_all();
        continue;
      }
      if (active_ == 0) return;
      cv_.wait(lk);
    }
  }

  void Fail(const Status& st) {  // mu_ held
    if (!failed_) error_ = st;
    failed_ = true;
    cv_.notify_all();
  }

  // Pops and tokenizes one queued batch; mu_ held on entry and exit.
  void TokenizeOne(Tokenizer* tok, std::unique_lock<std::mutex>* lk) {
    Batch* b = queue_.front();
    queue_.pop_front();
    lk->unlock();
    b->ids.resize(b->items.size());
    for (size_t i = 0; i < b->items.size(); ++i) {
      b->ids[i].clear();
      tok->EncodeOrdinary(b->items[i].piece.text, &b->ids[i]);
      std::string().swap(b->items[i].piece.text);  // only its size is needed from here on
    }
    lk->lock();
    b->done = true;
    cv_.notify_all();
  }

  Status Fill(UnitSource* src, Batch* b, bool* eof) {
    size_t bytes = 0;
    while (bytes < o_.batch_bytes && b->items.size() < 4096) {
      UnitItem item;
      FORGE_ASSIGN_OR_RETURN(bool more, src->Next(&item));
      if (!more) {
        *eof = true;
        break;
      }
      item.text_bytes = static_cast<int64_t>(item.piece.text.size());
      bytes += item.piece.text.size();
      b->items.push_back(std::move(item));
    }
    return Status::Ok();
  }

  // Takes this unit's batches out of the queue and waits for those being tokenized, so that
  // none is freed while another thread holds it. mu_ held.
  void Drain(std::deque<std::unique_ptr<Batch>>* inflight, std::unique_lock<std::mutex>* lk) {
    for (const auto& b : *inflight) {
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (*it == b.get()) {
          queue_.erase(it);
          b->done = true;
          break;
        }
      }
    }
    for (const auto& b : *inflight) cv_.wait(*lk, [&] { return b->done; });
    permits_ += static_cast<int>(inflight->size());
    inflight->clear();
    cv_.notify_all();
  }

  Status RunUnit(int64_t u, Tokenizer* tok) {
    FORGE_ASSIGN_OR_RETURN(std::unique_ptr<UnitSource> src, open_(u));
    UnitWriter writer(o_, ids_[static_cast<size_t>(u)], o_.tokenizer->vocab_size(), progress_);
    std::deque<std::unique_ptr<Batch>> inflight;
    bool eof = false;
    std::unique_lock<std::mutex> lk(mu_);
    auto fail = [&](const Status& st) {
      Drain(&inflight, &lk);
      return st;
    };
    for (;;) {
      if (failed_) return fail(Status::Unavailable("stopped by an earlier error"));
      if (!inflight.empty() && inflight.front()->done) {
        std::unique_ptr<Batch> b = std::move(inflight.front());
        inflight.pop_front();
        lk.unlock();
        Status st;
        for (size_t i = 0; i < b->items.size() && st.ok(); ++i) st = writer.Add(b->items[i], b->ids[i]);
        b.reset();
        lk.lock();
        ++permits_;
        cv_.notify_all();
        if (!st.ok()) return fail(st);
        continue;
      }
      if (eof && inflight.empty()) break;
      if (!eof && permits_ > 0) {
        --permits_;
        lk.unlock();
        auto b = std::make_unique<Batch>();
        Status st = Fill(src.get(), b.get(), &eof);
        lk.lock();
        if (!st.ok() || b->items.empty()) {
          ++permits_;
          if (!st.ok()) return fail(st);
          continue;
        }
        queue_.push_back(b.get());
        inflight.push_back(std::move(b));
        cv_.notify_all();
        continue;
      }
      if (!queue_.empty()) {
        TokenizeOne(tok, &lk);
        continue;
      }
      cv_.wait(lk);
    }
    lk.unlock();
    FORGE_ASSIGN_OR_RETURN(UnitResult result, writer.Finish());
    result.index = u;
    std::vector<ReadReport> reports = src->Reports();
    if (result.files.size() < reports.size()) result.files.resize(reports.size());
    for (size_t i = 0; i < reports.size(); ++i) result.files[i].read = reports[i];
    {
      std::lock_guard<std::mutex> g(done_mu_);
      FORGE_RETURN_IF_ERROR(done_(std::move(result)));
    }
    progress_->units.fetch_add(1);
    return Status::Ok();
  }

  const PipelineOptions& o_;
  const std::vector<int64_t>& ids_;
  const std::function<StatusOr<std::unique_ptr<UnitSource>>(int64_t)>& open_;
  const std::function<Status(UnitResult&&)>& done_;
  PipelineProgress* progress_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch*> queue_;
  int permits_ = 0;
  int64_t next_ = 0;
  int active_ = 0;
  bool failed_ = false;
  Status error_;
  std::mutex done_mu_;
};

}  // namespace

std::string UnitShardName(Split split, int64_t unit_id, int k) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-%06lld-%04d.tok", SplitName(split),
                static_cast<long long>(unit_id), k);
  return buf;
}

Status RunPipeline(const PipelineOptions& options, const std::vector<int64_t>& unit_ids,
                   const std::function<StatusOr<std::unique_ptr<UnitSource>>(int64_t)>& open,
                   const std::function<Status(UnitResult&&)>& done, PipelineProgress* progress) {
  if (options.tokenizer == nullptr) return Status::Invalid("prepare: no tokenizer");
  if (options.shard_tokens < 1) return Status::Invalid("prepare: shard_tokens must be >= 1");
  PipelineOptions o = options;
  o.threads = std::max(1, o.threads);
  Engine engine(o, unit_ids, open, done, progress);
  return engine.Run();
}

}  // namespace forge
