// The Open MPI processes of `mpirun -n P shardsim plan --mpi`: who this process is, and a
// gather of text at rank 0. Without MPI at build time, Available() is false and constructing
// one throws.
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// MPI_COMM_WORLD for the lifetime of the object (MPI_Init .. MPI_Finalize).
class MpiWorld {
 public:
  // Whether this build has MPI (Open MPI's libopenmpi-dev was found).
  static bool Available();
  // Initializes MPI. Throws InputError when the build has no MPI.
  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  // This process's rank and the number of processes.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Every process's `text`, in rank order, at rank 0 (empty elsewhere). Collective.
  std::vector<std::string> Gather(const std::string& text) const;
  // Ends every process with `code` (after an error on one of them).
  [[noreturn]] void Abort(int code) const;

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace shardsim
