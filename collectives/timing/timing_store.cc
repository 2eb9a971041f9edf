#include "collectives/timing/timing_store.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "sim/fnv_hash.h"

namespace shardsim {

namespace {

// The entries' layout; a file of another layout reads as a miss.
constexpr uint64_t kMagic = 0x31544d4953445253ull;  // "SRDSIMT1", lowest byte first.
constexpr uint64_t kFormat = 3;

// Two FNV-1a hashes of one sequence of values, the second started from another state: 128 bits
// that name an entry (the inputs are not adversarial, so FNV's spread is enough).
class Digester {
 public:
  Digester() { b_.Mix(0x9e3779b97f4a7c15ull); }
  void Mix(uint64_t v) {
    a_.Mix(v);
    b_.Mix(v);
  }
  void MixDouble(double v) { Mix(std::bit_cast<uint64_t>(v)); }
  void MixString(const std::string& s) {
    Mix(s.size());
    for (char c : s) Mix(static_cast<unsigned char>(c));
  }
  uint64_t a() const { return a_.value(); }
  uint64_t b() const { return b_.value(); }

 private:
  FnvHash a_, b_;
};

// Appends values to an entry's bytes (this machine's byte order: a store is local to it).
class Writer {
 public:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.append(s);
  }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

// Reads an entry's bytes back; every checked read past the end fails (ok() false) and reads
// zeros.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    T v{};
    if (!ok_ || bytes_.size() - at_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  // The next value, unchecked: only after GetCount said the entry holds it.
  template <typename T>
  T Raw() {
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  // A count of items of `size` bytes each that the rest of the entry can hold, else 0 and a
  // failed read (a corrupt count must not allocate).
  uint64_t GetCount(size_t size) {
    const uint64_t n = Get<uint64_t>();
    if (!ok_ || n > (bytes_.size() - at_) / size) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  std::string GetString() {
    const uint64_t n = GetCount(1);
    std::string s(bytes_.substr(at_, n));
    at_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
  bool ok_ = true;
};

// A LinkUse's figures, bit for bit: an entry lists each distinct one once (a profile's tens of
// thousands of (group, link) uses repeat a thousand or so: 1,120 distinct among 35,328 for a
// data-axis all-reduce on the pod) and each use as its link and the index of its figures.
using Figures = std::array<uint64_t, 3>;
Figures FiguresOf(const LinkUse& u) {
  return {std::bit_cast<uint64_t>(u.duty), std::bit_cast<uint64_t>(u.flows),
          std::bit_cast<uint64_t>(u.flow_rate)};
}
struct FiguresHash {
  size_t operator()(const Figures& f) const {
    FnvHash h;
    for (uint64_t v : f) h.Mix(v);
    return h.value();
  }
};
// Bytes of one use as written: its link and its figures' index.
constexpr size_t kUseBytes = sizeof(LinkId) + sizeof(uint32_t);

// The layout an entry is kept in: the members and groups of `layout` numbered in its order.
CachedCollectiveModel::GroupLayout Canonical(const CachedCollectiveModel::GroupLayout& layout) {
  CachedCollectiveModel::GroupLayout canonical;
  canonical.positions.resize(layout.positions.size());
  std::iota(canonical.positions.begin(), canonical.positions.end(), 0);
  canonical.order.resize(layout.order.size());
  std::iota(canonical.order.begin(), canonical.order.end(), 0);
  return canonical;
}

}  // namespace

TimingStore::TimingStore(std::string dir, std::string version, const Topology& topo) {
  // Each version's entries in a folder of their own, named by a hash of it: an earlier build's
  // entries (which this one never reads) are removed by removing their folder.
  char folder[24];
  std::snprintf(folder, sizeof(folder), "%016llx",
                static_cast<unsigned long long>(HashBytes(version)));
  dir_ = dir + "/" + folder;
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error || !std::filesystem::is_directory(dir_)) {
    throw std::runtime_error("cannot use " + dir + ": " +
                             (error ? error.message() : std::string("not a directory")));
  }
  Digester d;
  d.Mix(kFormat);
  d.MixString(version);
  d.Mix(static_cast<uint64_t>(topo.num_vertices()));
  for (int v = 0; v < topo.num_vertices(); ++v) {
    const Node& node = topo.node(v);
    d.Mix(static_cast<uint64_t>(node.kind));
    d.Mix(static_cast<uint64_t>(static_cast<int64_t>(node.device)));
    d.Mix(node.coords.size());
    for (int c : node.coords) d.Mix(static_cast<uint64_t>(static_cast<int64_t>(c)));
  }
  d.Mix(topo.links().size());
  for (const Link& l : topo.links()) {
    d.Mix(static_cast<uint64_t>(l.src));
    d.Mix(static_cast<uint64_t>(l.dst));
    d.MixDouble(l.bandwidth.bytes_per_second());
    d.Mix(static_cast<uint64_t>(l.latency.picoseconds()));
    d.Mix(static_cast<uint64_t>(l.kind));
    d.Mix(static_cast<uint64_t>(static_cast<int64_t>(l.physical)));
    d.Mix(static_cast<uint64_t>(static_cast<int64_t>(l.dimension)));
    d.Mix(static_cast<uint64_t>(static_cast<int64_t>(l.direction)));
  }
  d.Mix(topo.torus().has_value());
  if (topo.torus()) {
    d.Mix(topo.torus()->shape.size());
    for (int n : topo.torus()->shape) d.Mix(static_cast<uint64_t>(n));
    for (bool w : topo.torus()->wraparound) d.Mix(w);
    d.Mix(topo.torus()->dcn_slices);
  }
  const CommSpec& comm = topo.comm();
  d.Mix(comm.nccl);
  d.Mix(static_cast<uint64_t>(comm.launch_latency.picoseconds()));
  d.Mix(static_cast<uint64_t>(comm.net_latency.picoseconds()));
  for (const ProtocolSpec& p : comm.protocols) {
    d.Mix(static_cast<uint64_t>(p.step_latency.picoseconds()));
    d.MixDouble(p.efficiency);
  }
  d.MixDouble(comm.nvlink_efficiency);
  d.MixDouble(comm.nic_efficiency);
  d.Mix(static_cast<uint64_t>(comm.channels));
  d.Mix(comm.nvls);
  d.Mix(comm.sharp);
  d.Mix(static_cast<uint64_t>(comm.chunk_size.count()));
  d.Mix(comm.multipath);
  d.Mix(static_cast<uint64_t>(comm.multipath_min_bytes.count()));
  machine_ = {d.a(), d.b()};
}

TimingStore::Digest TimingStore::KeyOf(const std::vector<int64_t>& placement,
                                       const CollectiveRequest& request) const {
  Digester d;
  d.Mix(machine_.a);
  d.Mix(machine_.b);
  d.Mix(placement.size());
  for (int64_t v : placement) d.Mix(static_cast<uint64_t>(v));
  d.Mix(static_cast<uint64_t>(request.kind));
  d.Mix(static_cast<uint64_t>(request.reduce));
  d.Mix(static_cast<uint64_t>(request.dtype));
  d.Mix(static_cast<uint64_t>(request.elements));
  d.MixString(request.algorithm);
  d.Mix(request.destination.size());
  for (int to : request.destination) d.Mix(static_cast<uint64_t>(static_cast<int64_t>(to)));
  d.Mix(static_cast<uint64_t>(request.chunk_size.count()));
  return {d.a(), d.b()};
}

std::string TimingStore::PathOf(const Digest& key) const {
  char name[40];
  std::snprintf(name, sizeof(name), "%016llx%016llx", static_cast<unsigned long long>(key.a),
                static_cast<unsigned long long>(key.b));
  return dir_ + "/" + name + ".timing";
}

std::string TimingStore::PathOf(const Mesh& mesh, const CollectiveRequest& request) const {
  return PathOf(KeyOf(CachedCollectiveModel::Layout(mesh, request.axes).placement, request));
}

std::shared_ptr<const CollectiveTiming> TimingStore::Load(const Mesh& mesh,
                                                          const CollectiveRequest& request) const {
  const CachedCollectiveModel::GroupLayout layout =
      CachedCollectiveModel::Layout(mesh, request.axes);
  const Digest key = KeyOf(layout.placement, request);
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return nullptr;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Magic, format, key, contents, checksum of the contents.
  constexpr size_t kHead = 4 * sizeof(uint64_t);
  if (bytes.size() < kHead + sizeof(uint64_t)) return nullptr;
  const std::string_view body(bytes.data() + kHead, bytes.size() - kHead - sizeof(uint64_t));
  Reader head(std::string_view(bytes.data(), kHead));
  Reader tail(std::string_view(bytes.data() + bytes.size() - sizeof(uint64_t), sizeof(uint64_t)));
  if (head.Get<uint64_t>() != kMagic || head.Get<uint64_t>() != kFormat ||
      head.Get<uint64_t>() != key.a || head.Get<uint64_t>() != key.b ||
      tail.Get<uint64_t>() != HashBytes(body)) {
    return nullptr;
  }
  Reader r(body);
  auto timing = std::make_shared<CollectiveTiming>();
  // Each list's count is checked against the bytes left before its items are read.
  timing->member_time.resize(r.GetCount(sizeof(int64_t)));
  for (Time& t : timing->member_time) t = Time::Picoseconds(r.Raw<int64_t>());
  timing->slowest = Time::Picoseconds(r.Get<int64_t>());
  timing->algorithm = r.GetString();
  LinkProfile& profile = *timing->profile;
  profile.links.resize(r.GetCount(sizeof(LinkId)));
  for (LinkId& l : profile.links) l = r.Raw<LinkId>();
  profile.link_share.resize(r.GetCount(sizeof(double)));
  for (double& s : profile.link_share) s = r.Raw<double>();
  std::vector<LinkUse> figures(r.GetCount(3 * sizeof(double)));
  for (LinkUse& f : figures) {
    f.duty = r.Raw<double>();
    f.flows = r.Raw<double>();
    f.flow_rate = r.Raw<double>();
  }
  bool indices_ok = true;
  auto read_uses = [&](std::vector<LinkUse>& uses) {
    uses.resize(r.GetCount(kUseBytes));
    for (LinkUse& u : uses) {
      const LinkId link = r.Raw<LinkId>();
      const uint32_t k = r.Raw<uint32_t>();
      if (k >= figures.size()) {
        indices_ok = false;
        return;
      }
      u = figures[k];
      u.link = link;
    }
  };
  read_uses(profile.link_use);
  profile.group_use.resize(r.GetCount(sizeof(uint64_t)));
  for (std::vector<LinkUse>& uses : profile.group_use) {
    if (indices_ok) read_uses(uses);
  }
  if (!indices_ok) return nullptr;
  // The translations, if kept: each image a group number (canonical) per group.
  const size_t groups = layout.order.size();
  std::optional<ProfileSymmetry> symmetry;
  if (r.Get<uint64_t>() != 0) {
    symmetry.emplace();
    symmetry->step.resize(r.GetCount(sizeof(int32_t)));
    for (int& step : symmetry->step) step = r.Raw<int32_t>();
    symmetry->image.resize(symmetry->step.size());
    for (std::vector<int32_t>& image : symmetry->image) {
      image.resize(r.GetCount(sizeof(int32_t)));
      if (!image.empty() && image.size() != groups) return nullptr;
      for (int32_t& g : image) {
        g = r.Raw<int32_t>();
        if (g < 0 || static_cast<size_t>(g) >= groups) return nullptr;
      }
    }
  }
  if (!r.ok() || !r.at_end() || timing->member_time.size() != layout.positions.size() ||
      layout.positions.size() != static_cast<size_t>(mesh.size()) ||
      (symmetry && profile.group_use.size() != groups)) {
    return nullptr;
  }
  // From the canonical layout onto the mesh's, the images renumbered by the mesh's groups.
  std::shared_ptr<const CollectiveTiming> moved =
      CachedCollectiveModel::Moved(timing, Canonical(layout), layout, mesh.size());
  if (symmetry) {
    for (std::vector<int32_t>& image : symmetry->image) {
      std::vector<int32_t> by_mesh(image.size());
      for (size_t c = 0; c < image.size(); ++c) {
        by_mesh[layout.order[c]] = layout.order[static_cast<size_t>(image[c])];
      }
      image = std::move(by_mesh);
    }
    moved->profile->PresetSymmetry(std::move(*symmetry));
  }
  return moved;
}

void TimingStore::Save(const Mesh& mesh, const CollectiveRequest& request,
                       const CollectiveTiming& timing, const ProfileSymmetry* symmetry) const {
  const CachedCollectiveModel::GroupLayout layout =
      CachedCollectiveModel::Layout(mesh, request.axes);
  if (layout.positions.size() != timing.member_time.size()) return;  // Not a timing of `mesh`.
  const Digest key = KeyOf(layout.placement, request);
  // Laid out canonically: members and groups in the layout's order.
  const std::shared_ptr<const CollectiveTiming> canonical = CachedCollectiveModel::Moved(
      std::shared_ptr<const CollectiveTiming>(&timing, [](const CollectiveTiming*) {}), layout,
      Canonical(layout), mesh.size());
  Writer w;
  w.Put(kMagic);
  w.Put(kFormat);
  w.Put(key.a);
  w.Put(key.b);
  const size_t body = w.bytes().size();
  w.Put<uint64_t>(canonical->member_time.size());
  for (Time t : canonical->member_time) w.Put<int64_t>(t.picoseconds());
  w.Put<int64_t>(canonical->slowest.picoseconds());
  w.PutString(canonical->algorithm);
  const LinkProfile& profile = *canonical->profile;
  w.Put<uint64_t>(profile.links.size());
  for (LinkId l : profile.links) w.Put(l);
  w.Put<uint64_t>(profile.link_share.size());
  for (double s : profile.link_share) w.Put(s);
  // The distinct figures in order of first use (link_use, then group_use), then the uses.
  std::unordered_map<Figures, uint32_t, FiguresHash> index;
  std::vector<const LinkUse*> figures;
  auto number = [&](const LinkUse& u) {
    const auto [it, added] = index.emplace(FiguresOf(u), static_cast<uint32_t>(figures.size()));
    if (added) figures.push_back(&u);
    return it->second;
  };
  for (const LinkUse& u : profile.link_use) number(u);
  for (const std::vector<LinkUse>& uses : profile.group_use) {
    for (const LinkUse& u : uses) number(u);
  }
  w.Put<uint64_t>(figures.size());
  for (const LinkUse* f : figures) {
    w.Put(f->duty);
    w.Put(f->flows);
    w.Put(f->flow_rate);
  }
  auto write_uses = [&](const std::vector<LinkUse>& uses) {
    w.Put<uint64_t>(uses.size());
    for (const LinkUse& u : uses) {
      w.Put(u.link);
      w.Put(index.at(FiguresOf(u)));
    }
  };
  write_uses(profile.link_use);
  w.Put<uint64_t>(profile.group_use.size());
  for (const std::vector<LinkUse>& uses : profile.group_use) write_uses(uses);
  // The translations, each group's image renumbered canonically (group order[c] is c), when
  // given and laid out per group.
  const size_t groups = layout.order.size();
  bool keep = symmetry != nullptr && profile.group_use.size() == groups &&
              symmetry->image.size() == symmetry->step.size();
  for (size_t d = 0; keep && d < symmetry->image.size(); ++d) {
    keep = symmetry->image[d].empty() || symmetry->image[d].size() == groups;
  }
  w.Put<uint64_t>(keep);
  if (keep) {
    std::vector<int32_t> canonical_of(groups);
    for (size_t c = 0; c < groups; ++c) canonical_of[layout.order[c]] = static_cast<int32_t>(c);
    w.Put<uint64_t>(symmetry->step.size());
    for (int step : symmetry->step) w.Put<int32_t>(step);
    for (const std::vector<int32_t>& image : symmetry->image) {
      w.Put<uint64_t>(image.size());
      for (size_t c = 0; c < image.size(); ++c) {
        w.Put<int32_t>(canonical_of[static_cast<size_t>(image[layout.order[c]])]);
      }
    }
  }
  const uint64_t sum = HashBytes(std::string_view(w.bytes()).substr(body));
  w.Put(sum);
  // A name of this process and thread: writers of one entry never share a temporary file.
  const std::string path = PathOf(key);
  const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(w.bytes().data(), static_cast<std::streamsize>(w.bytes().size()));
    if (!out.flush()) {
      out.close();
      std::remove(temp.c_str());
      return;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) std::remove(temp.c_str());
}

}  // namespace shardsim
