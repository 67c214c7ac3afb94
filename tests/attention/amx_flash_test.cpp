// flash_bf16's task kernel on AMX tiles (ops/attention/amx_flash.cpp) compiled on the tile model
// (ops/core/amx_tiles.hpp, DITOPS_AMX_MODEL=1) at the baseline, so the whole tile program runs on
// every machine: called through the entry the library calls (flash_task_amx, one task at a time
// on K and V packed by PackedKV as a flash_bf16 run packs them), against the fp64 oracle, and
// against the vdpbf16ps kernel (the avx512+bf16+vnni variant's flash_task) where the CPU runs it.

#define DITOPS_AMX_MODEL 1

#include "ops/attention/amx_flash.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/attention/packing.hpp"
#include "ops/core/isa.hpp"
#include "tests/reference/attention_ref.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

using attention::FlashProblem;
using attention::FlashRun;
using attention::FlashTask;
using attention::FlashTiles;
using attention::kKvBlock;
using attention::MaskKind;
using attention::PackedKV;

using TaskKernel = void (*)(const FlashRun&, const FlashTask&, float*) noexcept;

/// 64-byte aligned floats (the kernels' scratch and partials).
struct AlignedFloats {
  explicit AlignedFloats(std::int64_t count)
      : data(static_cast<float*>(
            std::aligned_alloc(64, static_cast<std::size_t>((count * 4 + 64) / 64 * 64)))) {
    std::fill(data.get(), data.get() + count, 0.f);
  }
  float* get() const { return data.get(); }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data;
};

enum class Values {
  uniform,  ///< q, k, v uniform in [-1, 1], rounded to bf16
  /// q and k in {-1, 0, 1} (mostly 0) with scale_log2 = 1: every score is a small integer, exact
  /// in any order of summation, so every weight 2^(s - m) is a power of two, exact in bf16.
  integer_scores
};

struct Case {
  std::int64_t q_len = 16, kv_len = 64, dk = 64, dv = 64, heads = 1, kv_heads = 1;
  bool causal = false;
  std::int64_t splits = 1;  ///< > 1: split-KV tasks writing partials, merged by the library
  int row_group = attention::kMaxRowGroup;  ///< FlashTiles::row_group (96 or 24 rows)
  MaskKind mask = MaskKind::none;
  Values values = Values::uniform;
  float scale_error = 1;  ///< the kernel runs with scale_log2 times this (1: right)
  std::string describe() const {
    return "Sq=" + std::to_string(q_len) + " Skv=" + std::to_string(kv_len) +
           " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) +
           " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
           (causal ? " causal" : "") + " splits=" + std::to_string(splits) +
           " row_group=" + std::to_string(row_group) +
           (mask == MaskKind::boolean    ? " bool-mask"
            : mask == MaskKind::additive ? " additive-mask"
                                         : "");
  }
};

