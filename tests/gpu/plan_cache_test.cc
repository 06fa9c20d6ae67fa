// PlanCache (no GPU needed; lives with the CUDA kernels, hence in this suite): location from
// the environment, Get/Put/PutIfAbsent round trips, the file format, corrupt files as errors
// naming the file, and concurrent writers that lose no entries while readers never see a
// partial file.
#include "kernels/cuda/plan_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace forge::cuda {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for the scope, restoring the old value (or absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

class PlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("forge_plan_cache_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path() const { return (dir_ / "sub" / "plans.json").string(); }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path dir_;
};

TEST_F(PlanCacheTest, LocationFromEnvironment) {
  {
    ScopedEnv cache("FORGE_PLAN_CACHE", "off");
    EXPECT_FALSE(PlanCache::FromEnv().enabled());
  }
  {
    ScopedEnv cache("FORGE_PLAN_CACHE", "/tmp/x/plans.json");
    EXPECT_EQ(PlanCache::FromEnv().path(), "/tmp/x/plans.json");
  }
  {
    ScopedEnv cache("FORGE_PLAN_CACHE", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/var/cache/me");
    EXPECT_EQ(PlanCache::FromEnv().path(), "/var/cache/me/forge/plans.json");
  }
  {
    ScopedEnv cache("FORGE_PLAN_CACHE", "");
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(PlanCache::FromEnv().path(), "/home/someone/.cache/forge/plans.json");
  }
  {
    ScopedEnv cache("FORGE_PLAN_CACHE", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", nullptr);
    EXPECT_FALSE(PlanCache::FromEnv().enabled());
  }
}

TEST_F(PlanCacheTest, ProfilerAttachedFollowsTheToolsVariables) {
  const char* names[] = {"CUDA_INJECTION64_PATH", "NV_NSIGHT_INJECTION_TRANSPORT_TYPE",
                         "NV_COMPUTE_PROFILER_PERFWORKS_DIR",
                         "NV_SANITIZER_INJECTION_TRANSPORT_TYPE"};
  ScopedEnv a(names[0], nullptr), b(names[1], nullptr), c(names[2], nullptr), d(names[3], nullptr);
  EXPECT_FALSE(ProfilerAttached());
  for (const char* name : names) {
    SCOPED_TRACE(name);
    {
      ScopedEnv empty(name, "");
      EXPECT_FALSE(ProfilerAttached());
    }
    ScopedEnv set(name, "uds");
    EXPECT_TRUE(ProfilerAttached());
  }
  EXPECT_FALSE(ProfilerAttached());
}

TEST_F(PlanCacheTest, DisabledCacheRecordsNothing) {
  const PlanCache off;
  EXPECT_FALSE(off.enabled());
  const auto got = off.Get("k");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_FALSE(off.Put("k", "v").ok());
}

TEST_F(PlanCacheTest, RoundTripsAndWritesReadableJson) {
  const PlanCache cache(Path());
  auto missing = cache.Get("a");
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_FALSE(missing->has_value());  // no file yet

  ASSERT_TRUE(cache.Put("sdpa fwd B=16 | GPU | cudnn 91900", "engine=3 knobs=").ok());
  ASSERT_TRUE(cache.Put("b", "2").ok());
  ASSERT_TRUE(cache.Put("b", "3").ok());  // Put replaces
  auto a = PlanCache(Path()).Get("sdpa fwd B=16 | GPU | cudnn 91900");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ(**a, "engine=3 knobs=");
  EXPECT_EQ(*cache.Get("b").value(), "3");

  // PutIfAbsent keeps the first value and reports it.
  auto kept = cache.PutIfAbsent("b", "4");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "3");
  auto added = cache.PutIfAbsent("c", "5");
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(*added, "5");
  EXPECT_EQ(*cache.Get("c").value(), "5");

  const nlohmann::json j = nlohmann::json::parse(ReadFile(Path()));
  EXPECT_EQ(j["format"], "forge-plan-cache-v1");
  EXPECT_EQ(j["plans"]["b"], "3");
  EXPECT_EQ(j["plans"].size(), 3u);
  // Only the file and its lock remain: no temporary files left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(Path()).parent_path())) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "plans.json" || name == "plans.json.lock") << name;
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST_F(PlanCacheTest, CorruptFileIsAnErrorNamingIt) {
  fs::create_directories(fs::path(Path()).parent_path());
  for (const char* text : {"{not json", "[1, 2]", "{\"format\": \"other\", \"plans\": {}}",
                           "{\"format\": \"forge-plan-cache-v1\", \"plans\": {\"k\": 3}}"}) {
    std::ofstream(Path(), std::ios::trunc) << text;
    const PlanCache cache(Path());
    auto got = cache.Get("k");
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_NE(got.status().message().find(Path()), std::string::npos) << got.status().ToString();
    EXPECT_FALSE(cache.Put("k", "v").ok()) << "must not overwrite a file it cannot read";
    EXPECT_EQ(ReadFile(Path()), text);
  }
}

// Writers (threads: flock excludes separate opens in one process too) each add their own
// keys while a reader keeps reading: every key survives, and no read fails or sees a file
// that lacks a key its writer had already finished recording.
TEST_F(PlanCacheTest, ConcurrentWritersLoseNothingAndReadersSeeWholeFiles) {
  constexpr int kWriters = 6, kKeys = 15;
  const PlanCache cache(Path());
  ASSERT_TRUE(cache.Put("seed", "0").ok());
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      auto got = cache.Get("seed");
      if (!got.ok() || !got->has_value() || **got != "0") ++failures;
      ++reads;
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = "w" + std::to_string(w) + "k" + std::to_string(k);
        auto put = cache.PutIfAbsent(key, std::to_string(w * 100 + k));
        if (!put.ok()) ++failures;
      }
    });
  }
  for (std::thread& t : writers) t.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reads.load(), 0);
  for (int w = 0; w < kWriters; ++w) {
    for (int k = 0; k < kKeys; ++k) {
      auto got = cache.Get("w" + std::to_string(w) + "k" + std::to_string(k));
      ASSERT_TRUE(got.ok());
      ASSERT_TRUE(got->has_value()) << "lost w" << w << "k" << k;
      EXPECT_EQ(**got, std::to_string(w * 100 + k));
    }
  }
}

}  // namespace
}  // namespace forge::cuda
