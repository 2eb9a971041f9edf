// Pipeline schedules against their closed forms: with free communication and equal tasks,
// 1F1B and GPipe take (m + p - 1)(f + b), a bubble fraction (p - 1)/(m + p - 1) (Narayanan et
// al. 2021, Section 2.2.1); the interleaved schedule over v chunks (p - 1)/(v m + p - 1); and
// the activations each holds at once.
#include "planner/models/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace shardsim::planner {
namespace {

constexpr Time kF = Time::Picoseconds(1'000'000);  // 1 us forward per stage.
constexpr Time kB = Time::Picoseconds(2'000'000);  // 2 us backward.

// t / k (exact for the times here).
Time Over(Time t, int k) { return Time::Picoseconds(t.picoseconds() / k); }

struct Case {
  const char* name;
  PipelineSchedule schedule;
  int p, m, v;
};

class PipelineClosedFormTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineClosedFormTest, BubbleFractionIsTheClosedForm) {
  const Case& c = GetParam();
  // A stage's layers split into v chunks: each chunk takes 1/v of the stage's time.
  const PipelineTaskTimes chunk{Over(kF, c.v), Over(kB, c.v), Time()};
  const PipelineTimeline t = SimulatePipeline(c.p, c.m, c.v, c.schedule, chunk);
  const double work = c.m * (kF + kB).seconds();  // Every stage's compute.
  const double fraction = static_cast<double>(c.p - 1) / (c.v * c.m + c.p - 1);
  EXPECT_DOUBLE_EQ(t.end.seconds(), work / (1 - fraction));
  EXPECT_DOUBLE_EQ(t.bubble.seconds() / t.end.seconds(), fraction);
  for (Time busy : t.busy) EXPECT_DOUBLE_EQ(busy.seconds(), work);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineClosedFormTest,
    ::testing::Values(Case{"one_f_one_b_p4_m8", PipelineSchedule::kOneFOneB, 4, 8, 1},
                      Case{"one_f_one_b_p8_m32", PipelineSchedule::kOneFOneB, 8, 32, 1},
                      Case{"one_f_one_b_more_stages_than_microbatches", PipelineSchedule::kOneFOneB,
                           8, 3, 1},
                      Case{"gpipe_p4_m8", PipelineSchedule::kGpipe, 4, 8, 1},
                      Case{"interleaved_p4_m8_v2", PipelineSchedule::kInterleaved, 4, 8, 2},
                      Case{"interleaved_p4_m16_v4", PipelineSchedule::kInterleaved, 4, 16, 4},
                      Case{"interleaved_v1_is_1f1b", PipelineSchedule::kInterleaved, 4, 8, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// Activations held at once on the first stage: GPipe every microbatch's, 1F1B the p in its
// pipeline (stage s: p - s), interleaved its warmup's chunks plus one.
TEST(PipelineScheduleTest, InFlightActivations) {
  const PipelineTaskTimes times{kF, kB, Time()};
  EXPECT_EQ(SimulatePipeline(4, 8, 1, PipelineSchedule::kGpipe, times).in_flight[0], 8);
  const PipelineTimeline one = SimulatePipeline(4, 8, 1, PipelineSchedule::kOneFOneB, times);
  EXPECT_EQ(one.in_flight, (std::vector<int>{4, 3, 2, 1}));
  const PipelineTaskTimes chunk{Over(kF, 2), Over(kB, 2), Time()};
  const PipelineTimeline inter = SimulatePipeline(4, 8, 2, PipelineSchedule::kInterleaved, chunk);
  EXPECT_EQ(inter.in_flight[0], (4 - 0 - 1) * 2 + (2 - 1) * 4 + 1);
}

// Sends between stages lengthen the step: the first microbatch crosses p - 1 links forward
// and p - 1 back before the first stage can finish, so 1F1B takes at least 2 (p - 1) sends
// more than without them.
TEST(PipelineScheduleTest, SendsLengthenTheCriticalPath) {
  const Time send = Time::Picoseconds(300'000);
  const PipelineTimeline free =
      SimulatePipeline(4, 8, 1, PipelineSchedule::kOneFOneB, {kF, kB, Time()});
  const PipelineTimeline paid =
      SimulatePipeline(4, 8, 1, PipelineSchedule::kOneFOneB, {kF, kB, send});
  EXPECT_GE(paid.end, free.end + send * 6);
}

TEST(PipelineScheduleTest, RefusesWhatTheSchedulesCannotRun) {
  const PipelineTaskTimes times{kF, kB, Time()};
  EXPECT_THROW(SimulatePipeline(4, 6, 2, PipelineSchedule::kInterleaved, times),
               std::invalid_argument);
  EXPECT_THROW(SimulatePipeline(4, 8, 2, PipelineSchedule::kOneFOneB, times),
               std::invalid_argument);
  EXPECT_THROW(SimulatePipeline(0, 8, 1, PipelineSchedule::kGpipe, times), std::invalid_argument);
}

}  // namespace
}  // namespace shardsim::planner