/// A dense BSND problem of batch 1 with bf16 (or, for out, fp32 or bf16) tensors.
class Problem {
 public:
  Problem(const Case& c, DType out_dtype, std::uint32_t seed) : c_(c) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    std::uniform_int_distribution<int> pick(0, 23);
    const auto value = [&](bool qk) {
      if (!qk || c.values == Values::uniform) return bf16::from_float(uniform(rng));
      const int r = pick(rng);  // 1 in 12 non-zero
      return bf16::from_float(r == 0 ? 1.f : r == 1 ? -1.f : 0.f);
    };
    q_.resize(c.q_len * c.heads * c.dk);
    k_.resize(c.kv_len * c.kv_heads * c.dk);
    v_.resize(c.kv_len * c.kv_heads * c.dv);
    for (bf16& x : q_) x = value(true);
    for (bf16& x : k_) x = value(true);
    for (bf16& x : v_) x = value(false);
    if (c.mask == MaskKind::boolean) {
      bool_mask_.resize(c.heads * c.q_len * c.kv_len);
      for (std::uint8_t& m : bool_mask_) m = pick(rng) < 18;  // 3 in 4 attended
      // A whole query row masked off: it attends nothing (zeros, LSE -inf).
      if (c.q_len > 1) std::fill_n(bool_mask_.begin() + c.kv_len, c.kv_len, std::uint8_t{0});
    } else if (c.mask == MaskKind::additive) {
      bias_.resize(c.heads * c.q_len * c.kv_len);
      for (float& b : bias_) b = 2 * uniform(rng);
    }
    scale_ = c.values == Values::integer_scores ? std::log(2.0) : 1 / std::sqrt(double(c.dk));
    out_dtype_ = out_dtype;
  }

  /// Runs `kernel` over the problem's tasks (as the driver cuts them: up to 96 rows, GQA heads
  /// as rows of one task; c.splits ranges of KV blocks each, merged by the baseline merge).
  /// Returns out as doubles [Sq][H][dv] and the LSE [H][Sq] (natural log).
  void run(TaskKernel kernel, std::vector<double>& out, std::vector<double>& lse) const {
    const Case& c = c_;
    FlashProblem p;
    p.dtype = DType::bf16;
    p.dk = c.dk;
    p.dv = c.dv;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.batch = 1;
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
    p.q = q_.data();
    p.k = k_.data();
    p.v = v_.data();
    p.q_strides = {c.q_len * c.heads * c.dk, c.heads * c.dk, c.dk};
    p.k_strides = {c.kv_len * c.kv_heads * c.dk, c.kv_heads * c.dk, c.dk};
    p.v_strides = {c.kv_len * c.kv_heads * c.dv, c.kv_heads * c.dv, c.dv};
    p.out_strides = {c.q_len * c.heads * c.dv, c.heads * c.dv, c.dv};
    p.lse_strides = {c.heads * c.q_len, 1, c.q_len};
    p.causal = c.causal;
    p.dv_padded = attention::round_up(c.dv, 16);
    p.scale_log2 = c.values == Values::integer_scores
                       ? 1.f
                       : static_cast<float>(scale_) * static_cast<float>(1 / std::log(2.0));
    p.scale_log2 *= c.scale_error;
    p.mask_kind = c.mask;
    if (c.mask == MaskKind::boolean) p.mask = bool_mask_.data();
    if (c.mask == MaskKind::additive) p.mask = bias_.data();
    if (c.mask != MaskKind::none) {
      p.mask_strides[1] = c.q_len * c.kv_len;
      p.mask_strides[2] = c.kv_len;
      p.mask_strides[3] = 1;
    }
    std::vector<bf16> out_bf16(c.q_len * c.heads * c.dv);
    std::vector<float> out_f32(c.q_len * c.heads * c.dv);
    if (out_dtype_ == DType::bf16) {
      p.out = out_bf16.data();
    } else {
      // The kernel writes out in q's dtype: an fp32 output needs fp32 inputs, the same bf16
      // values widened (flash_bf16 rounds them to bf16 again: exactly).
      p.dtype = DType::f32;
      q_f32_ = widen(q_);
      k_f32_ = widen(k_);
      v_f32_ = widen(v_);
      p.q = q_f32_.data();
      p.k = k_f32_.data();
      p.v = v_f32_.data();
      p.out = out_f32.data();
    }
    std::vector<float> lse_f32(c.heads * c.q_len, 0.f);
    p.lse = lse_f32.data();

    const std::int64_t group = c.heads / c.kv_heads;
    const std::int64_t q_block = std::max<std::int64_t>(1, 96 / group);
    std::vector<FlashTask> tasks;
    for (std::int64_t h = 0; h < c.kv_heads; ++h) {
      for (std::int64_t q0 = 0; q0 < c.q_len; q0 += q_block) {
        FlashTask task;
        task.kv_head = h;
        task.q_begin = q0;
        task.q_end = std::min(c.q_len, q0 + q_block);
        task.kv_end = c.kv_len;
        tasks.push_back(task);
      }
    }
    FlashTiles tiles;
    tiles.bf16_dot = true;
    tiles.row_group = c.row_group;
    const PackedKV packed = PackedKV::pack(p, tiles, tasks, 1);
    const FlashRun run{p, tiles, packed.view()};
    AlignedFloats scratch(attention::flash_scratch_floats(p));
    for (const FlashTask& task : tasks) {
      if (c.splits == 1) {
        kernel(run, task, scratch.get());
        continue;
      }
      const std::int64_t rows = group * (task.q_end - task.q_begin);
      AlignedFloats partial_out(c.splits * rows * p.dv_padded), partial_lse(c.splits * rows);
      AlignedFloats merged(p.dv_padded);
      const std::int64_t blocks = attention::blocks_of(c.kv_len);
      for (std::int64_t s = 0; s < c.splits; ++s) {
        FlashTask part = task;
        part.kv_begin = std::min(c.kv_len, blocks * s / c.splits * kKvBlock);
        part.kv_end = std::min(c.kv_len, blocks * (s + 1) / c.splits * kKvBlock);
        part.partial_out = partial_out.get() + s * rows * p.dv_padded;
        part.partial_lse = partial_lse.get() + s * rows;
        kernel(run, part, scratch.get());
      }
      attention::flash_merge_splits<xsimd::sse2>(p, task, c.splits, partial_out.get(),
                                                 partial_lse.get(), merged.get());
    }
    out.resize(out_f32.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = out_dtype_ == DType::bf16 ? out_bf16[i].to_float() : out_f32[i];
    }
    lse.assign(lse_f32.begin(), lse_f32.end());
  }

  /// The fp64 oracle on the same (bf16) values.
  AttentionRefResult reference() const {
    const Case& c = c_;
    AttentionRefProblem r;
    r.q_len = c.q_len;
    r.kv_len = c.kv_len;
    r.heads = c.heads;
    r.kv_heads = c.kv_heads;
    r.dk = c.dk;
    r.dv = c.dv;
    r.scale = scale_;
    r.causal = c.causal;
    r.q = [&](std::int64_t, std::int64_t s, std::int64_t h, std::int64_t d) {
      return double(q_[(s * c.heads + h) * c.dk + d].to_float());
    };
    r.k = [&](std::int64_t, std::int64_t s, std::int64_t h, std::int64_t d) {
      return double(k_[(s * c.kv_heads + h) * c.dk + d].to_float());
    };
    r.v = [&](std::int64_t, std::int64_t s, std::int64_t h, std::int64_t d) {
      return double(v_[(s * c.kv_heads + h) * c.dv + d].to_float());
    };
    if (c.mask == MaskKind::boolean) {
      r.allowed = [&](std::int64_t, std::int64_t h, std::int64_t i, std::int64_t j) {
        return bool_mask_[(h * c.q_len + i) * c.kv_len + j] != 0;
      };
    } else if (c.mask == MaskKind::additive) {
      r.bias = [&](std::int64_t, std::int64_t h, std::int64_t i, std::int64_t j) {
        return double(bias_[(h * c.q_len + i) * c.kv_len + j]);
      };
    }
    return attention_reference(r);
  }

  double v_max() const {
    double m = 0;
    for (const bf16& x : v_) m = std::max(m, double(std::fabs(x.to_float())));
    return m;
  }

 private:
  static std::vector<float> widen(const std::vector<bf16>& x) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i].to_float();
    return y;
  }

  Case c_;
  std::vector<bf16> q_, k_, v_;
  mutable std::vector<float> q_f32_, k_f32_, v_f32_;
  std::vector<std::uint8_t> bool_mask_;
  std::vector<float> bias_;
  double scale_ = 1;
  DType out_dtype_ = DType::bf16;
};

