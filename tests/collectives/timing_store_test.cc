// TimingStore and StoredCollectiveModel: a timing read back equals the simulated one to the
// bit; an entry answers only the machine, code version, mesh placement and request it was made
// for; a damaged entry reads as a miss; a model behind a store simulates nothing a store holds
// (a plan search with a store: tests/planner/search/plan_search_test.cc).
#include "collectives/timing/timing_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/profile_symmetry.h"
#include "collectives/timing/stored_collective_model.h"
#include "tests/support/same_timing.h"
#include "tests/support/shuffled_groups.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

namespace fs = std::filesystem;
using test::ExpectSameTiming;

// A fresh directory for one test, removed after it.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("shardsim_store_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

CollectiveRequest Request(CollectiveKind kind, std::vector<int> axes, const std::string& algorithm,
                          int64_t elements = 3 << 14) {
  CollectiveRequest r;
  r.kind = kind;
  r.dtype = DType::kBF16;
  r.elements = elements;
  r.axes = std::move(axes);
  r.algorithm = algorithm;
  return r;
}

Topology V5p(std::optional<Bandwidth> bandwidth = std::nullopt) {
  HardwareSpec spec;
  spec.preset = "tpu-v5p";
  spec.shape = {4, 4, 8};
  spec.link.bandwidth = bandwidth;
  return BuildHardware(spec);
}

// Timings of several kinds (rings whose groups share links, torus_2d, a tree, a permute with
// idle members) saved and loaded: every field as simulated, to the bit.
TEST(TimingStoreTest, ReadsBackWhatWasSimulated) {
  TempDir dir("round_trip");
  Machine machine(V5p());
  const TimingStore store(dir.str(), "test", machine.topology());
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  CollectiveRequest permute = Request(CollectiveKind::kPermute, {1}, "auto");
  permute.destination = {1, 2, 3, -1};
  for (const CollectiveRequest& request :
       {Request(CollectiveKind::kAllReduce, {0}, "ring"),
        Request(CollectiveKind::kAllGather, {0, 1}, "torus_2d"),
        Request(CollectiveKind::kReduceScatter, {1}, "auto", 1 << 20),
        Request(CollectiveKind::kAllReduce, {0}, "tree", 1024), permute}) {
    NetworkCollectiveModel model(machine);
    std::shared_ptr<const CollectiveTiming> simulated = model.Estimate(mesh, request);
    ASSERT_FALSE(simulated->profile->links.empty());
    EXPECT_EQ(store.Load(mesh, request), nullptr);
    store.Save(mesh, request, *simulated);
    std::shared_ptr<const CollectiveTiming> loaded = store.Load(mesh, request);
    ASSERT_NE(loaded, nullptr) << simulated->algorithm;
    ExpectSameTiming(*loaded, *simulated, simulated->algorithm);
  }
}

// An entry answers only its own key: another code version, a machine with another link figure,
// another placement of the same axes, or a request differing in any field misses it.
TEST(TimingStoreTest, AnswersOnlyItsOwnKey) {
  TempDir dir("keys");
  Machine machine(V5p());
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  const CollectiveRequest request = Request(CollectiveKind::kAllReduce, {0}, "ring");
  NetworkCollectiveModel model(machine);
  const TimingStore store(dir.str(), "build-1", machine.topology());
  store.Save(mesh, request, *model.Estimate(mesh, request));
  ASSERT_NE(store.Load(mesh, request), nullptr);

  const TimingStore other_build(dir.str(), "build-2", machine.topology());
  EXPECT_EQ(other_build.Load(mesh, request), nullptr);
  // Each build's entries in a folder of its own inside the directory.
  EXPECT_NE(other_build.dir(), store.dir());
  EXPECT_EQ(fs::path(store.dir()).parent_path(), fs::path(dir.str()));
  const Topology slower = V5p(Bandwidth::BytesPerSecond(8.9e10));
  EXPECT_EQ(TimingStore(dir.str(), "build-1", slower).Load(mesh, request), nullptr);
  Topology other_comm = V5p();
  CommSpec comm = other_comm.comm();
  comm.multipath = !comm.multipath;
  other_comm.SetCommSpec(comm);
  EXPECT_EQ(TimingStore(dir.str(), "build-1", other_comm).Load(mesh, request), nullptr);
  // The same hardware built again: the same key.
  EXPECT_NE(TimingStore(dir.str(), "build-1", V5p()).Load(mesh, request), nullptr);

  std::vector<int> devices = mesh.devices();
  std::swap(devices[0], devices[1]);
  EXPECT_EQ(store.Load(Mesh(mesh.axes(), devices), request), nullptr);
  EXPECT_EQ(store.Load(PlaceMesh(machine, {{"fsdp", 16}, {"tp", 8}}), request), nullptr);

  std::vector<CollectiveRequest> others(8, request);
  others[0].kind = CollectiveKind::kReduceScatter;
  others[1].reduce = ReduceOp::kMax;
  others[2].dtype = DType::kF32;
  others[3].elements += 1;
  others[4].algorithm = "bidirectional_ring";
  others[5].axes = {1};
  others[6].destination = {1};
  others[7].chunk_size = Bytes::KiB(512);
  for (const CollectiveRequest& other : others) {
    EXPECT_EQ(store.Load(mesh, other), nullptr);
    EXPECT_NE(store.PathOf(mesh, other), store.PathOf(mesh, request));
  }
}

