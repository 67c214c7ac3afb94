// rainfusion_mask and rainfusion_density checked against the definitions in ditops/sparse.hpp,
// written here from token coordinates (never from the library's plans): text and frame-0 rows
// and columns, the spatial band in (t, h, w) order and the temporal band in (h, w, t) order
// with the smallest radius reaching 1 - sparsity, the textural lattice, dense; the measured
// density against rainfusion_density and 1 - sparsity (a 12 x 16 x 32 grid, and the Wan 2.1
// 480p grid for the density alone); text first and last, odd extents, one and two frames, with
// and without the dense first frame, no text; 1 and 2 threads; every class of bad input.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <limits>
#include <string>
#include <vector>

#include "tests/support/expect_rejected.hpp"

namespace ditops::test {
namespace {

RainFusionOptions options_of(std::int64_t frames, std::int64_t height, std::int64_t width,
                             std::int64_t text, bool text_first, bool dense_first_frame,
                             float sparsity = 0.64f, int stride = 2) {
  RainFusionOptions rf;
  rf.video = {frames, height, width, text, text_first};
  rf.dense_first_frame = dense_first_frame;
  rf.sparsity = sparsity;
  rf.textural_stride = stride;
  return rf;
}

std::string describe(const RainFusionOptions& rf) {
  const VideoLayout& v = rf.video;
  return std::to_string(v.text_tokens) + " text " + (v.text_first ? "first" : "last") + " + " +
         std::to_string(v.frames) + " x " + std::to_string(v.height) + " x " +
         std::to_string(v.width) + (rf.dense_first_frame ? " dense frame 0" : " no dense frame") +
         " sparsity " + std::to_string(rf.sparsity) + " stride " +
         std::to_string(rf.textural_stride);
}

/// Where a token sits, from the VideoLayout definition alone.
struct Token {
  bool text = false;
  std::int64_t t = 0, h = 0, w = 0;
};

struct Geometry {
  RainFusionOptions rf;
  std::int64_t T, H, W, text, F, V, S;
  explicit Geometry(const RainFusionOptions& options)
      : rf(options),
        T(options.video.frames),
        H(options.video.height),
        W(options.video.width),
        text(options.video.text_tokens),
        F(H * W),
        V(T * F),
        S(text + T * F) {}

  Token token(std::int64_t index) const {
    const std::int64_t video_index = rf.video.text_first ? index - text : index;
    if (video_index < 0 || video_index >= V) return {true, 0, 0, 0};
    return {false, video_index / F, video_index / W % H, video_index % W};
  }
  /// Text, or frame 0 when it is dense: attends and is attended by everything.
  bool always(const Token& x) const { return x.text || (rf.dense_first_frame && x.t == 0); }
  std::int64_t first_sparse_frame() const { return rf.dense_first_frame ? 1 : 0; }
  std::int64_t sparse_frames() const { return T - first_sparse_frame(); }
  /// Index of a sparse video token among the sparse ones in (t, h, w) order (spatial) or
  /// (h, w, t) order (temporal).
  std::int64_t spatial_index(const Token& x) const {
    return ((x.t - first_sparse_frame()) * H + x.h) * W + x.w;
  }
  std::int64_t temporal_index(const Token& x) const {
    return (x.h * W + x.w) * sparse_frames() + (x.t - first_sparse_frame());
  }
  bool lattice(const Token& x) const {
    return x.h % rf.textural_stride == 0 && x.w % rf.textural_stride == 0;
  }

  /// The definition of each pattern on a pair of tokens, spatial / temporal with band radius r.
  bool keeps(HeadPattern pattern, const Token& q, const Token& k, std::int64_t r) const {
    if (pattern == HeadPattern::dense || always(q) || always(k)) return true;
    switch (pattern) {
      case HeadPattern::spatial:
        return q.t == k.t || std::abs(spatial_index(q) - spatial_index(k)) <= r;
      case HeadPattern::temporal:
        return (q.h == k.h && q.w == k.w) || std::abs(temporal_index(q) - temporal_index(k)) <= r;
      case HeadPattern::textural:
        return lattice(k);
      default:
        return true;
    }
  }