TaskKernel model_kernel() { return &attention::amx_model::flash_task_amx<xsimd::sse2>; }

/// The largest |got - want| / (atol + rtol |want|) over outputs and, as |got - want| /
/// lse_tol, over the LSE (the rows where the oracle's is finite; the others must be -inf).
/// > 1 fails. NaN counts as a failure.
double worst_ratio(const std::vector<double>& out, const std::vector<double>& lse,
                   const AttentionRefResult& ref, Tolerance tol, double lse_tol) {
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double ratio =
        std::fabs(out[i] - ref.out[i]) / (tol.atol + tol.rtol * std::fabs(ref.out[i]));
    if (!(ratio <= worst)) worst = ratio != ratio ? INFINITY : ratio;
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      if (!(std::isinf(lse[i]) && lse[i] < 0)) worst = INFINITY;
      continue;
    }
    const double ratio = std::fabs(lse[i] - ref.lse[i]) / lse_tol;
    if (!(ratio <= worst)) worst = ratio != ratio ? INFINITY : ratio;
  }
  return worst;
}

/// Runs the model kernel on `c` and returns its worst ratio against the oracle under
/// flash_bf16's tolerance (tests/support/tolerance.hpp): Q (scaled) and K rounded to bf16 move
/// each score by at most δ = bf16_score_error; P rounded to bf16 once, with the row sums adding
/// the rounded weights, moves each normalized weight by a factor within e^{±2.05u} (u = 2^-9);
/// V is bf16 already (exact); the bf16 output adds one rounding (rtol 2^-8). So the output may
/// move by (e^{2δ + 2.05u} − 1 + u)·max |v| on top of flash's fp32 tolerance, and the LSE by
/// δ + 1.025u on top of its. The tile dot products are exact products summed in fp32 (as
/// vdpbf16ps sums them), so no term is added for the tiles.
double model_ratio(const Case& c, std::uint32_t seed) {
  const Problem problem(c, DType::bf16, seed);
  std::vector<double> out, lse;
  problem.run(model_kernel(), out, lse);
  const AttentionRefResult ref = problem.reference();
  const Tolerance tol = attention_tolerance<bf16>(AttentionBackend::flash_bf16, ref.magnitudes);
  return worst_ratio(out, lse, ref, tol,
                     attention_lse_tolerance(AttentionBackend::flash_bf16, ref.magnitudes));
}

