// Client side of the coordinator: a channel (plain or TLS) and retrying calls with backoff, so
// workers and forgectl ride out a coordinator restart.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace forge::rpc {

struct ChannelOptions {
  std::string address;      // host:port
  std::string tls_ca_file;  // "" = plaintext; else verify the server against this CA (PEM)
};

StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options);

// A gRPC status as a Status ("UNAUTHENTICATED: user API: invalid credentials").
Status FromGrpc(const grpc::Status& s, std::string_view what);
// The canonical upper-case name of a gRPC code ("NOT_FOUND").
const char* GrpcCodeName(grpc::StatusCode code);

struct RetryPolicy {
  double initial_backoff_s = 0.1;
  double max_backoff_s = 2.0;
  double give_up_after_s = 120.0;  // < 0: never
  double call_timeout_s = 10.0;    // deadline of each attempt
};

// Whether a call that ended with `code` may succeed when made again: UNAVAILABLE (no server,
// or one going down), DEADLINE_EXCEEDED, and CANCELLED, which our clients never cause
// themselves (no TryCancel): it is a server's graceful shutdown ending the calls in flight.
bool IsTransient(grpc::StatusCode code);

// Calls `attempt` (which must build a fresh ClientContext from the deadline it is given) until
// it returns a status that is not transient (IsTransient), backing off exponentially in
// between; gives up after policy.give_up_after_s with the last status.
grpc::Status CallWithRetry(const RetryPolicy& policy,
                           const std::function<grpc::Status(std::chrono::system_clock::time_point
                                                                deadline)>& attempt);

}  // namespace forge::rpc
