#include "rpc/connection_flags.h"

#include <cstdlib>

#include "rpc/auth.h"

namespace forge::rpc {

void AddSecretFlag(FlagParser* flags, const SecretSource& secret) {
  flags->Value(secret.flag, "FILE",
               std::string("the ") + secret.what + " (default $" + secret.env + ")");
}

StatusOr<std::string> LoadSecret(const FlagParser& flags, const SecretSource& secret) {
  return LoadSecret(flags.Get(secret.flag), secret.env, secret.what);
}

void AddCoordinatorFlags(FlagParser* flags) {
  flags->Value("--coordinator", "HOST:PORT", "the coordinator (default $FORGE_COORDINATOR)");
  flags->Value("--tls-ca", "FILE", "talk TLS to the coordinator, trusting this CA certificate");
}

StatusOr<ChannelOptions> CoordinatorChannel(const FlagParser& flags) {
  ChannelOptions channel;
  if (const char* a = std::getenv("FORGE_COORDINATOR")) channel.address = a;
  channel.address = flags.Get("--coordinator", channel.address);
  channel.tls_ca_file = flags.Get("--tls-ca");
  if (channel.address.empty())
    return Status::Invalid("no coordinator address: pass --coordinator or set FORGE_COORDINATOR");
  return channel;
}

}  // namespace forge::rpc
