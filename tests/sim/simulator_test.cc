#include "sim/simulator.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "sim/units.h"

namespace shardsim {
namespace {

TEST(SimulatorTest, RunsEventsInTimeOrder) {
  Simulator sim;
  std::vector<int> order;
  sim.ScheduleAt(Time::Nanoseconds(30), [&] { order.push_back(3); });
  sim.ScheduleAt(Time::Nanoseconds(10), [&] { order.push_back(1); });
  sim.ScheduleAt(Time::Nanoseconds(20), [&] { order.push_back(2); });
  sim.Run();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(sim.Now(), Time::Nanoseconds(30));
  EXPECT_EQ(sim.events_dispatched(), 3u);
}

TEST(SimulatorTest, TiesRunInSchedulingOrder) {
  Simulator sim;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    sim.ScheduleAt(Time::Microseconds(1), [&order, i] { order.push_back(i); });
  }
  sim.Run();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(SimulatorTest, EventsScheduledDuringRunAtNowRunAfterEarlierTies) {
  Simulator sim;
  std::vector<int> order;
  sim.ScheduleAt(Time::Nanoseconds(5), [&] {
    order.push_back(1);
    sim.Schedule(Time(), [&] { order.push_back(3); });
  });
  sim.ScheduleAt(Time::Nanoseconds(5), [&] { order.push_back(2); });
  sim.Run();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(SimulatorTest, CancelledEventsDoNotRun) {
  Simulator sim;
  int ran = 0;
  EventId a = sim.Schedule(Time::Nanoseconds(1), [&] { ran += 1; });
  sim.Schedule(Time::Nanoseconds(2), [&] { ran += 10; });
  EXPECT_TRUE(sim.Cancel(a));
  EXPECT_FALSE(sim.Cancel(a));  // Twice is a no-op.
  EXPECT_EQ(sim.pending(), 1u);
  sim.Run();
  EXPECT_EQ(ran, 10);
  EXPECT_EQ(sim.events_dispatched(), 1u);
}

TEST(SimulatorTest, CancelOfARecycledSlotDoesNotHitTheNewEvent) {
  Simulator sim;
  int ran = 0;
  EventId old = sim.Schedule(Time::Nanoseconds(1), [&] { ++ran; });
  sim.Run();  // `old` ran; its slot is free.
  sim.Schedule(Time::Nanoseconds(1), [&] { ran += 10; });
  EXPECT_FALSE(sim.Cancel(old));
  sim.Run();
  EXPECT_EQ(ran, 11);
}

TEST(SimulatorTest, AcceptsMoveOnlyCallbacks) {
  Simulator sim;
  auto p = std::make_unique<int>(41);
  int seen = 0;
  sim.Schedule(Time::Nanoseconds(1), [&seen, p = std::move(p)] { seen = *p + 1; });
  sim.Run();
  EXPECT_EQ(seen, 42);
}

TEST(SimulatorTest, LargeCallbacksAreStoredOnTheHeap) {
  Simulator sim;
  std::array<int64_t, 32> big{};
  big[31] = 7;
  int64_t seen = 0;
  sim.Schedule(Time::Nanoseconds(1), [&seen, big] { seen = big[31]; });
  sim.Run();
  EXPECT_EQ(seen, 7);
}

TEST(SimulatorTest, RunUntilLeavesLaterEventsPending) {
  Simulator sim;
  int ran = 0;
  sim.ScheduleAt(Time::Microseconds(1), [&] { ++ran; });
  sim.ScheduleAt(Time::Microseconds(5), [&] { ++ran; });
  sim.RunUntil(Time::Microseconds(2));
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(sim.pending(), 1u);
  sim.Run();
  EXPECT_EQ(ran, 2);
}

TEST(SimulatorTest, StopEndsTheRun) {
  Simulator sim;
  int ran = 0;
  sim.Schedule(Time::Nanoseconds(1), [&] {
    ++ran;
    sim.Stop();
  });
  sim.Schedule(Time::Nanoseconds(2), [&] { ++ran; });
  sim.Run();
  EXPECT_EQ(ran, 1);
}

class CountingObserver : public Observer {
 public:
  void OnEvent(Time) override { ++events; }
  bool WantsEvents() const override { return true; }
  void OnRunEnd(Time now) override { end = now; }
  int events = 0;
  Time end;
};

TEST(SimulatorTest, ObserversSeeEveryEventAndTheEnd) {
  Simulator sim;
  CountingObserver obs;
  sim.AddObserver(&obs);
  EXPECT_TRUE(sim.tracing());
  for (int i = 1; i <= 5; ++i) sim.Schedule(Time::Nanoseconds(i), [] {});
  sim.Run();
  EXPECT_EQ(obs.events, 5);
  EXPECT_EQ(obs.end, Time::Nanoseconds(5));
}

TEST(SimulatorTest, TwoSimulatorsInOneProcessAreIndependent) {
  Simulator a, b;
  int ra = 0, rb = 0;
  a.Schedule(Time::Nanoseconds(1), [&] { ++ra; });
  b.Schedule(Time::Nanoseconds(2), [&] { ++rb; });
  a.Run();
  EXPECT_EQ(ra, 1);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(b.pending(), 1u);
}

}  // namespace
}  // namespace shardsim

namespace shardsim {
namespace {

TEST(SimulatorTest, SchedulingInThePastThrows) {
  Simulator sim;
  sim.ScheduleAt(Time::Microseconds(2), [&] {
    try {
      sim.ScheduleAt(Time::Microseconds(1), [] {});
      ADD_FAILURE() << "no exception";
    } catch (const TimeRangeError&) {
      ADD_FAILURE() << "a broken invariant, not a time overflow";
    } catch (const std::logic_error& e) {
      EXPECT_STREQ(e.what(), "an event was scheduled in the past");
    }
  });
  sim.Run();
}

TEST(SimulatorTest, ATimeThatOverflowedIsATimeRangeError) {
  // A duration past the int64 range converted from floating point comes out as INT64_MIN
  // (x86), giving a negative time: the input's numbers are at fault, not the simulator.
  Simulator sim;
  sim.ScheduleAt(Time::Microseconds(2), [&] {
    EXPECT_THROW(sim.Schedule(Time::Picoseconds(std::numeric_limits<int64_t>::min()), [] {}),
                 TimeRangeError);
  });
  sim.Run();
  EXPECT_THROW(sim.ScheduleAt(Time::Picoseconds(-1), [] {}), TimeRangeError);
}

}  // namespace
}  // namespace shardsim
