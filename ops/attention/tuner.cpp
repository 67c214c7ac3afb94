#include "ops/attention/tuner.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/backends.hpp"
#include "ops/core/file.hpp"
#include "ops/core/warn.hpp"

namespace ditops::attention {
namespace {

constexpr const char* kFormat = "ditops-attention-tune-v1";
/// 512 entries take ~50 KiB: a larger file was not written by ditops.
constexpr std::size_t kMaxCacheFileBytes = std::size_t{16} << 20;

using Entry = std::pair<std::string, Config>;

/// The dtype named in a tuner key (one of its space-separated words), if any.
std::optional<DType> key_dtype(const std::string& key) {
  std::istringstream words(key);
  std::string word;
  while (words >> word) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      if (word == dtype_name(dtype)) return dtype;
    }
  }
  return std::nullopt;
}

/// One entry of a cache file, or nullopt with `problem` saying why it is dropped: files are
/// hand-edited, and a bad entry must not cost the good ones.
std::optional<Entry> parse_entry(const nlohmann::json& entry, std::string& problem) {
  if (!entry.is_object()) {
    problem = "not an object";
    return std::nullopt;
  }
  for (const auto& [field, value] : entry.items()) {
    if (field != "key" && field != "config") {
      problem = "unknown field \"" + field + "\"";
      return std::nullopt;
    }
  }
  if (!entry.contains("key") || !entry["key"].is_string() || !entry.contains("config") ||
      !entry["config"].is_string()) {
    problem = "needs the strings \"key\" and \"config\"";
    return std::nullopt;
  }
  const std::string key = entry["key"].get<std::string>();
  const std::string text = entry["config"].get<std::string>();
  const auto config = Config::parse(text);
  if (!config) {
    problem = "config \"" + text + "\" is not a configuration";
    return std::nullopt;
  }
  const auto dtype = key_dtype(key);
  if (!dtype) {
    problem = "key \"" + key + "\" names no dtype";
    return std::nullopt;
  }
  if (!find_backend(config->backend)->tunable(*dtype)) {
    problem = "backend " + std::string(backend_name(config->backend)) + " is not allowed for " +
              dtype_name(*dtype) + " inputs";
    return std::nullopt;
  }
  return Entry{key, *config};
}

/// A cache file as found on disk.
struct CacheFile {
  /// Missing, or a ditops tuning cache: it may be (re)written. Anything else is left as it is.
  bool ours = true;
  std::string problem;         ///< why it is not ours
  std::vector<Entry> entries;  ///< most recent first
  unsigned mode = 0;           ///< permission bits of an existing file, kept when it is replaced
};

CacheFile read_cache_file(const std::string& path) {
  CacheFile file;
  // A symbolic link is not followed: the file is replaced by rename(), which would put a
  // regular file where the link was and leave the target stale.
  const core::FileContents contents =
      core::read_regular_file(path, kMaxCacheFileBytes, /*follow_symlink=*/false);
  if (contents.status == core::FileStatus::missing) return file;
  if (contents.status != core::FileStatus::ok) {
    file.ours = false;
    file.problem = contents.problem;
    return file;
  }
  file.mode = contents.mode;
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(contents.text);
  } catch (const nlohmann::json::exception& error) {
    file.ours = false;
    file.problem = std::string("not JSON: ") + error.what();
    return file;
  }
  if (!document.is_object() || !document.contains("format") ||
      document["format"] != nlohmann::json(kFormat)) {
    file.ours = false;
    file.problem = std::string("not a ditops tuning cache: no \"format\": \"") + kFormat + "\"";
    return file;
  }
  if (!document.contains("entries") || !document["entries"].is_array()) {
    core::warn_once("ditops: tuning cache " + path +
                    " has no \"entries\" array; starting it afresh");
    return file;
  }
  const nlohmann::json& entries = document["entries"];
  for (std::size_t index = 0; index < entries.size(); ++index) {
    std::string problem;
    if (auto entry = parse_entry(entries[index], problem)) {
      file.entries.push_back(std::move(*entry));
    } else {
      core::warn_once("ditops: tuning cache " + path + ": entry #" + std::to_string(index) +
                      " dropped (" + problem + ")");
    }
  }
  return file;
}

void warn_not_ours(const std::string& path, const CacheFile& file) {
  core::warn_once("ditops: ignoring tuning cache " + path + " (" + file.problem +
                  "); it is left as it is and tuning results are not saved");
}

void warn_unwritable(const std::string& path, const std::string& what) {
  core::warn_once("ditops: cannot write tuning cache " + path + " (" + what +
                  "); tuning results are kept in this process only");
}

