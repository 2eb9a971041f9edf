#include "planner/models/step_build_cache.h"

#include <stdexcept>

#include "planner/value_sharding.h"

namespace shardsim::planner {

StepBuildCache::Key StepBuildCache::KeyOf(const TransformerConfig& model, const TrainConfig& train,
                                          const LogicalRules& rules,
                                          const std::vector<MeshAxis>& axes, RematPolicy remat,
                                          const std::vector<std::string>& remat_save,
                                          const std::vector<std::string>& offload) {
  Key key{model, train, rules, {}, {}, remat, remat_save, offload};
  for (const MeshAxis& a : axes) {
    key.axis_names.push_back(a.name);
    if (model.experts > 0) key.axis_sizes.push_back(a.size);
  }
  return key;
}

std::shared_ptr<const ExpandedTrainStep> StepBuildCache::Find(
    const Key& key, const std::vector<MeshAxis>& axes) const {
  for (const auto& [made_for, step] : steps_) {
    if (!(made_for == key)) continue;
    for (const ArraySpec& a : step->global.arrays) {
      try {
        LocalShape(a.shape, FromSpec(a.sharding, static_cast<int>(a.shape.size()), axes), axes);
      } catch (const std::invalid_argument&) {
        ++misses_;
        return nullptr;
      }
    }
    ++hits_;
    return step;
  }
  ++misses_;
  return nullptr;
}

void StepBuildCache::Insert(Key key, std::shared_ptr<const ExpandedTrainStep> step) {
  steps_.emplace_back(std::move(key), std::move(step));
  if (steps_.size() > kCapacity) steps_.pop_front();
}

PartitionChoices& StepBuildCache::Choices(const Mesh& mesh) {
  for (MeshChoices& m : choices_) {
    if (m.axes == mesh.axes() && m.devices == mesh.devices()) return *m.choices;
  }
  choices_.push_back({mesh.axes(), mesh.devices(), std::make_unique<PartitionChoices>()});
  if (choices_.size() > kChoiceMeshes) choices_.pop_front();
  return *choices_.back().choices;
}

}  // namespace shardsim::planner
