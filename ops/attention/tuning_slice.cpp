#include "ops/attention/tuning_slice.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace ditops::attention {
namespace {

/// Keys query row `row` of a sequence sees (causal: bottom-right aligned).
std::int64_t keys_seen(const FlashProblem& p, const Sequence& s, std::int64_t row) {
  return p.causal ? std::clamp<std::int64_t>(row + s.kv_len - s.q_len + 1, 0, s.kv_len) : s.kv_len;
}

/// Query-key pairs one query head visits in sequence `seq`.
double sequence_pairs(const FlashProblem& p, std::int64_t seq) {
  const Sequence s = sequence_of(p, seq);
  if (!p.causal) return static_cast<double>(s.q_len) * static_cast<double>(s.kv_len);
  double pairs = 0;
  for (std::int64_t row = 0; row < s.q_len; ++row)
    pairs += static_cast<double>(keys_seen(p, s, row));
  return pairs;
}

template <class T>
T* advance(T* base, std::int64_t elements, std::int64_t element_bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return base == nullptr
             ? nullptr
             : reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elements * element_bytes);
}

}  // namespace

double visited_pairs(const FlashProblem& p) {
  double pairs = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) pairs += sequence_pairs(p, seq);
  return pairs * static_cast<double>(p.heads);
}

TuningSlice::TuningSlice(const Call& call, double share) : call_(call) {
  FlashProblem& p = call_.problem;
  const double total = visited_pairs(p);
  if (total <= 0 || p.kv_heads == 0) return;
  const std::int64_t group = p.heads / p.kv_heads;
  const double target = total * share;
  const double per_kv_head = total / static_cast<double>(p.kv_heads);
  if (target >= per_kv_head) {  // whole KV heads of every sequence
    const auto kv_heads = std::min<std::int64_t>(p.kv_heads, std::floor(target / per_kv_head));
    fraction_ = static_cast<double>(kv_heads) / static_cast<double>(p.kv_heads);
    p.kv_heads = kv_heads;
    p.heads = kv_heads * group;
    return;
  }
  // One KV head: the longest prefix of sequences within the target, if it has any work.
  p.kv_heads = 1;
  p.heads = group;
  double pairs = 0;
  std::int64_t first_with_rows = -1, prefix = 0;
  for (std::int64_t seq = 0; seq < call.problem.batch; ++seq) {
    const double more = sequence_pairs(p, seq) * static_cast<double>(group);
    if (more > 0 && first_with_rows < 0) first_with_rows = seq;
    if (pairs + more > target) break;
    pairs += more;
    prefix = seq + 1;
  }
  if (pairs > 0) {
    p.batch = prefix;
    fraction_ = pairs / total;
    return;
  }
  // Rows from the end of the first sequence with any until the target, at least one task's
  // (96 rows, GQA heads counted as rows). Fewer tasks than threads are split over the keys.
  const Sequence s = sequence_of(p, first_with_rows);
  const std::int64_t min_rows = std::min(s.q_len, std::max<std::int64_t>(1, 96 / group));
  std::int64_t rows = 0;
  pairs = 0;
  while (rows < s.q_len && (rows < min_rows || pairs < target)) {
    pairs += static_cast<double>(keys_seen(p, s, s.q_len - 1 - rows) * group);
    ++rows;
  }
  cut_rows(first_with_rows, rows);
  fraction_ = pairs / total;
}

void TuningSlice::cut_rows(std::int64_t seq, std::int64_t rows) {
  FlashProblem& p = call_.problem;
  const Sequence s = sequence_of(p, seq);
  const std::int64_t element = dtype_size(p.dtype);
  // The slice's sequence 0 is the call's sequence `seq`, its rows [q_len - rows, q_len).
  const std::int64_t first_row = s.q_row0 + s.q_len - rows;
  p.q = advance(p.q, seq * p.q_strides.batch + first_row * p.q_strides.seq, element);
  p.out = advance(p.out, seq * p.out_strides.batch + first_row * p.out_strides.seq, element);
  p.k = advance(p.k, seq * p.k_strides.batch + s.k_row0 * p.k_strides.seq, element);
  p.v = advance(p.v, seq * p.v_strides.batch + s.k_row0 * p.v_strides.seq, element);
  p.lse = advance(p.lse, seq * p.lse_strides.batch + first_row * p.lse_strides.seq,
                  std::int64_t{sizeof(float)});
  if (p.mask_kind != MaskKind::none) {
    p.mask = advance(p.mask, seq * p.mask_strides[0] + (s.q_len - rows) * p.mask_strides[2],
                     p.mask_kind == MaskKind::boolean ? std::int64_t{1} : std::int64_t{4});
  }
  p.batch = 1;
  if (p.cu_q) {
    cu_q_ = {0, static_cast<std::int32_t>(rows)};
    cu_k_ = {0, static_cast<std::int32_t>(s.kv_len)};
    p.cu_q = cu_q_.data();
    p.cu_k = cu_k_.data();
  } else {
    p.q_len = rows;
  }
}

}  // namespace ditops::attention
