#pragma once
// K and V packed once per call for the flash kernel (the layouts PackedView describes): the
// packed data lives in the calling thread's scratch (core::thread_scratch), which later calls
// reuse, so one PackedKV per thread at a time.

#include <cstdint>
#include <vector>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

class PackedKV {
 public:
  /// Packs the K and V heads `tasks` read (all of them for dense calls; a sparse pass may use a
  /// few), in problem.k_order when set, on `threads` threads. Packs nothing when `tiles` read K
  /// in place (KLayout::direct).
  static PackedKV pack(const FlashProblem& problem, const FlashTiles& tiles,
                       const std::vector<FlashTask>& tasks, int threads);

  PackedKV() = default;
  PackedKV(PackedKV&&) = default;
  PackedKV& operator=(PackedKV&&) = default;
  PackedKV(const PackedKV&) = delete;  // the view points into the offset tables
  PackedKV& operator=(const PackedKV&) = delete;

  /// What the kernel reads: valid while this object lives and the thread's scratch is not
  /// reused.
  PackedView view() const noexcept {
    return {k_, k_bf16_, k_offset_.data(), v_, v_bf16_, v_offset_.data()};
  }

 private:
  float *k_ = nullptr, *v_ = nullptr;
  std::uint16_t *k_bf16_ = nullptr, *v_bf16_ = nullptr;
  std::vector<std::int64_t> k_offset_, v_offset_;
};

}  // namespace ditops::attention
