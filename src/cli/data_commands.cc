#include "cli/data_commands.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/tokenize_command.h"
#include "cli/tokenizer_flag.h"
#include "common/flags.h"
#include "worker/data/dataset.h"
#include "worker/data/inspect.h"
#include "worker/data/prepare.h"

namespace forge {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "forge: %s\n", s.ToString().c_str());
  return 1;
}

// The progress line on stderr: redrawn in place on a terminal, else one line every 10 s.
class PrepareProgressLine {
 public:
  PrepareProgressLine() : tty_(::isatty(2) != 0) {}
  void Update(const PrepareProgress& p) {
    const std::string line = FormatPrepareProgress(p);
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
      drawn_ = true;
    } else if (p.seconds >= next_) {
      std::fprintf(stderr, "%s\n", line.c_str());
      next_ = p.seconds + 10;
      pending_.clear();
    } else {
      pending_ = line;  // the last state is shown at the end
    }
    std::fflush(stderr);
  }
  void End() {
    if (drawn_) std::fprintf(stderr, "\n");
    if (!pending_.empty()) std::fprintf(stderr, "%s\n", pending_.c_str());
    drawn_ = false;
    pending_.clear();
  }

 private:
  bool tty_;
  bool drawn_ = false;
  double next_ = 0;
  std::string pending_;
};

int DataPrepare(int argc, char** argv) {
  FlagParser flags(
      "forge data prepare", "",
      "Tokenizes text into a dataset (token shards + manifest.json). With --input: .txt/.md "
      "files (one document each) and JSON Lines (.jsonl, .ndjson; plain, .gz or .zst; one "
      "document per line). Without --input: the bundled corpus. A killed run continues where "
      "it stopped when run again; a run with more inputs adds only the new files.");
  flags.List("--input", "PATH...", "files, directories (walked) or globs to tokenize");
  flags.Value("--format", "auto|text|jsonl", "how to read the inputs (default auto: by name)");
  flags.Value("--text-key", "KEY", "the JSON Lines key that holds the text (default text)");
  AddTokenizerFlag(&flags);
  flags.Value("--out", "DIR", "dataset directory (default $FORGE_DATA_DIR/dataset)");
  flags.Value("--val-fraction", "F",
              "hold out this fraction of documents, chosen by a hash of their text "
              "(default 0.005)");
  flags.List("--val-input", "PATH...", "hold out these files whole instead");
  flags.Value("--threads", "N", "threads (default: all cores)");
  flags.Value("--shard-tokens", "N", "tokens per shard file (default 10000000)");
  flags.Value("--chunk-bytes", "N", "input bytes per work unit (default 134217728)");
  flags.Value("--invalid-utf8", "replace|reject",
              "ill-formed UTF-8: replace with U+FFFD as WHATWG decoders do (default), or fail");
  flags.Bool("--force", "start over: replace the dataset or unfinished run in --out");
  flags.Bool("--quiet", "no progress line");
  if (int rc; flags.ParseOrExit(argc, argv, 3, &rc)) return rc;
  PrepareOptions opt = DefaultPrepareOptions();
  opt.inputs = flags.GetAll("--input");
  opt.val_inputs = flags.GetAll("--val-input");
  if (opt.inputs.empty() && !opt.val_inputs.empty()) {
    return Fail(Status::Invalid("--val-input needs --input (the training files)"));
  }
  if (!opt.inputs.empty() && !flags.Has("--out")) {
    return Fail(Status::Invalid("--input needs --out DIR (where the dataset goes)"));
  }
  opt.output_dir = flags.Get("--out", opt.output_dir);
  opt.tokenizer = TokenizerFlag(flags);
  opt.text_key = flags.Get("--text-key", opt.text_key);
  if (flags.Has("--format")) {
    auto f = ParseInputFormat(flags.Get("--format"));
    if (!f.ok()) return Fail(f.status());
    opt.format = *f;
  }
  if (flags.Has("--invalid-utf8")) {
    auto p = ParseInvalidUtf8(flags.Get("--invalid-utf8"));
    if (!p.ok()) return Fail(p.status());
    opt.invalid_utf8 = *p;
  }
  int64_t chunk = static_cast<int64_t>(opt.chunk_bytes);
  for (Status s : {flags.GetInt("--threads", &opt.threads),
                   flags.GetInt("--shard-tokens", &opt.shard_tokens),
                   flags.GetInt("--chunk-bytes", &chunk),
                   flags.GetDouble("--val-fraction", &opt.val_fraction)}) {
    if (!s.ok()) return Fail(s);
  }
  if (flags.Has("--val-fraction") && (opt.val_fraction < 0 || opt.val_fraction >= 1)) {
    return Fail(Status::Invalid("--val-fraction: expected a number in [0, 1), got " +
                                flags.Get("--val-fraction")));
  }
  if (chunk < 1) return Fail(Status::Invalid("--chunk-bytes: expected a count >= 1"));
  opt.chunk_bytes = static_cast<uint64_t>(chunk);
  if (opt.inputs.empty() && (flags.Has("--format") || flags.Has("--text-key") ||
                             flags.Has("--tokenizer") || flags.Has("--val-fraction") ||
                             flags.Has("--invalid-utf8") || flags.Has("--chunk-bytes"))) {
    return Fail(Status::Invalid("--format, --text-key, --tokenizer, --val-fraction, "
                                "--invalid-utf8 and --chunk-bytes apply to --input files; the "
                                "bundled corpus is prepared one way"));
  }
  opt.force = flags.Has("--force");
  opt.log = [](const std::string& line) { std::fprintf(stderr, "forge: %s\n", line.c_str()); };
  PrepareProgressLine line;
  if (!flags.Has("--quiet")) opt.progress = [&line](const PrepareProgress& p) { line.Update(p); };
  PrepareSummary summary;
  Status s = PrepareDataset(opt, &summary);
  line.End();
  if (!s.ok()) return Fail(s);
  std::printf("%s\n", summary.ToString().c_str());
  return 0;
}

