// Data mixtures: the Feistel epoch order is a permutation (exhaustively for small sizes) and fast
// at 10^9 sequences; the weighted apportionment is deterministic, house-monotone, agrees with a
// replay of its own draws and converges to the weights; a TrainMixture draws the same sequences
// into the same global positions for every world size, counts epochs per source, equals the
// plain single-dataset sampler bitwise with one source, and refuses sources of different
// tokenizers; data plans survive a resume and are rebased when the weights change.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "worker/data/data_plan.h"
#include "worker/data/dataset.h"
#include "worker/data/mixture.h"
#include "worker/data/permutation.h"
#include "worker/data/sampler.h"
#include "worker/data/train_mixture.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::string TestDir() {
  return ::testing::TempDir() + "/forge_mixture_test_" + std::to_string(::getpid());
}

struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(TestDir()); }
};
[[maybe_unused]] ::testing::Environment* const kCleanUp =
    ::testing::AddGlobalTestEnvironment(new CleanUp);

// A dataset whose train token i is first + i, so a row reveals its source and sequence.
std::string CountingSource(const std::string& name, int32_t first, int train_tokens,
                           const std::string& tokenizer = "gpt2-bpe") {
  const std::string dir = TestDir() + "/" + name;
  if (fs::exists(dir / fs::path("manifest.json"))) return dir;
  fs::create_directories(dir);
  DatasetManifest m;
  m.tokenizer = tokenizer;
  m.vocab_size = 65536;
  m.eot_token = 0;
  const int sizes[2] = {train_tokens, 100};
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> t(static_cast<size_t>(sizes[s]));
    for (int i = 0; i < sizes[s]; ++i) t[size_t(i)] = (s == 0 ? first : 60000) + i;
    const std::string file = s == 0 ? "train.tok" : "val.tok";
    auto info = WriteShard(dir + "/" + file, t, TokenDtype::kUint16);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    m.splits[s].shards.push_back({file, sizes[s], info->crc32c});
    m.splits[s].tokens = sizes[s];
  }
  EXPECT_TRUE(WriteDatasetManifest(dir, m).ok());
  return dir;
}

// ---------------------------------------------------------------------------------------
// Feistel permutation

TEST(DataMixtureTest, FeistelIsAPermutationForSmallSizes) {
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 97, 127, 128, 1000, 1024, 4093, 4096,
                    65521, 65536}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}}) {
      for (int64_t epoch : {0, 5}) {
        const FeistelPermutation p(n, seed, epoch);
        std::vector<char> seen(static_cast<size_t>(n), 0);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t y = p(i);
          ASSERT_GE(y, 0) << n;
          ASSERT_LT(y, n) << n;
          ASSERT_FALSE(seen[size_t(y)]) << "n " << n << ": " << y << " hit twice";
          seen[size_t(y)] = 1;
        }
      }
    }
  }
  // Keyed: another epoch or seed gives another order.
  std::vector<int64_t> a, b, c;
  const FeistelPermutation pa(1000, 7, 0), pb(1000, 7, 1), pc(1000, 8, 0);
  for (int64_t i = 0; i < 1000; ++i) {
    a.push_back(pa(i));
    b.push_back(pb(i));
    c.push_back(pc(i));
  }
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  // Not the identity nor a near-identity: few fixed points.
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += a[size_t(i)] == i;
  EXPECT_LT(fixed, 20);
}

TEST(DataMixtureTest, FeistelLookupsAtABillionSequencesAreFast) {
  const int64_t n = 1'000'000'007;  // a prime just above 2^29.9
  const FeistelPermutation p(n, 1234, 3);
  const int lookups = 1000000;
  std::vector<int64_t> out(static_cast<size_t>(lookups));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < lookups; ++i) out[size_t(i)] = p(int64_t(i) * 997 + 17);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ %d Feistel lookups at S = %ld: %.1f ns each ]\n", lookups, long(n),
              s / lookups * 1e9);
  EXPECT_LT(s, 2.0);  // ~30 ns each on an idle core; generous for a loaded CI machine
  for (int64_t y : out) {
    ASSERT_GE(y, 0);
    ASSERT_LT(y, n);
  }
  std::vector<int64_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end())
      << "distinct inputs gave equal outputs";
  // Spread: the outputs fill [0, n) roughly evenly (each tenth holds ~10%).
  std::vector<int> tenths(10, 0);
  for (int64_t y : out) ++tenths[size_t(y / (n / 10 + 1))];
  for (int t : tenths) EXPECT_NEAR(t, lookups / 10, lookups / 100);
}

