// Named model configurations (SPEC `model: llama-3-70b`), each from a cited public source.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "planner/models/transformer.h"

namespace shardsim::planner {

// One preset: its name, configuration and where the figures come from.
struct ModelPreset {
  std::string name;          // As users type it ("llama-3-70b").
  TransformerConfig config;  // The model.
  std::string source;        // The public source of its figures.
};

// Every preset, in the order `shardsim run` lists them.
const std::vector<ModelPreset>& ModelPresets();

// The preset named `name`, or null.
const ModelPreset* FindModelPreset(std::string_view name);

}  // namespace shardsim::planner
