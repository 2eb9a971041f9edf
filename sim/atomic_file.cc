#include "sim/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace shardsim {
namespace {

[[noreturn]] void CannotWrite(const std::string& path, int err) {
  throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

}  // namespace

StagedFile::StagedFile(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(::getpid()) + ".staged") {
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) CannotWrite(path_, EISDIR);
  errno = 0;
  stream_.open(temp_path_, std::ios::binary | std::ios::trunc);
  if (!stream_) CannotWrite(path_, errno ? errno : EIO);
}

StagedFile::~StagedFile() {
  if (renamed_) return;
  if (stream_.is_open()) stream_.close();
  std::remove(temp_path_.c_str());
}

void StagedFile::Close() {
  if (!stream_.is_open()) return;
  errno = 0;
  stream_.flush();
  bool ok = static_cast<bool>(stream_);
  int err = errno;
  stream_.close();
  if (!ok || !stream_) CannotWrite(path_, err ? err : EIO);
}

void WriteFileAtomically(const std::string& path, std::string_view contents) {
  WriteOutputFiles({{path, std::string(contents)}});
}

void WriteOutputFiles(const std::vector<std::pair<std::string, std::string>>& outputs,
                      const std::vector<StagedFile*>& staged_files) {
  // Staged files close first; their destructors remove them if anything below fails.
  for (StagedFile* s : staged_files) s->Close();
  std::vector<std::string> staged;
  auto fail = [&staged](const std::string& path, int err) {
    for (const std::string& tmp : staged) std::remove(tmp.c_str());
    CannotWrite(path, err);
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
  for (StagedFile* s : staged_files) {
    if (std::rename(s->temp_path().c_str(), s->path().c_str()) != 0) fail(s->path(), errno);
    s->renamed_ = true;
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
