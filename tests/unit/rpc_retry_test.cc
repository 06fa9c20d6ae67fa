// rpc::CallWithRetry and FromGrpc: which gRPC outcomes a worker or forgectl rides out (retries)
// and which end the call, so a coordinator restart, hard or graceful, loses no worker.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <vector>

#include "rpc/channel.h"

namespace forge {
namespace {

rpc::RetryPolicy Fast() {
  rpc::RetryPolicy p;
  p.initial_backoff_s = 0.001;
  p.max_backoff_s = 0.002;
  p.give_up_after_s = 5.0;
  p.call_timeout_s = 1.0;
  return p;
}

// Plays `codes` in order, one per attempt, then OK.
grpc::Status Replay(const std::vector<grpc::StatusCode>& codes, int* attempts) {
  return rpc::CallWithRetry(Fast(), [&](std::chrono::system_clock::time_point) {
    const int i = (*attempts)++;
    return i < int(codes.size()) ? grpc::Status(codes[size_t(i)], "scripted")
                                 : grpc::Status::OK;
  });
}

TEST(RpcRetry, RidesOutACoordinatorRestartHardOrGraceful) {
  int attempts = 0;
  // kill -9: UNAVAILABLE; a graceful shutdown ends calls in flight with CANCELLED.
  const grpc::Status s =
      Replay({grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED,
              grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::CANCELLED},
             &attempts);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(attempts, 5);
  EXPECT_TRUE(rpc::IsTransient(grpc::StatusCode::CANCELLED));
}

TEST(RpcRetry, AnswersThatAreNotTransientEndTheCall) {
  for (const grpc::StatusCode code :
       {grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::UNAUTHENTICATED,
        grpc::StatusCode::NOT_FOUND, grpc::StatusCode::FAILED_PRECONDITION,
        grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::INTERNAL}) {
    int attempts = 0;
    const grpc::Status s = Replay({code}, &attempts);
    EXPECT_EQ(s.error_code(), code) << rpc::GrpcCodeName(code);
    EXPECT_EQ(attempts, 1) << rpc::GrpcCodeName(code);
    EXPECT_FALSE(rpc::IsTransient(code)) << rpc::GrpcCodeName(code);
  }
}

TEST(RpcRetry, GivesUpOnTransientFailuresAfterItsLimit) {
  rpc::RetryPolicy p = Fast();
  p.give_up_after_s = 0.05;
  int attempts = 0;
  const grpc::Status s = rpc::CallWithRetry(p, [&](std::chrono::system_clock::time_point) {
    ++attempts;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
  });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_GT(attempts, 1);
}

TEST(RpcRetry, StatusCodesNameTheCallAndMapToOurs) {
  const Status cancelled = rpc::FromGrpc(grpc::Status(grpc::StatusCode::CANCELLED, "bye"),
                                         "heartbeat");
  EXPECT_EQ(cancelled.code(), Code::kUnavailable) << cancelled.ToString();
  EXPECT_NE(cancelled.ToString().find("heartbeat: CANCELLED: bye"), std::string::npos)
      << cancelled.ToString();
  EXPECT_EQ(rpc::FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "x"), "run").code(),
            Code::kNotFound);
  EXPECT_TRUE(rpc::FromGrpc(grpc::Status::OK, "ok").ok());
}

}  // namespace
}  // namespace forge
