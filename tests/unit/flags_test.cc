#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/closest_match.h"
#include "common/flags.h"

namespace forge {
namespace {

// argv from a list of words (the parser keeps pointers only while parsing).
struct Argv {
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> words;
  std::vector<char*> ptrs;
};

FlagParser TrainFlags() {
  FlagParser f("forge train", "CONFIG", "Trains a model.");
  f.Value("--steps", "N", "optimizer steps");
  f.Bool("--direct", "no coordinator");
  f.List("--input", "PATH...", "inputs");
  f.Value("--out", "DIR", "output");
  f.Alias("-o", "--out");
  f.MaxPositional(1);
  return f;
}

TEST(FlagsTest, ParsesValuesBoolsListsAndPositionals) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "c.yaml", "--steps", "10", "--direct", "--input", "a", "b*",
          "--input=c", "-o", "x"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  EXPECT_EQ(f.positional(), std::vector<std::string>{"c.yaml"});
  int64_t steps = 0;
  ASSERT_TRUE(f.GetInt("--steps", &steps).ok());
  EXPECT_EQ(steps, 10);
  EXPECT_TRUE(f.Has("--direct"));
  EXPECT_EQ(f.GetAll("--input"), (std::vector<std::string>{"a", "b*", "c"}));
  EXPECT_EQ(f.Get("--out"), "x");
}

TEST(FlagsTest, UnknownFlagNamesItAndTheClosestKnownOne) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "c.yaml", "--stpes", "10"});
  const Status s = f.Parse(a.argc(), a.argv(), 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "unknown flag --stpes (did you mean --steps?)");
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--bogus", "1"});
  EXPECT_EQ(g.Parse(b.argc(), b.argv(), 2).message(), "unknown flag --bogus");
}

TEST(FlagsTest, MalformedValuesNameTheFlag) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "--steps", "ten"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  int64_t steps = 0;
  EXPECT_EQ(f.GetInt("--steps", &steps).message(), "--steps: expects an integer, got 'ten'");
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--steps"});
  EXPECT_EQ(g.Parse(b.argc(), b.argv(), 2).message(), "--steps: expects N");
  FlagParser h = TrainFlags();
  Argv c({"forge", "train", "a.yaml", "b.yaml"});
  EXPECT_FALSE(h.Parse(c.argc(), c.argv(), 2).ok());
}

TEST(FlagsTest, HelpAndVersionExitZero) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "--help"});
  int rc = -1;
  testing::internal::CaptureStdout();
  EXPECT_TRUE(f.ParseOrExit(a.argc(), a.argv(), 2, &rc));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("usage: forge train CONFIG [flags]"), std::string::npos);
  EXPECT_NE(out.find("-o, --out DIR"), std::string::npos);
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--version"});
  testing::internal::CaptureStdout();
  EXPECT_TRUE(g.ParseOrExit(b.argc(), b.argv(), 2, &rc));
  EXPECT_EQ(testing::internal::GetCapturedStdout().rfind("forge train ", 0), 0u);
  EXPECT_EQ(rc, 0);
}

TEST(FlagsTest, ClosestMatch) {
  EXPECT_EQ(ClosestMatch("--chekpoint", {"--checkpoint", "--config"}), "--checkpoint");
  EXPECT_EQ(ClosestMatch("--zzzzzz", {"--checkpoint", "--config"}), "");
}

}  // namespace
}  // namespace forge
