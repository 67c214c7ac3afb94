#pragma once
// Auto-tuning cache for attention: an in-process LRU of 512 entries keyed by
// the problem description, optionally persisted as JSON (DITOPS_TUNE_CACHE), thread-safe.
// The file is only ever read if it is a regular file, only replaced if it is a ditops cache
// (anything else is left as it is), and replaced atomically under a lock file, merging what
// other processes stored, so concurrent processes keep each other's entries.

#include <cstdint>
#include <ditops/attention.hpp>
#include <optional>
#include <string>

namespace ditops::attention {

/// One runnable configuration: a backend plus its internal layout and tile choice.
struct Config {
  AttentionBackend backend = AttentionBackend::flash;
  bool k_packed = true;  ///< KLayout::packed or direct
  int row_group = 16;    ///< micro-tiles sharing a K/V block (at most kMaxRowGroup)
  std::string describe() const;
  /// Parses describe()'s output; nullopt for anything else.
  static std::optional<Config> parse(const std::string& text);
};

/// Cached choice for `key`, refreshing its LRU position.
std::optional<Config> cached_config(const std::string& key);
/// Stores (and, with DITOPS_TUNE_CACHE, persists) the choice for `key`.
void store_config(const std::string& key, const Config& config);
/// Empties the in-process cache; the DITOPS_TUNE_CACHE file is read again on the next lookup.
void forget_tuning();
/// Entries currently cached (tests).
std::size_t cache_size();
inline constexpr std::size_t kTuneCacheCapacity = 512;

}  // namespace ditops::attention
