#pragma once
// A temporary directory per test, removed with everything in it (permissions restored first, so
// a test that made something unwritable still cleans up).

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace ditops::test {

/// A fresh directory under the temp directory, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& stem = "ditops_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (stem + ".XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, error);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path_, error)) {
      std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, error);
    }
    std::filesystem::remove_all(path_, error);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  /// Names in the directory, sorted.
  std::vector<std::string> names(const std::string& sub = "") const {
    std::vector<std::string> list;
    for (const auto& entry : std::filesystem::directory_iterator(path_ + "/" + sub)) {
      list.push_back(entry.path().filename().string());
    }
    std::sort(list.begin(), list.end());
    return list;
  }

 private:
  std::string path_;
};

}  // namespace ditops::test
