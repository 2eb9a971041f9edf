// Training steps under pipeline parallelism: each stage's layers simulated on its own devices
// (composed from 2 and 3 layers), the schedule run as a timeline of those times with the
// activations sent between stages, then the data-parallel gradient reduction and the update.
#pragma once

#include "collectives/runtime/machine.h"
#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"

namespace shardsim::planner {

// Simulates one training step of `model` under `plan`, whose `pipeline` splits the layers
// into stages over its mesh axis (the rules give `layers: <that axis>`). The data axes (axes
// only the batch rule uses) and the stage axis leave the stage's own mesh: one stage's
// microbatch (batch / (microbatches x data)) runs on the devices of stage 0 and data position
// 0, forward only and forward plus backward, composed from 2 and 3 layers; their per-layer
// slopes are a chunk's task times (a stage's layers over virtual_stages chunks; the last
// chunk also runs the embedding, final norm, logits and loss: the intercepts). An
// activation's send between stages is a ppermute over the stage axis priced by the collective
// model on the whole mesh. After the schedule (SimulatePipeline) the stage's gradients are
// all-reduced over the data axes and the optimizer runs (its time: the update's slope and
// intercept). Memory: the stage's parameters, gradients and optimizer state, and its peak
// with the schedule's in-flight microbatch chunks holding their activations. Throws SpecError
// at "plan.pipeline" or "plan.rules.layers" for a plan that does not fit together.
TrainStepReport SimulatePipelinedTrainStep(const Machine& machine, const TransformerConfig& model,
                                           const TrainConfig& train, const StepPlan& plan,
                                           const TrainStepOptions& options);

}  // namespace shardsim::planner
