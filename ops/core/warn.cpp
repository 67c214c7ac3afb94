#include "ops/core/warn.hpp"

#include <cstdio>
#include <mutex>
#include <set>

namespace ditops::core {

void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> shown;
  std::lock_guard lock(mutex);
  if (shown.insert(message).second) std::fprintf(stderr, "%s\n", message.c_str());
}

}  // namespace ditops::core
