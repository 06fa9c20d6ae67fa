#include "worker/infer/dataset_eval.h"

#include <cmath>
#include <functional>

#include "worker/data/sampler.h"

namespace forge {

StatusOr<std::vector<int32_t>> TokenByteLengths(Tokenizer* tok, int vocab) {
  std::vector<int32_t> len(size_t(vocab), 0);
  std::vector<bool> special(size_t(vocab), false);
  for (const SpecialToken& s : tok->special_tokens())
    if (s.id >= 0 && s.id < vocab) special[size_t(s.id)] = true;
  const int known = std::min(vocab, tok->vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    if (special[size_t(id)]) continue;
    FORGE_ASSIGN_OR_RETURN(std::string bytes, tok->Decode(std::span<const int32_t>(&id, 1)));
    len[size_t(id)] = int32_t(bytes.size());
  }
  return len;
}

namespace {

using BatchLoss = std::function<Status(const MicroBatch&, float*)>;

StatusOr<DatasetEvalResult> Evaluate(const BatchLoss& batch_loss, const TokenDataset& ds,
                                     const DatasetEvalOptions& opt, Tokenizer* tok) {
  const TokenStream& stream = ds.split(opt.split);
  const SplitManifest& sm = ds.manifest().splits[static_cast<int>(opt.split)];
  const int T = opt.seq_len, mb = opt.micro_batch;
  if (T < 1 || mb < 1) return Status::Invalid("eval: seq_len and micro_batch must be >= 1");
  const int64_t S = NumSequences(stream.size(), T);
  if (S <= 0)
    return Status::Precondition("the split's " + std::to_string(stream.size()) +
                                " tokens hold no sequence of " + std::to_string(T + 1));
  DatasetEvalResult r;
  r.batches = opt.batches > 0 ? opt.batches : std::max<int64_t>(1, S / mb);
  const size_t per = size_t(mb) * size_t(T);
  r.inputs.resize(per * size_t(r.batches));
  r.targets.resize(per * size_t(r.batches));
  r.per_batch.resize(size_t(r.batches));
  double total = 0.0;
  for (int64_t i = 0; i < r.batches; ++i) {
    int32_t* in = r.inputs.data() + per * size_t(i);
    int32_t* tgt = r.targets.data() + per * size_t(i);
    Status st = FillEvalBatch(stream, T, i, mb, in, tgt);
    if (st.ok()) st = batch_loss({in, tgt}, &r.per_batch[size_t(i)]);
    if (!st.ok()) return st.Annotate("eval batch " + std::to_string(i));
    total += r.per_batch[size_t(i)];
  }
  r.loss = total / double(r.batches);
  r.perplexity = std::exp(r.loss);
  r.tokens = int64_t(per) * r.batches;

  if (tok != nullptr) {
    FORGE_ASSIGN_OR_RETURN(std::vector<int32_t> len,
                           TokenByteLengths(tok, std::max(tok->vocab_size(), ds.manifest().vocab_size)));
    for (int32_t t : r.targets) {
      if (t < 0 || size_t(t) >= len.size())
        return Status::Invalid("token " + std::to_string(t) + " is outside the tokenizer");
      r.bytes += len[size_t(t)];
    }
    r.bytes_source = "decoded";
  } else if (sm.text_bytes > 0 && sm.tokens > 0) {
    r.bytes = int64_t(std::llround(double(sm.text_bytes) / double(sm.tokens) * double(r.tokens)));
    r.bytes_source = "manifest_ratio";
  }
  if (r.bytes > 0) r.bits_per_byte = r.loss * double(r.tokens) / std::log(2.0) / double(r.bytes);
  return r;
}

}  // namespace

StatusOr<DatasetEvalResult> EvaluateDataset(TrainBackend* backend, const TokenDataset& ds,
                                            const DatasetEvalOptions& opt, Tokenizer* tok) {
  FORGE_RETURN_IF_ERROR(backend->BeginEval());
  return Evaluate([backend](const MicroBatch& b, float* loss) { return backend->EvalLoss(b, loss); },
                  ds, opt, tok);
}

StatusOr<DatasetEvalResult> EvaluateDataset(DecodeBackend* backend, const TokenDataset& ds,
                                            const DatasetEvalOptions& opt, Tokenizer* tok) {
  const int T = opt.seq_len, mb = opt.micro_batch;
  std::vector<int> seqs(size_t(std::max(mb, 0)));
  for (int i = 0; i < mb; ++i) seqs[size_t(i)] = i;
  std::vector<std::vector<int32_t>> in(seqs.size()), tgt(seqs.size());
  std::vector<float> losses;
  auto batch_loss = [&](const MicroBatch& b, float* loss) -> Status {
    FORGE_RETURN_IF_ERROR(backend->Reset(mb, T));
    for (int i = 0; i < mb; ++i) {
      in[size_t(i)].assign(b.inputs + int64_t(i) * T, b.inputs + int64_t(i + 1) * T);
      tgt[size_t(i)].assign(b.targets + int64_t(i) * T, b.targets + int64_t(i + 1) * T);
    }
    FORGE_RETURN_IF_ERROR(backend->AppendLosses(seqs, in, tgt, &losses));
    double sum = 0.0;
    for (float l : losses) sum += l;
    *loss = float(sum / double(losses.size()));
    return Status::Ok();
  };
  return Evaluate(batch_loss, ds, opt, tok);
}

}  // namespace forge
