#include "worker/infer/complete_text.h"

#include "common/utf8.h"

namespace forge {

StatusOr<std::vector<TextCompletion>> CompleteTexts(DecodeBackend* backend, Tokenizer* tok,
                                                    const std::vector<std::string>& prompts,
                                                    GenerateOptions opt) {
  const int32_t start = tok->bos_id() >= 0 ? tok->bos_id() : tok->eot_id();
  opt.stop_ids = {tok->eot_id()};
  const int max_len = opt.max_len > 0 ? opt.max_len : backend->model().seq_len;
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) {
    std::vector<int32_t> t = {start};
    tok->EncodeOrdinary(p, &t);
    // Room for at least one new token: the last max_len - 1 tokens.
    if (int(t.size()) > max_len - 1 && max_len > 1) t.erase(t.begin(), t.end() - (max_len - 1));
    ids.push_back(std::move(t));
  }
  FORGE_ASSIGN_OR_RETURN(std::vector<Generation> gens, Generate(backend, ids, opt));
  std::vector<TextCompletion> out;
  for (size_t i = 0; i < gens.size(); ++i) {
    std::vector<int32_t> shown = gens[i].tokens;
    if (gens[i].stop == "stop_token" && !shown.empty()) shown.pop_back();
    FORGE_ASSIGN_OR_RETURN(std::string text, tok->Decode(shown));
    out.push_back({prompts[i], SanitizeUtf8(text), gens[i].stop});
  }
  return out;
}

}  // namespace forge
