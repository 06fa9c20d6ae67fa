// Document readers: JSONL errors name file and line (in chunks too), gzip and zstd streams
// (concatenated members/frames, corruption, truncation), chunks that keep every document whole
// and whose checksums combine to the file's, text documents read whole or in pieces, and the
// held-out hash.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/crc32c_combine.h"
#include "worker/data/documents.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::string Dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "/forge_documents_test_" + std::to_string(::getpid());
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(Dir()); }
};
[[maybe_unused]] ::testing::Environment* const kCleanUp =
    ::testing::AddGlobalTestEnvironment(new CleanUp);

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = Dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string WriteGzip(const std::string& name, const std::vector<std::string>& members) {
  const std::string path = Dir() + "/" + name;
  std::remove(path.c_str());
  for (const std::string& m : members) {  // each a separate gzip member, appended
    gzFile gz = gzopen(path.c_str(), "ab");
    gzwrite(gz, m.data(), static_cast<unsigned>(m.size()));
    gzclose(gz);
  }
  return path;
}

std::string ZstdFrame(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3));
  return out;
}

InputFile Input(const std::string& path, InputFormat format) {
  InputFile f;
  f.path = path;
  f.size = fs::file_size(path);
  f.format = format;
  InputFormat by_name;
  ClassifyName(path, &by_name, &f.compression);
  return f;
}

// Every document (whole) of a reader, and its report.
StatusOr<std::vector<std::string>> ReadAll(const InputFile& f, uint64_t chunk = 0,
                                           uint64_t chunk_bytes = 0, ReadReport* report = nullptr,
                                           DocumentOptions o = {}) {
  FORGE_ASSIGN_OR_RETURN(auto r, OpenDocuments(f, o, chunk, chunk_bytes, nullptr));
  std::vector<std::string> docs;
  std::string cur;
  DocPiece p;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool more, r->Next(&p));
    if (!more) break;
    if (p.begins) cur.clear();
    cur += p.text;
    if (p.ends) docs.push_back(cur);
  }
  if (report != nullptr) *report = r->report();
  return docs;
}

std::string JsonlOf(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    out += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + texts[i] + "\"}\n";
  }
  return out;
}

TEST(DataDocumentsTest, JsonlErrorsNameFileAndLine) {
  const std::string path = Write("bad.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\n"
                                              "{\"text\": \"three\" \"x\": 1}\n");
  auto docs = ReadAll(Input(path, InputFormat::kJsonl));
  ASSERT_FALSE(docs.ok());
  EXPECT_EQ(docs.status().message(), path + ":4: column 18: expected ',' or '}', found '\"'");

  const std::string missing = Write("missing.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  auto m = ReadAll(Input(missing, InputFormat::kJsonl));
  EXPECT_EQ(m.status().message(), missing + ":2: no \"text\" key");

  // In a chunk that starts mid-file, the line number is counted back from the file's start.
  std::string big;
  for (int i = 0; i < 200; ++i) big += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  big += "{\"text\": 5}\n";
  const std::string chunked = Write("chunked.jsonl", big);
  const uint64_t bad_line_start = fs::file_size(chunked) - std::string("{\"text\": 5}\n").size();
  auto last = ReadAll(Input(chunked, InputFormat::kJsonl), bad_line_start / 512, 512);
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().message(), chunked + ":201: \"text\" is a number, not a string");

  const std::string utf = Write("utf.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xFF\"}\n");
  DocumentOptions reject;
  reject.invalid_utf8 = InvalidUtf8::kReject;
  auto r = ReadAll(Input(utf, InputFormat::kJsonl), 0, 0, nullptr, reject);
  EXPECT_EQ(r.status().message(), utf + ":2: column 15: invalid UTF-8");
  auto repaired = ReadAll(Input(utf, InputFormat::kJsonl));
  ASSERT_TRUE(repaired.ok());
  EXPECT_EQ((*repaired)[1], "bad \xEF\xBF\xBD");
}