TEST(DataMixtureTest, SamplingPlanUsesTheTableUpToTheThresholdAndFeistelAbove) {
  const int64_t T = 4;
  const int64_t small = 1000, large = kShuffleTableMaxSequences + 3;
  const SamplingPlan a(small * T + 1, T, 9, true);
  const std::vector<uint32_t> table = EpochPermutation(small, 9, 1);
  for (int64_t i = 0; i < small; i += 7) EXPECT_EQ(a.SequenceAt(small + i), table[size_t(i)]);
  const SamplingPlan b(large * T + 1, T, 9, true);
  ASSERT_EQ(b.num_sequences(), large);
  const FeistelPermutation f(large, 9, 2);
  for (int64_t i = 0; i < large; i += large / 97) EXPECT_EQ(b.SequenceAt(2 * large + i), f(i));
  // Source streams: stream 0 is the seed's own order, others differ.
  const SamplingPlan s1(small * T + 1, T, 9, true, 1);
  int same = 0;
  for (int64_t i = 0; i < small; ++i) same += s1.SequenceAt(i) == a.SequenceAt(i);
  EXPECT_LT(same, 20);
}

// ---------------------------------------------------------------------------------------
// Weighted apportionment

std::vector<double> Normalised(const std::vector<double>& w) {
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<double> out;
  for (double x : w) out.push_back(x / sum);
  return out;
}

TEST(DataMixtureTest, CountsAgreeWithAReplayAndTrackTheWeightsAtEveryPosition) {
  const std::vector<std::vector<double>> cases = {
      {1, 1}, {0.7, 0.3}, {0.5, 0.3, 0.2}, {0.01, 0.99}, {3, 1, 1, 1, 1}, {2}};
  for (const auto& w : cases) {
    auto m = MixtureSchedule::Make(w, 77);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const std::vector<double> share = Normalised(w);
    const int64_t N = 3000;
    const auto draws = m->DrawsFrom(0, N);
    std::vector<int64_t> replay(w.size(), 0);
    for (int64_t p = 0; p <= N; ++p) {
      if (p % 97 == 0 || p == N) {
        ASSERT_EQ(m->CountsBefore(p), replay) << "position " << p;
        for (size_t s = 0; s < w.size(); ++s)
          EXPECT_LE(std::fabs(double(replay[s]) - double(p) * share[s]), 2.0)
              << "source " << s << " at position " << p;
      }
      if (p == N) break;
      const auto& d = draws[size_t(p)];
      ASSERT_EQ(d.index, replay[size_t(d.source)]);  // each source's own cursor
      ++replay[size_t(d.source)];
    }
    // Far out, without replaying: the proportions still hold, and DrawsFrom there continues
    // the counts.
    for (int64_t p : {int64_t{1} << 20, int64_t{123456789012}, int64_t{1} << 45}) {
      const std::vector<int64_t> c = m->CountsBefore(p);
      int64_t sum = 0;
      for (size_t s = 0; s < w.size(); ++s) {
        sum += c[s];
        EXPECT_LE(std::fabs(double(c[s]) - double(p) * share[s]),
                  // + the weights' resolution: each share is q_s / Q, q_s rounded to 2^-24
                  2.0 + double(p) * std::ldexp(8.0, -MixtureSchedule::kWeightBits))
            << "source " << s << " at " << p;
      }
      EXPECT_EQ(sum, p);
      const auto next = m->DrawsFrom(p, 64);
      std::vector<int64_t> cc = c;
      for (const auto& d : next) EXPECT_EQ(d.index, cc[size_t(d.source)]++);
      EXPECT_EQ(m->CountsBefore(p + 64), cc);
    }
  }
}

