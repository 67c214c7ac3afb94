#pragma once
// The part of an attention call the tuner times its candidates on, so that tuning a new key
// costs a bounded share of the call instead of several runs of all of it.

#include <array>
#include <cstdint>

#include "ops/attention/call.hpp"

namespace ditops::attention {

/// Query-key pairs `call` visits (causal masking counted, other masks not): its work.
double visited_pairs(const FlashProblem& p);

/// A sub-call of at most about `share` of `call`'s work: the first KV heads (each with its
/// query heads) of the first sequences, or, where one (sequence, KV head) is more than
/// `share`, the last query rows (at least 96) of the first sequence with any, for that KV head
/// alone (the last rows keep the bottom-right causal diagonal and are the costliest). Its query
/// rows, out, LSE and mask are the call's own, so its runs write only what the call writes.
class TuningSlice {
 public:
  TuningSlice(const Call& call, double share);
  TuningSlice(const TuningSlice&) = delete;  // the slice's varlen offsets point into itself
  TuningSlice& operator=(const TuningSlice&) = delete;

  const Call& call() const noexcept { return call_; }
  /// The slice's work as a fraction of the call's (1 when the call cannot be cut finer).
  double fraction() const noexcept { return fraction_; }

 private:
  void cut_rows(std::int64_t seq, std::int64_t rows);

  Call call_;
  std::array<std::int32_t, 2> cu_q_{}, cu_k_{};
  double fraction_ = 1;
};

}  // namespace ditops::attention