TEST(DataDocumentsTest, UnreadableFilesAreErrorsNamingThem) {
  InputFile dir = Input(Write("plain.jsonl", "{}"), InputFormat::kJsonl);
  dir.path = Dir();  // a directory: opens, but cannot be read
  auto r = ReadAll(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(Dir() + ": read failed"), std::string::npos)
      << r.status().ToString();
  InputFile gone = dir;
  gone.path = Dir() + "/gone.jsonl";
  auto g = ReadAll(gone);
  EXPECT_EQ(g.status().code(), Code::kNotFound);
  EXPECT_NE(g.status().message().find(gone.path), std::string::npos);
}

TEST(DataDocumentsTest, GzipAndZstdStreams) {
  const std::vector<std::string> texts = {"alpha", "beta \\u00e9", "gamma"};
  const std::string plain = JsonlOf(texts);
  const std::vector<std::string> want = {"alpha", "beta \xC3\xA9", "gamma"};

  // Two gzip members (as `cat a.gz b.gz` makes) read as one stream.
  const std::string gz = WriteGzip("two.jsonl.gz", {plain.substr(0, 20), plain.substr(20)});
  ReadReport rep;
  auto g = ReadAll(Input(gz, InputFormat::kJsonl), 0, 0, &rep);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*g, want);
  std::ifstream in(gz, std::ios::binary);
  const std::string gz_bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(rep.crc, Crc32c(gz_bytes));  // the file as stored
  EXPECT_EQ(rep.end, gz_bytes.size());

  // Two zstd frames.
  const std::string zst = Write("two.jsonl.zst", ZstdFrame(plain.substr(0, 30)) + ZstdFrame(plain.substr(30)));
  auto z = ReadAll(Input(zst, InputFormat::kJsonl));
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_EQ(*z, want);

  // A compressed text file is one document.
  const std::string tgz = WriteGzip("doc.txt.gz", {"Some text.\nMore text.\n"});
  auto t = ReadAll(Input(tgz, InputFormat::kText));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, std::vector<std::string>{"Some text.\nMore text.\n"});

  // Truncated and corrupt streams are errors naming the file.
  const std::string frame = ZstdFrame(plain);
  const std::string cut = Write("cut.jsonl.zst", frame.substr(0, frame.size() - 5));
  auto c = ReadAll(Input(cut, InputFormat::kJsonl));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(cut + ": truncated zstd stream"), std::string::npos)
      << c.status().message();
  std::string bad_gz = gz_bytes;
  bad_gz[bad_gz.size() / 2] ^= 0x55;
  bad_gz[bad_gz.size() / 2 + 1] ^= 0x55;
  const std::string corrupt = Write("corrupt.jsonl.gz", bad_gz);
  auto b = ReadAll(Input(corrupt, InputFormat::kJsonl));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(corrupt + ": "), std::string::npos) << b.status().message();
  const std::string short_gz = Write("short.jsonl.gz", gz_bytes.substr(0, gz_bytes.size() / 2));
  auto s = ReadAll(Input(short_gz, InputFormat::kJsonl));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("truncated gzip stream"), std::string::npos)
      << s.status().message();
}

TEST(DataDocumentsTest, ChunksKeepDocumentsWholeAndTileTheFile) {
  std::vector<std::string> texts;
  uint64_t x = 7;
  for (int i = 0; i < 400; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    texts.push_back("doc " + std::to_string(i) + " " + std::string(1 + (x >> 58), 'a' + i % 26));
  }
  std::string data = JsonlOf(texts);
  data.pop_back();  // the last line without a newline
  const std::string path = Write("chunks.jsonl", data);
  const InputFile f = Input(path, InputFormat::kJsonl);
  auto whole = ReadAll(f);
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(*whole, texts);
  for (uint64_t chunk_bytes : {1ull, 7ull, 64ull, 100ull, 1000ull, 4096ull, 1ull << 20}) {
    std::vector<std::string> all;
    uint32_t crc = 0;
    uint64_t next = 0;
    for (uint64_t k = 0; k * chunk_bytes < f.size; ++k) {
      ReadReport rep;
      auto docs = ReadAll(f, k, chunk_bytes, &rep);
      ASSERT_TRUE(docs.ok()) << docs.status().ToString();
      ASSERT_EQ(rep.begin, next) << "chunk " << k << " of " << chunk_bytes;
      crc = Crc32cCombine(crc, rep.crc, rep.end - rep.begin);
      next = rep.end;
      all.insert(all.end(), docs->begin(), docs->end());
    }
    EXPECT_EQ(next, f.size);
    EXPECT_EQ(all, texts) << "chunk_bytes " << chunk_bytes;
    EXPECT_EQ(crc, Crc32c(data)) << "chunk_bytes " << chunk_bytes;
  }
}