TEST(DataMixtureTest, TheDrawIsDeterministicAndEveryBatchIsMixed) {
  auto a = MixtureSchedule::Make({0.6, 0.4}, 5);
  auto b = MixtureSchedule::Make({0.6, 0.4}, 5);
  auto c = MixtureSchedule::Make({0.6, 0.4}, 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<int> sa, sb, sc;
  for (const auto& d : a->DrawsFrom(1000, 500)) sa.push_back(d.source);
  for (const auto& d : b->DrawsFrom(1000, 500)) sb.push_back(d.source);
  for (const auto& d : c->DrawsFrom(1000, 500)) sc.push_back(d.source);
  EXPECT_EQ(sa, sb);
  // Each global batch of 10 takes 6 and 4, give or take one, whatever the seed's phases.
  for (const auto* s : {&sa, &sc}) {
    for (size_t g = 0; g + 10 <= s->size(); g += 10) {
      const int from0 = int(std::count(s->begin() + long(g), s->begin() + long(g + 10), 0));
      EXPECT_GE(from0, 5);
      EXPECT_LE(from0, 7);
    }
  }
  EXPECT_FALSE(MixtureSchedule::Make({}, 1).ok());
  EXPECT_FALSE(MixtureSchedule::Make({1, 0}, 1).ok());
  EXPECT_FALSE(MixtureSchedule::Make({1, -2}, 1).ok());
}

// ---------------------------------------------------------------------------------------
// TrainMixture over real shards

struct Row {
  int source;
  int64_t sequence;
  bool operator<(const Row& o) const {
    return source != o.source ? source < o.source : sequence < o.sequence;
  }
  bool operator==(const Row& o) const { return source == o.source && sequence == o.sequence; }
};

// Source A's train tokens start at 0, B's at 20000: a row's first token says which.
std::vector<Row> Rows(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int b,
                      int64_t T) {
  std::vector<Row> rows;
  for (int j = 0; j < b; ++j) {
    const int32_t* x = in.data() + j * T;
    const int32_t* y = tg.data() + j * T;
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(x[t], x[0] + t);
      EXPECT_EQ(y[t], x[t] + 1);
    }
    const int source = x[0] >= 20000 ? 1 : 0;
    const int32_t rel = x[0] - (source ? 20000 : 0);
    EXPECT_EQ(rel % T, 0);
    rows.push_back({source, rel / T});
  }
  return rows;
}

TEST(DataMixtureTest, RankSlicesOfAMixtureAreTheSameForEveryWorldSize) {
  const int64_t T = 16;
  const std::string a = CountingSource("a", 0, 4001), b = CountingSource("b", 20000, 801);
  auto mix = TrainMixture::Open({{a, 0.75}, {b, 0.25}}, T, 3, true);
  ASSERT_TRUE(mix.ok()) << mix.status().ToString();
  const int64_t G = 16;
  const int mb = 2;
  for (int64_t cursor : {int64_t{0}, int64_t{48}, int64_t{480}}) {
    std::vector<Row> reference;  // by global position, from world 1
    for (int W : {1, 2, 4, 8}) {
      const int A = int(G / (W * mb));
      std::vector<Row> by_position(size_t(G), Row{-1, -1});
      for (int r = 0; r < W; ++r) {
        for (int k = 0; k < A; ++k) {
          std::vector<int32_t> in(size_t(mb * T)), tg(in.size());
          ASSERT_TRUE(mix->FillTrainBatch(cursor, r, W, mb, k, in.data(), tg.data()).ok());
          const auto rows = Rows(in, tg, mb, T);
          for (int j = 0; j < mb; ++j)
            by_position[size_t(SliceStart(0, r, W, mb, k) + j)] = rows[size_t(j)];
        }
      }
      if (W == 1)
        reference = by_position;
      else
        EXPECT_EQ(by_position, reference) << "world " << W << " cursor " << cursor;
    }
    int from_b = 0;
    for (const Row& r : reference) from_b += r.source;
    EXPECT_GE(from_b, 3);  // 16 * 0.25, give or take one
    EXPECT_LE(from_b, 5);
  }
}

