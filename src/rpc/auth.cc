#include "rpc/auth.h"

#include <cstdlib>
#include <random>

#include "common/file_io.h"

namespace forge::rpc {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

grpc::Status CheckBearer(const grpc::ServerContext& ctx, const std::string& expected,
                         std::string_view api) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kAuthMetadataKey);
  if (it == md.end())
    return {grpc::StatusCode::UNAUTHENTICATED,
            std::string(api) + ": missing credentials (authorization: Bearer <token>)"};
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.substr(0, kPrefix.size()) != kPrefix ||
      !ConstantTimeEquals(value.substr(kPrefix.size()), expected))
    return {grpc::StatusCode::UNAUTHENTICATED, std::string(api) + ": invalid credentials"};
  return grpc::Status::OK;
}

void AddBearer(grpc::ClientContext* ctx, const std::string& secret) {
  ctx->AddMetadata(kAuthMetadataKey, "Bearer " + secret);
}

StatusOr<std::string> LoadSecret(const std::string& file, const char* env, std::string_view what) {
  std::string secret;
  if (!file.empty()) {
    FORGE_ASSIGN_OR_RETURN(secret, ReadSmallFile(file));
  } else if (const char* v = std::getenv(env); v != nullptr) {
    secret = v;
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                             secret.back() == ' ' || secret.back() == '\t'))
    secret.pop_back();
  if (secret.empty())
    return Status::Invalid(std::string(what) + ": no secret given (" +
                           (file.empty() ? std::string("set ") + env + " or pass a file"
                                         : "file " + file + " is empty") +
                           ")");
  return secret;
}

std::string RandomSecret() {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) {
    const unsigned v = rd() & 0xff;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

}  // namespace forge::rpc