// A damaged entry is a miss, never an answer: cut short, a byte changed, emptied, or another
// key's entry under this one's name.
TEST(TimingStoreTest, DamagedEntriesAreMisses) {
  TempDir dir("damaged");
  Machine machine(V5p());
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  const CollectiveRequest request = Request(CollectiveKind::kAllGather, {0}, "ring");
  const CollectiveRequest other = Request(CollectiveKind::kAllGather, {1}, "ring");
  NetworkCollectiveModel model(machine);
  const TimingStore store(dir.str(), "test", machine.topology());
  const std::shared_ptr<const CollectiveTiming> timing = model.Estimate(mesh, request);
  store.Save(mesh, other, *model.Estimate(mesh, other));
  const std::string path = store.PathOf(mesh, request);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto write = [](const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  };
  store.Save(mesh, request, *timing);
  const std::string whole = read(path);
  ASSERT_GT(whole.size(), 100u);
  for (size_t cut : {size_t{0}, size_t{7}, size_t{40}, whole.size() / 2, whole.size() - 1}) {
    write(path, whole.substr(0, cut));
    EXPECT_EQ(store.Load(mesh, request), nullptr) << "cut at " << cut;
  }
  for (size_t at : {size_t{3}, size_t{20}, size_t{40}, whole.size() / 2, whole.size() - 3}) {
    std::string changed = whole;
    changed[at] = static_cast<char>(changed[at] ^ 0x10);
    write(path, changed);
    EXPECT_EQ(store.Load(mesh, request), nullptr) << "byte " << at;
  }
  write(path, read(store.PathOf(mesh, other)));
  EXPECT_EQ(store.Load(mesh, request), nullptr);
  write(path, whole);
  ASSERT_NE(store.Load(mesh, request), nullptr);
  ExpectSameTiming(*store.Load(mesh, request), *timing, "restored");
  // Every write went through a temporary file renamed into place: none is left.
  for (const auto& e : fs::directory_iterator(store.dir())) {
    EXPECT_EQ(e.path().extension(), ".timing") << e.path();
  }
}

// An entry answers every mesh with the same groups: an all-reduce over data 4 of 64 v5p chips
// placed at random (members finish at different times) is read back on a mesh listing the same
// groups in a shuffled order, equal there to that mesh's own simulation.
TEST(TimingStoreTest, AnswersMeshesWithTheSameGroups) {
  TempDir dir("same_groups");
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const int data = 4;
  const auto [placed_a, placed_b] = test::ShuffledGroupPlacements(64, data, 7);
  const Mesh a = PlaceMesh(machine, {{"data", data}, {"fsdp", 4}, {"tensor", 4}}, placed_a);
  const Mesh b = PlaceMesh(machine, {{"data", data}, {"fsdp", 2}, {"tensor", 8}}, placed_b);
  const CollectiveRequest request = Request(CollectiveKind::kAllReduce, {0}, "ring", 1 << 16);
  const TimingStore store(dir.str(), "test", machine.topology());
  NetworkCollectiveModel model(machine);
  std::shared_ptr<const CollectiveTiming> on_a = model.Estimate(a, request);
  // The premise: members finish apart, so a timing left in a's order would be wrong on b.
  NetworkCollectiveModel fresh(machine);
  std::shared_ptr<const CollectiveTiming> on_b = fresh.Estimate(b, request);
  ASSERT_NE(on_a->member_time, on_b->member_time);
  store.Save(a, request, *on_a);
  EXPECT_EQ(store.PathOf(a, request), store.PathOf(b, request));
  std::shared_ptr<const CollectiveTiming> loaded = store.Load(b, request);
  ASSERT_NE(loaded, nullptr);
  ExpectSameTiming(*loaded, *on_b, "moved to b");
}

