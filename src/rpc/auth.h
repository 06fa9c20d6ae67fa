// Bearer-token credentials for the coordinator's two APIs: the user token (forgectl) and the
// workers' join secret. Both travel as `authorization: Bearer <secret>` call metadata (over
// TLS when the coordinator serves it) and are compared in constant time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace forge::rpc {

inline constexpr const char* kAuthMetadataKey = "authorization";

// Equal length and bytes, in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// OK when the call carries "Bearer <expected>"; UNAUTHENTICATED (naming what was missing, never
// the secret) otherwise. `api` names the API in the message ("user API", "worker API").
grpc::Status CheckBearer(const grpc::ServerContext& ctx, const std::string& expected,
                         std::string_view api);

// Adds the bearer metadata to a client call.
void AddBearer(grpc::ClientContext* ctx, const std::string& secret);

// A secret from `file` (trailing whitespace trimmed) when given, else from environment variable
// `env`; InvalidArgument when neither yields a non-empty secret (naming both sources).
StatusOr<std::string> LoadSecret(const std::string& file, const char* env, std::string_view what);

// 32 random bytes as 64 hex characters (std::random_device), for generated secrets.
std::string RandomSecret();

}  // namespace forge::rpc
