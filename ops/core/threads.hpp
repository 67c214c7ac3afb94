#pragma once
// Threads: one OpenMP team per call, its workers bound to physical cores with hwloc.

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

namespace ditops::core {

/// The most threads set_num_threads and DITOPS_NUM_THREADS accept: libgomp sizes per-team
/// arrays on the starting thread's stack, so a team of 200000 overflows it.
inline constexpr int kMaxThreads = 4096;

/// The thread count DITOPS_NUM_THREADS=`value` asks for (0 = physical cores); nullopt, with a
/// warning on stderr naming the cap, where it is not an integer from 0 to kMaxThreads.
std::optional<int> threads_from_env(const char* value);

/// Physical cores of the machine (hwloc), at least 1.
int physical_cores() noexcept;

/// Where the calls of one thread run their teams: an Instance's cores (set on the instance's own
/// thread for as long as it lives). Without one (null), calls use thread_count() threads on
/// the whole machine.
struct Placement {
  std::vector<int> cores;  ///< physical core indices, hwloc's order
};
/// The calling thread's placement, or null.
const Placement* current_placement() noexcept;
void set_current_placement(const Placement* placement) noexcept;

/// The thread count operators use now: the calling thread's placement's cores, else
/// set_num_threads / DITOPS_NUM_THREADS / physical cores.
int thread_count() noexcept;
/// Binds the calling worker thread to physical core `worker % cores` (of `placement` where
/// given, else of the machine), once per thread and core. Team member 0 is never bound: it is
/// the application's thread, or an Instance's, which bound itself.
void bind_worker(int worker, const Placement* placement) noexcept;
/// Binds the calling thread to physical core `core` (unless DITOPS_BIND=none or OpenMP's own
/// placement is in force); false if that failed.
bool bind_current_thread(int core) noexcept;

/// Runs body(begin, end, thread) over [0, count) split into one contiguous range per thread
/// (oneDNN's balance211: sizes differ by at most one). `threads` is capped by count.
template <class Body>
void parallel_ranges(std::int64_t count, int threads, const Body& body) {
  threads = static_cast<int>(std::min<std::int64_t>(threads, count));
  if (threads <= 1) {
    if (count > 0) body(std::int64_t{0}, count, 0);
    return;
  }
  const Placement* placement = current_placement();
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    const int team = omp_get_num_threads();
    bind_worker(thread, placement);
    const std::int64_t base = count / team;
    const std::int64_t extra = count % team;
    const std::int64_t begin = thread * base + std::min<std::int64_t>(thread, extra);
    const std::int64_t end = begin + base + (thread < extra ? 1 : 0);
    if (begin < end) body(begin, end, thread);
  }
}

/// Runs body(task, thread) for every task in [0, count), handed out dynamically (one atomic
/// counter) so that tasks of unequal cost balance: order them most expensive first. Use it
/// where costs differ (causal attention, ragged batches); parallel_ranges where they do not.
template <class Body>
void parallel_tasks(std::int64_t count, int threads, const Body& body) {
  threads = static_cast<int>(std::min<std::int64_t>(threads, count));
  if (threads <= 1) {
    for (std::int64_t task = 0; task < count; ++task) body(task, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  const Placement* placement = current_placement();
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    bind_worker(thread, placement);
    for (std::int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < count;
         task = next.fetch_add(1, std::memory_order_relaxed)) {
      body(task, thread);
    }
  }
}

/// Threads worth using for a pass that streams `bytes`: one per ~256 KiB (below that the fork
/// and join cost more than the copy), at most thread_count().
inline int threads_for_bytes(std::int64_t bytes) noexcept {
  constexpr std::int64_t kBytesPerThread = 256 * 1024;
  return static_cast<int>(
      std::clamp<std::int64_t>(bytes / kBytesPerThread, 1, std::max(1, thread_count())));
}

/// Bytes written from which a pass bypasses the caches with streaming stores:
/// DITOPS_STREAMING_STORE_BYTES, else 32 MiB. Above 32 MiB an output cannot stay in one core's
/// share of any current server L3 (Zen 4: 4 MiB per core, Sapphire/Granite Rapids: 2-5 MiB per
/// core), so caching it only costs the read-for-ownership of every line; below, the next
/// operator may still find it in cache. The tests lower it so that the streaming paths run on
/// outputs of a few MiB. Read once, at first use.
std::int64_t streaming_store_bytes() noexcept;
/// Parses a DITOPS_STREAMING_STORE_BYTES value (a byte count, 0 to 2^40); nullopt (after one
/// line on stderr) for anything else.
std::optional<std::int64_t> streaming_store_bytes_from_env(const char* value);

/// Whether a pass that writes `bytes` should bypass the caches with streaming stores.
inline bool use_streaming_stores(std::int64_t bytes) noexcept {
  return bytes >= streaming_store_bytes();
}

}  // namespace ditops::core
