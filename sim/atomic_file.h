// Writing output files all at once: a reader never sees a partial file.
#pragma once

#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardsim {

// An output file written piece by piece while a command runs: the pieces go to a temporary
// file beside `path`, which WriteOutputFiles renames into place with the command's other
// outputs; a StagedFile destroyed before that removes its temporary file.
class StagedFile {
 public:
  // Opens the temporary file; throws std::runtime_error "cannot write PATH: reason".
  explicit StagedFile(std::string path);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  // Where the pieces go.
  std::ostream& stream() { return stream_; }
  // The final path.
  const std::string& path() const { return path_; }
  // The temporary path (removed or renamed by the end).
  const std::string& temp_path() const { return temp_path_; }

 private:
  friend void WriteOutputFiles(const std::vector<std::pair<std::string, std::string>>& outputs,
                               const std::vector<StagedFile*>& staged);
  // Closes the stream; throws std::runtime_error "cannot write PATH: reason" on failure.
  void Close();

  std::string path_;
  std::string temp_path_;
  std::ofstream stream_;
  bool renamed_ = false;
};

// Writes `contents` to a temporary file beside `path`, then renames it over `path`.
// Throws std::runtime_error naming the path if it cannot be written.
void WriteFileAtomically(const std::string& path, std::string_view contents);

// Writes several (path, contents) outputs of one command, and the files `staged` while it
// ran, all or nothing: every file goes to a temporary name first, and they are renamed into
// place only when all were written, so a failure leaves neither a partial file nor an earlier
// output of the same command behind. Throws std::runtime_error "cannot write PATH: reason".
void WriteOutputFiles(const std::vector<std::pair<std::string, std::string>>& outputs,
                      const std::vector<StagedFile*>& staged = {});

}  // namespace shardsim
