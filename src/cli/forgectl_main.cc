// forgectl: the user client of forge-coordinator.
//   forgectl [--coordinator HOST:PORT] [--token-file FILE] [--tls-ca FILE] [--json] COMMAND ...
//     submit SPEC.yaml [--watch]        queue a run; prints its id
//     stop RUN [--now]                  checkpoint then stop (--now: abort without saving)
//     resume RUN [--checkpoint step_N] [--workers N]
//     checkpoint RUN                    save a checkpoint now, keep training
//     status RUN                        one run in detail
//     list [--active]                   every run, one line each
//     watch RUN [--history] [--reconnect-for S]
//                                       live progress line until the run ends; a coordinator
//                                       that goes away is reconnected to (stderr says so) for
//                                       up to S seconds (default 600)
//     checkpoints RUN                   committed checkpoints
//     data RUN                          the data plan at the latest checkpoint: per source its
//                                       weight, sequences and tokens consumed, and epoch
//     export RUN [--checkpoint step_N] [-o NAME] [--bf16] [--format forge|hf]
//                                       one safetensors file (forge) or a Hugging Face Llama
//                                       directory (hf) under <run_dir>/exports
//     report RUN [-o FILE]              self-contained HTML page of the run's recorded history
//                                       (charts of loss, throughput, MFU, memory, step time;
//                                       default FILE: RUN.html)
// Each command's flags are declared once (kCommands, common/flags.h): `forgectl --help` lists
// the commands, `forgectl COMMAND --help` one command's flags; the global flags may come before
// or after the command's name. The address comes from --coordinator or FORGE_COORDINATOR, the
// token from --token-file or FORGE_TOKEN. Errors are one line on stderr ("forgectl: NOT_FOUND:
// no run with id 'x'") and exit code 1; bad usage (an unknown flag or command, a malformed
// value) exits 2 before anything is sent. `watch` exits 0 when the run COMPLETED or STOPPED, 1
// when it FAILED.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/human_format.h"
#include "cli/progress_line.h"
#include "cli/report_html.h"
#include "common/file_io.h"
#include "common/flags.h"
#include "forge/v1/runs.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/connection_flags.h"