  /// Share of the video x video pairs `pattern` keeps with radius r, counted from keeps().
  double density(HeadPattern pattern, std::int64_t r) const {
    std::int64_t kept = 0;
    std::vector<Token> video(V);
    for (std::int64_t i = 0; i < V; ++i) video[i] = {false, i / F, i / W % H, i % W};
    for (const Token& q : video) {
      for (const Token& k : video) kept += keeps(pattern, q, k, r);
    }
    return static_cast<double>(kept) / static_cast<double>(V * V);
  }
};

/// bool [S, S] mask of `pattern`, filled by rainfusion_mask over a sentinel (7), with guard
/// bytes before and after that must stay untouched.
std::vector<std::uint8_t> mask_of(HeadPattern pattern, const RainFusionOptions& rf,
                                  std::int64_t S) {
  constexpr std::int64_t kGuardBytes = 64;
  std::vector<std::uint8_t> storage(static_cast<std::size_t>(S * S + 2 * kGuardBytes), 7);
  rainfusion_mask(pattern, rf, as_bool(view(storage.data() + kGuardBytes, {S, S})));
  std::int64_t guards = 0;
  for (std::int64_t i = 0; i < kGuardBytes; ++i) {
    guards += storage[i] != 7;
    guards += storage[storage.size() - 1 - i] != 7;
  }
  EXPECT_EQ(guards, 0) << "wrote outside the mask";
  return std::vector<std::uint8_t>(storage.begin() + kGuardBytes, storage.end() - kGuardBytes);
}

/// Kept video x video pairs of a mask over V^2.
double measured_density(const Geometry& g, const std::vector<std::uint8_t>& mask) {
  std::vector<std::uint8_t> video(static_cast<std::size_t>(g.S));
  for (std::int64_t i = 0; i < g.S; ++i) video[i] = !g.token(i).text;
  std::int64_t kept = 0;
  for (std::int64_t q = 0; q < g.S; ++q) {
    if (!video[q]) continue;
    const std::uint8_t* row = mask.data() + q * g.S;
    for (std::int64_t k = 0; k < g.S; ++k) kept += video[k] & row[k];
  }
  return static_cast<double>(kept) / static_cast<double>(g.V * g.V);
}

/// The band radius a spatial / temporal mask shows: the largest index distance of a kept pair
/// of sparse video tokens outside one frame (spatial) or one (h, w) column (temporal).
std::int64_t observed_radius(const Geometry& g, HeadPattern pattern,
                             const std::vector<std::uint8_t>& mask) {
  std::int64_t radius = 0;
  for (std::int64_t q = 0; q < g.S; ++q) {
    const Token tq = g.token(q);
    if (g.always(tq)) continue;
    for (std::int64_t k = 0; k < g.S; ++k) {
      const Token tk = g.token(k);
      if (g.always(tk) || !mask[q * g.S + k]) continue;
      if (pattern == HeadPattern::spatial && tq.t != tk.t) {
        radius = std::max(radius, std::abs(g.spatial_index(tq) - g.spatial_index(tk)));
      }
      if (pattern == HeadPattern::temporal && (tq.h != tk.h || tq.w != tk.w)) {
        radius = std::max(radius, std::abs(g.temporal_index(tq) - g.temporal_index(tk)));
      }
    }
  }
  return radius;
}

/// Every mask of `rf` against the definitions; returns nothing, reports with `context`.
void check_masks(const RainFusionOptions& rf) {
  const Geometry g(rf);
  const std::string context = describe(rf);
  for (HeadPattern pattern :
       {HeadPattern::dense, HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural}) {
    SCOPED_TRACE(context + " pattern " + pattern_name(pattern));
    const std::vector<std::uint8_t> mask = mask_of(pattern, rf, g.S);
    std::int64_t not_boolean = 0;
    for (std::uint8_t value : mask) not_boolean += value > 1;
    ASSERT_EQ(not_boolean, 0) << "entries not written as 0 / 1";

    // Text rows and columns, and frame 0's with dense_first_frame, are all true.
    std::int64_t always_missing = 0;
    for (std::int64_t q = 0; q < g.S; ++q) {
      for (std::int64_t k = 0; k < g.S; ++k) {
        if ((g.always(g.token(q)) || g.always(g.token(k))) && !mask[q * g.S + k]) ++always_missing;
      }
    }
    EXPECT_EQ(always_missing, 0) << "text / frame-0 rows or columns not all true";

    const bool banded = pattern == HeadPattern::spatial || pattern == HeadPattern::temporal;
    const std::int64_t r = banded ? observed_radius(g, pattern, mask) : 0;
    // The whole mask is the definition with that radius (own frame / column always kept).
    std::int64_t wrong = 0, first_wrong = -1, asymmetric = 0;
    for (std::int64_t q = 0; q < g.S; ++q) {
      for (std::int64_t k = 0; k < g.S; ++k) {
        if (static_cast<bool>(mask[q * g.S + k]) != g.keeps(pattern, g.token(q), g.token(k), r)) {
          if (wrong++ == 0) first_wrong = q * g.S + k;
        }
        asymmetric += mask[q * g.S + k] != mask[k * g.S + q];
      }
    }
    EXPECT_EQ(wrong, 0) << "differs from the definition (radius " << r << "), first at query "
                        << first_wrong / g.S << " key " << first_wrong % g.S;
    if (pattern != HeadPattern::textural) {
      EXPECT_EQ(asymmetric, 0) << "not symmetric";
    }

    const double measured = measured_density(g, mask);
    EXPECT_DOUBLE_EQ(measured, rainfusion_density(pattern, rf));
    if (banded) {
      // The smallest radius reaching 1 - sparsity: one less misses it (or r is 0).
      const double target = 1.0 - static_cast<double>(rf.sparsity);
      const double floor = g.density(pattern, 0);
      if (floor >= target) {
        EXPECT_EQ(r, 0) << "the own frame / column alone reaches the target";
      } else {
        EXPECT_GE(measured, target);
        EXPECT_LT(g.density(pattern, r - 1), target) << "radius " << r << " is not the smallest";
      }
    }
    if (pattern == HeadPattern::textural) {
      // Every sparse video row is the same row: text | frame 0 (dense) | lattice key.
      std::int64_t first_row = -1, differing = 0;
      for (std::int64_t q = 0; q < g.S; ++q) {
        if (g.always(g.token(q))) continue;
        if (first_row < 0) first_row = q;
        for (std::int64_t k = 0; k < g.S; ++k) {
          differing += mask[q * g.S + k] != mask[first_row * g.S + k];
        }
      }
      EXPECT_EQ(differing, 0) << "sparse rows differ";
    }
    if (pattern == HeadPattern::dense) {
      EXPECT_DOUBLE_EQ(measured, 1.0);
    }
  }
}

TEST(RainFusionMask, MatchesTheDefinitions) {
  // Odd H and W, one and two frames and more, text first / last / none, dense frame 0 or not,
  // strides 1..3 (3 leaves partial lattice rows), sparsities from none to past the floor.
  const float sparsities[] = {0.f, 0.5f, 0.8f, 0.97f};
  int variant = 0;
  for (std::int64_t frames : {1, 2, 4}) {
    for (std::int64_t text : {0, 9}) {
      for (bool text_first : {true, false}) {
        if (text == 0 && !text_first) continue;
        for (bool dense_first_frame : {true, false}) {
          const float sparsity = sparsities[variant % 4];
          const int stride = 1 + variant % 3;
          ++variant;
          check_masks(
              options_of(frames, 5, 7, text, text_first, dense_first_frame, sparsity, stride));
        }
      }
    }
  }
  // Degenerate extents: one token per frame, one row, one column.
  check_masks(options_of(6, 1, 1, 3, true, true, 0.5f, 2));
  check_masks(options_of(3, 1, 9, 2, false, false, 0.7f, 2));
  check_masks(options_of(3, 7, 1, 0, true, true, 0.3f, 4));
}

TEST(RainFusionMask, ThreadCountDoesNotChangeIt) {
  const RainFusionOptions rf = options_of(5, 9, 11, 13, false, true, 0.75f, 2);
  const std::int64_t S = 13 + 5 * 9 * 11;
  const int before = num_threads();
  for (HeadPattern pattern : {HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural}) {
    set_num_threads(1);
    const auto one = mask_of(pattern, rf, S);
    set_num_threads(2);
    const auto two = mask_of(pattern, rf, S);
    EXPECT_EQ(one, two) << pattern_name(pattern);
  }
  set_num_threads(before);
}

TEST(RainFusionMask, StridedRowsAreWrittenInPlace) {
  // A mask whose rows are padded: padding untouched, rows equal to the contiguous mask.
  const RainFusionOptions rf = options_of(3, 4, 6, 5, true, true, 0.6f, 2);
  const std::int64_t S = 5 + 3 * 4 * 6;
  const auto contiguous = mask_of(HeadPattern::spatial, rf, S);
  TestTensor<std::uint8_t> padded({S, S}, 3);
  rainfusion_mask(HeadPattern::spatial, rf, as_bool(padded.view()));
  EXPECT_EQ(padded.damaged_canaries(), 0);
  for (std::int64_t i = 0; i < S * S; ++i) ASSERT_EQ(padded.at(i), contiguous[i]) << i;
}

/// Density of a pattern on the floor its own frame / column and frame 0 set, from the
/// definition: frame 0's rows keep all V keys, each other row keeps frame 0 plus `per_row`.
double floor_density(const Geometry& g, double per_row) {
  const double F = static_cast<double>(g.F), V = static_cast<double>(g.V);
  return (F * V + (V - F) * (F + per_row)) / (V * V);
}

TEST(RainFusionDensity, MeasuredOnA12x16x32Grid) {
  // 128 text tokens + 12 x 16 x 32: S = 6272, each mask 39 MB.
  for (float sparsity : {0.5f, 0.75f, 0.9f}) {
    const RainFusionOptions rf = options_of(12, 16, 32, 128, true, true, sparsity);
    const Geometry g(rf);
    const double target = 1.0 - sparsity;
    // Spatial keeps at least frame 0 and its own frame; temporal frame 0 and its own column.
    const double spatial_floor = floor_density(g, static_cast<double>(g.F));
    const double temporal_floor = floor_density(g, static_cast<double>(g.T - 1));
    for (HeadPattern pattern : {HeadPattern::spatial, HeadPattern::temporal}) {
      SCOPED_TRACE(describe(rf) + " " + pattern_name(pattern));
      const double floor = pattern == HeadPattern::spatial ? spatial_floor : temporal_floor;
      const double measured = measured_density(g, mask_of(pattern, rf, g.S));
      EXPECT_DOUBLE_EQ(measured, rainfusion_density(pattern, rf));
      if (floor >= target) {
        EXPECT_DOUBLE_EQ(measured, floor);
      } else {
        EXPECT_GE(measured, target);
        EXPECT_LE(measured, target + 0.03);
      }
    }
  }
  // The floors bind where the definition says: spatial at 0.9 only (floor 3/12-ish = 0.236).
  const Geometry g(options_of(12, 16, 32, 128, true, true, 0.9f));
  EXPECT_GT(floor_density(g, static_cast<double>(g.F)), 0.1);
  EXPECT_LT(floor_density(g, static_cast<double>(g.F)), 0.25);
}

TEST(RainFusionDensity, Wan480pGrid) {
  // Wan 2.1 480p: 21 latent frames of 30 x 52, 512 text tokens (S = 33272): no S x S mask,
  // the densities against the definition's floors and targets.
  for (float sparsity : {0.5f, 0.75f, 0.9f}) {
    const RainFusionOptions rf = options_of(21, 30, 52, 512, true, true, sparsity);
    const Geometry g(rf);
    const double target = 1.0 - sparsity;
    const double spatial = rainfusion_density(HeadPattern::spatial, rf);
    const double temporal = rainfusion_density(HeadPattern::temporal, rf);
    const double spatial_floor = floor_density(g, static_cast<double>(g.F));
    SCOPED_TRACE(describe(rf));
    if (spatial_floor >= target) {
      EXPECT_DOUBLE_EQ(spatial, spatial_floor);
    } else {
      EXPECT_GE(spatial, target);
      EXPECT_LE(spatial, target + 0.03);
    }
    EXPECT_GE(temporal, target);
    EXPECT_LE(temporal, target + 0.03);
    EXPECT_EQ(rainfusion_density(HeadPattern::dense, rf), 1.0);
    // Textural: frame 0's rows and, for the other rows, frame 0 plus the 15 x 26 lattice of
    // each of the 20 sparse frames.
    EXPECT_DOUBLE_EQ(rainfusion_density(HeadPattern::textural, rf),
                     floor_density(g, 20.0 * 15 * 26));
  }
  // 0.9 sits below the spatial floor (1/21 + 20/21 x 2/21 = 0.138).
  const RainFusionOptions rf = options_of(21, 30, 52, 512, true, true, 0.9f);
  EXPECT_NEAR(rainfusion_density(HeadPattern::spatial, rf), 1.0 / 21 + 20.0 / 21 * 2.0 / 21, 1e-12);
}

TEST(RainFusionDensity, TexturalStrideAndDenseFrame) {
  // Without the dense frame 0 every video row keeps exactly the lattice: ceil(H / tau) x
  // ceil(W / tau) per frame.
  const RainFusionOptions rf = options_of(4, 7, 10, 3, true, false, 0.5f, 3);
  EXPECT_DOUBLE_EQ(rainfusion_density(HeadPattern::textural, rf), (3.0 * 4.0) / (7.0 * 10.0));
}

// ---- bad inputs
// ----------------------------------------------------------------------------------

/// The call throws ditops::Error naming `call` and `needle`, and `mask` keeps its sentinel.
template <class Call>
void expect_mask_rejected(Call&& call, const std::string& needle,
                          const TestTensor<std::uint8_t>& mask) {
  const auto before = mask.snapshot();
  try {
    call();
    ADD_FAILURE() << "no ditops::Error for: " << needle;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message '" << message << "' does not name " << needle;
    EXPECT_TRUE(message.rfind("rainfusion_mask: ", 0) == 0 ||
                message.rfind("rainfusion_density: ", 0) == 0)
        << "message '" << message << "' does not name the call";
  }
  EXPECT_TRUE(mask.unchanged_since(before)) << needle << ": mask touched before the error";
}

TEST(RainFusionMask, RejectsBadInputsBeforeWriting) {
  const RainFusionOptions good = options_of(3, 4, 5, 6, true, true, 0.5f);
  const std::int64_t S = 6 + 3 * 4 * 5;
  TestTensor<std::uint8_t> mask({S, S});
  for (std::int64_t i = 0; i < mask.size(); ++i) mask.at(i) = 0x5A;
  const TensorView view = as_bool(mask.view());
  auto both = [&](const RainFusionOptions& rf, const std::string& needle) {
    expect_mask_rejected([&] { rainfusion_mask(HeadPattern::spatial, rf, view); }, needle, mask);
    expect_mask_rejected([&] { rainfusion_density(HeadPattern::spatial, rf); }, needle, mask);
  };

  RainFusionOptions rf = good;
  const std::vector<std::array<std::int64_t, 4>> bad_extents = {
      {0, 4, 5, 6}, {3, -1, 5, 6}, {3, 4, 0, 6}, {3, 4, 5, -1}};
  for (const auto& [frames, height, width, text] : bad_extents) {
    rf = good;
    rf.video = {frames, height, width, text, true};
    both(rf, "rf.video");
  }
  rf = good;
  rf.video = {std::int64_t{1} << 20, std::int64_t{1} << 11, 1, 0, true};  // 2^31 tokens
  both(rf, "rf.video");
  rf.video = {std::int64_t{1} << 40, std::int64_t{1} << 40, 1, 0, true};  // overflows int64
  both(rf, "rf.video");
  for (float sparsity : {-0.1f, 1.0f, std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::infinity()}) {
    rf = good;
    rf.sparsity = sparsity;
    both(rf, "rf.sparsity");
  }
  for (int stride : {0, -2}) {
    rf = good;
    rf.textural_stride = stride;
    both(rf, "rf.textural_stride");
  }
  for (float recall : {0.f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    rf = good;
    rf.recall_threshold = recall;
    both(rf, "rf.recall_threshold");
  }
  const auto bad_pattern = static_cast<HeadPattern>(7);
  expect_mask_rejected([&] { rainfusion_mask(bad_pattern, good, view); }, "pattern", mask);
  expect_mask_rejected([&] { rainfusion_density(bad_pattern, good); }, "pattern", mask);

  // The mask itself: shape, dtype, rank, strides, null data.
  auto rejects_mask = [&](const TensorView& bad, const std::string& needle) {
    expect_mask_rejected([&] { rainfusion_mask(HeadPattern::temporal, good, bad); }, needle, mask);
  };
  TensorView wrong = view;
  wrong.shape[1] = S - 1;
  rejects_mask(wrong, "mask");
  wrong = view;
  wrong.shape[0] = S + 1;
  rejects_mask(wrong, "mask");
  wrong = mask.view();  // u8, not bool
  rejects_mask(wrong, "mask.dtype");
  wrong = view;
  wrong.dtype = DType::f32;
  rejects_mask(wrong, "mask.dtype");
  wrong = view;
  wrong.rank = 3;
  wrong.shape = {1, S, S};
  wrong.strides = {S * S, S, 1};
  rejects_mask(wrong, "mask has rank 3");
  wrong = view;
  wrong.strides[0] = 0;  // every row the same memory
  rejects_mask(wrong, "mask");
  wrong = view;
  wrong.strides[1] = 2;
  rejects_mask(wrong, "mask.strides[1]");
  wrong = view;
  wrong.data = nullptr;
  rejects_mask(wrong, "mask.data");
}

}  // namespace
}  // namespace ditops::test
