// Every Forge program's command line, as a user meets it (the real binaries, common/flags.h
// behind each): --help prints the usage on standard output and exits 0, --version prints
// "<program> <version> (commit <hash>)" as `forge --version` does, and a misspelled flag or
// command is refused (exit 2, nothing on standard output) with a message that names it and
// the closest known one, before the program does anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "mpi_launch.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using test::Bin;

struct Outcome {
  int exit_code = -1;
  std::string out, err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ProgramFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/program_flags_" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `args` run with the program `program` (a file under bin/), its standard output and error
  // kept apart. No coordinator address or token is in its environment.
  Outcome Exec(const std::string& program, const std::string& args) {
    const std::string out = dir_ + "/out", err = dir_ + "/err";
    const std::string cmd = "env -u FORGE_COORDINATOR -u FORGE_TOKEN -u FORGE_JOIN_SECRET "
                            "timeout 60 " + Bin(program) + " " + args + " >" + out + " 2>" + err;
    const int status = std::system(cmd.c_str());
    Outcome r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
  }

  std::string dir_;
};

struct Program {
  std::string binary;  // under bin/
  std::string command;  // the subcommand, if any
};

// Every program and subcommand with a command line; the CUDA benchmarks where they were built.
std::vector<Program> Programs() {
  std::vector<Program> p = {
      {"forge", ""},           {"forge", "train"},          {"forge", "export"},
      {"forge", "import"},     {"forge", "generate"},       {"forge", "eval"},
      {"forge", "data"},       {"forge", "data prepare"},   {"forge", "data baseline"},
      {"forge", "data tokenize"}, {"forge", "data inspect"}, {"forge", "has-gpu"},
      {"forge", "plan"},
      {"forgectl", ""},
      {"forge-coordinator", ""}, {"forge-worker", ""},      {"forge-tokenizer-bench", ""},
      {"forge-coordinator-load", ""},
  };
  for (const char* c : {"submit", "stop", "resume", "checkpoint", "status", "list", "watch",
                        "checkpoints", "data", "export", "report"})
    p.push_back({"forgectl", c});
  for (const char* b : {"forge-bench", "forge-dist-bench", "forge-gemm-bench", "forge-fp8-probe",
                        "forge-sdpa-bench", "forge-wgmma-bench", "forge-calibrate"})
    if (fs::exists(Bin(b))) p.push_back({b, ""});
  return p;
}

std::string Name(const Program& p) {
  return p.command.empty() ? p.binary : p.binary + " " + p.command;
}

TEST_F(ProgramFlags, HelpPrintsTheUsageOnStandardOutputAndExitsZero) {
  for (const Program& p : Programs()) {
    for (const char* help : {"--help", "-h"}) {
      Outcome r = Exec(p.binary, p.command + " " + help);
      EXPECT_EQ(r.exit_code, 0) << Name(p) << " " << help << ": " << r.err;
      EXPECT_EQ(r.out.rfind("usage: " + Name(p), 0), 0u) << Name(p) << ": " << r.out;
      EXPECT_NE(r.out.find("--version"), std::string::npos) << Name(p) << ": " << r.out;
      EXPECT_EQ(r.err, "") << Name(p);
    }
  }
  // Help lists what the program takes: forgectl its commands and the flags every one takes.
  Outcome top = Exec("forgectl", "--help");
  for (const char* c : {"submit SPEC.yaml", "resume RUN", "report RUN", "--coordinator"})
    EXPECT_NE(top.out.find(c), std::string::npos) << c << "\n" << top.out;
  Outcome submit = Exec("forgectl", "submit --help");
  for (const char* f : {"usage: forgectl submit SPEC.yaml [flags]", "--watch", "--reconnect-for S",
                        "--coordinator HOST:PORT", "--json"})
    EXPECT_NE(submit.out.find(f), std::string::npos) << f << "\n" << submit.out;
  Outcome coordinator = Exec("forge-coordinator", "--help");
  for (const char* f : {"--state-dir DIR", "--data-root DIR", "--metrics-port N", "FORGE_TOKEN"})
    EXPECT_NE(coordinator.out.find(f), std::string::npos) << f << "\n" << coordinator.out;
  Outcome forge = Exec("forge", "help");
  EXPECT_EQ(forge.exit_code, 0);
  EXPECT_EQ(forge.out, Exec("forge", "--help").out);
  EXPECT_NE(forge.out.find("has-gpu"), std::string::npos) << forge.out;
}

