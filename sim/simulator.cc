#include "sim/simulator.h"

#include <stdexcept>

#include "sim/units.h"

namespace shardsim {

uint32_t Simulator::AllocateSlot() {
  if (!free_slots_.empty()) {
    uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  slots_.emplace_back();
  return static_cast<uint32_t>(slots_.size() - 1);
}

int32_t Simulator::AllocateBucket() {
  if (!free_buckets_.empty()) {
    int32_t b = free_buckets_.back();
    free_buckets_.pop_back();
    return b;
  }
  if (buckets_.size() > kBucketMask) {
    throw std::length_error("more than 16M distinct event times pending at once");
  }
  buckets_.emplace_back();
  return static_cast<int32_t>(buckets_.size() - 1);
}

EventId Simulator::ScheduleAt(Time at, Callback&& cb) {
  // Times are never negative: one is what a duration beyond the int64 range (a huge one
  // converted from floating point, or sums that wrapped) turns into.
  if (at.picoseconds() < 0) {
    throw TimeRangeError("at simulated time " + FormatTime(now_) +
                         ", an op or transfer would end past the simulator's time range (about "
                         "106 days)");
  }
  if (at < now_) throw std::logic_error("an event was scheduled in the past");
  uint32_t slot = AllocateSlot();
  Slot& s = slots_[slot];
  s.callback = std::move(cb);
  s.live = true;
  s.next = -1;
  ++live_;
  int64_t t = at.picoseconds();
  if (last_bucket_ >= 0 && t == last_time_) {
    Bucket& b = buckets_[last_bucket_];
    slots_[b.tail].next = static_cast<int32_t>(slot);
    b.tail = static_cast<int32_t>(slot);
  } else {
    int32_t b = AllocateBucket();
    buckets_[b] = Bucket{static_cast<int32_t>(slot), static_cast<int32_t>(slot)};
    HeapPush(Key{t, (sequence_++ << kBucketBits) | static_cast<uint64_t>(b)});
    last_bucket_ = b;
    last_time_ = t;
  }
  return EventId{(uint64_t{s.generation} << 32) | slot};
}

bool Simulator::Cancel(EventId id) {
  uint32_t slot = static_cast<uint32_t>(id.value & 0xffffffffu);
  uint32_t gen = static_cast<uint32_t>(id.value >> 32);
  if (!id || slot >= slots_.size()) return false;
  Slot& s = slots_[slot];
  if (!s.live || s.generation != gen) return false;
  s.live = false;
  s.callback.Reset();
  --live_;
  return true;  // The heap key stays until it surfaces; the slot is freed then.
}

// The heap is 4-ary: half the depth of a binary heap, and the four children of a node share
// one 64-byte cache line, which matters once the pending set outgrows the caches.
void Simulator::HeapPush(Key k) {
  size_t i = heap_.size();
  heap_.push_back(k);
  while (i > 0) {
    size_t parent = (i - 1) / 4;
    if (!Before(k, heap_[parent])) break;
    heap_[i] = heap_[parent];
    i = parent;
  }
  heap_[i] = k;
}

void Simulator::HeapPop() {
  Key last = heap_.back();
  heap_.pop_back();
  size_t n = heap_.size();
  if (n == 0) return;
  size_t i = 0;
  const Key* h = heap_.data();
  while (true) {
    size_t first = 4 * i + 1;
    if (first >= n) break;
    size_t best = first;
    if (first + 4 <= n) {
      // Four children (the common case): a branch-free tournament, as the comparisons are
      // unpredictable (it took a cold transformer layer's simulation from 22.0 to 20.2 ms).
      const size_t a = Before(h[first + 1], h[first]) ? first + 1 : first;
      const size_t b = Before(h[first + 3], h[first + 2]) ? first + 3 : first + 2;
      best = Before(h[b], h[a]) ? b : a;
    } else {
      for (size_t c = first + 1; c < n; ++c) {
        if (Before(h[c], h[best])) best = c;
      }
    }
    if (!Before(h[best], last)) break;
    heap_[i] = h[best];
    i = best;
  }
  heap_[i] = last;
}

void Simulator::RunUntil(Time limit) {
  stopped_ = false;
  while (!heap_.empty() && !stopped_) {
    const Key& top = heap_.front();
    if (top.time > limit.picoseconds()) break;
    int64_t time = top.time;
    int32_t bucket = static_cast<int32_t>(top.order & kBucketMask);
    Bucket& b = buckets_[bucket];
    uint32_t slot = static_cast<uint32_t>(b.head);
    b.head = slots_[slot].next;
    if (b.head < 0) {  // The bucket is spent: no event can join it any more.
      HeapPop();
      free_buckets_.push_back(bucket);
      if (last_bucket_ == bucket) last_bucket_ = -1;
    }
    Slot& s = slots_[slot];
    if (++s.generation == 0) s.generation = 1;  // 0 would make the id read as "no event".
    free_slots_.push_back(slot);
    if (!s.live) continue;  // Cancelled.
    now_ = Time::Picoseconds(time);
    Callback cb = std::move(s.callback);
    s.live = false;
    --live_;
    ++dispatched_;
    cb();
    for (Observer* o : event_observers_) o->OnEvent(now_);
  }
  if (heap_.empty() || stopped_) {
    for (Observer* o : observers_) o->OnRunEnd(now_);
  }
}

void Simulator::AddObserver(Observer* observer) {
  observers_.push_back(observer);
  if (observer->WantsEvents()) event_observers_.push_back(observer);
}

void Simulator::DeclareProcess(int32_t pid, const std::string& name, int32_t sort_index) {
  for (Observer* o : observers_) o->OnProcess(pid, name, sort_index);
}

void Simulator::DeclareThread(int32_t pid, int32_t tid, const std::string& name,
                              int32_t sort_index) {
  for (Observer* o : observers_) o->OnThread(pid, tid, name, sort_index);
}

void Simulator::ReportSlice(const SliceRecord& slice) {
  for (Observer* o : observers_) o->OnSlice(slice);
}

void Simulator::ReportCounter(const CounterRecord& counter) {
  for (Observer* o : observers_) o->OnCounter(counter);
}

}  // namespace shardsim