TEST(AmxFlashModel, MatchesFp64OracleOverSweep) {
  struct Head {
    std::int64_t dk, dv, heads, kv_heads;
  };
  // dk and dv not multiples of 32 (72: a 96-word Q row and K^T block, dv_padded 80: an odd last
  // 16-column panel) and an odd small pair (33: an odd d zero padded in a pair; 20: one and a
  // quarter panels); GQA with 4 query heads per KV head.
  const Head heads[] = {{64, 64, 4, 1}, {72, 72, 2, 2}, {128, 128, 4, 1}, {33, 20, 1, 1}};
  std::uint32_t seed = 1;
  double worst = 0;
  int cases = 0;
  for (std::int64_t q_len : {1, 15, 16, 17, 33, 100}) {
    for (std::int64_t kv_len : {1, 63, 64, 65, 200}) {
      for (bool causal : {false, true}) {
        for (int pick = 0; pick < 2; ++pick) {
          const Head& h = heads[(q_len + kv_len + pick * 2 + causal) % 4];
          Case c;
          c.q_len = q_len;
          c.kv_len = kv_len;
          c.dk = h.dk;
          c.dv = h.dv;
          c.heads = h.heads;
          c.kv_heads = h.kv_heads;
          c.causal = causal;
          c.splits = attention::blocks_of(kv_len) >= 2 && pick == 1 ? 2 : 1;
          c.row_group = pick == 1 ? 4 : attention::kMaxRowGroup;
          const double ratio = model_ratio(c, seed++);
          EXPECT_LE(ratio, 1.0) << c.describe();
          worst = std::max(worst, ratio);
          ++cases;
        }
      }
    }
  }
  // Every head shape with every sequence tail, once more.
  for (const Head& h : heads) {
    for (std::int64_t q_len : {17, 100}) {
      Case c;
      c.q_len = q_len;
      c.kv_len = 200;
      c.dk = h.dk;
      c.dv = h.dv;
      c.heads = h.heads;
      c.kv_heads = h.kv_heads;
      c.causal = q_len == 100;
      const double ratio = model_ratio(c, seed++);
      EXPECT_LE(ratio, 1.0) << c.describe();
      worst = std::max(worst, ratio);
      ++cases;
    }
  }
  RecordProperty("worst_ratio", std::to_string(worst));
  std::printf("[ amx flash ] %d cases, worst error / tolerance %.3f\n", cases, worst);
}

TEST(AmxFlashModel, MasksMatchFp64Oracle) {
  for (MaskKind mask : {MaskKind::boolean, MaskKind::additive}) {
    for (bool causal : {false, true}) {
      Case c;
      c.q_len = 33;
      c.kv_len = 130;
      c.dk = 72;
      c.dv = 72;
      c.heads = 4;
      c.kv_heads = 1;
      c.causal = causal;
      c.mask = mask;
      EXPECT_LE(model_ratio(c, 7), 1.0) << c.describe();
    }
  }
}

// The check can fail: the same kernel with its scale 10 % off (scores 10 % off, a shift the
// bf16 bound of a few 2^-8 cannot cover) exceeds the tolerance it meets with the right scale.
TEST(AmxFlashModel, WrongScaleExceedsTheTolerance) {
  Case c;
  c.q_len = 33;
  c.kv_len = 200;
  c.dk = 128;
  c.dv = 128;
  c.heads = 4;
  c.kv_heads = 1;
  EXPECT_LE(model_ratio(c, 3), 1.0);
  c.scale_error = 1.1f;
  EXPECT_GT(model_ratio(c, 3), 1.0);
}

/// The vdpbf16ps kernel (the avx512+bf16+vnni variant's flash_task, which runs bf16_dot runs
/// on vdpbf16ps), where this process runs that variant: it rounds the same Q, K, P and V. Null
/// elsewhere.
TaskKernel vdpbf16ps_kernel() {
  if (core::kernel_variant() != core::kAvx512Bf16Variant) return nullptr;
  return attention::attention_kernels().flash_task;
}

/// The library's kernel on the instructions, where this process uses AMX-BF16 (the kernel the
/// flash driver then runs for flash_bf16); null elsewhere.
TaskKernel instructions_kernel() {
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  if (core::amx_usable(core::AmxUnit::bf16)) return &attention::amx::flash_task_amx<avx512_bf16>;
#endif
  return nullptr;
}

