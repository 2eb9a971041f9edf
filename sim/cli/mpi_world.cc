#include "sim/cli/mpi_world.h"

#include <cstdlib>

#include "sim/cli/run_file.h"

#ifdef SHARDSIM_HAVE_MPI
#include <mpi.h>
#endif

namespace shardsim {

#ifdef SHARDSIM_HAVE_MPI

bool MpiWorld::Available() { return true; }

MpiWorld::MpiWorld() {
  MPI_Init(nullptr, nullptr);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

std::vector<std::string> MpiWorld::Gather(const std::string& text) const {
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(rank_ == 0 ? size_ : 0);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  std::vector<std::string> parts;
  for (size_t r = 0; r < lengths.size(); ++r) {
    parts.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
  }
  return parts;
}

void MpiWorld::Abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

#else

bool MpiWorld::Available() { return false; }

MpiWorld::MpiWorld() {
  throw InputError(
      "--mpi: this shardsim was built without MPI (install Open MPI's libopenmpi-dev and "
      "openmpi-bin, then rebuild)");
}

MpiWorld::~MpiWorld() = default;

std::vector<std::string> MpiWorld::Gather(const std::string& text) const { return {text}; }

void MpiWorld::Abort(int code) const { std::exit(code); }

#endif

}  // namespace shardsim
