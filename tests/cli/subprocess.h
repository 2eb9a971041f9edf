// Helpers shared by the end-to-end CLI tests: run the real shardsim binary as a subprocess,
// capture its exit code, stdout and stderr, and give each test a fresh scratch folder.
// Header-only (the test folder's CMake glob compiles *_test.cc files only).
#ifndef SHARDSIM_TESTS_CLI_SUBPROCESS_H_
#define SHARDSIM_TESTS_CLI_SUBPROCESS_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <set>
#include <string>
#include <vector>

extern char** environ;

namespace shardsim::cli_test {

namespace fs = std::filesystem;

// The shardsim binary: $SHARDSIM_BINARY, else build/shardsim beside this test's folder
// (cli_tests is built in build/tests/, shardsim at the top of the build tree).
inline std::string Binary() {
  if (const char* b = std::getenv("SHARDSIM_BINARY"); b && *b) return b;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (self.parent_path().parent_path() / "shardsim").string();
}

// The source tree: $SHARDSIM_SOURCE_DIR, else three folders up from this file.
inline std::string SourceDir() {
  if (const char* root = std::getenv("SHARDSIM_SOURCE_DIR")) return root;
  return fs::path(__FILE__).parent_path().parent_path().parent_path().string();
}

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The result of one run of the binary.
struct Result {
  int exit_code = -1;  // The exit status; -1 if it did not exit normally (a signal).
  std::string out;     // Everything written to stdout.
  std::string err;     // Everything written to stderr.
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout ---\n"
            << r.out << "--- stderr ---\n"
            << r.err << "--------------";
}

// Starts `BINARY ARGS...` with stdout and stderr redirected to files under `capture_dir`
// (files rather than pipes: nothing can deadlock on a full pipe) and returns its pid, or -1
// (with a test failure) when it cannot start.
inline pid_t SpawnBinary(const std::string& binary, const std::vector<std::string>& args,
                         const fs::path& capture_dir) {
  const std::string out_path = (capture_dir / "stdout.txt").string();
  const std::string err_path = (capture_dir / "stderr.txt").string();
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << binary << ": " << std::strerror(rc);
    return -1;
  }
  return pid;
}

// Runs `BINARY ARGS...` as SpawnBinary starts it and waits for it.
inline Result RunBinary(const std::string& binary, const std::vector<std::string>& args,
                        const fs::path& capture_dir) {
  Result r;
  const pid_t pid = SpawnBinary(binary, args, capture_dir);
  if (pid < 0) return r;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(capture_dir / "stdout.txt");
  r.err = ReadFile(capture_dir / "stderr.txt");
  return r;
}

// Runs `shardsim ARGS...` (RunBinary of Binary()).
inline Result RunShardsim(const std::vector<std::string>& args, const fs::path& capture_dir) {
  return RunBinary(Binary(), args, capture_dir);
}

// True when `text` is exactly one line that starts with "error: ".
inline bool IsOneErrorLine(const std::string& text) {
  return text.starts_with("error: ") && !text.empty() && text.back() == '\n' &&
         std::count(text.begin(), text.end(), '\n') == 1;
}

// Names of everything in a folder.
inline std::set<std::string> Listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// A fresh folder per test: `in/` for files the test writes, `out/` for output files the
// binary is asked to write (so a test can check nothing else appeared there), and the
// captured stdout/stderr at the top. Derive a fixture per test file (gtest wants one fixture
// class per suite name).
class CliFixture : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(Binary()))
        << "no shardsim binary at '" << Binary() << "'; set SHARDSIM_BINARY";
    std::string pattern = (fs::temp_directory_path() / "shardsim_cli_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    fs::create_directory(in());
    fs::create_directory(out());
  }

  void TearDown() override {
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
  }

  fs::path in() const { return root_ / "in"; }
  fs::path out() const { return root_ / "out"; }

  Result Run(const std::vector<std::string>& args) const { return RunShardsim(args, root_); }

  // Writes a file under in/ and returns its path.
  std::string WriteInput(const std::string& name, const std::string& text) const {
    fs::path p = in() / name;
    WriteFile(p, text);
    return p.string();
  }

  // Runs and expects success with nothing on stderr.
  Result RunOk(const std::vector<std::string>& args) const {
    Result r = Run(args);
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.err, "") << r;
    return r;
  }

  fs::path root_;
};

}  // namespace shardsim::cli_test

#endif  // SHARDSIM_TESTS_CLI_SUBPROCESS_H_