/// Largest |a - b| over the outputs.
double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = d != d ? INFINITY : d;
  }
  return worst;
}

/// Two kernels on the same problem, fp32 outputs: their largest output difference / max |v|.
double kernels_apart(const Case& c, std::uint32_t seed, TaskKernel a, TaskKernel b) {
  const Problem problem(c, DType::f32, seed);
  std::vector<double> a_out, a_lse, b_out, b_lse;
  problem.run(a, a_out, a_lse);
  problem.run(b, b_out, b_lse);
  return max_difference(a_out, b_out) / problem.v_max();
}

std::vector<Case> comparison_cases() {
  std::vector<Case> cases;
  for (std::int64_t q_len : {15, 100}) {
    for (std::int64_t kv_len : {65, 200}) {
      for (bool causal : {false, true}) {
        Case c;
        c.q_len = q_len;
        c.kv_len = kv_len;
        c.dk = q_len == 15 ? 72 : 128;
        c.dv = c.dk;
        c.heads = 4;
        c.kv_heads = q_len == 15 ? 4 : 1;
        c.causal = causal;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Weights that are powers of two (integer scores): two kernels that round the same Q, K and V
// compute the same P exactly, and the same row sums but for the order of their fp32 additions,
// so their outputs differ only by fp32 summation order: each output, Σ_j p_j v_j / Σ_j p_j over
// n <= 200 keys, is within (n - 1)·2^-24 relative of its exact value in both numerator and
// denominator in either order, so the two differ by at most 4·n·2^-24·max |v| (5e-5 at
// n = 200), some 100 times less than the oracle's tolerance.
double summation_order_bound(const Case& c) { return 4.0 * c.kv_len * 0x1p-24; }

// Uniform data: the two kernels round the same Q, K and V, but each weight 2^(s - m) is rounded
// to bf16 on its own: the kernels' running maxima m differ (the vdpbf16ps kernel updates it per
// step of two KV blocks, the tiles per block), as do their exp2 polynomials (the baseline's
// 2e-7, AVX-512's 4.2e-5 relative) and the fp32 order of the score sums. Each rounded weight is
// within 2^-9 of its exact value, so the two kernels' weights are within 2^-8 + 4.3e-5 of each
// other, their normalized weights within a factor e^{±2(2^-8 + 4.3e-5)}, and their outputs (the
// row sums add the rounded weights: convex combinations of V rows) within
// (e^{2(2^-8 + 4.3e-5)} − 1)·max |v| (7.9e-3), about a third of the oracle's tolerance here.
const double kWeightRoundingBound = std::expm1(2 * (0x1p-8 + 4.3e-5));

/// Checks kernels a and b against each other on the comparison cases, both kinds of data.
void expect_kernels_agree(TaskKernel a, TaskKernel b, const char* what) {
  double worst_exact = 0, worst_uniform = 0;
  std::uint32_t seed = 11;
  for (Case c : comparison_cases()) {
    c.values = Values::integer_scores;
    const double exact = kernels_apart(c, seed++, a, b);
    EXPECT_LE(exact, summation_order_bound(c)) << what << " integer scores " << c.describe();
    worst_exact = std::max(worst_exact, exact);
    c.values = Values::uniform;
    const double uniform = kernels_apart(c, seed++, a, b);
    EXPECT_LE(uniform, kWeightRoundingBound) << what << " " << c.describe();
    worst_uniform = std::max(worst_uniform, uniform);
  }
  std::printf("[ amx flash ] %s, worst difference / max|v|: integer scores %.3g, uniform %.3g\n",
              what, worst_exact, worst_uniform);
}

TEST(AmxFlashModel, MatchesVdpbf16psKernel) {
  if (vdpbf16ps_kernel() == nullptr) GTEST_SKIP() << "the CPU does not run AVX512-BF16 here";
  expect_kernels_agree(model_kernel(), vdpbf16ps_kernel(), "tile model vs vdpbf16ps");
}

// The library's kernel on the instructions (where AMX-BF16 is used: tools/amx-check.sh runs
// it there), against the vdpbf16ps kernel and the tile model, with the same bounds.
TEST(AmxFlashInstructions, MatchesVdpbf16psKernelAndTheModel) {
  if (instructions_kernel() == nullptr) {
    GTEST_SKIP() << "AMX-BF16 is not used here: " << core::amx_reason(core::AmxUnit::bf16);
  }
  expect_kernels_agree(instructions_kernel(), vdpbf16ps_kernel(), "AMX vs vdpbf16ps");
  expect_kernels_agree(instructions_kernel(), model_kernel(), "AMX vs tile model");
}

}  // namespace
}  // namespace ditops::test
