#pragma once
// fp64 oracle for mla_decode_paged: the cache read back dequantized (int8 * scale), the paged
// walk through the block table, an exact softmax. Optionally q_nope quantized to int8 exactly
// as the library documents (mla.hpp), for a tight check of everything after quantization.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ditops/runtime.hpp>
#include <limits>
#include <string>
#include <vector>

#include "ops/core/isa.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {

inline constexpr int kRefNope = 512;
inline constexpr int kRefRope = 64;

/// q_nope as the library quantizes it (float arithmetic, the documented formula): the
/// dequantized values int8 * (max|q| / 127).
inline std::vector<double> quantize_like_library(const std::vector<float>& values) {
  float max_abs = 0.f;
  for (float v : values) max_abs = std::max(max_abs, std::fabs(v));
  const float scale = max_abs / 127.f;
  std::vector<double> out(values.size(), 0.0);
  if (!(scale > 0.f)) return out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float q = std::clamp(std::nearbyint(values[i] / scale), -127.f, 127.f);
    out[i] = static_cast<double>(q) * static_cast<double>(scale);
  }
  return out;
}

struct MlaReference {
  std::vector<double> out;    ///< [B, H, 512]
  std::vector<double> bound;  ///< [B, H]: worst-case |out - ref| per element from quantizing q
  /// [B, H, 512]: worst-case |out - ref| from quantizing the softmax weights for P·V as the
  /// library does (mla.hpp): per paged block, head and scale group g, the weights
  /// w_t = p_t * s_t,g are rounded to levels of max w / weight_levels (255, or 127 on the ISA
  /// levels that multiply them with pmaddubsw; error <= half a level each), and
  /// the output is the quantized numerator over the sum of the quantized weights w~_t / s_t.
  /// With eN[d] = sum_t (level_t / 2) |q_t[d]| and eD = sum_t (level_t / 2) / s_t:
  /// |out~ - out| <= (eN[d] + max_t |v_t[d]| eD) / (D - eD), D = sum_t p_t.
  std::vector<double> p_bound;
};

/// u8 levels of the P·V weights of the running kernel variant: 127 on SSE4.2 and AVX2, whose
/// pmaddubsw would saturate the int16 sums of 255 x 127 pairs; 255 elsewhere (avx2+vnni's
/// vpdpbusd included).
inline int mla_weight_levels() {
  const std::string variant = core::kernel_variant_name();
  return variant == "sse4.2" || variant == "avx2" ? 127 : 255;
}