// An entry keeps its profile's translations (LinkProfile::symmetry), each group's image
// renumbered for the mesh that reads it: read back on another mesh with the same groups in
// another order, they equal the translations found afresh on the timing read.
TEST(TimingStoreTest, KeepsTranslationsForEveryMesh) {
  TempDir dir("translations");
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const Mesh a = PlaceMesh(machine, {{"data", 8}, {"fsdp", 2}, {"tensor", 4}});
  const Mesh b = PlaceMesh(machine, {{"data", 8}, {"fsdp", 4}, {"tensor", 2}});
  const CollectiveRequest request = Request(CollectiveKind::kAllReduce, {0}, "ring", 1 << 16);
  // The premise: the same groups, numbered otherwise by the two meshes.
  ASSERT_EQ(CachedCollectiveModel::Layout(a, {0}).placement,
            CachedCollectiveModel::Layout(b, {0}).placement);
  ASSERT_NE(CachedCollectiveModel::Layout(a, {0}).order,
            CachedCollectiveModel::Layout(b, {0}).order);
  const TimingStore store(dir.str(), "test", machine.topology());
  NetworkCollectiveModel model(machine);
  std::shared_ptr<const CollectiveTiming> on_a = model.Estimate(a, request);
  const ProfileSymmetry found = FindProfileSymmetry(machine.topology(), *on_a->profile);
  // The premise: some translation moves groups onto others.
  bool moves = false;
  for (const std::vector<int32_t>& image : found.image) {
    for (size_t g = 0; g < image.size(); ++g) moves = moves || image[g] != static_cast<int32_t>(g);
  }
  ASSERT_TRUE(moves);
  store.Save(a, request, *on_a, &found);
  for (const Mesh* mesh : {&a, &b}) {
    std::shared_ptr<const CollectiveTiming> loaded = store.Load(*mesh, request);
    ASSERT_NE(loaded, nullptr);
    const ProfileSymmetry afresh = FindProfileSymmetry(machine.topology(), *loaded->profile);
    const ProfileSymmetry& kept = loaded->profile->symmetry(machine.topology());
    EXPECT_EQ(kept.step, afresh.step);
    EXPECT_EQ(kept.image, afresh.image);
  }
}

// A reduce-scatter and the all-gather that runs as its ring pass answer each other from the
// store, as the CachedCollectiveModel answers them: whichever a run simulated, the next run
// simulates neither.
TEST(StoredCollectiveModelTest, ARingPassAnswersItsPartner) {
  TempDir dir("ring_pass");
  Machine machine(V5p());
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  const TimingStore store(dir.str(), "test", machine.topology());
  const CollectiveRequest gather = Request(CollectiveKind::kAllGather, {0}, "ring");
  CollectiveRequest scatter = gather;
  scatter.kind = CollectiveKind::kReduceScatter;
  scatter.elements = gather.elements * 32;
  NetworkCollectiveModel first_network(machine);
  StoredCollectiveModel first(first_network, store, machine.topology());
  first.Estimate(mesh, scatter);
  NetworkCollectiveModel second_network(machine);
  StoredCollectiveModel second(second_network, store, machine.topology());
  std::shared_ptr<const CollectiveTiming> loaded = second.Estimate(mesh, gather);
  EXPECT_EQ(second_network.simulations(), 0);
  EXPECT_EQ(second.loaded(), 1);
  NetworkCollectiveModel fresh(machine);
  ExpectSameTiming(*loaded, *fresh.Estimate(mesh, gather), "gather from the scatter");
  // Not across algorithms that run no ring pass: a direct reduce-scatter answers no all-gather.
  CollectiveRequest other = gather;
  other.algorithm = "direct";
  other.elements += 8;
  NetworkCollectiveModel third_network(machine);
  StoredCollectiveModel third(third_network, store, machine.topology());
  CollectiveRequest direct_scatter = other;
  direct_scatter.kind = CollectiveKind::kReduceScatter;
  direct_scatter.elements = other.elements * 32;
  third.Estimate(mesh, direct_scatter);
  EXPECT_EQ(third_network.simulations(), 1);
  third.Estimate(mesh, other);
  EXPECT_EQ(third_network.simulations(), 2);
}

// A model behind a store simulates what the store lacks and keeps it; a second one, on a fresh
// network model, answers from the store without simulating, the same timing.
TEST(StoredCollectiveModelTest, SimulatesOnlyWhatTheStoreLacks) {
  TempDir dir("model");
  Machine machine(V5p());
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  const TimingStore store(dir.str(), "test", machine.topology());
  const CollectiveRequest request = Request(CollectiveKind::kAllReduce, {0}, "auto", 1 << 20);
  NetworkCollectiveModel first_network(machine);
  StoredCollectiveModel first(first_network, store, machine.topology());
  std::shared_ptr<const CollectiveTiming> simulated = first.Estimate(mesh, request);
  EXPECT_EQ(first_network.simulations(), 1);
  EXPECT_EQ(first.loaded(), 0);
  NetworkCollectiveModel second_network(machine);
  StoredCollectiveModel second(second_network, store, machine.topology());
  std::shared_ptr<const CollectiveTiming> loaded = second.Estimate(mesh, request);
  EXPECT_EQ(second_network.simulations(), 0);
  EXPECT_EQ(second.loaded(), 1);
  ExpectSameTiming(*loaded, *simulated, "loaded");
}

}  // namespace
}  // namespace shardsim