TEST(DataDocumentsTest, TextFilesWholeOrInPieces) {
  // A BOM goes; empty documents are skipped and counted.
  const std::string bom = Write("bom.txt", "\xEF\xBB\xBFHello\n");
  auto b = ReadAll(Input(bom, InputFormat::kText));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, std::vector<std::string>{"Hello\n"});
  ReadReport rep;
  auto e = ReadAll(Input(Write("empty.md", ""), InputFormat::kText), 0, 0, &rep);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->empty());
  EXPECT_EQ(rep.skipped_empty, 1);

  // A document over max_doc_bytes comes in pieces cut after "\n" between non-space
  // characters; together they are the document, with the same hash and repair.
  std::string doc = "\xEF\xBB\xBF";
  for (int i = 0; i < 3000; ++i) {
    doc += "Line " + std::to_string(i) + (i % 7 == 0 ? "  \n" : "\n");
    if (i % 500 == 0) doc += "bad byte \xC3 here\n\n";
  }
  const std::string path = Write("big.txt", doc);
  DocumentOptions small;
  small.max_doc_bytes = 4096;
  small.piece_bytes = 1000;
  auto r = OpenDocuments(Input(path, InputFormat::kText), small, 0, 0, nullptr);
  ASSERT_TRUE(r.ok());
  std::string joined;
  DocPiece p;
  int pieces = 0;
  uint64_t hash = 0;
  for (;;) {
    auto more = (*r)->Next(&p);
    ASSERT_TRUE(more.ok()) << more.status().ToString();
    if (!*more) break;
    EXPECT_EQ(p.begins, pieces == 0);
    if (!p.ends) {
      ASSERT_GE(p.text.size(), 2u);
      EXPECT_EQ(p.text.back(), '\n');  // cut right after a newline ...
      EXPECT_NE(p.text[p.text.size() - 2], ' ');  // ... with no space before it
    }
    EXPECT_TRUE(p.repaired);
    hash = p.doc_hash;
    joined += p.text;
    ++pieces;
  }
  EXPECT_GT(pieces, 10);
  auto whole = ReadAll(Input(path, InputFormat::kText));  // read in one go
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(whole->size(), 1u);
  EXPECT_EQ(joined, (*whole)[0]);
  EXPECT_EQ(hash, HeldOutHash(joined));
  EXPECT_EQ((*r)->report().crc, Crc32c(doc));
}

TEST(DataDocumentsTest, HeldOutByHashIsDeterministicAndProportional) {
  int held = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const std::string text = "document number " + std::to_string(i);
    const uint64_t h = HeldOutHash(text);
    EXPECT_EQ(h, HeldOutHash(text));
    // Pieces hash as the whole.
    const uint64_t st = HeldOutHashExtend(HeldOutHashExtend(HeldOutHashStart(), text.substr(0, 5)),
                                          text.substr(5));
    EXPECT_EQ(HeldOutHashFinish(st), h);
    held += IsHeldOut(h, 0.1);
    // A larger fraction holds out a superset.
    if (IsHeldOut(h, 0.1)) EXPECT_TRUE(IsHeldOut(h, 0.2));
  }
  EXPECT_NEAR(held, n / 10, n / 100);  // 10% +- 1%
  EXPECT_FALSE(IsHeldOut(HeldOutHash("x"), 0.0));
  EXPECT_TRUE(IsHeldOut(HeldOutHash("x"), 1.0));
}

}  // namespace
}  // namespace forge
