// The command-line flags of the coordinator's connection and credentials, declared once so
// that every program (forge-worker, forge-coordinator, forgectl) names, explains and reads
// them alike.
#pragma once

#include <string>

#include "common/flags.h"
#include "common/status.h"
#include "rpc/channel.h"

namespace forge::rpc {

// A secret's file flag, the environment variable read without it, and what it is.
struct SecretSource {
  const char* flag;
  const char* env;
  const char* what;
};
inline constexpr SecretSource kJoinSecret{"--join-secret-file", "FORGE_JOIN_SECRET",
                                          "join secret"};
inline constexpr SecretSource kUserToken{"--token-file", "FORGE_TOKEN", "user token"};

// "--join-secret-file FILE  the join secret (default $FORGE_JOIN_SECRET)".
void AddSecretFlag(FlagParser* flags, const SecretSource& secret);
// The secret from the flag's file, else from its environment variable (LoadSecret).
StatusOr<std::string> LoadSecret(const FlagParser& flags, const SecretSource& secret);

// --coordinator HOST:PORT and --tls-ca FILE: the coordinator a client talks to.
void AddCoordinatorFlags(FlagParser* flags);
// The channel they name: the address from --coordinator, else $FORGE_COORDINATOR (Invalid when
// neither gives one).
StatusOr<ChannelOptions> CoordinatorChannel(const FlagParser& flags);

}  // namespace forge::rpc