/// block_table: [B, max_blocks]; cache tensors [num_blocks, block_size, ...].
template <class Q, class R>
MlaReference mla_reference(const TestTensor<Q>& q_nope, const TestTensor<Q>& q_rope,
                           const TestTensor<std::int8_t>& nope, const TestTensor<float>& nope_scale,
                           const TestTensor<R>& rope, const TestTensor<std::int32_t>& block_table,
                           const std::vector<std::int32_t>& seq_lens, double scale, bool quantize_q,
                           int weight_levels) {
  const std::int64_t batch = q_nope.shape()[0], heads = q_nope.shape()[1];
  const std::int64_t block_size = nope.shape()[1], groups = nope_scale.shape()[2];
  const std::int64_t max_blocks = block_table.shape()[1];
  MlaReference ref;
  ref.out.assign(static_cast<std::size_t>(batch * heads * kRefNope), 0.0);
  ref.bound.assign(static_cast<std::size_t>(batch * heads), 0.0);
  ref.p_bound.assign(static_cast<std::size_t>(batch * heads * kRefNope), 0.0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t length = seq_lens[b];
    // Dequantized latent rows of the sequence, in token order.
    std::vector<double> keys(static_cast<std::size_t>(length * (kRefNope + kRefRope)));
    std::vector<double> key_abs_sums(static_cast<std::size_t>(length));
    for (std::int64_t t = 0; t < length; ++t) {
      const std::int64_t block =
          static_cast<std::int64_t>(block_table.value(b * max_blocks + t / block_size));
      const std::int64_t row = block * block_size + t % block_size;
      double* key = keys.data() + t * (kRefNope + kRefRope);
      for (int d = 0; d < kRefNope; ++d) {
        const double s = nope_scale.value(row * groups + d / (kRefNope / groups));
        key[d] = nope.value(row * kRefNope + d) * s;
        key_abs_sums[t] += std::fabs(key[d]);
      }
      for (int d = 0; d < kRefRope; ++d) key[kRefNope + d] = rope.value(row * kRefRope + d);
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      std::vector<float> q_values(kRefNope);
      float q_max = 0.f;
      for (int d = 0; d < kRefNope; ++d) {
        q_values[d] = static_cast<float>(q_nope.value((b * heads + h) * kRefNope + d));
        q_max = std::max(q_max, std::fabs(q_values[d]));
      }
      std::vector<double> q(kRefNope + kRefRope);
      if (quantize_q) {
        const std::vector<double> quantized = quantize_like_library(q_values);
        std::copy(quantized.begin(), quantized.end(), q.begin());
      } else {
        std::copy(q_values.begin(), q_values.end(), q.begin());
      }
      for (int d = 0; d < kRefRope; ++d)
        q[kRefNope + d] = q_rope.value((b * heads + h) * kRefRope + d);
      std::vector<double> logits(static_cast<std::size_t>(length));
      double max_logit = -std::numeric_limits<double>::infinity(), max_perturbation = 0;
      for (std::int64_t t = 0; t < length; ++t) {
        double dot = 0;
        for (int d = 0; d < kRefNope + kRefRope; ++d)
          dot += q[d] * keys[t * (kRefNope + kRefRope) + d];
        logits[t] = scale * dot;
        max_logit = std::max(max_logit, logits[t]);
        // |q - int8(q) * s| <= s / 2 per element, so the logit moves by at most this.
        max_perturbation =
            std::max(max_perturbation, scale * (q_max / 127.0 / 2.0) * key_abs_sums[t]);
      }
      double sum = 0;
      for (auto& logit : logits) sum += (logit = std::exp(logit - max_logit));
      double max_value = 0;
      for (int d = 0; d < kRefNope; ++d) {
        double acc = 0;
        for (std::int64_t t = 0; t < length; ++t) {
          const double v = keys[t * (kRefNope + kRefRope) + d];
          acc += logits[t] * v;
          max_value = std::max(max_value, std::fabs(v));
        }
        ref.out[(b * heads + h) * kRefNope + d] = length ? acc / sum : 0.0;
      }
      // P·V weight quantization (see MlaReference::p_bound), per scale group and paged block.
      const std::int64_t group_dim = kRefNope / groups;
      for (std::int64_t g = 0; g < groups; ++g) {
        std::vector<double> error_n(static_cast<std::size_t>(group_dim), 0.0);
        std::vector<double> value_max(static_cast<std::size_t>(group_dim), 0.0);
        double error_d = 0;
        for (std::int64_t first = 0; first < length; first += block_size) {
          const std::int64_t end = std::min(length, first + block_size);
          const auto row_of = [&](std::int64_t t) {
            return static_cast<std::int64_t>(block_table.value(b * max_blocks + t / block_size)) *
                       block_size +
                   t % block_size;
          };
          double top = 0;
          for (std::int64_t t = first; t < end; ++t) {
            top = std::max(top, logits[t] * nope_scale.value(row_of(t) * groups + g));
          }
          const double half_level = top / weight_levels / 2.0;
          for (std::int64_t t = first; t < end; ++t) {
            const double s = nope_scale.value(row_of(t) * groups + g);
            if (!(s > 0)) continue;
            error_d += half_level / s;
            for (std::int64_t d = 0; d < group_dim; ++d) {
              const double q8 = nope.value(row_of(t) * kRefNope + g * group_dim + d);
              error_n[d] += half_level * std::fabs(q8);
              value_max[d] = std::max(value_max[d], std::fabs(q8 * s));
            }
          }
        }
        for (std::int64_t d = 0; d < group_dim; ++d) {
          ref.p_bound[(b * heads + h) * kRefNope + g * group_dim + d] =
              length ? (error_n[d] + value_max[d] * error_d) / (sum - error_d) : 0.0;
        }
      }
      // Logits perturbed by at most e move each softmax weight by a factor within e^(+-2e),
      // so every output element moves by at most (e^(2e) - 1) * max|v|.
      ref.bound[b * heads + h] = std::expm1(2 * max_perturbation) * max_value;
    }
  }
  return ref;
}

}  // namespace ditops::test
