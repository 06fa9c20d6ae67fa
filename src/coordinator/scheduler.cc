#include "coordinator/scheduler.h"

#include <map>

namespace forge::coord {

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
  // Workers launched alone, in join order.
  std::vector<std::string> picked;
  for (const PoolWorker& w : idle) {
    if (w.group_size > 1 && !w.group_id.empty()) continue;
    if (world > 1 && w.device.rfind("cuda", 0) != 0) continue;
    picked.push_back(w.id);
    if (int(picked.size()) == world) break;
  }
  if (int(picked.size()) == world) {
    p.worker_ids = std::move(picked);
    p.comm_id_from_coordinator = world > 1;
  }
  return p;
}

}  // namespace forge::coord
