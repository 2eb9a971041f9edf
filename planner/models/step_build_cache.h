#ifndef SHARDSIM_PLANNER_MODELS_STEP_BUILD_CACHE_H_
#define SHARDSIM_PLANNER_MODELS_STEP_BUILD_CACHE_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/program.h"
#include "planner/models/logical_rules.h"
#include "planner/models/transformer.h"
#include "planner/partition_analysis.h"
#include "planner/partition_choices.h"
#include "planner/remat.h"

namespace shardsim::planner {

// A training step as BuildTrainStep makes it, with its grads expanded and remat and offload
// applied (PartitionStep's first half): what the mesh's axis names decide, not their sizes.
struct ExpandedTrainStep {
  ProgramSpec global;  // BuildTrainStep's; its mesh_axes hold the sizes it was built for.
  // BuildTrainStep's layer values and vocabulary tiles; per layer, the checkpoint values
  // offload and a custom remat name (CheckpointValues).
  std::vector<std::vector<std::string>> layers, head_tiles, offloaded, saved;
  // `global`, grads expanded, remat and offload applied; shared with its partitions.
  std::shared_ptr<const ProgramSpec> expanded;
  std::vector<size_t> boundaries;  // Its backward passes' first and last ops (ExpandGrads').
  // What partitioning reads of `expanded` alone, made by its first partition and read by the
  // rest (on other meshes of the same axis names). Used by one thread at a time, as the step
  // is (StepBuildCache is one worker's).
  std::shared_ptr<PartitionAnalysis> analysis = std::make_shared<PartitionAnalysis>();
};

// Training steps built and expanded for a search's earlier plans, found by all that decides
// them: the model, the training configuration, the rules, remat and the values it keeps,
// offload, and the mesh's axis names, with their sizes only for a mixture of experts (whose
// dispatch BuildTrainStep lays out by them; a dense step reads sizes only to check that its
// parameters divide). A plan whose mesh differs only in sizes takes the step built for
// another where every input array of it divides over its own sizes; where one does not, it
// finds nothing and builds its own, failing as BuildTrainStep does. Not thread-safe: one per
// search worker. Keeps the kCapacity most recently made steps, and the choices of layout made
// on the meshes partitioned on (Choices).
class StepBuildCache {
 public:
  // What decides an expanded step.
  struct Key {
    TransformerConfig model;
    TrainConfig train;
    LogicalRules rules;
    std::vector<std::string> axis_names;
    std::vector<int> axis_sizes;  // Empty for a dense model.
    RematPolicy remat = RematPolicy::kNone;
    std::vector<std::string> remat_save, offload;

    bool operator==(const Key&) const = default;
  };
  static constexpr size_t kCapacity = 64;

  // The key of `model`'s step on `train` over a mesh of `axes` under `rules`, `remat` keeping
  // `remat_save`, the checkpoint values `offload` held in host memory.
  static Key KeyOf(const TransformerConfig& model, const TrainConfig& train,
                   const LogicalRules& rules, const std::vector<MeshAxis>& axes, RematPolicy remat,
                   const std::vector<std::string>& remat_save,
                   const std::vector<std::string>& offload);
  // The step made for `key` whose input arrays divide over `axes` (its sizes); null if none.
  std::shared_ptr<const ExpandedTrainStep> Find(const Key& key,
                                                const std::vector<MeshAxis>& axes) const;
  // Keeps `step` for `key` (dropping the oldest beyond kCapacity).
  void Insert(Key key, std::shared_ptr<const ExpandedTrainStep> step);
  // Steps found and not found by Find.
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

  // Auto mode's choices of layout for partitions on `mesh` (its axes, sizes and placement):
  // the plans on one mesh share them, whatever their rules, as a choice is a function of the
  // op and its operands there (PartitionChoices). Kept for the kChoiceMeshes meshes most
  // recently made.
  PartitionChoices& Choices(const Mesh& mesh);
  static constexpr size_t kChoiceMeshes = 16;

 private:
  // One mesh's choices.
  struct MeshChoices {
    std::vector<MeshAxis> axes;
    std::vector<int> devices;
    std::unique_ptr<PartitionChoices> choices;
  };

  std::deque<std::pair<Key, std::shared_ptr<const ExpandedTrainStep>>> steps_;
  std::deque<MeshChoices> choices_;
  mutable int64_t hits_ = 0;
  mutable int64_t misses_ = 0;
};

}  // namespace shardsim::planner

#endif  // SHARDSIM_PLANNER_MODELS_STEP_BUILD_CACHE_H_
