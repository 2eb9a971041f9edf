// Self-contained HTML reports for `shardsim plan --report` and `shardsim compare --report`
// (SPEC "Searching plans", "Comparing plans"): one file, inline SVG charts, no scripts, no
// network.
#pragma once

#include <string>
#include <vector>

#include "planner/models/serve_step_run.h"
#include "planner/models/train_step_run.h"
#include "planner/search/plan_search.h"
#include "topology/topology.h"

namespace shardsim {

// One simulated step shown in a report: its label, a line describing its plan, its report.
struct ReportedStep {
  std::string label;                // "1", "A", ...
  std::string plan;                 // "data=8,fsdp=64,tensor=4; remat selective; mb 1".
  planner::TrainStepReport report;  // Its figures (link_busy for the utilisation chart).
};

// The plan search page: `summary` lines (as printed), the ranked table and stacked step and
// memory bars of `top` (best first), the scatter of step time against peak memory of every
// evaluated plan in `result` (fitting or not), and the per-link utilisation of `top[0]` on
// `topology`.
std::string PlanReportHtml(const std::string& title, const std::vector<std::string>& summary,
                           const planner::SearchResult& result,
                           const std::vector<ReportedStep>& top, const Topology& topology);

// One serving plan shown in a report: its label, plan line and simulated serving figures.
struct ReportedServe {
  std::string label;            // "1", "2", ...
  std::string plan;             // "data=2,tensor=4".
  int64_t decode_len = 0;       // Tokens generated per sequence (the decode steps + 1).
  planner::ServeReport report;  // Its figures.
};

// The serving search page: `summary` lines, the ranked table of `top` (TTFT, TPOT, the whole
// generation, tokens/s per device, peak), the scatter of generation time against peak memory
// of every evaluated plan in `result`, each top plan's generation split into the prefill and
// the decode steps' compute, exposed communication and the rest, and its memory (weights, KV
// cache, activations) against HBM.
std::string ServePlanReportHtml(const std::string& title, const std::vector<std::string>& summary,
                                const planner::SearchResult& result,
                                const std::vector<ReportedServe>& top);

// The comparison page: the side-by-side `table` (rows of cells, the first row naming the
// runs), stacked step and memory bars and per-link utilisation of each run (`topologies`, one
// per run), and the `reasons` (sentences).
std::string CompareReportHtml(const std::string& title,
                              const std::vector<std::vector<std::string>>& table,
                              const std::vector<ReportedStep>& runs,
                              const std::vector<const Topology*>& topologies,
                              const std::vector<std::string>& reasons);

}  // namespace shardsim
