#include "worker/parallel/bootstrap.h"

#include <cstdlib>

namespace forge {
namespace {

// Parses an environment integer; absent or empty: *present = false, *out untouched.
Status ReadInt(GetEnvFn env, const char* name, bool* present, int* out) {
  const char* v = env(name);
  *present = v != nullptr && *v != '\0';
  if (!*present) return Status::Ok();
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24))
    return Status::Invalid(std::string("environment variable ") + name +
                           ": expected a non-negative integer, got \"" + v + "\"");
  *out = static_cast<int>(x);
  return Status::Ok();
}

// Reads rank/world/local rank from three variables; *found = the rank and world were set.
Status ReadTriple(GetEnvFn env, const char* rank_var, const char* world_var, const char* local_var,
                  bool* found, LaunchInfo* info) {
  bool has_rank = false, has_world = false, has_local = false;
  FORGE_RETURN_IF_ERROR(ReadInt(env, rank_var, &has_rank, &info->rank));
  FORGE_RETURN_IF_ERROR(ReadInt(env, world_var, &has_world, &info->world));
  FORGE_RETURN_IF_ERROR(ReadInt(env, local_var, &has_local, &info->local_rank));
  *found = has_rank && has_world;
  if (!*found) return Status::Ok();
  if (!has_local) info->local_rank = info->rank;
  if (info->world < 1 || info->rank >= info->world)
    return Status::Invalid(std::string(rank_var) + "=" + std::to_string(info->rank) +
                           " is outside [0, " + world_var + "=" + std::to_string(info->world) +
                           ")");
  return Status::Ok();
}

}  // namespace

const char* LaunchKindName(LaunchKind k) {
  switch (k) {
    case LaunchKind::kSingle: return "single";
    case LaunchKind::kMpi: return "mpi";
    case LaunchKind::kSlurm: return "slurm";
    case LaunchKind::kTorchrun: return "torchrun";
  }
  return "?";
}

StatusOr<LaunchInfo> DetectLaunch(GetEnvFn env) {
  if (env == nullptr) env = [](const char* n) -> const char* { return std::getenv(n); };
  LaunchInfo info;
  bool found = false;
  // Open MPI's mpirun.
  FORGE_RETURN_IF_ERROR(ReadTriple(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK", &found, &info));
  if (found) {
    info.kind = LaunchKind::kMpi;
    return info;
  }
  // srun --mpi=pmix: PMIx gives the rank, Slurm the sizes.
  if (const char* p = env("PMIX_RANK"); p != nullptr && *p != '\0') {
    FORGE_RETURN_IF_ERROR(
        ReadTriple(env, "PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", &found, &info));
    if (found) {
      info.kind = LaunchKind::kMpi;
      return info;
    }
  }
  FORGE_RETURN_IF_ERROR(
      ReadTriple(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &found, &info));
  if (found) {
    info.kind = LaunchKind::kSlurm;
    return info;
  }
  FORGE_RETURN_IF_ERROR(ReadTriple(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", &found, &info));
  if (found) {
    info.kind = LaunchKind::kTorchrun;
    return info;
  }
  return LaunchInfo{};
}

}  // namespace forge
