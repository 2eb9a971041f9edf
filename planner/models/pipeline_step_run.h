// Training steps under pipeline parallelism: each stage's layers simulated on its own devices
// (composed from two consecutive layer counts), the schedule run as a timeline of those times with
// the activations sent between stages, then the data-parallel gradient reduction and the update.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/runtime/machine.h"
#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"

namespace shardsim::planner {

// The layers of each of `chunks` pipeline chunks (virtual stage j = c * stages + s at index j),
// in model order: layers / chunks each, the remainder one more each to the middle chunks 1, 2,
// ..., chunks - 2, then to the first (whose embedding costs little); never to the last, which
// also runs the head (Llama 3's 405B pipeline likewise gave its first and last stages a layer
// fewer). Throws SpecError at "plan.pipeline" when some chunk would have no layer.
std::vector<int64_t> ChunkLayers(int64_t layers, int chunks);

// The layers of each chunk (indexed as ChunkLayers') of `layers` over `stages` stages under
// `pipeline`: ChunkLayers' split, or with first_stage_layers or last_stage_layers those stages'
// counts and the rest split evenly among the stages between (as Megatron-LM's
// get_num_layers_to_build), each stage's layers split evenly among its virtual stages. Throws
// SpecError at "plan.pipeline" when they do not split so, or some chunk would have no layer.
std::vector<int64_t> PipelineChunkLayers(int64_t layers, int stages, const PipelinePlan& pipeline);

// What the schedules one pipelined step tries (SimulateTrainStep's, to stay within memory)
// share: each stage step's built program and its partition, which no schedule changes, by the
// kind of layers (dense layers, experts), the layer count, the run (forward, microbatch, step),
// offload and whether it is the layers alone.
struct PipelineBuilds {
  std::map<std::tuple<int64_t, int64_t, int64_t, int, bool, bool>, BuiltTrainStep> steps;
  PartitionChoices choices;  // Shared by the stage steps' partitions (one stage mesh).
};

// Simulates one training step of `model` under `plan`, whose `pipeline` splits the layers
// into stages over its mesh axis (the rules give `layers: <that axis>`), stages x
// virtual_stages chunks of consecutive layers (ChunkLayers). The data axes (axes only the
// batch rule uses) and the stage axis leave the stage's own mesh: one stage's microbatch
// (batch / (microbatches x data)) runs on the devices of stage 0 and data position 0, forward
// only and forward plus backward, composed from n and n + 1 layers (2 and 3; with
// options.settle the first n where those steps have settled, as ComposeShortSteps waits for an
// unpipelined step's); their per-layer slopes make a chunk's task times (a mixture of experts
// with leading dense layers: slopes of each kind, the dense layer's from an n + 1-layer step
// whose first layer is dense; the last chunk also runs
// the embedding, final norm, logits and loss: the intercepts). An activation's send between
// stages is a ppermute over the stage axis priced by the collective model on the whole mesh.
// After the schedule (SimulatePipeline) each stage's gradients are all-reduced over the data
// axes and its optimizer runs (its time: the update's slopes and intercept); the step ends
// with the slowest. Memory: per stage, its parameters, gradients and optimizer state, and its
// peak with the schedule's in-flight microbatch chunks holding their activations; the report
// gives the stage with the highest peak. Throws SpecError at "plan.pipeline" or
// "plan.rules.layers" for a plan that does not fit together.
// `builds`: kept for the next call with the same machine, model, train, plan and collective
// model (null: made for this call alone).
TrainStepReport SimulatePipelinedTrainStep(const Machine& machine, const TransformerConfig& model,
                                           const TrainConfig& train, const StepPlan& plan,
                                           const TrainStepOptions& options,
                                           PipelineBuilds* builds = nullptr);

}  // namespace shardsim::planner
