// How a machine's collective library drives its links: NCCL's protocols, fixed costs and
// achievable link rates on GPU machines; neutral (every figure the ideal one) elsewhere.
#pragma once

#include <array>
#include <string>

#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// NCCL's protocols, in its order: LL (8-byte stores with a 4-byte flag: lowest latency, half
// the bytes are flags), LL128 (128-byte lines with an 8-byte flag), Simple (bulk copies with
// a fence per chunk: full bandwidth, the highest latency).
enum class Protocol { kLL = 0, kLL128 = 1, kSimple = 2 };

// Number of protocols.
inline constexpr int kNumProtocols = 3;

// "LL", "LL128", "Simple" (NCCL_PROTO's spelling).
const char* ProtocolName(Protocol protocol);

// One protocol's costs.
struct ProtocolSpec {
  // Added to every message a collective step sends (the receiver's flag polling or fence and
  // the step's synchronisation): NCCL's per-step hardware latency.
  Time step_latency;
  // Fraction of the achievable link rate the payload gets (LL: half the bytes are flags, and
  // one thread stores 8 bytes at a time; LL128: 120 of 128 bytes are data). In (0, 1].
  double efficiency = 1.0;
};

// The collective library's figures (`hardware.comm` overrides each one).
struct CommSpec {
  // Whether collectives run as NCCL runs them: a launch latency per collective, a protocol
  // per collective chosen by the tuner, and `auto` choosing among NCCL's algorithms. False on
  // TPUs (ICI DMA engines, XLA's own collectives) and on custom machines unless overridden.
  bool nccl = false;
  // Per collective: kernel launch and the ranks' synchronisation before the first step.
  Time launch_latency;
  // Per message that crosses a NIC: the scale-out transport's own latency (proxy thread,
  // doorbell, RDMA completion), on top of the links' (NCCL models network steps with their
  // own, larger latency). Every transfer over a NIC link pays it, collectives or not.
  Time net_latency;
  // By Protocol.
  std::array<ProtocolSpec, kNumProtocols> protocols;
  // Achievable fraction of the NVLink line rate (every transfer over an NVLink link).
  double nvlink_efficiency = 1.0;
  // Achievable fraction of the NIC line rate (every transfer over a NIC link).
  double nic_efficiency = 1.0;
  // Rings NCCL runs at once across nodes, each rail-aligned on a different NIC.
  int channels = 1;
  // Whether the NVSwitch reduces in the network (NVLS / NVLink SHARP).
  bool nvls = false;
  // Whether the scale-out switches reduce in the network (InfiniBand SHARP: NCCL's CollNet).
  // No preset's fabric is documented with it (hardware.md); `hardware.comm.sharp` sets it.
  bool sharp = false;
  // Pipelining unit of the NVLS and hierarchical algorithms: a buffer flows through their
  // stages in pieces of this size (at most 64 pieces).
  Bytes chunk_size = Bytes::MiB(1);

  // Whether a transfer of at least `multipath_min_bytes` between two devices with several
  // minimal routes (a torus: the dimension orders, and both ways round where they tie) is
  // split evenly over them, leaving through several ports at once.
  bool multipath = false;
  // The smallest transfer that is split.
  Bytes multipath_min_bytes = Bytes::KiB(64);

  // The spec of `protocol`.
  const ProtocolSpec& protocol(Protocol p) const { return protocols[static_cast<int>(p)]; }
};

}  // namespace shardsim
