#include "worker/infer/mc_eval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/json_parse.h"

namespace forge {
namespace {

using json = nlohmann::json;

// lm-eval's HellaSwag text clean-up: strip, " [title]" -> ". ", drop "[...]" markers, then
// collapse double spaces.
std::string HellaswagPreprocess(std::string text) {
  const auto b = text.find_first_not_of(" \t\n\r");
  const auto e = text.find_last_not_of(" \t\n\r");
  text = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  for (size_t p; (p = text.find(" [title]")) != std::string::npos;) text.replace(p, 8, ". ");
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      const size_t close = text.find(']', i);
      if (close != std::string::npos) {
        i = close;
        continue;
      }
    }
    out += text[i];
  }
  for (size_t p; (p = out.find("  ")) != std::string::npos;) out.replace(p, 2, " ");
  return out;
}

StatusOr<int> LabelOf(const json& v, const std::string& where) {
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::stoi(s);
  }
  return Status::Invalid(where + ": label " + v.dump() + " is not an index");
}

StatusOr<McExample> ParseExample(const json& j, const std::string& where) {
  McExample ex;
  auto strings = [&](const json& a, const char* key) -> Status {
    if (!a.is_array() || a.empty()) return Status::Invalid(where + ": " + key + " must be a non-empty list of strings");
    for (const json& s : a) {
      if (!s.is_string()) return Status::Invalid(where + ": " + key + " must be a non-empty list of strings");
      ex.endings.push_back(s.get<std::string>());
    }
    return Status::Ok();
  };
  if (j.contains("answerKey") && j.contains("question")) {  // ARC
    const json& q = j["question"];
    json choices = j.contains("choices") ? j["choices"] : json();
    std::string stem;
    if (q.is_string()) {
      stem = q.get<std::string>();
    } else if (q.is_object() && q.contains("stem") && q["stem"].is_string()) {
      stem = q["stem"].get<std::string>();
      if (q.contains("choices")) {  // the original release: [{"text", "label"}, ...]
        json text = json::array(), label = json::array();
        for (const json& c : q["choices"]) {
          text.push_back(c.value("text", json()));
          label.push_back(c.value("label", json()));
        }
        choices = {{"text", text}, {"label", label}};
      }
    } else {
      return Status::Invalid(where + ": question must be a string or {\"stem\": ...}");
    }
    if (!choices.is_object() || !choices.contains("text") || !choices.contains("label"))
      return Status::Invalid(where + ": choices must be {\"text\": [...], \"label\": [...]}");
    FORGE_RETURN_IF_ERROR(strings(choices["text"], "choices.text"));
    const json& labels = choices["label"];
    const json& key = j["answerKey"];
    ex.label = -1;
    for (size_t i = 0; labels.is_array() && i < labels.size(); ++i)
      if (labels[i] == key) ex.label = int(i);
    if (ex.label < 0)
      return Status::Invalid(where + ": answerKey " + key.dump() + " is not among choices.label");
    ex.context = "Question: " + stem + "\nAnswer:";
  } else if (j.contains("ctx_a") && j.contains("activity_label")) {  // HellaSwag
    std::string b = j.value("ctx_b", "");
    if (!b.empty()) b[0] = char(std::toupper(static_cast<unsigned char>(b[0])));
    ex.context = HellaswagPreprocess(j.value("activity_label", "") + ": " +
                                     j.value("ctx_a", "") + " " + b);
    FORGE_RETURN_IF_ERROR(strings(j.value("endings", json()), "endings"));
    for (std::string& e : ex.endings) e = HellaswagPreprocess(e);
    if (!j.contains("label")) return Status::Invalid(where + ": label is missing");
    FORGE_ASSIGN_OR_RETURN(ex.label, LabelOf(j["label"], where));
  } else {
    const char* ctx_key = j.contains("context") ? "context" : j.contains("ctx") ? "ctx" : "query";
    if (!j.contains(ctx_key) || !j[ctx_key].is_string())
      return Status::Invalid(where + ": expected \"context\" (a string), \"endings\" and "
                                     "\"label\", or the HellaSwag or ARC fields");
    ex.context = j[ctx_key].get<std::string>();
    const char* end_key = j.contains("endings") ? "endings" : "choices";
    FORGE_RETURN_IF_ERROR(strings(j.value(end_key, json()), end_key));
    const char* label_key = j.contains("label") ? "label" : "gold";
    if (!j.contains(label_key)) return Status::Invalid(where + ": label is missing");
    FORGE_ASSIGN_OR_RETURN(ex.label, LabelOf(j[label_key], where));
  }
  if (ex.label < 0 || ex.label >= int(ex.endings.size()))
    return Status::Invalid(where + ": label " + std::to_string(ex.label) + " is not one of the " +
                           std::to_string(ex.endings.size()) + " endings");
  return ex;
}

}  // namespace

StatusOr<std::vector<McExample>> ReadMcTasks(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::vector<McExample> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    FORGE_ASSIGN_OR_RETURN(json j, ParseJsonObject(line, where));
    FORGE_ASSIGN_OR_RETURN(McExample ex, ParseExample(j, where));
    ex.line = n;
    out.push_back(std::move(ex));
  }
  if (out.empty()) return Status::Invalid(path + ": no examples");
  return out;
}