namespace forge::cli {
namespace {

struct Global {
  bool json = false;
};

// The flags every command takes, before or after its name.
void AddGlobalFlags(FlagParser* f) {
  rpc::AddCoordinatorFlags(f);
  rpc::AddSecretFlag(f, rpc::kUserToken);
  f->Bool("--json", "print the API's messages as JSON instead of text");
}

struct Command {
  const char* name;
  const char* positional;  // for the usage line: "RUN", "SPEC.yaml" or ""
  const char* summary;      // its line in `forgectl --help`
  const char* description;  // its `forgectl COMMAND --help`
  void (*add_flags)(FlagParser*);  // the command's own flags
};

void AddReconnectFlag(FlagParser* f) {
  f->Value("--reconnect-for", "S",
           "keep reconnecting to a coordinator that went away for S seconds (default 600)");
}

const Command kCommands[] = {
    {"submit", "SPEC.yaml", "queue a run; prints its id",
     "Queues a run (the spec is a run config); prints its id.",
     [](FlagParser* f) {
       f->Bool("--watch", "then follow it as `watch` does, until it ends");
       AddReconnectFlag(f);
     }},
    {"stop", "RUN", "checkpoint, then stop (--now: abort without saving)",
     "Checkpoints the run, then stops it.",
     [](FlagParser* f) { f->Bool("--now", "abort at once, without saving a checkpoint"); }},
    {"resume", "RUN", "restart a stopped or failed run from a checkpoint",
     "Restarts a stopped or failed run from a checkpoint.",
     [](FlagParser* f) {
       f->Value("--checkpoint", "step_N", "the checkpoint to resume (default the latest)");
       f->Value("--workers", "N", "the world size to resume with (default the run's)");
     }},
    {"checkpoint", "RUN", "save a checkpoint now, keep training",
     "Saves a checkpoint now; the run keeps training.", [](FlagParser*) {}},
    {"status", "RUN", "one run in detail", "One run in detail.", [](FlagParser*) {}},
    {"list", "", "every run, one line each", "Every run, one line each.",
     [](FlagParser* f) { f->Bool("--active", "only runs that have not ended"); }},
    {"watch", "RUN", "a live progress line until the run ends",
     "A live progress line until the run ends (exit 0 when it COMPLETED or STOPPED, 1 when it "
     "FAILED);\na coordinator that goes away is reconnected to, saying so on stderr.",
     [](FlagParser* f) {
       f->Bool("--history", "first print the events so far");
       AddReconnectFlag(f);
     }},
    {"checkpoints", "RUN", "committed checkpoints",
     "The run's committed checkpoints.", [](FlagParser*) {}},
    {"data", "RUN", "per data source: weight, sequences and tokens consumed, epoch",
     "The data plan at the latest checkpoint: per source its weight, sequences and tokens "
     "consumed, and epoch.",
     [](FlagParser*) {}},
    {"export", "RUN", "a checkpoint as safetensors or a Hugging Face directory",
     "Writes a checkpoint as one safetensors file (forge) or a Hugging Face Llama directory "
     "(hf)\nunder <run_dir>/exports, on the coordinator's machine.",
     [](FlagParser* f) {
       f->Value("--checkpoint", "step_N", "the checkpoint to export (default the latest)");
       f->Value("--out", "NAME", "the name under <run_dir>/exports");
       f->Alias("-o", "--out");
       f->Bool("--bf16", "bf16 tensors (default f32)");
       f->Value("--format", "forge|hf", "what to write (default forge)");
     }},
    {"report", "RUN", "an HTML page of the run's recorded history",
     "A self-contained HTML page of the run's recorded history (charts of loss, throughput, "
     "MFU,\nmemory, step time).",
     [](FlagParser* f) {
       f->Value("--out", "FILE", "where to write it (default RUN.html)");
       f->Alias("-o", "--out");
     }},
};

const Command* FindCommand(std::string_view name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

// `forgectl` without a command: the global flags and the list of commands.
FlagParser TopFlags() {
  std::string text = "commands (forgectl COMMAND --help for each one's flags):\n";
  for (const Command& c : kCommands) {
    std::string left = std::string(c.name) + " " + c.positional;
    left.resize(std::max<size_t>(left.size(), 18), ' ');
    text += "  " + left + c.summary + "\n";
  }
  text += "\nThe address comes from --coordinator or FORGE_COORDINATOR, the token from "
          "--token-file or FORGE_TOKEN.";
  FlagParser f("forgectl", "COMMAND ...", text);
  AddGlobalFlags(&f);
  return f;
}

FlagParser CommandFlags(const Command& c) {
  FlagParser f(std::string("forgectl ") + c.name, c.positional, c.description);
  c.add_flags(&f);
  AddGlobalFlags(&f);
  f.Positional(c.positional[0] == '\0' ? 0 : 1);
  return f;
}

int Fail(const std::string& line) {
  std::fprintf(stderr, "forgectl: %s\n", line.c_str());
  return 1;
}

int Fail(const grpc::Status& s) {
  return Fail(std::string(rpc::GrpcCodeName(s.error_code())) + ": " + s.error_message());
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;  // scripts see 0 / "" / false too
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token)
      : stub_(v1::RunService::NewStub(channel)), token_(std::move(token)) {}

  // Unary call with a deadline; transient failures (coordinator restarting) are retried.
  template <typename Req, typename Resp, typename Fn>
  grpc::Status Call(Fn method, const Req& req, Resp* resp) {
    rpc::RetryPolicy policy;
    policy.give_up_after_s = 20.0;
    return rpc::CallWithRetry(policy, [&](std::chrono::system_clock::time_point deadline) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      rpc::AddBearer(&ctx, token_);
      resp->Clear();
      return (stub_.get()->*method)(&ctx, req, resp);
    });
  }
  v1::RunService::Stub* stub() { return stub_.get(); }
  const std::string& token() const { return token_; }