int DataInspect(int argc, char** argv) {
  FlagParser flags("forge data inspect", "[DIR]",
                   "Shows what a dataset holds and decodes a few sampled documents back to text "
                   "(DIR default $FORGE_DATA_DIR/dataset).");
  flags.Value("--samples", "N", "documents to decode from the train split, plus one from val "
                                "(default 3; 0: none)");
  flags.Value("--sample-tokens", "N", "tokens shown of each (default 200)");
  flags.Value("--seed", "N", "which documents (default 1)");
  flags.Bool("--verify", "check every shard's checksum and every token id (reads everything)");
  flags.Value("--threads", "N", "threads for --verify (default: all cores)");
  flags.MaxPositional(1);
  if (int rc; flags.ParseOrExit(argc, argv, 3, &rc)) return rc;
  InspectOptions o;
  o.data_dir = DefaultDataDir();
  int64_t seed = 1;
  for (Status s : {flags.GetInt("--samples", &o.samples),
                   flags.GetInt("--sample-tokens", &o.sample_tokens),
                   flags.GetInt("--seed", &seed), flags.GetInt("--threads", &o.threads)}) {
    if (!s.ok()) return Fail(s);
  }
  o.seed = static_cast<uint64_t>(seed);
  o.verify = flags.Has("--verify");
  const std::string dir =
      flags.positional().empty() ? DefaultDataDir() + "/dataset" : flags.positional()[0];
  Status s = InspectDataset(dir, o, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
  });
  std::fflush(stdout);
  if (!s.ok()) return Fail(s);
  return 0;
}

int DataBaseline(int argc, char** argv) {
  FlagParser flags("forge data baseline", "",
                   "Prints the unigram cross-entropy of a dataset's validation split (JSON).");
  flags.Value("--dataset", "DIR", "dataset directory (default $FORGE_DATA_DIR/dataset)");
  if (int rc; flags.ParseOrExit(argc, argv, 3, &rc)) return rc;
  const std::string dir = flags.Get("--dataset", DefaultDataDir() + "/dataset");
  auto ds = TokenDataset::Open(dir);
  if (!ds.ok()) return Fail(ds.status());
  UnigramBaseline b = ComputeUnigramBaseline(*ds);
  std::printf("{\"unigram_val_cross_entropy\":%.4f,\"train_unigram_entropy\":%.4f,"
              "\"train_tokens\":%ld,\"val_tokens\":%ld}\n",
              b.val_cross_entropy, b.train_entropy, long(b.train_tokens), long(b.val_tokens));
  return 0;
}

}  // namespace

int RunDataCommand(int argc, char** argv) {
  const std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "prepare") return DataPrepare(argc, argv);
  if (sub == "baseline") return DataBaseline(argc, argv);
  if (sub == "tokenize") return RunDataTokenize(argc, argv);
  if (sub == "inspect") return DataInspect(argc, argv);
  FlagParser flags("forge data", "COMMAND",
                   "commands (forge data COMMAND --help for each one's flags):\n"
                   "  prepare    tokenize text into a dataset\n"
                   "  inspect    what a dataset holds, with decoded samples (--verify: check it)\n"
                   "  baseline   unigram cross-entropy of a dataset's validation split\n"
                   "  tokenize   text to token ids and back, with any tokenizer");
  if (sub.empty()) {
    std::fputs(flags.Usage().c_str(), stderr);
    return 2;
  }
  if (sub[0] == '-') {  // forge data --help, --version
    if (int rc; flags.ParseOrExit(3, argv, 2, &rc)) return rc;
  }
  const Status unknown = UnknownCommand(sub, {"prepare", "inspect", "baseline", "tokenize"});
  return flags.UsageError(unknown);
}

}  // namespace forge
