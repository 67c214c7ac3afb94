#include "ops/attention/tuner.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {
namespace {

constexpr const char* kFormat = "ditops-attention-tune-v1";

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
    save_file();
  }

  std::size_t size() {
    std::lock_guard lock(mutex_);
    return order_.size();
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

  static const char* path() {
    const char* env = std::getenv("DITOPS_TUNE_CACHE");
    return env && *env ? env : nullptr;
  }

  void load_file_once() {
    const char* file = path();
    if (file == nullptr || loaded_path_ == file) return;
    loaded_path_ = file;
    std::ifstream in(file);
    if (!in) return;  // not written yet
    try {
      const auto document = nlohmann::json::parse(in);
      if (!document.is_object() || document.value("format", "") != kFormat ||
          !document.contains("entries") || !document["entries"].is_array()) {
        throw std::runtime_error("not a ditops attention tuning cache");
      }
      std::vector<std::pair<std::string, Config>> entries;
      for (const auto& entry : document["entries"]) {
        const auto config = Config::parse(entry.at("config").get<std::string>());
        if (!config) throw std::runtime_error("unknown configuration");
        entries.emplace_back(entry.at("key").get<std::string>(), *config);
      }
      // The file lists most recent first; insert oldest first to keep that order.
      for (auto it = entries.rbegin(); it != entries.rend(); ++it) insert(it->first, it->second);
    } catch (const std::exception& error) {
      warn_once(std::string("ditops: ignoring tuning cache ") + file + " (" + error.what() + ")");
    }
  }

  /// Whole cache to a temporary file in the same directory, then rename(): readers see the
  /// old file or the new one, never a half-written one.
  void save_file() {
    const char* file = path();
    if (file == nullptr) return;
    nlohmann::json document{{"format", kFormat}, {"entries", nlohmann::json::array()}};
    for (const auto& [key, config] : order_) {
      document["entries"].push_back({{"key", key}, {"config", config.describe()}});
    }
    const std::string temporary =
        std::string(file) + ".tmp." + std::to_string(static_cast<long>(::getpid()));
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << document.dump(1) << '\n';
      if (!out) {
        warn_once(std::string("ditops: cannot write tuning cache ") + temporary);
        return;
      }
    }
    std::error_code error;
    std::filesystem::rename(temporary, file, error);
    if (error) {
      warn_once(std::string("ditops: cannot replace tuning cache ") + file + ": " +
                error.message());
      std::filesystem::remove(temporary, error);
    }
  }

  std::mutex mutex_;
  std::list<std::pair<std::string, Config>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, Config>>::iterator> index_;
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
  Config config;
  if (name == "flash") {
    config.backend = AttentionBackend::flash;
  } else if (name == "flash_bf16") {
    config.backend = AttentionBackend::flash_bf16;
  } else {
    return std::nullopt;
  }
  if (layout != "k=packed" && layout != "k=direct") return std::nullopt;
  config.k_packed = layout == "k=packed";
  if (group.rfind("row_group=", 0) != 0) return std::nullopt;
  try {
    config.row_group = std::stoi(group.substr(10));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (config.row_group < 1 || config.row_group > kMaxRowGroup) return std::nullopt;
  return config;
}

std::optional<Config> cached_config(const std::string& key) { return TuneCache::get().find(key); }
void store_config(const std::string& key, const Config& config) {
  TuneCache::get().store(key, config);
}
std::size_t cache_size() { return TuneCache::get().size(); }

void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> shown;
  std::lock_guard lock(mutex);
  if (shown.insert(message).second) std::fprintf(stderr, "%s\n", message.c_str());
}

}  // namespace ditops::attention
