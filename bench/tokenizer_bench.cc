// forge-tokenizer-bench: encoding throughput of Forge's tokenizers on a text file, one JSON
// line per (tokenizer, thread count), for comparison with bench/tiktoken_bench.py (Python's
// native tiktoken) on the same documents.
//
//   forge-tokenizer-bench --tokenizer cl100k_base,o200k_base --input FILE --threads 1,16
//
// Documents: the file's lines grouped in order until each holds at least --doc-bytes bytes
// (the last may hold fewer), exactly as tiktoken_bench.py groups them. Each run gives every
// thread a fresh Clone() (cold piece cache) and hands documents out dynamically; the best of
// --repeat runs is reported. Loading is not timed.
#include <time.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/flags.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"

namespace forge {
namespace {

// CPU time of the whole process (all threads): on a shared machine the honest denominator.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// $FORGE_DATA_DIR, else the nearest .forge-data from the working directory up.
std::string DataDir() {
  if (const char* env = std::getenv("FORGE_DATA_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  for (std::filesystem::path p = std::filesystem::current_path(ec); !ec && !p.empty(); p = p.parent_path()) {
    if (std::filesystem::is_directory(p / ".forge-data", ec)) return (p / ".forge-data").string();
    if (p == p.parent_path()) break;
  }
  return ".forge-data";
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> Documents(const std::string& text, size_t doc_bytes) {
  std::vector<std::string> docs;
  std::string cur;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    eol = eol == std::string::npos ? text.size() : eol + 1;
    cur.append(text, pos, eol - pos);
    pos = eol;
    if (cur.size() >= doc_bytes) docs.push_back(std::move(cur)), cur.clear();
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

int Main(int argc, char** argv) {
  FlagParser flags("forge-tokenizer-bench", "", "Encoding throughput of Forge's tokenizers (JSON lines).");
  flags.Value("--tokenizer", "LIST", "comma-separated names or paths (default cl100k_base)");
  flags.Value("--input", "FILE", "UTF-8 text (ill-formed bytes are replaced first)");
  flags.Value("--threads", "LIST", "comma-separated thread counts (default 1,<hardware threads>)");
  flags.Value("--doc-bytes", "N", "group lines into documents of at least N bytes (default 4096)");
  flags.Value("--repeat", "N", "runs per configuration; the fastest is reported (default 3)");
  flags.Value("--data-dir", "DIR", "where named tokenizers live (default $FORGE_DATA_DIR)");
  if (int rc; flags.ParseOrExit(argc, argv, 1, &rc)) return rc;
  const char* prog = "forge-tokenizer-bench";
  int64_t doc_bytes = 4096, repeat = 3;
  if (Status s = flags.GetInt("--doc-bytes", &doc_bytes); !s.ok()) return bench::FailJson(prog, s.ToString());
  if (Status s = flags.GetInt("--repeat", &repeat); !s.ok()) return bench::FailJson(prog, s.ToString());
  if (!flags.Has("--input")) return bench::FailJson(prog, "--input FILE is required");
  std::ifstream in(flags.Get("--input"), std::ios::binary);
  if (!in) return bench::FailJson(prog, flags.Get("--input") + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<std::string> docs = Documents(SanitizeUtf8(ss.str()), static_cast<size_t>(doc_bytes));
  int64_t bytes = 0;
  for (const std::string& d : docs) bytes += static_cast<int64_t>(d.size());

  std::vector<int> threads;
  const std::string default_threads = "1," + std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  for (const std::string& t : SplitList(flags.Get("--threads", default_threads))) {
    int n = 0;
    if (!bench::ParseInt(t.c_str(), &n) || n < 1) return bench::FailJson(prog, "--threads: bad count '" + t + "'");
    threads.push_back(n);
  }
  std::string data_dir = flags.Get("--data-dir", DataDir());

  for (const std::string& spec : SplitList(flags.Get("--tokenizer", "cl100k_base"))) {
    auto tok = LoadTokenizer(spec, data_dir);
    if (!tok.ok()) return bench::FailJson(prog, tok.status().ToString());
    for (int nt : threads) {
      double best = 1e30, best_cpu = 1e30;
      int64_t tokens = 0;
      for (int64_t r = 0; r < repeat; ++r) {
        std::vector<std::unique_ptr<Tokenizer>> clones;
        for (int t = 0; t < nt; ++t) clones.push_back((*tok)->Clone());
        std::atomic<size_t> next{0};
        std::atomic<int64_t> count{0};
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = CpuSeconds();
        auto work = [&](Tokenizer* t) {
          std::vector<int32_t> ids;
          int64_t n = 0;
          for (size_t i = next++; i < docs.size(); i = next++) {
            ids.clear();
            t->EncodeOrdinary(docs[i], &ids);
            n += static_cast<int64_t>(ids.size());
          }
          count += n;
        };
        std::vector<std::thread> pool;
        for (int t = 1; t < nt; ++t) pool.emplace_back(work, clones[t].get());
        work(clones[0].get());
        for (std::thread& th : pool) th.join();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        best_cpu = std::min(best_cpu, CpuSeconds() - c0);
        tokens = count;
      }
      nlohmann::ordered_json j;
      j["impl"] = "forge";
      j["tokenizer"] = (*tok)->name();
      j["threads"] = nt;
      j["documents"] = docs.size();
      j["bytes"] = bytes;
      j["tokens"] = tokens;
      j["seconds"] = best;
      j["cpu_seconds"] = best_cpu;
      j["mb_per_s"] = bytes / 1e6 / best;
      j["tokens_per_s"] = tokens / best;
      j["tokens_per_s_per_thread"] = tokens / best / nt;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Main(argc, argv); }
