#include "sim/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace shardsim {

void WriteFileAtomically(const std::string& path, std::string_view contents) {
  WriteOutputFiles({{path, std::string(contents)}});
}

void WriteOutputFiles(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<std::string> staged;
  auto fail = [&staged](const std::string& path, int err) {
    for (const std::string& tmp : staged) std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [path, contents] = outputs[i];
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(path, EISDIR);
    std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(i);
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(path, errno);
    staged.push_back(tmp);
    bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
    int err = errno;
    if (std::fclose(f) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok) fail(path, err);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (std::rename(staged[i].c_str(), outputs[i].first.c_str()) != 0) {
      int err = errno;
      staged.erase(staged.begin(), staged.begin() + static_cast<std::ptrdiff_t>(i));
      fail(outputs[i].first, err);
    }
  }
}

}  // namespace shardsim
