#include "collectives/timing/collective_cost_model.h"

#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/runtime/machine.h"
#include "sim/simulator.h"
#include "topology/network.h"

namespace shardsim {

std::shared_ptr<const CollectiveTiming> NetworkCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  ++simulations_;
  auto timing = std::make_shared<CollectiveTiming>();
  timing->member_time.assign(mesh.size(), Time());
  const Topology& topo = machine_.topology();
  Simulator sim;
  Network network(sim, topo, machine_.router());
  std::vector<int> axis_sizes;
  for (int a : request.axes) axis_sizes.push_back(mesh.axes()[a].size);
  std::vector<std::vector<int>> groups = mesh.Groups(request.axes);
  std::vector<CollectiveJob> jobs(groups.size());
  std::vector<std::unique_ptr<CollectiveAlgorithm>> algorithms;
  for (size_t g = 0; g < groups.size(); ++g) {
    CollectiveJob& job = jobs[g];
    int n = static_cast<int>(groups[g].size());
    job.kind = request.kind;
    job.reduce = request.reduce;
    job.dtype = request.dtype;
    job.numerics = false;
    for (int p : groups[g]) job.members.push_back(topo.device_vertex(mesh.device(p)));
    job.total = request.elements;
    bool chunked = job.kind == CollectiveKind::kReduceScatter ||
                   job.kind == CollectiveKind::kAllToAll;
    job.block = chunked ? request.elements / n : request.elements;
    job.destination = request.destination;
    const std::vector<int>& positions = groups[g];
    job.on_member_done = [&sim, timing, &positions](int member) {
      timing->member_time[positions[member]] = sim.Now();
    };
    std::string resolved;
    algorithms.push_back(MakeAlgorithm(request.algorithm, network, job, axis_sizes, &resolved,
                                       request.chunk_size));
    if (timing->algorithm.empty()) timing->algorithm = resolved;
  }
  for (auto& algorithm : algorithms) algorithm->Start();
  sim.Run();
  Time longest;
  for (Time t : timing->member_time) longest = std::max(longest, t);
  for (LinkId l = 0; l < static_cast<LinkId>(topo.links().size()); ++l) {
    if (network.link_bytes(l) <= 0 || longest == Time()) continue;
    timing->links.push_back(l);
    double capacity = topo.links()[l].bandwidth.bytes_per_second() * longest.seconds();
    timing->link_share.push_back(std::min(1.0, network.link_bytes(l) / capacity));
  }
  return timing;
}

std::shared_ptr<const CollectiveTiming> CachedCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  // The key: every field of the request, then the mesh (axis sizes and each position's
  // device). Algorithm names are spelled out character by character.
  std::vector<int64_t> key = {static_cast<int64_t>(request.kind),
                              static_cast<int64_t>(request.reduce),
                              static_cast<int64_t>(request.dtype), request.elements,
                              request.chunk_size.count(),
                              static_cast<int64_t>(request.algorithm.size())};
  for (char c : request.algorithm) key.push_back(c);
  key.push_back(static_cast<int64_t>(request.axes.size()));
  key.insert(key.end(), request.axes.begin(), request.axes.end());
  key.push_back(static_cast<int64_t>(request.destination.size()));
  key.insert(key.end(), request.destination.begin(), request.destination.end());
  key.push_back(static_cast<int64_t>(mesh.axes().size()));
  for (const MeshAxis& axis : mesh.axes()) key.push_back(axis.size);
  for (int p = 0; p < mesh.size(); ++p) key.push_back(mesh.device(p));
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  std::shared_ptr<const CollectiveTiming> timing = inner_.Estimate(mesh, request);
  cache_.emplace(std::move(key), timing);
  return timing;
}

}  // namespace shardsim
