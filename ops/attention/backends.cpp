#include "ops/attention/backends.hpp"

#include <array>
#include <chrono>
#include <cstdlib>
#include <limits>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/flash_driver.hpp"
#include "ops/attention/int8.hpp"
#include "ops/attention/reference.hpp"
#include "ops/attention/tuning_slice.hpp"
#include "ops/core/warn.hpp"
#include "ops/sparse/block_sparse.hpp"

namespace ditops::attention {
namespace {

std::string accepts_any(const Call&) { return {}; }

/// Rows that share one K/V head: with few, packing K costs as much as the attention.
std::int64_t rows_per_kv_head(const FlashProblem& p) {
  const std::int64_t q_rows =
      p.cu_q ? p.cu_q[p.batch] / std::max<std::int64_t>(p.batch, 1) : p.q_len;
  return q_rows * (p.heads / p.kv_heads);
}

Config default_config(const Call& call, AttentionBackend backend) {
  Config config;
  config.backend = backend;
  config.k_packed = rows_per_kv_head(call.problem) >= 16;
  config.row_group = config.k_packed ? kMaxRowGroup : 1;
  return config;
}

/// Packed K with two row-group sizes where many rows share a KV head; else both K layouts with
/// one micro-tile per group (direct reads only pay for flash's fp32 dot products).
std::vector<Config> flash_configs(const Call& call, AttentionBackend backend) {
  if (rows_per_kv_head(call.problem) >= 16) {
    return {Config{backend, true, 4}, Config{backend, true, kMaxRowGroup}};
  }
  std::vector<Config> list = {Config{backend, false, 1}};
  if (backend == AttentionBackend::flash) list.push_back(Config{backend, true, 1});
  return list;
}

void run_flash_config(const Call& call, const Config& config, int threads) {
  FlashTiles tiles;
  tiles.k_layout = config.k_packed ? KLayout::packed : KLayout::direct;
  tiles.row_group = config.row_group;
  tiles.bf16_dot =
      config.backend == AttentionBackend::flash_bf16 && config.k_packed && bf16_dot_available();
  run_flash(call.problem, tiles, threads);
}

std::string describe_config(const Call&, const Config& config) { return config.describe(); }

const Backend kReference{
    AttentionBackend::reference,
    "reference",
    accepts_any,
    [](DType) { return true; },
    [](const Call&) { return std::vector<Config>{}; },  // the oracle, not a speed candidate
    [](const Call&) {
      return Config{AttentionBackend::reference, false, 1};
    },
    [](const Call& call, const Config&, int threads) {
      run_reference(call.problem, call.scale, threads);
    },
    describe_config};

const Backend kFlash{AttentionBackend::flash,
                     "flash",
                     accepts_any,
                     [](DType) { return true; },
                     [](const Call& call) { return flash_configs(call, AttentionBackend::flash); },
                     [](const Call& call) { return default_config(call, AttentionBackend::flash); },
                     run_flash_config,
                     describe_config};

const Backend kFlashBf16{
    AttentionBackend::flash_bf16,
    "flash_bf16",
    accepts_any,
    [](DType dtype) { return dtype != DType::f32; },  // it rounds fp32 inputs to bf16
    [](const Call& call) {
      // Timed only where its dot product is native: elsewhere it is flash with bf16 rounding.
      return bf16_dot_available() ? flash_configs(call, AttentionBackend::flash_bf16)
                                  : std::vector<Config>{};
    },
    [](const Call& call) { return default_config(call, AttentionBackend::flash_bf16); },
    run_flash_config,
    [](const Call&, const Config& config) {
      return config.describe() +
             (bf16_dot_available() ? "" : " (no AVX512-BF16 here: fp32 dot products)");
    }};

const Backend kInt8{AttentionBackend::int8,
                    "int8",
                    accepts_any,
                    [](DType) { return false; },  // quantizes: only when asked for
                    [](const Call&) { return std::vector<Config>{}; },
                    [](const Call& call) { return default_config(call, AttentionBackend::int8); },
                    [](const Call& call, const Config&, int threads) {
                      run_flash(call.problem, FlashTiles{}, threads, call.int8_chunk);
                    },
                    [](const Call& call, const Config&) {
                      return "int8 chunk=" + std::to_string(call.int8_chunk) +
                             " row_group=" + std::to_string(int8_row_group(call.int8_chunk)) +
                             (smooth_keys() ? " smooth_k" : " smooth_k=off");
                    }};

const Backend kSparse{
    AttentionBackend::sparse,
    "sparse",
    [](const Call& call) -> std::string {
      if (call.problem.cu_q) return "it serves attention_forward, not varlen calls";
      if (call.problem.mask_kind != MaskKind::boolean) return "it needs a boolean attn_mask";
      return {};
    },
    [](DType) { return true; },
    [](const Call&) {
      return std::vector<Config>{Config{AttentionBackend::sparse, true, kMaxRowGroup}};
    },
    [](const Call&) {
      return Config{AttentionBackend::sparse, true, kMaxRowGroup};
    },
    [](const Call& call, const Config&, int threads) { sparse::run_sparse_backend(call, threads); },
    describe_config};

const std::array<Backend, 5> kBackends = {kFlash, kFlashBf16, kSparse, kInt8, kReference};

/// The fastest of `list` on a slice of `call` (TuningSlice); the first backend's default
/// configuration where the call is too small to slice.
Config fastest_on_slice(const Call& call, const std::vector<Config>& list, int threads) {
  const double runs = static_cast<double>(kSliceRuns * list.size());
  const TuningSlice slice(call, kTuningShare / runs);
  if (slice.fraction() * runs > kMaxTuningShare) {
    return find_backend(list.front().backend)->forced_config(call);
  }
  std::vector<double> fastest(list.size(), std::numeric_limits<double>::infinity());
  for (int round = 0; round < kSliceRuns; ++round) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      find_backend(list[i].backend)->run(slice.call(), list[i], threads);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) fastest[i] = std::min(fastest[i], seconds);
    }
  }
  // The earliest of equals wins: the table's order.
  return list[std::min_element(fastest.begin(), fastest.end()) - fastest.begin()];
}

