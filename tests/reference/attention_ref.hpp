#pragma once
// fp64 oracle for attention: materialized scores, exact softmax, any layout via accessors.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace ditops::test {

/// Shape and row-major element index of a [B, S, N, D] tensor (BSND), or [B, N, S, D] with
/// head_first (BNSD): the two layouts of attention_forward.
inline std::vector<std::int64_t> attention_shape(bool head_first, std::int64_t batch,
                                                 std::int64_t len, std::int64_t heads,
                                                 std::int64_t dim) {
  return head_first ? std::vector<std::int64_t>{batch, heads, len, dim}
                    : std::vector<std::int64_t>{batch, len, heads, dim};
}
inline std::int64_t attention_index(bool head_first, std::int64_t b, std::int64_t pos,
                                    std::int64_t h, std::int64_t d, std::int64_t len,
                                    std::int64_t heads, std::int64_t dim) {
  return head_first ? ((b * heads + h) * len + pos) * dim + d
                    : ((b * len + pos) * heads + h) * dim + d;
}

struct AttentionRefProblem {
  std::int64_t batch = 1, q_len = 1, kv_len = 1, heads = 1, kv_heads = 1, dk = 1, dv = 1;
  double scale = 1;
  bool causal = false;  ///< bottom-right aligned
  // Element readers, indexed (b, position, head, d).
  std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)> q, k, v;
  /// Mask (b, head, query, key): false = excluded; bias is added to the scaled score (below
  /// -2^126 it excludes the key).
  std::function<bool(std::int64_t, std::int64_t, std::int64_t, std::int64_t)> allowed;
  std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)> bias;
};

/// The magnitudes that bound how far rounding Q and K moves a result (tests/support/tolerance.hpp):
/// over every attended (query, key) pair, the largest scale·Σ_d |q_d k_d| and
/// scale·sqrt(Σ_d (q_d k_d)²); the largest |v|.
struct AttentionMagnitudes {
  double score_l1 = 0, score_l2 = 0, v_max = 0;
  void include(const AttentionMagnitudes& other) {
    score_l1 = std::max(score_l1, other.score_l1);
    score_l2 = std::max(score_l2, other.score_l2);
    v_max = std::max(v_max, other.v_max);
  }
};

struct AttentionRefResult {
  std::vector<double> out;  ///< [B, Sq, N, Dv]
  std::vector<double> lse;  ///< [B, N, Sq]; -inf for rows with no attended key
  AttentionMagnitudes magnitudes;
  double at(const AttentionRefProblem& p, std::int64_t b, std::int64_t s, std::int64_t n,
            std::int64_t d) const {
    return out[((b * p.q_len + s) * p.heads + n) * p.dv + d];
  }
};

inline AttentionRefResult attention_reference(const AttentionRefProblem& p) {
  const double minus_inf = -std::numeric_limits<double>::infinity();
  AttentionRefResult result;
  result.out.assign(p.batch * p.q_len * p.heads * p.dv, 0.0);
  result.lse.assign(p.batch * p.heads * p.q_len, minus_inf);
  const std::int64_t group = p.heads / p.kv_heads;
  std::vector<double> keys(p.kv_len * p.dk), values(p.kv_len * p.dv), query(p.dk), scores(p.kv_len);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t kvh = h / group;
      for (std::int64_t j = 0; j < p.kv_len; ++j) {
        for (std::int64_t d = 0; d < p.dk; ++d) keys[j * p.dk + d] = p.k(b, j, kvh, d);
        for (std::int64_t d = 0; d < p.dv; ++d) {
          values[j * p.dv + d] = p.v(b, j, kvh, d);
          result.magnitudes.v_max =
              std::max(result.magnitudes.v_max, std::fabs(values[j * p.dv + d]));
        }
      }
      for (std::int64_t i = 0; i < p.q_len; ++i) {
        for (std::int64_t d = 0; d < p.dk; ++d) query[d] = p.q(b, i, h, d);
        double top = minus_inf;
        for (std::int64_t j = 0; j < p.kv_len; ++j) {
          bool ok = !p.causal || j <= i + p.kv_len - p.q_len;
          if (p.allowed && !p.allowed(b, h, i, j)) ok = false;
          double s = minus_inf;
          if (ok) {
            s = 0;
            double l1 = 0, l2 = 0;
            for (std::int64_t d = 0; d < p.dk; ++d) {
              const double product = query[d] * keys[j * p.dk + d];
              s += product;
              l1 += std::fabs(product);
              l2 += product * product;
            }
            s *= p.scale;
            AttentionMagnitudes& m = result.magnitudes;
            m.score_l1 = std::max(m.score_l1, std::fabs(p.scale) * l1);
            m.score_l2 = std::max(m.score_l2, std::fabs(p.scale) * std::sqrt(l2));
            // A bias below -2^126 excludes its key like -inf (ditops' additive-mask rule).
            if (p.bias) {
              const double bias = p.bias(b, h, i, j);
              s = bias < -0x1p126 ? minus_inf : s + bias;
            }
          }
          scores[j] = s;
          top = std::max(top, s);
        }
        if (top == minus_inf) continue;
        double sum = 0;
        for (std::int64_t j = 0; j < p.kv_len; ++j) {
          scores[j] = scores[j] == minus_inf ? 0.0 : std::exp(scores[j] - top);
          sum += scores[j];
        }
        result.lse[(b * p.heads + h) * p.q_len + i] = top + std::log(sum);
        double* out = &result.out[((b * p.q_len + i) * p.heads + h) * p.dv];
        for (std::int64_t j = 0; j < p.kv_len; ++j) {
          if (scores[j] == 0) continue;
          const double weight = scores[j] / sum;
          for (std::int64_t d = 0; d < p.dv; ++d) out[d] += weight * values[j * p.dv + d];
        }
      }
    }
  }
  return result;
}

}  // namespace ditops::test
