// The discrete-event engine: runs callbacks in (time, insertion sequence) order.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/callback.h"
#include "sim/observer.h"
#include "sim/time.h"

namespace shardsim {

// Identifies a scheduled event so it can be cancelled. Zero is "no event".
struct EventId {
  uint64_t value = 0;  // Slot in the low 32 bits, slot generation in the high 32 bits.
  // True if this names an event (it may since have run or been cancelled).
  explicit operator bool() const { return value != 0; }
  bool operator==(const EventId&) const = default;
};

// A discrete-event simulator. Events scheduled for the same time run in the order they were
// scheduled (FIFO), so a run is deterministic. There is no global instance: models take a
// `Simulator&`.
//
// The pending set is a 4-ary min-heap of buckets, each a FIFO list of events at one time.
// An event for the same time as the most recently scheduled one joins that bucket without
// touching the heap: collectives start and finish thousands of transfers at the same instant,
// so most schedules are O(1) appends and most dispatches O(1) list pops. Appending only to
// the latest bucket keeps the (time, sequence) order exact. Cancellation marks the event's
// slot dead; it is dropped when it surfaces (lazy deletion, as in ns-3's schedulers).
class Simulator {
 public:
  Simulator() = default;
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  // The current simulated time.
  Time Now() const { return now_; }

  // Schedules `cb` at absolute time `at`. Throws TimeRangeError if `at` is negative (a time
  // that overflowed), std::logic_error if it is before Now().
  EventId ScheduleAt(Time at, Callback&& cb);
  // Schedules `cb` after `delay` (>= 0) from now.
  EventId Schedule(Time delay, Callback&& cb) { return ScheduleAt(now_ + delay, std::move(cb)); }
  // Cancels a pending event. Returns false if it already ran, was cancelled, or is unknown.
  bool Cancel(EventId id);

  // Runs events until none is left or Stop() is called.
  void Run() { RunUntil(Time::Max()); }
  // Runs events with time <= `limit`; leaves later ones pending.
  void RunUntil(Time limit);
  // Makes the running Run() return after the current event.
  void Stop() { stopped_ = true; }

  // Number of events dispatched so far (cancelled events are not counted).
  uint64_t events_dispatched() const { return dispatched_; }
  // Number of live pending events.
  uint64_t pending() const { return live_; }

  // Adds an observer (not owned; must outlive the simulator's use of it).
  void AddObserver(Observer* observer);
  // True if any observer is attached: models skip building trace records otherwise.
  bool tracing() const { return !observers_.empty(); }
  // Declares a process (device or switch) to observers.
  void DeclareProcess(int32_t pid, const std::string& name, int32_t sort_index);
  // Declares a thread (track) to observers.
  void DeclareThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index);
  // Reports a completed slice to observers.
  void ReportSlice(const SliceRecord& slice);
  // Reports a counter sample to observers.
  void ReportCounter(const CounterRecord& counter);

 private:
  // Heap key of a bucket: ordered by time, then by the sequence number of its first event.
  // The low kBucketBits of `order` hold the bucket index, the high bits the sequence.
  struct Key {
    int64_t time;
    uint64_t order;
  };
  static constexpr int kBucketBits = 24;
  static constexpr uint64_t kBucketMask = (uint64_t{1} << kBucketBits) - 1;

  struct Slot {
    Callback callback;
    uint32_t generation = 1;
    bool live = false;
    int32_t next = -1;  // Next event of the same bucket.
  };
  struct Bucket {
    int32_t head = -1;
    int32_t tail = -1;
  };

  static bool Before(const Key& a, const Key& b) {
    // One 128-bit comparison (times are never negative), which compiles without branches.
    using U = unsigned __int128;
    return ((U{static_cast<uint64_t>(a.time)} << 64) | a.order) <
           ((U{static_cast<uint64_t>(b.time)} << 64) | b.order);
  }
  void HeapPush(Key k);
  void HeapPop();
  uint32_t AllocateSlot();
  int32_t AllocateBucket();

  Time now_;
  uint64_t sequence_ = 0;
  uint64_t dispatched_ = 0;
  uint64_t live_ = 0;
  bool stopped_ = false;
  std::vector<Key> heap_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<Bucket> buckets_;
  std::vector<int32_t> free_buckets_;
  int32_t last_bucket_ = -1;  // The bucket the latest event joined, while it is pending.
  int64_t last_time_ = 0;     // Its time.
  std::vector<Observer*> observers_;
  std::vector<Observer*> event_observers_;
};

}  // namespace shardsim
