#include "ops/core/threads.hpp"

#include <hwloc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/runtime.hpp>
#include <ditops/tensor.hpp>
#include <mutex>
#include <string>
#include <vector>

namespace ditops::core {
namespace {

/// The machine's cores as hwloc sees them (restricted to the process's CPU binding, so taskset
/// and cgroups are respected), loaded once; hwloc allows concurrent reads after loading.
class Topology {
 public:
  static const Topology& get() {
    static const Topology topology;
    return topology;
  }
  int cores() const noexcept { return static_cast<int>(core_sets_.size()); }
  bool bind(int core) const noexcept {
    if (topology_ == nullptr || core_sets_.empty()) return false;
    return hwloc_set_cpubind(topology_, core_sets_[core % core_sets_.size()],
                             HWLOC_CPUBIND_THREAD) == 0;
  }

 private:
  Topology() {
    if (hwloc_topology_init(&topology_) != 0) {
      topology_ = nullptr;
      return;
    }
    hwloc_topology_set_flags(
        topology_, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM | HWLOC_TOPOLOGY_FLAG_RESTRICT_TO_CPUBINDING);
    if (hwloc_topology_load(topology_) != 0) {
      hwloc_topology_destroy(topology_);
      topology_ = nullptr;
      return;
    }
    const int count = hwloc_get_nbobjs_by_type(topology_, HWLOC_OBJ_CORE);
    for (int i = 0; i < count; ++i) {
      hwloc_obj_t core = hwloc_get_obj_by_type(topology_, HWLOC_OBJ_CORE, i);
      hwloc_cpuset_t set = hwloc_bitmap_dup(core->cpuset);
      hwloc_bitmap_singlify(set);  // one PU per core: no SMT sibling, no migration
      core_sets_.push_back(set);
    }
  }
  ~Topology() {
    for (hwloc_cpuset_t set : core_sets_) hwloc_bitmap_free(set);
    if (topology_) hwloc_topology_destroy(topology_);
  }
  hwloc_topology_t topology_ = nullptr;
  std::vector<hwloc_cpuset_t> core_sets_;
};

int default_thread_count() {
  if (const char* env = std::getenv("DITOPS_NUM_THREADS")) {
    if (const auto threads = threads_from_env(env)) return *threads;
  }
  return physical_cores();
}

std::atomic<int>& current_thread_count() {
  static std::atomic<int> count{default_thread_count()};
  return count;
}

bool binding_enabled() {
  // DITOPS_BIND=none leaves placement to the OS or to OMP_PROC_BIND / OMP_PLACES.
  static const bool enabled = [] {
    const char* env = std::getenv("DITOPS_BIND");
    return !(env && std::strcmp(env, "none") == 0) && std::getenv("OMP_PROC_BIND") == nullptr &&
           std::getenv("OMP_PLACES") == nullptr;
  }();
  return enabled;
}

}  // namespace

std::optional<std::int64_t> streaming_store_bytes_from_env(const char* value) {
  constexpr long long kMaxBytes = 1LL << 40;
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(value, &end, 10);
  if (end != value && *end == '\0' && errno == 0 && bytes >= 0 && bytes <= kMaxBytes) {
    return static_cast<std::int64_t>(bytes);
  }
  std::fprintf(stderr,
               "ditops: ignoring DITOPS_STREAMING_STORE_BYTES=%s (expected a byte count from 0 to "
               "%lld); streaming from 32 MiB\n",
               value, kMaxBytes);
  return std::nullopt;
}

std::int64_t streaming_store_bytes() noexcept {
  static const std::int64_t bytes = [] {
    const char* env = std::getenv("DITOPS_STREAMING_STORE_BYTES");
    const auto parsed = env != nullptr ? streaming_store_bytes_from_env(env) : std::nullopt;
    return parsed.value_or(std::int64_t{32} << 20);
  }();
  return bytes;
}

std::optional<int> threads_from_env(const char* value) {
  char* end = nullptr;
  errno = 0;
  const long threads = std::strtol(value, &end, 10);
  if (end != value && *end == '\0' && errno == 0 && threads >= 0 && threads <= kMaxThreads) {
    return threads == 0 ? physical_cores() : static_cast<int>(threads);
  }
  std::fprintf(stderr,
               "ditops: ignoring DITOPS_NUM_THREADS=%s (expected an integer from 0 to %d, the "
               "thread cap)\n",
               value, kMaxThreads);
  return std::nullopt;
}

int physical_cores() noexcept {
  const int cores = Topology::get().cores();
  return cores > 0 ? cores : std::max(1, omp_get_num_procs());
}

namespace {
thread_local const Placement* thread_placement = nullptr;
}  // namespace

const Placement* current_placement() noexcept { return thread_placement; }
void set_current_placement(const Placement* placement) noexcept { thread_placement = placement; }

int thread_count() noexcept {
  if (thread_placement) return static_cast<int>(thread_placement->cores.size());
  return current_thread_count().load(std::memory_order_relaxed);
}

bool bind_current_thread(int core) noexcept {
  return binding_enabled() && Topology::get().bind(core);
}

void bind_worker(int worker, const Placement* placement) noexcept {
  // libgomp keeps its worker threads alive between regions, so a worker binds once per core;
  // the thread-local remembers the core it is bound to.
  thread_local int bound_core = -1;
  if (worker == 0 || !binding_enabled()) return;
  const int core =
      placement ? placement->cores[static_cast<std::size_t>(worker) % placement->cores.size()]
                : worker % physical_cores();
  if (bound_core == core) return;
  if (Topology::get().bind(core)) bound_core = core;
}

}  // namespace ditops::core

namespace ditops {

void set_num_threads(int n) {
  if (n < 0 || n > core::kMaxThreads) {
    throw Error("set_num_threads: n (" + std::to_string(n) + ") must be from 0 to " +
                std::to_string(core::kMaxThreads) + " (the thread cap)");
  }
  core::current_thread_count().store(n == 0 ? core::physical_cores() : n,
                                     std::memory_order_relaxed);
}

int num_threads() { return core::thread_count(); }

}  // namespace ditops