 private:
  std::unique_ptr<v1::RunService::Stub> stub_;
  std::string token_;
};

void PrintRunLine(const v1::Run& r) {
  std::printf("%-24s %-13s %6ld/%-6ld workers %d  restarts %d/%d  %s\n", r.id().c_str(),
              StateName(r.state()), long(r.step()), long(r.total_steps()), r.workers(),
              r.restarts(), r.max_restarts(), FormatUtcTime(r.created_unix_ms()).c_str());
}

void PrintRunDetail(const v1::Run& r) {
  std::printf("run        %s (%s)\n", r.id().c_str(), r.name().c_str());
  std::printf("state      %s%s%s\n", StateName(r.state()), r.state_reason().empty() ? "" : ": ",
              r.state_reason().c_str());
  std::printf("progress   %s\n", ProgressLine(r).c_str());
  std::printf("workers    %d (attempt %d, restarts %d of %d)\n", r.workers(), r.attempt(),
              r.restarts(), r.max_restarts());
  for (int i = 0; i < r.worker_ids_size(); ++i)
    std::printf("  rank %d   %s\n", i, r.worker_ids(i).c_str());
  if (r.latest_checkpoint_step() >= 0)
    std::printf("checkpoint step_%ld\n", long(r.latest_checkpoint_step()));
  else
    std::printf("checkpoint none\n");
  for (const std::string& w : r.warnings()) std::printf("warning    %s\n", w.c_str());
  std::printf("run dir    %s\n", r.run_dir().c_str());
  std::printf("created    %s, updated %s\n", FormatUtcTime(r.created_unix_ms()).c_str(),
              FormatUtcTime(r.updated_unix_ms()).c_str());
}

// The request of a command about one run.
template <typename Req>
Req ForRun(const std::string& run_id) {
  Req req;
  req.set_run_id(run_id);
  return req;
}

// Calls a RunService method and prints its answer: as JSON with --json, else with print_text.
template <typename Req, typename Resp, typename PrintText>
int CallAndPrint(const Global& g, Client* c,
                 grpc::Status (v1::RunService::Stub::*method)(grpc::ClientContext*, const Req&,
                                                              Resp*),
                 const Req& req, PrintText print_text) {
  Resp resp;
  if (auto s = c->Call(method, req, &resp); !s.ok()) return Fail(s);
  if (g.json) std::printf("%s\n", Json(resp).c_str());
  else print_text(resp);
  return 0;
}

// The same for a method that answers with the run: "VERB ID (STATE)", or the run's details.
template <typename Req>
int CallAndPrintRun(const Global& g, Client* c,
                    grpc::Status (v1::RunService::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                 v1::Run*),
                    const Req& req, const char* verb) {
  return CallAndPrint(g, c, method, req, [&](const v1::Run& r) {
    if (verb) std::printf("%s %s (%s)\n", verb, r.id().c_str(), StateName(r.state()));
    else PrintRunDetail(r);
  });
}

// One line per source: what it has given the run by the plan's checkpoint.
void PrintDataPlan(const v1::DataPlan& plan) {
  if (plan.step() > 0)
    std::printf("run %s: data at checkpoint step_%ld, %ld sequences consumed\n",
                plan.run_id().c_str(), long(plan.step()), long(plan.cursor()));
  else
    std::printf("run %s: data at the start of the run (no checkpoint yet)\n",
                plan.run_id().c_str());
  double total_weight = 0;
  for (const v1::DataSource& s : plan.sources()) total_weight += s.weight();
  std::printf("%-6s %8s %7s %12s %14s %6s %12s  %s\n", "SOURCE", "WEIGHT", "SHARE", "SEQUENCES",
              "TOKENS", "EPOCH", "EPOCH_SEQS", "DIR");
  for (int i = 0; i < plan.sources_size(); ++i) {
    const v1::DataSource& s = plan.sources(i);
    const std::string epoch_seqs =
        s.epoch_sequences() > 0 ? std::to_string(s.epoch_sequences()) : "-";
    std::printf("%-6d %8g %6.1f%% %12ld %14ld %6ld %12s  %s\n", i, s.weight(),
                100.0 * s.weight() / total_weight, long(s.sequences()), long(s.tokens()),
                long(s.epoch()), epoch_seqs.c_str(),
                s.dir().empty() ? "(the worker's default dataset)" : s.dir().c_str());
  }
  if (plan.origin() > 0)
    std::printf("(these weights apportion the stream from global sequence %ld on)\n",
                long(plan.origin()));
}

bool Terminal(v1::RunState s) {
  return s == v1::STOPPED || s == v1::COMPLETED || s == v1::FAILED;
}

// Follows the run until it ends. When the coordinator goes away (killed, restarted, a network
// break) the stream is reopened with backoff, saying so on stderr, for up to `reconnect_s`
// seconds without reaching it (20 s, as other commands, when it was never reached); the events
// of the time away are printed on reconnecting, those already printed are not printed again.
int Watch(const Global& g, Client* c, const std::string& run_id, bool history,
          double reconnect_s) {
  using Clock = std::chrono::steady_clock;
  const bool tty = !g.json && isatty(STDOUT_FILENO);
  bool printed_line = false;
  v1::Run last;
  int64_t last_event = 0;  // ids grow over the coordinator's life, restarts included
  bool first = true;
  double backoff_s = 0.25;
  Clock::time_point lost_at{};  // when the coordinator was last reached (while lost)
  Clock::time_point told_at{};  // when stderr last said so
  bool lost = false;
  bool reached = false;
  auto end_line = [&] {
    if (tty && printed_line) std::printf("\n");
    std::fflush(stdout);
    printed_line = false;
  };
  for (;;) {
    v1::WatchRunRequest req;
    req.set_run_id(run_id);
    // After a reconnect the coordinator's history is asked for again: the events of the time
    // away (a checkpoint committed, a restart) are printed, those seen before are skipped by id.
    req.set_history((history && first) || reached);
    grpc::ClientContext ctx;
    rpc::AddBearer(&ctx, c->token());
    auto reader = c->stub()->WatchRun(&ctx, req);
    v1::RunUpdate u;
    while (reader->Read(&u)) {
      if (lost) {
        end_line();
        std::fprintf(stderr, "forgectl: reconnected to the coordinator after %.1f s\n",
                     std::chrono::duration<double>(Clock::now() - lost_at).count());
        lost = false;
      }
      first = false;
      reached = true;
      backoff_s = 0.25;
      last = u.run();
      if (g.json) {
        std::printf("%s\n", Json(u).c_str());
        std::fflush(stdout);
        continue;
      }
      for (const v1::RunEvent& e : u.events()) {
        if (e.id() <= last_event) continue;  // seen before the coordinator went away
        last_event = e.id();
        if (tty && printed_line) std::printf("\r\033[K");
        std::printf("%s\n", EventLine(e).c_str());
        printed_line = false;
      }
      if (tty) {
        std::printf("\r\033[K%s", ProgressLine(u.run()).c_str());
        printed_line = true;
      } else if (!u.steps().empty() || Terminal(u.run().state())) {
        std::printf("%s\n", ProgressLine(u.run()).c_str());
      }
      std::fflush(stdout);
    }
    grpc::Status s = reader->Finish();
    if (s.ok() || Terminal(last.state())) break;
    // A graceful shutdown ends open streams with CANCELLED (under Slurm scancel's SIGTERM
    // reaches the coordinator before forge-job.sh restarts it): reconnect, as after kill -9.
    if (!rpc::IsTransient(s.error_code())) {
      end_line();
      return Fail(s);
    }
    const auto now = Clock::now();
    if (!lost) {
      lost = true;
      lost_at = told_at = now;
      end_line();
      std::fprintf(stderr, "forgectl: %s the coordinator (%s: %s); %s\n",
                   reached ? "lost" : "cannot reach", rpc::GrpcCodeName(s.error_code()),
                   s.error_message().c_str(), reached ? "reconnecting" : "retrying");
    }
    const double away = std::chrono::duration<double>(now - lost_at).count();
    if (away > (reached ? reconnect_s : std::min(reconnect_s, 20.0))) {
      end_line();
      return Fail(std::string("gave up ") + (reached ? "reconnecting" : "trying") +
                  " to reach the coordinator after " +
                  std::to_string(int(away)) + " s (" + rpc::GrpcCodeName(s.error_code()) +
                  ": " + s.error_message() + ")");
    }
    if (std::chrono::duration<double>(now - told_at).count() >= 30) {
      told_at = now;
      std::fprintf(stderr, "forgectl: still reconnecting (%d s so far)\n", int(away));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(int(backoff_s * 1000)));
    backoff_s = std::min(5.0, backoff_s * 2);
  }
  end_line();
  if (!g.json && last.state() == v1::FAILED)
    std::fprintf(stderr, "forgectl: run %s FAILED: %s\n", run_id.c_str(),
                 last.state_reason().c_str());
  return last.state() == v1::FAILED ? 1 : 0;
}

// --reconnect-for S (default 600): how long watch keeps trying to reach a coordinator that
// went away.
Status ReconnectSeconds(const FlagParser& flags, double* out) {
  *out = 600;
  FORGE_RETURN_IF_ERROR(flags.GetDouble("--reconnect-for", out));
  if (*out < 0) return Status::Invalid("--reconnect-for: must be >= 0, got " + flags.Get("--reconnect-for"));
  return Status::Ok();
}

// Runs a command whose flags and positional arguments were checked already.
int Dispatch(const Global& g, const std::string& name, const FlagParser& cmd, Client* c) {
  const std::vector<std::string>& p = cmd.positional();
  if (name == "submit") {
    auto text = ReadSmallFile(p[0]);
    if (!text.ok()) return Fail(text.status().ToString());
    v1::SubmitRunRequest req;
    req.set_spec_yaml(*text);
    req.set_source(p[0]);
    v1::Run run;
    if (auto s = c->Call(&v1::RunService::Stub::SubmitRun, req, &run); !s.ok()) return Fail(s);
    if (g.json) std::printf("%s\n", Json(run).c_str());
    else std::printf("submitted %s (%s)\n", run.id().c_str(), StateName(run.state()));
    std::fflush(stdout);
    double reconnect_s = 0;
    (void)ReconnectSeconds(cmd, &reconnect_s);  // checked before connecting
    return cmd.Has("--watch") ? Watch(g, c, run.id(), true, reconnect_s) : 0;
  }
  if (name == "stop") {
    auto req = ForRun<v1::StopRunRequest>(p[0]);
    req.set_immediate(cmd.Has("--now"));
    return CallAndPrintRun(g, c, &v1::RunService::Stub::StopRun, req, "stopping");
  }
  if (name == "resume") {
    auto req = ForRun<v1::ResumeRunRequest>(p[0]);
    req.set_checkpoint(cmd.Get("--checkpoint"));
    int workers = 0;
    (void)cmd.GetInt("--workers", &workers);  // checked before connecting
    req.set_workers(workers);
    return CallAndPrintRun(g, c, &v1::RunService::Stub::ResumeRun, req, "resumed");
  }
  if (name == "checkpoint") {
    return CallAndPrintRun(g, c, &v1::RunService::Stub::CheckpointRun,
                           ForRun<v1::CheckpointRunRequest>(p[0]), "checkpoint requested for");
  }
  if (name == "status") {
    return CallAndPrintRun(g, c, &v1::RunService::Stub::GetRun, ForRun<v1::GetRunRequest>(p[0]),
                           nullptr);
  }
  if (name == "list") {
    v1::ListRunsRequest req;
    req.set_active_only(cmd.Has("--active"));
    return CallAndPrint(g, c, &v1::RunService::Stub::ListRuns, req,
                        [](const v1::ListRunsResponse& resp) {
                          for (const v1::Run& r : resp.runs()) PrintRunLine(r);
                          if (resp.runs().empty()) std::printf("no runs\n");
                        });
  }
  if (name == "watch") {
    double reconnect_s = 0;
    (void)ReconnectSeconds(cmd, &reconnect_s);  // checked before connecting
    return Watch(g, c, p[0], cmd.Has("--history"), reconnect_s);
  }
  if (name == "checkpoints") {
    return CallAndPrint(
        g, c, &v1::RunService::Stub::ListCheckpoints, ForRun<v1::ListCheckpointsRequest>(p[0]),
        [](const v1::ListCheckpointsResponse& resp) {
          for (const v1::Checkpoint& k : resp.checkpoints())
            std::printf("step_%-8ld %d rank(s)  %10.1f MB  %s  %s\n", long(k.step()),
                        k.world_size(), double(k.bytes()) / 1e6,
                        FormatUtcTime(k.committed_unix_ms()).c_str(), k.dir().c_str());
          if (resp.checkpoints().empty()) std::printf("no checkpoints\n");
        });
  }
  if (name == "data") {
    return CallAndPrint(g, c, &v1::RunService::Stub::GetDataPlan,
                        ForRun<v1::GetDataPlanRequest>(p[0]), PrintDataPlan);
  }
  if (name == "export") {
    auto req = ForRun<v1::ExportCheckpointRequest>(p[0]);
    req.set_checkpoint(cmd.Get("--checkpoint"));
    req.set_output(cmd.Get("--out"));
    req.set_bf16(cmd.Has("--bf16"));
    req.set_format(cmd.Get("--format"));
    return CallAndPrint(g, c, &v1::RunService::Stub::ExportCheckpoint, req,
                        [](const v1::ExportCheckpointResponse& resp) {
                          std::printf("exported step_%ld to %s (%.1f MB)\n", long(resp.step()),
                                      resp.path().c_str(), double(resp.bytes()) / 1e6);
                        });
  }
  if (name == "report") {
    auto req = ForRun<v1::GetRunHistoryRequest>(p[0]);
    v1::RunHistory history;
    if (auto s = c->Call(&v1::RunService::Stub::GetRunHistory, req, &history); !s.ok())
      return Fail(s);
    const std::string path = cmd.Get("--out", p[0] + ".html");
    if (Status s = WriteFileAtomic(path, RenderRunReportHtml(history)); !s.ok())
      return Fail(s.ToString());
    std::printf("wrote %s: run %s, %d step records, %d events\n", path.c_str(), p[0].c_str(),
                history.steps_size(), history.events_size());
    return 0;
  }
  return Fail("no command " + name);  // kCommands names only commands handled above
}

// The values Dispatch reads, checked before anything is sent.
Status CheckValues(const FlagParser& cmd) {
  double reconnect_s = 0;
  FORGE_RETURN_IF_ERROR(ReconnectSeconds(cmd, &reconnect_s));
  int workers = 0;
  FORGE_RETURN_IF_ERROR(cmd.GetInt("--workers", &workers));
  if (workers < 0) return Status::Invalid("--workers: must be >= 0, got " + cmd.Get("--workers"));
  return Status::Ok();
}

}  // namespace
}  // namespace forge::cli

