// Pipeline-parallel schedules (GPipe, 1F1B, Megatron's interleaved 1F1B) as timelines: each
// stage runs its forward and backward tasks in the schedule's order, each task starting when
// its stage is free and its input has arrived from the neighbouring stage.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sim/time.h"

namespace shardsim::planner {

// The order each stage runs its tasks in (SPEC plan.pipeline.schedule).
enum class PipelineSchedule {
  kGpipe,        // Every microbatch's forward, then every backward (last microbatch first).
  kOneFOneB,     // PipeDream-flush: stage s runs p - s - 1 forwards, then one forward and one
                 // backward alternately, then the remaining backwards.
  kInterleaved,  // Megatron's interleaved 1F1B over v model chunks per stage (Narayanan et al.
                 // 2021): needs microbatches divisible by the stages.
};

// The SPEC name of `schedule` ("gpipe", "1f1b", "interleaved").
std::string_view PipelineScheduleName(PipelineSchedule schedule);

// SPEC's plan.pipeline: the mesh axis whose positions are the stages, the schedule, and the
// model chunks per stage.
struct PipelinePlan {
  std::string axis = "stage";
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int virtual_stages = 1;
  // The first and the last stage's layers (0: as ChunkLayers spreads them), the others split
  // evenly among the stages between (Megatron-LM's --decoder-first-pipeline-num-layers and
  // --decoder-last-pipeline-num-layers; shardsim extensions of plan.pipeline).
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
};

// One microbatch's times through one model chunk (a stage's layers / virtual_stages).
struct PipelineTaskTimes {
  Time forward;
  Time backward;
  Time send;  // An activation (forward) or its gradient (backward) to the next stage.
};

// One task as the schedule ran it.
struct PipelineTaskRun {
  int microbatch = 0;
  int chunk = 0;  // The stage's model chunk (virtual stage chunk * stages + stage).
  bool forward = true;
  Time start, end;
};

// A simulated pipeline.
struct PipelineTimeline {
  Time end;                    // When the last stage finished its last backward.
  std::vector<Time> busy;      // Per stage: time computing.
  Time bubble;                 // The most idle time of a stage within [0, end].
  std::vector<int> in_flight;  // Per stage: most microbatch chunks whose forward ran and
                               // backward did not yet (activations held at once).
  std::vector<std::vector<PipelineTaskRun>> runs;  // Per stage: its tasks in the order run.
};

// Runs `microbatches` through `stages` stages of `virtual_stages` chunks each under
// `schedule`, chunk times `times`. Virtual stage c * stages + s lives on stage s. Throws
// std::invalid_argument for counts < 1, interleaved with microbatches not a multiple of the
// stages, or virtual_stages > 1 with another schedule.
PipelineTimeline SimulatePipeline(int stages, int microbatches, int virtual_stages,
                                  PipelineSchedule schedule, const PipelineTaskTimes& times);

// The same with each virtual stage's own times (stages x virtual_stages of them, virtual
// stage c * stages + s at index c * stages + s): a last stage that also runs the head, say.
PipelineTimeline SimulatePipeline(int stages, int microbatches, int virtual_stages,
                                  PipelineSchedule schedule,
                                  const std::vector<PipelineTaskTimes>& per_virtual_stage);

}  // namespace shardsim::planner
