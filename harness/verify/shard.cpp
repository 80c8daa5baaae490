// Shard assignment; see shard.h.
#include "harness/verify/shard.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "harness/verify/baseline.h"

namespace rh {

ShardSpec parse_shard(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("--shard '" + text + "': expected I/N with 1 <= I <= N <= 1024, e.g. 2/4");
  };
  const auto slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= text.size()) throw bad();
  const auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::string i = text.substr(0, slash), n = text.substr(slash + 1);
  if (!digits(i) || !digits(n)) throw bad();
  ShardSpec s{std::stoi(i), std::stoi(n)};
  if (s.index < 1 || s.count < 1 || s.index > s.count || s.count > 1024) throw bad();
  return s;
}

namespace {

// Union-find over the plan's baselines.
struct Groups {
  std::vector<size_t> parent;
  explicit Groups(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), size_t{0}); }
  size_t find(size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void join(size_t a, size_t b) {
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

}   // namespace

ShardPlan plan_shards(const std::vector<Scenario>& sel, int count) {
  if (count < 1) throw std::invalid_argument("plan_shards: count must be >= 1");
  std::vector<Scenario> builtin;
  std::vector<size_t> index;
  for (size_t i = 0; i < sel.size(); ++i)
    if (!sel[i].trainer) builtin.push_back(sel[i]), index.push_back(i);
  const CheckPlan plan = plan_checks(builtin, "baselines");   // only the grouping is used
  Groups g(plan.baselines.size());
  for (const auto& c : plan.cells) g.join(c.baseline, c.reference);

  // A group: its first scenario (the order key for ties), its members, its cost.
  struct Group {
    size_t first = 0;
    std::vector<size_t> members;
    int64_t cost = 0;
  };
  std::vector<Group> groups;
  std::vector<long> group_of_root(plan.baselines.size(), -1);
  std::vector<bool> baseline_counted(plan.baselines.size(), false);
  for (const auto& c : plan.cells) {
    const size_t root = g.find(c.baseline);
    if (group_of_root[root] < 0) {
      group_of_root[root] = static_cast<long>(groups.size());
      groups.push_back({index[c.scenario], {}, 0});
    }
    Group& grp = groups[static_cast<size_t>(group_of_root[root])];
    grp.members.push_back(index[c.scenario]);
    for (size_t b : {c.baseline, c.reference})
      if (!baseline_counted[b]) {
        baseline_counted[b] = true;
        grp.cost += plan.baselines[b].cfg.train.iterations * plan.baselines[b].dp_size;
      }
    const Scenario& s = sel[index[c.scenario]];
    grp.cost += std::max<int64_t>(0, s.cfg.train.iterations - s.save_at) * s.resume_dp();
  }
  for (size_t i = 0; i < sel.size(); ++i) {
    if (!sel[i].trainer) continue;
    const Scenario& s = sel[i];
    const int64_t N = s.cfg.train.iterations;
    int64_t cost = N * std::max(1, s.trainer->determinism_runs) + N;
    if (s.trainer->round_trip) cost += std::max<int64_t>(0, N - s.save_at);
    groups.push_back({i, {i}, cost});
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return a.cost != b.cost ? a.cost > b.cost : a.first < b.first;
  });
  ShardPlan out;
  out.shard_of.assign(sel.size(), 0);
  out.cost.assign(static_cast<size_t>(count), 0);
  for (const auto& grp : groups) {
    const size_t k = static_cast<size_t>(std::min_element(out.cost.begin(), out.cost.end()) - out.cost.begin());
    out.cost[k] += grp.cost;
    for (size_t m : grp.members) out.shard_of[m] = static_cast<int>(k) + 1;
  }
  return out;
}

}   // namespace rh
