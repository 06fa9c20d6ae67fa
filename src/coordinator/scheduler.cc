#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdlib>
#include <map>

namespace forge::coord {
namespace {

// N of "cuda:N" (0 for "cuda" and "cpu").
int GpuIndex(const std::string& device) {
  const size_t colon = device.find(':');
  return colon == std::string::npos ? 0 : std::atoi(device.c_str() + colon + 1);
}

}  // namespace

bool StandaloneGpu(const std::string& device, const std::string& group_id, int group_size) {
  return (group_size <= 1 || group_id.empty()) && device.rfind("cuda", 0) == 0;
}

Placement PlaceRun(const std::vector<PoolWorker>& idle, int world) {
  Placement p;
  if (world < 1) return p;
  // Whole launch groups of exactly `world` members, all idle.
  std::map<std::string, std::vector<const PoolWorker*>> groups;
  for (const PoolWorker& w : idle)
    if (w.group_size > 1 && !w.group_id.empty()) groups[w.group_id].push_back(&w);
  for (const auto& [id, members] : groups) {
    if (members.front()->group_size != world || int(members.size()) != world) continue;
    std::vector<std::string> by_rank(world);
    bool ok = true;
    for (const PoolWorker* w : members) {
      if (w->group_rank < 0 || w->group_rank >= world || !by_rank[w->group_rank].empty())
        ok = false;
      else
        by_rank[w->group_rank] = w->id;
    }
    if (ok) {
      p.worker_ids = std::move(by_rank);
      return p;
    }
  }
  // Workers launched alone, in join order, one per GPU (a worker relaunched on a GPU whose
  // old worker is not yet timed out must not share it: NCCL takes one rank per device).
  std::vector<const PoolWorker*> picked;
  for (const PoolWorker& w : idle) {
    if (w.group_size > 1 && !w.group_id.empty()) continue;
    if (world > 1 && w.device.rfind("cuda", 0) != 0) continue;
    if (world > 1 && std::any_of(picked.begin(), picked.end(), [&](const PoolWorker* p) {
          return p->host == w.host && p->device == w.device;
        }))
      continue;
    picked.push_back(&w);
    if (int(picked.size()) == world) break;
  }
  if (int(picked.size()) == world) {
    std::stable_sort(picked.begin(), picked.end(), [](const PoolWorker* a, const PoolWorker* b) {
      if (a->host != b->host) return a->host < b->host;
      return GpuIndex(a->device) < GpuIndex(b->device);
    });
    for (const PoolWorker* w : picked) p.worker_ids.push_back(w->id);
    p.comm_id_from_coordinator = world > 1;
  }
  return p;
}

}  // namespace forge::coord