TEST(DataMixtureTest, EachSourceCountsItsOwnEpochs) {
  const int64_t T = 16;
  const std::string a = CountingSource("a", 0, 4001), b = CountingSource("b", 20000, 801);
  // A: 250 sequences, B: 50. Equal weights: B wraps every ~100 positions, A every ~500.
  auto mix = TrainMixture::Open({{a, 1.0}, {b, 1.0}}, T, 11, true);
  ASSERT_TRUE(mix.ok()) << mix.status().ToString();
  const int64_t positions = 1000;
  std::map<int64_t, std::multiset<int64_t>> b_epochs;  // epoch -> B sequences seen
  std::multiset<int64_t> a_first_epoch;
  int64_t a_seen = 0, b_seen = 0;
  for (int64_t c = 0; c < positions; c += 10) {
    std::vector<int32_t> in(size_t(10 * T)), tg(in.size());
    ASSERT_TRUE(mix->FillTrainBatch(c, 0, 1, 10, 0, in.data(), tg.data()).ok());
    for (const Row& r : Rows(in, tg, 10, T)) {
      if (r.source == 1) b_epochs[b_seen++ / 50].insert(r.sequence);
      else if (a_seen++ < 250) a_first_epoch.insert(r.sequence);
    }
  }
  EXPECT_EQ(a_seen + b_seen, positions);
  ASSERT_GE(b_epochs.size(), 9u);
  for (const auto& [epoch, seqs] : b_epochs) {
    if (seqs.size() < 50) continue;  // the epoch in progress
    EXPECT_EQ(std::set<int64_t>(seqs.begin(), seqs.end()).size(), 50u) << "B epoch " << epoch;
  }
  EXPECT_EQ(std::set<int64_t>(a_first_epoch.begin(), a_first_epoch.end()).size(), 250u);
  const DataUsage u = mix->UsageAt(positions);
  ASSERT_EQ(u.sources.size(), 2u);
  EXPECT_EQ(u.sources[0].sequences, a_seen);
  EXPECT_EQ(u.sources[1].sequences, b_seen);
  EXPECT_EQ(u.sources[0].epoch, a_seen / 250);
  EXPECT_EQ(u.sources[1].epoch, b_seen / 50);
  EXPECT_EQ(u.sources[1].epoch_sequences, 50);
  EXPECT_EQ(u.sources[1].tokens, b_seen * T);
  EXPECT_EQ(u.sources[0].sequences + u.sources[1].sequences, positions);
}

TEST(DataMixtureTest, OneSourceIsThePlainSamplerBitwise) {
  const int64_t T = 16;
  const std::string a = CountingSource("a", 0, 4001);
  auto mix = TrainMixture::Open({{a, 2.5}}, T, 99, true);
  ASSERT_TRUE(mix.ok()) << mix.status().ToString();
  auto ds = TokenDataset::Open(a);
  ASSERT_TRUE(ds.ok());
  const SamplingPlan plan(ds->split(Split::kTrain).size(), T, 99, true);
  for (int64_t cursor : {int64_t{0}, int64_t{240}, int64_t{12345}}) {
    for (int W : {1, 2}) {
      for (int r = 0; r < W; ++r) {
        std::vector<int32_t> in1(size_t(4 * T)), tg1(in1.size()), in2(in1.size()), tg2(in1.size());
        ASSERT_TRUE(mix->FillTrainBatch(cursor, r, W, 4, 1, in1.data(), tg1.data()).ok());
        ASSERT_TRUE(FillTrainBatch(ds->split(Split::kTrain), plan, cursor, r, W, 4, 1, in2.data(),
                                   tg2.data())
                        .ok());
        EXPECT_EQ(in1, in2);
        EXPECT_EQ(tg1, tg2);
      }
    }
  }
  EXPECT_EQ(mix->UsageAt(480).sources[0].sequences, 480);
}

