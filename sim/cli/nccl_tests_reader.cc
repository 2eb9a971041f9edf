#include "sim/cli/nccl_tests_reader.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <utility>

#include "sim/cli/run_file.h"

namespace shardsim {
namespace {

// nccl-tests' binaries and the shardsim ops they measure.
struct TestName {
  const char* test;
  OpKind op;
};
constexpr TestName kTests[] = {
    {"all_reduce_perf", OpKind::kPsum},
    {"all_gather_perf", OpKind::kAllGather},
    {"reduce_scatter_perf", OpKind::kPsumScatter},
    {"alltoall_perf", OpKind::kAllToAll},
};

std::vector<std::string> Tokens(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string t;
  while (in >> t) out.push_back(t);
  return out;
}

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

NcclTestsRun ParseNcclTests(const std::string& path, const std::string& text) {
  NcclTestsRun run;
  run.path = path;
  auto fail = [&](int line, const std::string& message) -> void {
    throw InputError(path + ":" + std::to_string(line) + ": " + message);
  };
  std::istringstream in(text);
  std::string line;
  int number = 0;
  std::string named;
  while (std::getline(in, line)) {
    ++number;
    std::vector<std::string> tokens = Tokens(line);
    if (tokens.empty()) continue;
    if (tokens[0][0] == '#') {
      const size_t at = line.find("Collective test starting:");
      if (at != std::string::npos) {
        std::vector<std::string> rest = Tokens(line.substr(at + 25));
        if (!rest.empty()) named = rest[0];
      }
      // "#  Rank  0 Group  0 Pid ... device  0 [0x07] NVIDIA A100-SXM4-40GB"
      if (tokens.size() >= 3 && (tokens[0] == "#" && tokens[1] == "Rank" && AllDigits(tokens[2]))) {
        ++run.ranks;
      }
      continue;
    }
    if (!AllDigits(tokens[0])) continue;  // Trailing summaries ("Out of bounds values ...").
    // size count type redop root time algbw busbw #wrong [in-place: time algbw busbw #wrong]
    if (tokens.size() < 8) {
      fail(number,
           "expected nccl-tests columns 'size count type redop root time algbw busbw', "
           "got " +
               std::to_string(tokens.size()) + " fields");
    }
    // Releases before the redop and root columns print the time in column 3: refuse them
    // rather than read a bandwidth as a time.
    static const char* const kRedops[] = {"sum", "prod", "min", "max", "avg", "none", "mulsum"};
    if (std::find(std::begin(kRedops), std::end(kRedops), tokens[3]) == std::end(kRedops)) {
      fail(number, "expected a reduction ('sum', 'max', ... or 'none') in column 4, got '" +
                       tokens[3] +
                       "': an nccl-tests output without the redop and root columns "
                       "is not supported");
    }
    char* end = nullptr;
    const double us = std::strtod(tokens[5].c_str(), &end);
    if (end == tokens[5].c_str() || *end != '\0' || !(us > 0)) {
      fail(number, "the out-of-place time column reads '" + tokens[5] +
                       "', expected a positive number of microseconds");
    }
    NcclTestsPoint p;
    p.size = Bytes(std::strtoll(tokens[0].c_str(), nullptr, 10));
    p.time = Time::FromSeconds(us * 1e-6);
    p.line = number;
    if (p.size.count() > 0) run.points.push_back(p);
  }
  if (named.empty()) {
    for (const TestName& t : kTests) {
      if (path.find(t.test) != std::string::npos) named = t.test;
    }
  }
  bool known = false;
  for (const TestName& t : kTests) {
    if (named == t.test) {
      run.test = t.test;
      run.op = t.op;
      known = true;
    }
  }
  if (!known) {
    std::string list;
    for (const TestName& t : kTests) list += (list.empty() ? "" : ", ") + std::string(t.test);
    fail(1, (named.empty() ? std::string("cannot tell which test wrote this file")
                           : "unknown test '" + named + "'") +
                ": expected a 'Collective test starting: NAME' line or a file name containing "
                "one of " +
                list);
  }
  if (run.ranks == 0) fail(1, "no '#  Rank N ...' lines: cannot tell how many GPUs ran the test");
  if (run.points.empty()) fail(number, "no result rows (lines starting with a size in bytes)");
  return run;
}

}  // namespace shardsim
