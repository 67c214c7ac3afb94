#include "ops/sparse/layout.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "ops/core/check.hpp"
#include "ops/core/scratch.hpp"

namespace ditops {

const char* pattern_name(HeadPattern pattern) noexcept {
  switch (pattern) {
    case HeadPattern::dense:
      return "dense";
    case HeadPattern::spatial:
      return "spatial";
    case HeadPattern::temporal:
      return "temporal";
    case HeadPattern::textural:
      return "textural";
  }
  return "unknown";
}

namespace sparse {
namespace {

std::string layout_string(const VideoLayout& v) {
  return std::to_string(v.frames) + " x " + std::to_string(v.height) + " x " +
         std::to_string(v.width) + " + " + std::to_string(v.text_tokens) + " text";
}

/// Query window of sparse position rho (0-based among the sparse video tokens) whose own group
/// (frame or column) is [group_begin, group_end): the group plus a band of `radius` positions.
struct Window {
  std::int64_t begin, end;
};
Window band_window(std::int64_t rho, std::int64_t group_begin, std::int64_t group_end,
                   std::int64_t radius, std::int64_t sparse_tokens) noexcept {
  return {std::max<std::int64_t>(0, std::min(group_begin, rho - radius)),
          std::min(sparse_tokens, std::max(group_end, rho + radius + 1))};
}

}  // namespace

Layout checked_layout(const char* call, const RainFusionOptions& rf) {
  const VideoLayout& v = rf.video;
  if (v.frames < 1 || v.height < 1 || v.width < 1 || v.text_tokens < 0) {
    core::fail(call, "rf.video (" + layout_string(v) +
                         ") needs frames, height and width >= 1 and text_tokens >= 0");
  }
  const core::CheckedSize video = core::CheckedSize(v.frames) * v.height * v.width;
  const core::CheckedSize tokens = video + v.text_tokens;
  if (tokens.overflow || tokens.value > std::numeric_limits<std::int32_t>::max()) {
    core::fail(call, "rf.video (" + layout_string(v) + ") has more than 2^31 - 1 tokens");
  }
  if (!(rf.sparsity >= 0.f && rf.sparsity < 1.f)) {
    core::fail(call, "rf.sparsity (" + std::to_string(rf.sparsity) + ") must be in [0, 1)");
  }
  if (rf.textural_stride < 1) {
    core::fail(call,
               "rf.textural_stride (" + std::to_string(rf.textural_stride) + ") must be >= 1");
  }
  if (!(rf.recall_threshold > 0.f && rf.recall_threshold <= 1.f)) {
    core::fail(call, "rf.recall_threshold (" + std::to_string(rf.recall_threshold) +
                         ") must be in (0, 1]");
  }
  Layout layout;
  layout.frames = v.frames;
  layout.height = v.height;
  layout.width = v.width;
  layout.text = v.text_tokens;
  layout.frame_size = v.height * v.width;
  layout.video = video.value;
  layout.tokens = tokens.value;
  layout.first_video = v.text_first ? v.text_tokens : 0;
  layout.first_text = v.text_first ? 0 : video.value;
  layout.dense_first_frame = rf.dense_first_frame;
  layout.sparsity = rf.sparsity;
  layout.stride = rf.textural_stride;
  layout.recall_threshold = rf.recall_threshold;
  return layout;
}

std::string describe(const Layout& l) {
  return "rf.video: " + std::to_string(l.text) + " text + " + std::to_string(l.frames) + " x " +
         std::to_string(l.height) + " x " + std::to_string(l.width) + " = " +
         std::to_string(l.tokens) + " tokens";
}

void check_self_attention(const char* call, std::int64_t q_len, std::int64_t kv_len,
                          const Layout& layout, const AttentionOptions& options) {
  if (!options.attn_mask.empty() || options.attn_mask.rank != 0) {
    core::fail(call, "options.attn_mask is not supported (the scores are over the whole layout)");
  }
  if (options.causal) core::fail(call, "options.causal is not supported");
  const int seq_dim = options.head_first ? 2 : 1;
  const std::pair<const char*, std::int64_t> lengths[] = {{"q", q_len}, {"k", kv_len}};
  for (const auto& [name, length] : lengths) {
    if (length != layout.tokens) {
      core::fail(call, std::string(name) + ".shape[" + std::to_string(seq_dim) + "] (" +
                           std::to_string(length) + " tokens) must equal the layout's S (" +
                           describe(layout) + ")");
    }
  }
}

HeadPattern checked_pattern(const char* call, HeadPattern pattern) {
  switch (pattern) {
    case HeadPattern::dense:
    case HeadPattern::spatial:
    case HeadPattern::temporal:
    case HeadPattern::textural:
      return pattern;
  }
  core::fail(call,
             "pattern (" + std::to_string(static_cast<int>(pattern)) + ") is not a HeadPattern");
}

PatternPlan plan_pattern(HeadPattern pattern, const Layout& l) {
  PatternPlan plan;
  plan.pattern = pattern;
  const std::int64_t S = l.tokens, F = l.frame_size, t0 = l.first_sparse_frame();
  const std::int64_t dense_frame = l.dense_first_frame ? F : 0;
  const std::int64_t sparse_frames = l.frames - t0, sparse_tokens = sparse_frames * F;
  // order, position and two window ends per token: 16 bytes a token, 32 GiB at S = 2^31 - 1.
  core::check_allocation(core::CheckedSize(S) * 4, sizeof(std::int32_t));
  plan.order.reserve(S);
  if (pattern == HeadPattern::dense) {
    for (std::int64_t token = 0; token < S; ++token) plan.order.push_back(token);
  } else {
    for (std::int64_t i = 0; i < l.text; ++i) plan.order.push_back(l.first_text + i);
    for (std::int64_t i = 0; i < dense_frame; ++i) plan.order.push_back(l.first_video + i);
    plan.sink_end = l.text + dense_frame;
    // The sparse video tokens in the pattern's order.
    if (pattern == HeadPattern::temporal) {
      for (std::int64_t h = 0; h < l.height; ++h) {
        for (std::int64_t w = 0; w < l.width; ++w) {
          for (std::int64_t t = t0; t < l.frames; ++t) plan.order.push_back(l.video_token(t, h, w));
        }
      }
    } else if (pattern == HeadPattern::textural) {
      for (bool lattice : {true, false}) {
        for (std::int64_t t = t0; t < l.frames; ++t) {
          for (std::int64_t h = 0; h < l.height; ++h) {
            for (std::int64_t w = 0; w < l.width; ++w) {
              if ((h % l.stride == 0 && w % l.stride == 0) == lattice) {
                plan.order.push_back(l.video_token(t, h, w));
              }
            }
          }
        }
      }
    } else {
      for (std::int64_t i = dense_frame; i < l.video; ++i) plan.order.push_back(l.first_video + i);
    }
  }
  plan.position.assign(S, 0);
  for (std::int64_t p = 0; p < S; ++p) plan.position[plan.order[p]] = static_cast<std::int32_t>(p);

  // Sparse position rho's own group: its frame (spatial) or its (h, w) column (temporal).
  const std::int64_t group = pattern == HeadPattern::temporal ? sparse_frames : F;
  const std::int64_t lattice_tokens = sparse_frames * ((l.height + l.stride - 1) / l.stride) *
                                      ((l.width + l.stride - 1) / l.stride);
  auto window_of = [&](std::int64_t rho, std::int64_t radius) -> Window {
    if (pattern == HeadPattern::textural) return {0, lattice_tokens};
    const std::int64_t group_begin = rho / group * group;
    return band_window(rho, group_begin, group_begin + group, radius, sparse_tokens);
  };
  const double video_pairs = static_cast<double>(l.video) * static_cast<double>(l.video);
  auto density_of = [&](std::int64_t radius) {
    // Frame 0's rows keep every video key; a sparse row keeps frame 0 and its window.
    double kept = static_cast<double>(dense_frame) * static_cast<double>(l.video);
    for (std::int64_t rho = 0; rho < sparse_tokens; ++rho) {
      const Window w = window_of(rho, radius);
      kept += static_cast<double>(dense_frame + w.end - w.begin);
    }
    return kept / video_pairs;
  };
  if (pattern == HeadPattern::spatial || pattern == HeadPattern::temporal) {
    // Smallest radius reaching the requested density (density grows with the radius).
    const double target = 1.0 - static_cast<double>(l.sparsity);
    std::int64_t low = 0, high = sparse_tokens;
    while (low < high) {
      const std::int64_t mid = low + (high - low) / 2;
      if (density_of(mid) >= target) {
        high = mid;
      } else {
        low = mid + 1;
      }
    }
    plan.radius = low;
  }
  plan.density = pattern == HeadPattern::dense ? 1.0 : density_of(plan.radius);

  plan.window.assign(2 * S, 0);
  for (std::int64_t p = 0; p < S; ++p) {
    Window w{0, S};
    if (pattern != HeadPattern::dense && p >= plan.sink_end) {
      const Window band = window_of(p - plan.sink_end, plan.radius);
      w = {plan.sink_end + band.begin, plan.sink_end + band.end};
      if (w.begin == plan.sink_end) w.begin = 0;  // contiguous with the sink
    }
    plan.window[2 * p] = static_cast<std::int32_t>(w.begin);
    plan.window[2 * p + 1] = static_cast<std::int32_t>(w.end);
  }
  return plan;
}

std::shared_ptr<const PatternPlan> cached_plan(HeadPattern pattern, const Layout& l) {
  using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool,
                         float, int>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const PatternPlan>> cache;
  // The sparsity only shapes spatial and temporal plans; the stride only textural ones.
  const bool banded = pattern == HeadPattern::spatial || pattern == HeadPattern::temporal;
  const Key key{static_cast<int>(pattern),
                l.frames,
                l.height,
                l.width,
                l.text,
                l.first_video == 0 && l.text > 0,
                l.dense_first_frame,
                banded ? l.sparsity : 0.f,
                pattern == HeadPattern::textural ? l.stride : 0};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto found = cache.find(key); found != cache.end()) return found->second;
  }
  auto plan = std::make_shared<const PatternPlan>(plan_pattern(pattern, l));
  const std::lock_guard<std::mutex> lock(mutex);
  // A handful of layouts per model: a bound keeps a caller sweeping layouts from growing it.
  constexpr std::size_t kMaxPlans = 64;
  if (cache.size() >= kMaxPlans) cache.clear();
  return cache.emplace(key, std::move(plan)).first->second;
}

}  // namespace sparse
}  // namespace ditops