StatusOr<McSequence> McTokens(Tokenizer* tok, const std::string& context, const std::string& ending,
                              int max_len) {
  // lm-eval: trailing spaces of the context move to the continuation.
  std::string ctx = context, cont = " " + ending;
  while (!ctx.empty() && ctx.back() == ' ') {
    ctx.pop_back();
    cont.insert(cont.begin(), ' ');
  }
  const std::vector<int32_t> ctx_ids = tok->Encode(ctx);
  const std::vector<int32_t> whole = tok->Encode(ctx + cont);
  const size_t split = std::min(ctx_ids.size(), whole.size());
  if (whole.size() == split) return Status::Invalid("an ending encodes to no tokens: \"" + ending + "\"");
  McSequence s;
  const int32_t start = tok->bos_id() >= 0 ? tok->bos_id() : tok->eot_id();
  s.tokens.push_back(start);
  s.tokens.insert(s.tokens.end(), whole.begin(), whole.end());
  s.continuation_begin = 1 + split;
  if (int(s.tokens.size()) > max_len) {
    const size_t cut = s.tokens.size() - size_t(max_len);
    if (cut >= s.continuation_begin)
      return Status::Invalid("an ending of " + std::to_string(whole.size() - split) +
                             " tokens does not fit the model's context of " + std::to_string(max_len));
    s.tokens.erase(s.tokens.begin(), s.tokens.begin() + cut);
    s.continuation_begin -= cut;
  }
  return s;
}

double ContinuationLogLikelihood(const float* logits, int64_t stride, int vocab,
                                 const std::vector<int32_t>& tokens, size_t begin) {
  double total = 0.0;
  for (size_t c = std::max<size_t>(begin, 1); c < tokens.size(); ++c) {
    const float* row = logits + int64_t(c - 1) * stride;
    double mx = row[0];
    for (int v = 1; v < vocab; ++v) mx = std::max(mx, double(row[v]));
    double sum = 0.0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
    total += double(row[tokens[c]]) - mx - std::log(sum);
  }
  return total;
}

StatusOr<McResult> ScoreMcTasks(DecodeBackend* backend, Tokenizer* tok,
                                const std::vector<McExample>& examples, int max_tokens_per_call) {
  const ModelConfig& m = backend->model();
  struct Item {
    size_t example, ending;
    McSequence seq;
  };
  std::vector<Item> items;
  McResult r;
  r.scores.resize(examples.size());
  for (size_t e = 0; e < examples.size(); ++e) {
    const McExample& ex = examples[e];
    r.scores[e].loglik.assign(ex.endings.size(), 0.0);
    for (size_t k = 0; k < ex.endings.size(); ++k) {
      auto seq = McTokens(tok, ex.context, ex.endings[k], m.seq_len);
      if (!seq.ok()) return seq.status().Annotate("example at line " + std::to_string(ex.line));
      for (int32_t t : seq->tokens)
        if (t >= m.vocab)
          return Status::Invalid("example at line " + std::to_string(ex.line) + ": token " +
                                 std::to_string(t) + " is outside the model's vocabulary of " +
                                 std::to_string(m.vocab) + " (another tokenizer's model?)");
      r.scores[e].ending_bytes.push_back(int64_t(ex.endings[k].size()));
      r.scores[e].ending_tokens.push_back(int(seq->tokens.size() - seq->continuation_begin));
      items.push_back({e, k, std::move(*seq)});
    }
  }
  // Calls of whole sequences, up to max_tokens_per_call tokens (at least one sequence).
  std::vector<float> logits;
  const int64_t stride = m.padded_vocab();
  for (size_t first = 0; first < items.size();) {
    size_t last = first;
    int64_t tokens = 0;
    while (last < items.size() &&
           (last == first || tokens + int64_t(items[last].seq.tokens.size()) <= max_tokens_per_call)) {
      tokens += int64_t(items[last].seq.tokens.size());
      ++last;
    }
    FORGE_RETURN_IF_ERROR(backend->Reset(int(last - first), m.seq_len));
    std::vector<int> seqs;
    std::vector<std::vector<int32_t>> toks;
    for (size_t i = first; i < last; ++i) {
      seqs.push_back(int(i - first));
      toks.push_back(items[i].seq.tokens);
    }
    FORGE_RETURN_IF_ERROR(backend->Append(seqs, toks, /*all_positions=*/true, &logits));
    int64_t row = 0;
    for (size_t i = first; i < last; ++i) {
      const Item& it = items[i];
      r.scores[it.example].loglik[it.ending] = ContinuationLogLikelihood(
          logits.data() + row * stride, stride, m.vocab, it.seq.tokens, it.seq.continuation_begin);
      row += int64_t(it.seq.tokens.size());
    }
    first = last;
  }
  int64_t right = 0, right_norm = 0;
  double chance = 0.0;
  for (size_t e = 0; e < examples.size(); ++e) {
    McScore& s = r.scores[e];
    for (size_t k = 1; k < s.loglik.size(); ++k) {
      if (s.loglik[k] > s.loglik[s.pred]) s.pred = int(k);
      const double a = s.loglik[k] / double(std::max<int64_t>(1, s.ending_bytes[k]));
      const double b = s.loglik[s.pred_norm] / double(std::max<int64_t>(1, s.ending_bytes[s.pred_norm]));
      if (a > b) s.pred_norm = int(k);
    }
    right += s.pred == examples[e].label;
    right_norm += s.pred_norm == examples[e].label;
    chance += 1.0 / double(s.loglik.size());
  }
  r.examples = int64_t(examples.size());
  r.acc = double(right) / double(r.examples);
  r.acc_norm = double(right_norm) / double(r.examples);
  r.chance = chance / double(r.examples);
  return r;
}

}  // namespace forge