TEST_F(ProgramFlags, VersionNamesTheProgramAsForgeVersionDoes) {
  Outcome forge = Exec("forge", "--version");
  ASSERT_EQ(forge.exit_code, 0) << forge.err;
  EXPECT_EQ(forge.out, VersionString("forge") + "\n");
  const std::string rest = forge.out.substr(std::string("forge").size());  // " 0.4.0 (commit x)\n"
  ASSERT_EQ(rest.rfind(" 0.", 0), 0u) << forge.out;
  ASSERT_NE(rest.find(" (commit "), std::string::npos) << forge.out;
  for (const Program& p : Programs()) {
    Outcome r = Exec(p.binary, p.command + " --version");
    EXPECT_EQ(r.exit_code, 0) << Name(p) << ": " << r.err;
    EXPECT_EQ(r.out, p.binary + rest) << Name(p);
    EXPECT_EQ(r.err, "") << Name(p);
  }
}

TEST_F(ProgramFlags, AMisspelledFlagIsRefusedNamingItAndTheClosestOne) {
  const std::string d = dir_;
  const struct {
    std::string binary, args, message;
  } cases[] = {
      {"forge", "train " + d + "/tiny.yaml --stpes 10",
       "forge train: unknown flag --stpes (did you mean --steps?)"},
      {"forge", "export --chekpoint latest -o " + d + "/x",
       "forge export: unknown flag --chekpoint (did you mean --checkpoint?)"},
      {"forge", "import " + d + "/hf --run-dri " + d + "/run",
       "forge import: unknown flag --run-dri (did you mean --run-dir?)"},
      {"forge", "generate --checkpoint latest --promt hi",
       "forge generate: unknown flag --promt (did you mean --prompt?)"},
      {"forge", "eval --checkpoint latest --taks " + d + "/t.jsonl",
       "forge eval: unknown flag --taks (did you mean --tasks?)"},
      {"forge", "data prepare --out " + d + "/ds --treads 2",
       "forge data prepare: unknown flag --treads (did you mean --threads?)"},
      {"forge", "data baseline --datset " + d + "/ds",
       "forge data baseline: unknown flag --datset (did you mean --dataset?)"},
      {"forge", "data tokenize --tokeniser gpt2",
       "forge data tokenize: unknown flag --tokeniser (did you mean --tokenizer?)"},
      {"forge", "data inspect " + d + "/ds --verfy",
       "forge data inspect: unknown flag --verfy (did you mean --verify?)"},
      {"forge", "has-gpu --verbose", "forge has-gpu: unknown flag --verbose"},
      {"forge", "--verison", "forge: unknown flag --verison (did you mean --version?)"},
      {"forgectl", "submit " + d + "/tiny.yaml --watc",
       "forgectl submit: unknown flag --watc (did you mean --watch?)"},
      {"forgectl", "--coordinator 127.0.0.1:1 stop r --noww",
       "forgectl stop: unknown flag --noww (did you mean --now?)"},
      {"forgectl", "resume r --worker 2",
       "forgectl resume: unknown flag --worker (did you mean --workers?)"},
      {"forgectl", "checkpoint r --jsno", "forgectl checkpoint: unknown flag --jsno (did you mean --json?)"},
      {"forgectl", "status r --coordinater 127.0.0.1:1",
       "forgectl status: unknown flag --coordinater (did you mean --coordinator?)"},
      {"forgectl", "list --activ", "forgectl list: unknown flag --activ (did you mean --active?)"},
      {"forgectl", "watch r --histroy", "forgectl watch: unknown flag --histroy (did you mean --history?)"},
      {"forgectl", "watch r --reconnect 5",
       "forgectl watch: unknown flag --reconnect (did you mean --reconnect-for?)"},
      {"forgectl", "checkpoints r --tls-cs f",
       "forgectl checkpoints: unknown flag --tls-cs (did you mean --tls-ca?)"},
      {"forgectl", "data r --token-fle f",
       "forgectl data: unknown flag --token-fle (did you mean --token-file?)"},
      {"forgectl", "export r --fromat hf", "forgectl export: unknown flag --fromat (did you mean --format?)"},
      {"forgectl", "report r --ot x.html", "forgectl report: unknown flag --ot (did you mean --out?)"},
      {"forgectl", "--jsn", "forgectl: unknown flag --jsn (did you mean --json?)"},
      {"forge-coordinator", "--prot 1 --state-dir " + d + "/state",
       "forge-coordinator: unknown flag --prot (did you mean --metrics-port?)"},
      {"forge-coordinator", "--state-dir " + d + "/state --data-roots " + d,
       "forge-coordinator: unknown flag --data-roots (did you mean --data-root?)"},
      {"forge-worker", "--coordinater 127.0.0.1:1",
       "forge-worker: unknown flag --coordinater (did you mean --coordinator?)"},
      {"forge-worker", "--coordinator 127.0.0.1:1 --max-placement 1",
       "forge-worker: unknown flag --max-placement (did you mean --max-placements?)"},
      {"forge-tokenizer-bench", "--inptu " + d + "/t.txt",
       "forge-tokenizer-bench: unknown flag --inptu (did you mean --input?)"},
      {"forge-coordinator-load", "--worker 4",
       "forge-coordinator-load: unknown flag --worker (did you mean --workers?)"},
  };
  for (const auto& c : cases) {
    Outcome r = Exec(c.binary, c.args);
    EXPECT_EQ(r.exit_code, 2) << c.binary << " " << c.args << ": " << r.err;
    EXPECT_EQ(r.err.rfind(c.message + "\n", 0), 0u) << c.binary << " " << c.args << ": " << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;  // where to look next
    EXPECT_EQ(r.out, "") << c.binary << " " << c.args;
  }
  // Refused before anything was done: no state, dataset or run directory was created.
  EXPECT_FALSE(fs::exists(d + "/state"));
  EXPECT_FALSE(fs::exists(d + "/ds"));
  EXPECT_FALSE(fs::exists(d + "/run"));
  EXPECT_FALSE(fs::exists(d + "/x"));
}

