#pragma once
// The attention backends as one ordered table: each backend's name, when it refuses a call and
// why, which configurations the tuner may time, and how it runs. Names, parsing, the forced /
// cached / tuned choice and select_attention's report all read this table; nothing else lists
// the backends.

#include <ditops/attention.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/attention/call.hpp"
#include "ops/attention/tuner.hpp"

namespace ditops::attention {

struct Backend {
  AttentionBackend id;
  const char* name;  ///< what backend_name returns and DITOPS_ATTN_BACKEND accepts
  /// Why the backend cannot serve `call`, or an empty string when it can.
  std::string (*refusal)(const Call& call);
  /// Whether a tuned choice (the tuner or a cache entry) may be this backend for `dtype`
  /// inputs: never a backend less exact than the inputs, never one the tuner does not time.
  bool (*tunable)(DType dtype);
  /// The configurations the tuner times for an accepted call (empty: never tuned to).
  std::vector<Config> (*tuning_configs)(const Call& call);
  /// The configuration a forced call runs with.
  Config (*forced_config)(const Call& call);
  void (*run)(const Call& call, const Config& config, int threads);
  /// What select_attention reports for `config` (tiles, layout, what the CPU lacks).
  std::string (*describe)(const Call& call, const Config& config);
};

/// Every backend, in the order the tuner times them (a tie keeps the earlier one).
std::span<const Backend> backends() noexcept;
/// The backend `id` names, or null (automatic, or a value outside the enum).
const Backend* find_backend(AttentionBackend id) noexcept;
/// The backend called `name`, or null.
const Backend* find_backend(std::string_view name) noexcept;

/// What the choice settled on, and why a requested backend was not used.
struct Choice {
  Config config;
  bool from_cache = false;
  bool forced = false;
  std::string refused;  ///< "<source>=<backend>: <reason>" when a forced backend refused the call
};

/// Share of a call's work the tuner aims to spend timing candidates, on top of the call; a
/// call that cannot be cut finely enough to stay within kMaxTuningShare is not timed. A slice
/// runs at a lower rate than the whole call (fewer tasks to balance, packing less amortized):
/// with 0.18 of the work, first calls measured 1.04-1.30x a steady call (bench/tuning_bench.cpp,
/// AVX2, 2 threads).
inline constexpr double kTuningShare = 0.18;
inline constexpr double kMaxTuningShare = 0.25;
/// Runs of each candidate on the slice, candidates interleaved: a warm-up, then the faster of
/// two timed runs.
inline constexpr int kSliceRuns = 3;

/// The configurations the tuner times for `call`, in table order: every tunable backend that
/// accepts the call.
std::vector<Config> tuning_candidates(const Call& call);

/// Forced (options.backend, then DITOPS_ATTN_BACKEND) when that backend accepts the call, else
/// cached, else tuned: the candidates are timed on a slice of the call of about a fifth of
/// its work in all (TuningSlice: a warm-up and the faster of two runs each, interleaved), or,
/// for a call too small to slice, the first backend's default configuration is taken. The
/// timing runs write part of the call's out; run_winner then runs the winner on all of it.
Choice choose(const Call& call, int threads, bool run_winner);

}  // namespace ditops::attention
