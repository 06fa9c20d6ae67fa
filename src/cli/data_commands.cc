#include "cli/data_commands.h"

#include <cstdio>
#include <string>

#include "cli/tokenize_command.h"
#include "common/flags.h"
#include "worker/data/dataset.h"
#include "worker/data/prepare.h"

namespace forge {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "forge: %s\n", s.ToString().c_str());
  return 1;
}

int DataPrepare(int argc, char** argv) {
  FlagParser flags("forge data prepare", "",
                   "Tokenizes the bundled corpus into a dataset (shards + manifest.json).");
  flags.Value("--out", "DIR", "dataset directory (default $FORGE_DATA_DIR/dataset)");
  flags.Value("--threads", "N", "tokenizer threads (default: all cores)");
  flags.Bool("--force", "rewrite the dataset even when it is up to date");
  flags.MaxPositional(0);
  if (int rc; flags.ParseOrExit(argc, argv, 3, &rc)) return rc;
  PrepareOptions opt = DefaultPrepareOptions();
  opt.output_dir = flags.Get("--out", opt.output_dir);
  if (Status s = flags.GetInt("--threads", &opt.threads); !s.ok()) return Fail(s);
  opt.force = flags.Has("--force");
  opt.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  PrepareSummary summary;
  Status s = PrepareDataset(opt, &summary);
  if (!s.ok()) return Fail(s);
  std::printf("%s\n", summary.ToString().c_str());
  return 0;
}

int DataBaseline(int argc, char** argv) {
  FlagParser flags("forge data baseline", "",
                   "Prints the unigram cross-entropy of a dataset's validation split (JSON).");
  flags.Value("--dataset", "DIR", "dataset directory (default $FORGE_DATA_DIR/dataset)");
  flags.MaxPositional(0);
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
  const bool help = sub == "--help" || sub == "-h";
  std::fprintf(help ? stdout : stderr,
               "usage: forge data COMMAND [flags]   (forge data COMMAND --help for its flags)\n"
               "  prepare    tokenize text into a dataset\n"
               "  baseline   unigram cross-entropy of a dataset's validation split\n"
               "  tokenize   text to token ids and back, with any tokenizer\n");
  if (!help && !sub.empty()) std::fprintf(stderr, "forge data: unknown command '%s'\n", sub.c_str());
  return help ? 0 : 2;
}

}  // namespace forge