TEST_F(ProgramFlags, AnUnknownCommandIsNamedWithTheClosestOne) {
  const struct {
    std::string binary, args, message;
  } cases[] = {
      {"forge", "trian x.yaml", "forge: unknown command 'trian' (did you mean 'train'?)"},
      {"forge", "data prepar", "forge data: unknown command 'prepar' (did you mean 'prepare'?)"},
      {"forgectl", "--coordinator 127.0.0.1:1 stauts r",
       "forgectl: unknown command 'stauts' (did you mean 'status'?)"},
      {"forgectl", "frobnicate", "forgectl: unknown command 'frobnicate'"},
  };
  for (const auto& c : cases) {
    Outcome r = Exec(c.binary, c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.rfind(c.message + "\n", 0), 0u) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  // Without a command: the usage, on standard error, exit 2.
  for (const std::string binary : {"forge", "forgectl"}) {
    Outcome r = Exec(binary, "");
    EXPECT_EQ(r.exit_code, 2) << binary;
    EXPECT_EQ(r.err.rfind("usage: " + binary, 0), 0u) << r.err;
  }
}

TEST_F(ProgramFlags, MalformedValuesAndMissingArgumentsNameTheFlag) {
  const struct {
    std::string binary, args, message;
  } cases[] = {
      {"forgectl", "resume r --workers two",
       "forgectl resume: --workers: expects an integer, got 'two'"},
      {"forgectl", "watch r --reconnect-for -3", "forgectl watch: --reconnect-for: must be >= 0, got -3"},
      {"forgectl", "submit", "forgectl submit: expects SPEC.yaml"},
      {"forgectl", "status a b", "forgectl status: unexpected argument 'b'"},
      {"forge-coordinator", "--state-dir " + dir_ + "/state --metrics-port 70000",
       "forge-coordinator: --metrics-port: expects a port in [0, 65535] or any, got 70000"},
      {"forge-coordinator", "--state-dir " + dir_ + "/state --heartbeat-timeout-ms 0",
       "forge-coordinator: --heartbeat-timeout-ms: expects an integer in [1, 1073741824], got 0"},
      {"forge-coordinator", "--listen 127.0.0.1:0", "forge-coordinator: --state-dir is required"},
      {"forge-coordinator", "--state-dir", "forge-coordinator: --state-dir: expects DIR"},
      {"forge-worker", "--coordinator 127.0.0.1:1 --max-placements x",
       "forge-worker: --max-placements: expects an integer, got 'x'"},
      {"forge-worker", "--max-placements 1", "forge-worker: no coordinator address"},
      {"forge", "train --steps 1", "forge train: expects CONFIG\n(see 'forge train --help')"},
      {"forge", "plan " + dir_ + "/tiny.yaml", "forge plan: --gpus is required\n"},
      {"forge", "plan " + dir_ + "/tiny.yaml --gpus 0",
       "forge plan: --gpus: expects an integer in [1, 1024], got 0\n(see 'forge plan --help')"},
      {"forge", "generate --prompt hi", "forge generate: --checkpoint is required\n"},
      {"forge", "eval --batches 1", "forge eval: --checkpoint is required\n"},
  };
  for (const auto& c : cases) {
    Outcome r = Exec(c.binary, c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.rfind(c.message, 0), 0u) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/state"));
}

}  // namespace
}  // namespace forge