int main(int argc, char** argv) {
  using namespace forge;
  using namespace forge::cli;
  // The command is the first argument that is neither a flag nor a global flag's value.
  int at = 0;
  for (int i = 1; i < argc && at == 0; ++i) {
    const std::string_view a = argv[i];
    if (a == "--coordinator" || a == "--token-file" || a == "--tls-ca") ++i;
    else if (a.size() < 2 || a[0] != '-') at = i;
  }
  if (at == 0) {  // forgectl, forgectl --help, forgectl --version
    FlagParser top = TopFlags();
    if (int rc; top.ParseOrExit(argc, argv, 1, &rc)) return rc;
    std::fputs(top.Usage().c_str(), stderr);
    return 2;
  }
  const Command* command = FindCommand(argv[at]);
  if (command == nullptr) {
    std::vector<std::string_view> names;
    for (const Command& c : kCommands) names.push_back(c.name);
    return UsageError("forgectl", UnknownCommand(argv[at], names));
  }
  // Every argument but the command's name, global flags included.
  std::vector<char*> args(argv, argv + argc);
  args.erase(args.begin() + at);
  FlagParser flags = CommandFlags(*command);
  if (int rc; flags.ParseOrExit(int(args.size()), args.data(), 1, &rc)) return rc;
  if (Status s = CheckValues(flags); !s.ok()) return flags.UsageError(s);
  Global g;
  g.json = flags.Has("--json");
  auto options = rpc::CoordinatorChannel(flags);
  if (!options.ok()) return Fail(options.status().message());
  auto token = rpc::LoadSecret(flags, rpc::kUserToken);
  if (!token.ok()) return Fail(token.status().ToString());
  auto channel = rpc::MakeChannel(*options);
  if (!channel.ok()) return Fail(channel.status().ToString());
  Client client(*channel, *token);
  return Dispatch(g, command->name, flags, &client);
}
