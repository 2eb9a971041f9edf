// One reduce-scatter or all-gather pass around one or more disjoint rings: the building block
// of the ring, bidirectional ring and multi-dimensional torus algorithms.
#pragma once

#include <functional>
#include <vector>

#include "collectives/collective.h"

namespace shardsim {

// A pass around rings of members. Ring position r of a ring of size n owns chunk r (a list of
// segments of every member's work buffer). Reduce-scatter: at step s = 0..n-2, position r
// sends its partial of chunk (r - s - 1) mod n to position r + 1, which combines it into its
// own copy; after n - 1 steps position r holds chunk r reduced over the ring. All-gather: at
// step s, position r sends chunk (r - s) mod n to r + 1, which stores it; after n - 1 steps
// every position holds every chunk. Each step moves one chunk per position, so a pass over a
// ring of n members whose links are all one hop of bandwidth B costs (n - 1) * (a + C / B)
// for chunks of C bytes and hop latency a.
//
// Positions start independently (StartMember): data that arrives before a member started is
// held until it does, so passes chain per member (reduce-scatter then all-gather, or one torus
// dimension after another) without a global barrier between them.
class RingPass {
 public:
  // Reduce-scatter or all-gather.
  enum class Mode { kReduceScatter, kAllGather };

  // Writes the segments of the chunk owned by position `index` of ring `ring` into `out`
  // (cleared first). Called per send and arrival, only when the job moves real data, so no
  // layout is stored.
  using ChunkLayout = std::function<void(int ring, int index, std::vector<Segment>* out)>;
  // Elements of the chunk owned by position `index` of ring `ring` (called once per position).
  using ChunkCount = std::function<int64_t(int ring, int index)>;

  // `rings`: disjoint rings, each listing member ids in ring order. `layout` and `count`: the
  // chunks. `work`: per member buffers the pass reads and writes (ignored when the job moves
  // no data). `on_member_done(member)` runs when that member finished its part of the pass.
  RingPass(Network& network, const CollectiveJob& job, Mode mode,
           std::vector<std::vector<int>> rings, ChunkLayout layout, const ChunkCount& count,
           std::vector<std::vector<float>>* work, std::function<void(int member)> on_member_done);

  // Member `member` begins: it sends its first chunk, then handles held arrivals.
  void StartMember(int member);
  // Starts every member.
  void StartAll();

 private:
  struct Position {
    int ring = 0;   // Which ring.
    int index = 0;  // Position in it.
    bool started = false;
    int processed = 0;                                     // Arrivals handled.
    std::vector<std::pair<int, std::vector<float>>> held;  // (step, payload) before start.
  };

  int64_t ChunkElements(int ring, int index) const;
  void Send(int member, int step);
  void Arrive(int member, int step, std::vector<float> payload);
  void Handle(int member, int step, const std::vector<float>& payload);

  Network& network_;
  const CollectiveJob& job_;
  Mode mode_;
  std::vector<std::vector<int>> rings_;
  ChunkLayout layout_;
  std::vector<Segment> scratch_;
  std::vector<std::vector<float>>* work_;
  std::function<void(int)> on_member_done_;
  std::vector<Position> positions_;      // By member id.
  std::vector<int64_t> chunk_elements_;  // Flattened (ring, index) -> elements.
  std::vector<int> ring_offset_;         // Start of each ring in chunk_elements_.
};

}  // namespace shardsim
