// Helpers for the train/ tests: a scratch directory removed at the end, whole-file reads, and a
// manual clock that tests advance by hand.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dltrain::test {

class TrainTempDir {
 public:
  explicit TrainTempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("dltrain_train_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TrainTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TrainTempDir(const TrainTempDir&) = delete;
  TrainTempDir& operator=(const TrainTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A clock for Chronometer / Progress options: returns `t`, which the test sets.
struct ManualClock {
  double t = 1000.0;
  auto fn() {
    return [this] { return t; };
  }
};

}  // namespace dltrain::test
