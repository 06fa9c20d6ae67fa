// `forge data tokenize` as a user runs it: text -> ids in each format and back, the same ids
// as the library, and clear errors for bad ids and unknown tokenizers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer/tokenizer.h"
#include "../common/data_dir.h"
#include "mpi_launch.h"
#include "../common/run_command.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::DataDir;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs the command; returns its exit status and stdout+stderr in *out.
int RunCmd(const std::string& cmd, std::string* out) {
  test::CommandResult r = test::RunCommand(cmd);
  *out = std::move(r.out);
  return r.exit_code;
}

TEST(TokenizeCommandTest, EncodesDecodesAndExplainsErrors) {
  auto lib = LoadTokenizer("gpt2", DataDir());
  if (!lib.ok()) GTEST_SKIP() << "gpt2 not installed: " << lib.status().ToString();
  const fs::path dir = fs::path(::testing::TempDir()) / ("forge_tokenize_cmd_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string forge = "FORGE_DATA_DIR='" + DataDir() + "' " + test::Bin("forge") +
                            " data tokenize --tokenizer gpt2 ";
  const std::string text = "Grüße aus Köln! 東京 2024 — it's <|endoftext|> here.\n\xff bad byte\n";
  std::ofstream(dir / "in.txt", std::ios::binary) << text;
  std::string out;

  // u32 file, then back to text: the repaired input (U+FFFD for the bad byte).
  ASSERT_EQ(RunCmd(forge + "--input '" + (dir / "in.txt").string() + "' --format u32 --out '" +
                    (dir / "ids.bin").string() + "'", &out), 0) << out;
  const std::string raw = ReadFile(dir / "ids.bin");
  std::vector<int32_t> ids(raw.size() / 4);
  std::memcpy(ids.data(), raw.data(), raw.size());
  std::string repaired = text;
  repaired.replace(repaired.find('\xff'), 1, "\xEF\xBF\xBD");
  EXPECT_EQ(ids, (*lib)->Encode(repaired));
  ASSERT_EQ(RunCmd(forge + "--decode --format u32 --input '" + (dir / "ids.bin").string() + "'", &out), 0);
  EXPECT_EQ(out, repaired);

  // JSON and text formats; --specials turns the literal marker into its id.
  ASSERT_EQ(RunCmd("printf 'a<|endoftext|>b' | " + forge + "--format json", &out), 0) << out;
  EXPECT_EQ(out, "[64,27,91,437,1659,5239,91,29,65]\n");
  ASSERT_EQ(RunCmd("printf 'a<|endoftext|>b' | " + forge + "--specials", &out), 0) << out;
  EXPECT_EQ(out, "64 50256 65\n");
  ASSERT_EQ(RunCmd("echo '64 50256 65' | " + forge + "--decode", &out), 0) << out;
  EXPECT_EQ(out, "a<|endoftext|>b");

  // Errors name what is wrong.
  EXPECT_EQ(RunCmd("echo '64 999999' | " + forge + "--decode", &out), 1);
  EXPECT_NE(out.find("999999"), std::string::npos) << out;
  EXPECT_EQ(RunCmd("echo '64 x' | " + forge + "--decode", &out), 1);
  EXPECT_NE(out.find("<stdin>:1: expected a token id, found 'x"), std::string::npos) << out;
  EXPECT_EQ(RunCmd(forge + "--strict-utf8 --input '" + (dir / "in.txt").string() + "'", &out), 1);
  EXPECT_NE(out.find("invalid UTF-8 at byte"), std::string::npos) << out;
  EXPECT_NE(RunCmd(test::Bin("forge") + " data tokenize --tokenizer nope </dev/null", &out), 0);
  EXPECT_NE(out.find("'nope' is neither a known name"), std::string::npos) << out;
  EXPECT_EQ(RunCmd(forge + "--format xml </dev/null", &out), 1);
  EXPECT_NE(out.find("--format must be text, json or u32"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
