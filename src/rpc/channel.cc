#include "rpc/channel.h"

#include <thread>

#include "common/file_io.h"

namespace forge::rpc {

StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options) {
  if (options.address.empty()) return Status::Invalid("no coordinator address given");
  grpc::ChannelArguments args;
  // Reconnect quickly after a coordinator restart instead of gRPC's default of up to 120 s.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  // A failed connection makes the channel re-resolve the address, and the DNS resolver waits
  // at least this long between resolutions (default 30 s, in practice ~4 s of failed calls
  // here): after a coordinator restart workers missed heartbeat timeouts waiting on it.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls_ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    FORGE_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(options.tls_ca_file));
    creds = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(options.address, creds, args);
}

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  const std::string msg = std::string(what) + ": " + GrpcCodeName(s.error_code()) + ": " +
                          s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: return Status::Invalid(msg);
    case grpc::StatusCode::NOT_FOUND: return Status::NotFound(msg);
    case grpc::StatusCode::FAILED_PRECONDITION: return Status::Precondition(msg);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED: return Status::Unavailable(msg);
    case grpc::StatusCode::DATA_LOSS: return Status::DataLoss(msg);
    default: return Status::Internal(msg);
  }
}

bool IsTransient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::CANCELLED;
}

grpc::Status CallWithRetry(
    const RetryPolicy& policy,
    const std::function<grpc::Status(std::chrono::system_clock::time_point)>& attempt) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double backoff = policy.initial_backoff_s;
  for (;;) {
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(int64_t(policy.call_timeout_s * 1000));
    grpc::Status s = attempt(deadline);
    if (!IsTransient(s.error_code())) return s;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (policy.give_up_after_s >= 0 && waited + backoff > policy.give_up_after_s) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(backoff * 1000)));
    backoff = std::min(policy.max_backoff_s, backoff * 2);
  }
}

}  // namespace forge::rpc
