// The reference backend: scores materialized by an Eigen GEMM, the softmax in std::exp. Slow on
// purpose and written for reading: the other backends are tested against it.

#define EIGEN_DONT_PARALLELIZE  // the reference runs inside our own threads
#include "ops/attention/reference.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/log2_domain.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"

namespace ditops::attention {
namespace {

using core::kMinusInf;

template <class T>
float element(const void* base, std::int64_t offset) {
  return to_float(static_cast<const T*>(base)[offset]);
}
float load_element(DType dtype, const void* base, std::int64_t offset) {
  switch (dtype) {
    case DType::bf16:
      return element<bf16>(base, offset);
    case DType::f16:
      return element<f16>(base, offset);
    default:
      return element<float>(base, offset);
  }
}
void store_element(DType dtype, void* base, std::int64_t offset, float value) {
  switch (dtype) {
    case DType::bf16:
      static_cast<bf16*>(base)[offset] = bf16::from_float(value);
      break;
    case DType::f16:
      static_cast<f16*>(base)[offset] = f16::from_float(value);
      break;
    default:
      static_cast<float*>(base)[offset] = value;
  }
}

/// Element offsets of one query row's output and LSE.
struct RowOffsets {
  std::int64_t out, lse;
};
RowOffsets row_offsets(const FlashProblem& p, std::int64_t seq, std::int64_t head,
                       std::int64_t pos) {
  const Sequence s = sequence_of(p, seq);
  return {
      seq * p.out_strides.batch + (s.q_row0 + pos) * p.out_strides.seq + head * p.out_strides.head,
      seq * p.lse_strides.batch + (s.q_row0 + pos) * p.lse_strides.seq + head * p.lse_strides.head};
}

}  // namespace

void run_reference(const FlashProblem& p, float scale, int threads) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  constexpr std::int64_t kRows = 128;
  struct Job {
    std::int64_t seq, head, q0;
  };
  std::vector<Job> jobs;
  // Per thread, the materialized Q, K, V, scores and output (and Eigen's product temporaries)
  // of the longest sequence: checked here, since an allocation failing inside the thread team
  // would terminate the process. (Q rows are bounded by out; K rows may be a broadcast view.)
  std::int64_t longest_kv = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    longest_kv = std::max(longest_kv, sequence_of(p, seq).kv_len);
  }
  const core::CheckedSize per_thread =
      (core::CheckedSize(kRows) * (p.dk + p.dv) + core::CheckedSize(longest_kv) * (p.dk + p.dv) +
       core::CheckedSize(kRows) * longest_kv * 2) *
      2;
  core::check_allocation(per_thread * threads, sizeof(float));
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const std::int64_t q_len = sequence_of(p, seq).q_len;
    for (std::int64_t head = 0; head < p.heads; ++head) {
      for (std::int64_t q0 = 0; q0 < q_len; q0 += kRows) jobs.push_back({seq, head, q0});
    }
  }
  const std::int64_t group = p.heads / p.kv_heads;
  core::parallel_tasks(static_cast<std::int64_t>(jobs.size()), threads, [&](std::int64_t j, int) {
    const Job job = jobs[j];
    const Sequence s = sequence_of(p, job.seq);
    const std::int64_t rows = std::min(kRows, s.q_len - job.q0);
    const std::int64_t kv_head = job.head / group;
    Matrix q(rows, p.dk), k(s.kv_len, p.dk), v(s.kv_len, p.dv);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t base = job.seq * p.q_strides.batch +
                                (s.q_row0 + job.q0 + r) * p.q_strides.seq +
                                job.head * p.q_strides.head;
      for (std::int64_t d = 0; d < p.dk; ++d) q(r, d) = load_element(p.dtype, p.q, base + d);
    }
    for (std::int64_t key = 0; key < s.kv_len; ++key) {
      const std::int64_t kb = job.seq * p.k_strides.batch + (s.k_row0 + key) * p.k_strides.seq +
                              kv_head * p.k_strides.head;
      const std::int64_t vb = job.seq * p.v_strides.batch + (s.k_row0 + key) * p.v_strides.seq +
                              kv_head * p.v_strides.head;
      for (std::int64_t d = 0; d < p.dk; ++d) k(key, d) = load_element(p.dtype, p.k, kb + d);
      for (std::int64_t d = 0; d < p.dv; ++d) v(key, d) = load_element(p.dtype, p.v, vb + d);
    }
    Matrix scores = (q * k.transpose()) * scale;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pos = job.q0 + r;
      const std::int64_t visible =
          p.causal ? std::clamp<std::int64_t>(pos + s.kv_len - s.q_len + 1, 0, s.kv_len) : s.kv_len;
      const std::int64_t mask_row =
          job.seq * p.mask_strides[0] + job.head * p.mask_strides[1] + pos * p.mask_strides[2];
      float top = kMinusInf;
      for (std::int64_t key = 0; key < s.kv_len; ++key) {
        float& value = scores(r, key);
        if (key >= visible) value = kMinusInf;
        if (p.mask_kind == MaskKind::boolean &&
            !static_cast<const std::uint8_t*>(p.mask)[mask_row + key]) {
          value = kMinusInf;
        } else if (p.mask_kind == MaskKind::additive) {
          const float bias = static_cast<const float*>(p.mask)[mask_row + key];
          value = bias < -kAdditiveMaskLimit ? kMinusInf : value + bias;
        }
        top = std::max(top, value);
      }
      float sum = 0.f;
      for (std::int64_t key = 0; key < s.kv_len; ++key) {
        float& value = scores(r, key);
        value = top > kMinusInf ? std::exp(value - top) : 0.f;
        sum += value;
      }
      if (sum > 0.f) scores.row(r) /= sum;
      const RowOffsets offsets = row_offsets(p, job.seq, job.head, pos);
      if (p.lse) p.lse[offsets.lse] = sum > 0.f ? top + std::log(sum) : kMinusInf;
    }
    const Matrix out = scores * v;
    for (std::int64_t r = 0; r < rows; ++r) {
      const RowOffsets offsets = row_offsets(p, job.seq, job.head, job.q0 + r);
      for (std::int64_t d = 0; d < p.dv; ++d)
        store_element(p.dtype, p.out, offsets.out + d, out(r, d));
    }
  });
}

}  // namespace ditops::attention