TEST(DataMixtureTest, SourcesOfAnotherTokenizerAreRefused) {
  const std::string a = CountingSource("a", 0, 4001);
  const std::string c = CountingSource("c", 0, 4001, "cl100k_base");
  auto mix = TrainMixture::Open({{a, 1}, {c, 1}}, 16, 1, true);
  ASSERT_FALSE(mix.ok());
  EXPECT_NE(mix.status().message().find(a), std::string::npos) << mix.status().ToString();
  EXPECT_NE(mix.status().message().find(c), std::string::npos) << mix.status().ToString();
  EXPECT_NE(mix.status().message().find("tokenizer"), std::string::npos);
  auto missing = TrainMixture::Open({{a, 1}, {TestDir() + "/none", 1}}, 16, 1, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(TestDir() + "/none"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Data plans across a resume

TEST(DataMixtureTest, PlansContinueOrRebaseAtAResume) {
  const int64_t T = 16;
  const std::string a = CountingSource("a", 0, 4001), b = CountingSource("b", 20000, 801);
  auto mix = TrainMixture::Open({{a, 0.5}, {b, 0.5}}, T, 4, true);
  ASSERT_TRUE(mix.ok());
  const DataUsage saved = mix->UsageAt(100);
  auto back = DecodeDataUsage(EncodeDataUsage(saved), "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EncodeDataUsage(*back), EncodeDataUsage(saved));

  // Same sources and weights: the saved plan goes on.
  std::vector<std::string> notes;
  auto same = PlanForResume({{a, 0.5}, {b, 0.5}}, &saved, 100, &notes);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, PlanOf(saved));
  EXPECT_TRUE(notes.empty());
  EXPECT_FALSE(PlanForResume({{a, 0.5}, {b, 0.5}}, &saved, 99, &notes).ok());

  // New weights and a new source: rebased at 100; a and b continue where they were.
  const std::string d = CountingSource("d", 30000, 801);
  auto rebased = PlanForResume({{b, 0.2}, {a, 0.6}, {d, 0.2}}, &saved, 100, &notes);
  ASSERT_TRUE(rebased.ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(rebased->origin, 100);
  ASSERT_EQ(rebased->sources.size(), 3u);
  EXPECT_EQ(rebased->sources[0].stream, 1);
  EXPECT_EQ(rebased->sources[0].base, saved.sources[1].sequences);
  EXPECT_EQ(rebased->sources[1].stream, 0);
  EXPECT_EQ(rebased->sources[1].base, saved.sources[0].sequences);
  EXPECT_EQ(rebased->sources[2].stream, 2);
  EXPECT_EQ(rebased->sources[2].base, 0);
  auto next = TrainMixture::Open({{b, 0.2}, {a, 0.6}, {d, 0.2}}, T, 4, true);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(next->SetPlan(*rebased).ok());
  EXPECT_FALSE(next->FillTrainBatch(99, 0, 1, 2, 0, nullptr, nullptr).ok());  // before origin
  const DataUsage later = next->UsageAt(200);
  EXPECT_EQ(later.sources[0].sequences + later.sources[1].sequences + later.sources[2].sequences,
            saved.sources[0].sequences + saved.sources[1].sequences + 100);
  // Source a (stream 0) continues its own order: its next sequence after the resume is the one
  // the old plan would have given next.
  std::vector<int32_t> in(size_t(100 * T)), tg(in.size());
  ASSERT_TRUE(next->FillTrainBatch(100, 0, 1, 100, 0, in.data(), tg.data()).ok());
  const SamplingPlan order_a(4001, T, 4, true, 0);
  for (const Row& r : Rows(in, tg, 100, T)) {
    if (r.source != 0 || r.sequence >= 250) continue;  // b and d share the high token range
    EXPECT_EQ(r.sequence, order_a.SequenceAt(saved.sources[0].sequences));
    break;
  }
}

// ---------------------------------------------------------------------------------------
// Config

TEST(DataMixtureTest, ConfigReadsValidatesAndRoundTripsSources) {
  const std::string base = "model: {preset: tiny}\n";
  RunConfig c = test::ParseOk(base +
                              "data:\n  sources:\n    - {dir: /d/web, weight: 0.7}\n"
                              "    - dir: /d/code\n      weight: 0.3\n");
  ASSERT_EQ(c.data.sources.size(), 2u);
  EXPECT_EQ(c.data.sources[0].dir, "/d/web");
  EXPECT_EQ(c.data.sources[1].weight, 0.3);
  const std::string yaml = RunConfigToYaml(c);
  RunConfig back = test::ParseOk(yaml);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
  ASSERT_EQ(back.data.sources.size(), 2u);
  EXPECT_EQ(back.data.sources[1].dir, "/d/code");
  EXPECT_EQ(back.data.sources[0].weight, 0.7);

  EXPECT_TRUE(test::FailsWith(base + "data:\n  dataset_dir: /x\n  sources: [{dir: /y, weight: 1}]\n",
                              4, "data.sources", "data.dataset_dir and data.sources are both given"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources: [{dir: /y, weight: 0}]\n", 3,
                              "data.sources[0].weight", "must be a finite number > 0, got 0"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources:\n    - {dir: /y, weight: 1}\n"
                                     "    - {dir: '', weight: 1}\n",
                              5, "data.sources[1].dir", "must not be empty"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources:\n    - {dir: /y, weight: 1}\n"
                                     "    - {dir: /y, weight: 2}\n",
                              5, "data.sources[1].dir", "names the same dataset"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources:\n    - {dir: /y}\n", 4,
                              "data.sources[0].weight", "is required"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources:\n    - {dir: /y, weight: 1, w: 2}\n", 4,
                              "data.sources[0].w", "unknown key"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources: []\n", 3, "data.sources",
                              "must be a non-empty list"));
  EXPECT_TRUE(test::FailsWith(base + "data:\n  sources: [{dir: /y, weight: heavy}]\n", 3,
                              "data.sources[0].weight", "must be a number"));
}

}  // namespace
}  // namespace forge
