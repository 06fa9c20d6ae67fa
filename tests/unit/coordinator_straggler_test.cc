// The coordinator's straggler watch (coordinator/straggler_watch.h): busy time (step time less
// the rank's own wait in collectives) against the median of the other ranks, persistence in
// both directions, repeated records ignored, and nothing when off.
#include "coordinator/straggler_watch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace forge::coord {
namespace {

// Every rank's wall time is the same (they wait for each other); rank `slow` waits less.
std::vector<StragglerChange> Round(StragglerWatch* w, int64_t step, int world, int slow,
                                   double slow_busy, double threshold = 1.5, int reports = 3) {
  const double normal_busy = 0.10, wall = std::max(slow_busy, normal_busy) + 0.01;
  std::vector<StragglerChange> all;
  for (int r = 0; r < world; ++r) {
    const double busy = r == slow ? slow_busy : normal_busy + 0.001 * r;
    for (StragglerChange& c : w->Report("run", r, step, wall, wall - busy, threshold, reports))
      all.push_back(std::move(c));
  }
  return all;
}

TEST(StragglerWatch, PersistentlySlowRankIsReportedThenRecovers) {
  StragglerWatch w;
  int64_t step = 0;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.10).empty());
  EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.30).empty());
  EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.30).empty());
  std::vector<StragglerChange> c = Round(&w, ++step, 4, 2, 0.30);  // the third in a row
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 2);
  EXPECT_TRUE(c[0].straggling);
  EXPECT_NE(c[0].message.find("straggler: rank 2 is straggling: busy 0.3000 s per step"),
            std::string::npos)
      << c[0].message;
  EXPECT_NE(c[0].message.find("the median of the other 3 rank(s) (0.1010 s), 3 step reports"),
            std::string::npos)
      << c[0].message;
  EXPECT_EQ(w.Straggling("run"), std::vector<int>{2});
  ASSERT_EQ(w.Warnings("run").size(), 1u);
  EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.30).empty());  // still straggling: no new change

  // Two good reports are not enough; the third clears it.
  EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.10).empty());
  EXPECT_TRUE(Round(&w, ++step, 4, 2, 0.10).empty());
  c = Round(&w, ++step, 4, 2, 0.10);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].straggling);
  EXPECT_NE(c[0].message.find("straggler recovered: rank 2"), std::string::npos) << c[0].message;
  EXPECT_TRUE(w.Straggling("run").empty());
  EXPECT_TRUE(w.Warnings("run").empty());
}

TEST(StragglerWatch, InterruptedSlownessAndSmallExcessAreNotStragglers) {
  StragglerWatch w;
  int64_t step = 0;
  for (int i = 0; i < 10; ++i)  // slow every other report: never 3 in a row
    EXPECT_TRUE(Round(&w, ++step, 2, 1, i % 2 ? 0.30 : 0.10).empty()) << i;
  // Below the threshold ratio.
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Round(&w, ++step, 2, 1, 0.14).empty()) << i;
  // Above the ratio but by less than a millisecond.
  StragglerWatch tiny;
  for (int64_t s = 1; s <= 10; ++s) {
    tiny.Report("run", 0, s, 0.0005, 0.0, 1.5, 3);
    EXPECT_TRUE(tiny.Report("run", 1, s, 0.0012, 0.0, 1.5, 3).empty());
  }
}

TEST(StragglerWatch, RepeatedRecordsOffAndForgetting) {
  StragglerWatch w;
  w.Report("run", 0, 5, 0.2, 0.1, 1.5, 2);  // busy 0.1
  EXPECT_TRUE(w.Report("run", 1, 5, 0.2, 0.0, 1.5, 2).empty());  // busy 0.2: slow once
  // The same record again (a final report repeats the latest) does not count twice.
  EXPECT_TRUE(w.Report("run", 1, 5, 0.2, 0.0, 1.5, 2).empty());
  EXPECT_EQ(w.Report("run", 1, 6, 0.2, 0.0, 1.5, 2).size(), 1u);
  w.ForgetRun("run");
  EXPECT_TRUE(w.Straggling("run").empty());
  // Off: nothing, whatever the numbers.
  StragglerWatch off;
  for (int64_t s = 1; s <= 10; ++s) {
    off.Report("run", 0, s, 1.0, 0.9, 0.0, 1);
    EXPECT_TRUE(off.Report("run", 1, s, 1.0, 0.0, 0.0, 1).empty());
  }
  EXPECT_TRUE(off.Straggling("run").empty());
  // One rank alone has nobody to be compared with.
  StragglerWatch alone;
  for (int64_t s = 1; s <= 10; ++s) EXPECT_TRUE(alone.Report("run", 0, s, 5.0, 0.0, 1.5, 1).empty());
}

}  // namespace
}  // namespace forge::coord
