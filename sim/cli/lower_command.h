// `shardsim lower`: a global program (mode: explicit | auto) partitioned into the shard_map
// body (mode: manual) it runs as, printed as a run file.
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// What `shardsim lower` was asked.
struct LowerCommandOptions {
  std::string file;                    // The run file.
  std::string out_path;                // -o: write here instead of stdout.
  std::vector<std::string> overrides;  // --set KEY=VALUE, as `shardsim run` takes them.
};

// Partitions the run file's program and prints (or writes) the lowered run file: the same
// hardware and options, mode: manual, each op preceded by a comment with its result's global
// type and, for inserted collectives, the reason. Throws InputError for bad input.
void RunLowerCommand(const LowerCommandOptions& options);

}  // namespace shardsim