/// The forced backend (options.backend, then DITOPS_ATTN_BACKEND), if any, and where it came from.
struct Forced {
  const Backend* backend = nullptr;
  const char* source = "";
};

Forced forced_backend(const Call& call) {
  if (call.requested != AttentionBackend::automatic) {
    return {find_backend(call.requested), "options.backend"};
  }
  const char* env = std::getenv("DITOPS_ATTN_BACKEND");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "automatic") return {};
  if (const Backend* backend = find_backend(env)) return {backend, "DITOPS_ATTN_BACKEND"};
  std::string names;
  for (const Backend& b : backends()) names += (names.empty() ? "" : "|") + std::string(b.name);
  core::warn_once(std::string("ditops: DITOPS_ATTN_BACKEND=") + env + " is not a backend (" +
                  names + "|automatic); tuning instead");
  return {};
}

}  // namespace

std::span<const Backend> backends() noexcept { return kBackends; }

const Backend* find_backend(AttentionBackend id) noexcept {
  for (const Backend& backend : kBackends) {
    if (backend.id == id) return &backend;
  }
  return nullptr;
}

const Backend* find_backend(std::string_view name) noexcept {
  for (const Backend& backend : kBackends) {
    if (name == backend.name) return &backend;
  }
  return nullptr;
}

std::vector<Config> tuning_candidates(const Call& call) {
  std::vector<Config> list;
  for (const Backend& backend : kBackends) {
    if (!backend.tunable(call.problem.dtype) || !backend.refusal(call).empty()) continue;
    for (const Config& config : backend.tuning_configs(call)) list.push_back(config);
  }
  return list;
}

Choice choose(const Call& call, int threads, bool run_winner) {
  Choice choice;
  // No query row, nothing to write: a batch or head count of any size (q, out and lse have no
  // elements) must not be walked, by a run or by the tuner.
  const bool no_rows = call.problem.cu_q == nullptr && call.problem.q_len == 0;
  const auto run = [&](const Config& config) {
    if (!no_rows) find_backend(config.backend)->run(call, config, threads);
  };
  if (const Forced forced = forced_backend(call); forced.backend) {
    const std::string reason = forced.backend->refusal(call);
    if (reason.empty()) {
      choice.config = forced.backend->forced_config(call);
      choice.forced = true;
      if (run_winner) run(choice.config);
      return choice;
    }
    choice.refused = std::string(forced.source) + "=" + forced.backend->name + ": " + reason;
    core::warn_once("ditops: " + choice.refused + "; using the tuned choice");
  }
  const std::string key = call.key + " t" + std::to_string(threads);
  // A hand-edited cache may name a backend that refuses this call: then it is a miss.
  if (auto cached = cached_config(key);
      cached && find_backend(cached->backend)->refusal(call).empty()) {
    choice.config = *cached;
    choice.from_cache = true;
    if (run_winner) run(*cached);
    return choice;
  }
  const std::vector<Config> list = tuning_candidates(call);
  const Config best =
      list.size() > 1 && !no_rows ? fastest_on_slice(call, list, threads) : list.front();
  store_config(key, best);
  choice.config = best;
  if (run_winner) run(best);
  return choice;
}

}  // namespace ditops::attention