/// An exclusive flock on `path` (a lock file beside the cache), held for the object's life, so
/// that processes updating one cache take turns reading, merging and replacing it.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      problem_ = "lock file " + path + ": " + std::strerror(errno);
      return;
    }
    struct stat info;
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      problem_ = "lock file " + path + " is not a regular file";
      return;
    }
    // Polled, not blocking: a process that hangs holding the lock must not hang this one.
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        problem_ = "lock file " + path + ": " + std::strerror(errno);
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        problem_ = "lock file " + path + " is held by another process for more than " +
                   std::to_string(kPatience.count()) + " s";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  /// Empty when the lock is held.
  const std::string& problem() const { return problem_; }

 private:
  static constexpr std::chrono::seconds kPatience{10};
  int fd_ = -1;
  std::string problem_;
};

/// LRU: most recently used at the front of `order_`.
class TuneCache {
 public:
  static TuneCache& get() {
    static TuneCache cache;
    return cache;
  }

  std::optional<Config> find(const std::string& key) {
    std::lock_guard lock(mutex_);
    load_file_once();
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  void store(const std::string& key, const Config& config) {
    std::lock_guard lock(mutex_);
    load_file_once();
    insert(key, config);
    save_file(key, config);
  }

  std::size_t size() {
    std::lock_guard lock(mutex_);
    return order_.size();
  }

  void clear() {
    std::lock_guard lock(mutex_);
    index_.clear();
    order_.clear();
    loaded_path_.clear();
  }

 private:
  void insert(const std::string& key, const Config& config) {
    const auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = config;
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, config);
    index_[key] = order_.begin();
    if (order_.size() > kTuneCacheCapacity) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  void merge(const CacheFile& file) {
    // The file lists most recent first; insert oldest first to keep that order.
    for (auto it = file.entries.rbegin(); it != file.entries.rend(); ++it) {
      insert(it->first, it->second);
    }
  }

  static const char* path() {
    const char* env = std::getenv("DITOPS_TUNE_CACHE");
    return env && *env ? env : nullptr;
  }

  void load_file_once() {
    const char* file = path();
    if (file == nullptr || loaded_path_ == file) return;
    loaded_path_ = file;
    const CacheFile cache = read_cache_file(file);
    if (!cache.ours) return warn_not_ours(file, cache);
    merge(cache);
  }

  /// Merge-on-write: under the lock, what other processes stored since this one read the file
  /// is read again and kept beside the entry just stored (the newest), then the whole cache
  /// replaces the file.
  void save_file(const std::string& stored_key, const Config& stored_config) {
    const char* file = path();
    if (file == nullptr) return;
    const std::string path = file;
    // Checked before the lock file is created: nothing is created beside a foreign file.
    if (const CacheFile before = read_cache_file(path); !before.ours) {
      return warn_not_ours(path, before);
    }
    const FileLock lock(path + ".lock");
    if (!lock.problem().empty()) return warn_unwritable(path, lock.problem());
    const CacheFile current = read_cache_file(path);
    if (!current.ours) return warn_not_ours(path, current);
    merge(current);
    insert(stored_key, stored_config);
    nlohmann::json document{{"format", kFormat}, {"entries", nlohmann::json::array()}};
    for (const auto& [key, config] : order_) {
      document["entries"].push_back({{"key", key}, {"config", config.describe()}});
    }
    const std::string failure = core::replace_file(path, {document.dump(1) + '\n'}, current.mode);
    if (!failure.empty()) warn_unwritable(path, failure);
  }

  std::mutex mutex_;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::string loaded_path_;
};

}  // namespace

std::string Config::describe() const {
  if (backend == AttentionBackend::reference) return "reference";
  return std::string(backend_name(backend)) + " k=" + (k_packed ? "packed" : "direct") +
         " row_group=" + std::to_string(row_group);
}

std::optional<Config> Config::parse(const std::string& text) {
  if (text == "reference") return Config{AttentionBackend::reference, false, 1};
  std::istringstream in(text);
  std::string name, layout, group;
  if (!(in >> name >> layout >> group)) return std::nullopt;
  const Backend* backend = find_backend(name);
  if (backend == nullptr) return std::nullopt;
  Config config;
  config.backend = backend->id;
  if (layout != "k=packed" && layout != "k=direct") return std::nullopt;
  config.k_packed = layout == "k=packed";
  if (group.rfind("row_group=", 0) != 0) return std::nullopt;
  try {
    config.row_group = std::stoi(group.substr(10));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (config.row_group < 1 || config.row_group > kMaxRowGroup) return std::nullopt;
  // Only describe()'s exact text: no trailing junk ("row_group=16abc"), signs or extra words.
  if (config.describe() != text) return std::nullopt;
  return config;
}

std::optional<Config> cached_config(const std::string& key) { return TuneCache::get().find(key); }
void store_config(const std::string& key, const Config& config) {
  TuneCache::get().store(key, config);
}
std::size_t cache_size() { return TuneCache::get().size(); }
void forget_tuning() { TuneCache::get().clear(); }

}  // namespace ditops::attention
