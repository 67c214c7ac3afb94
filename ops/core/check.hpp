#pragma once
// Argument validation shared by every public call. Each check throws ditops::Error with a
// message "call: argument ..." that names the call, the argument and the offending values.

#include <cstdint>
#include <ditops/tensor.hpp>
#include <initializer_list>
#include <optional>
#include <string>

namespace ditops::core {

/// A tensor argument of a public call, named for error messages.
struct Arg {
  const char* call;
  const char* name;
  const TensorView& view;
};

[[noreturn]] void fail(const char* call, const std::string& message);

/// Names the public call running on this thread in errors raised below its argument checks
/// (allocate_aligned): `const core::CallScope scope("attention_forward");` at the entry.
class CallScope {
 public:
  explicit CallScope(const char* call) noexcept;
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  const char* outer_;
};
/// The innermost CallScope's call on this thread, or "ditops" outside any.
const char* current_call() noexcept;

/// An int64 size computed with overflow checks: once a step overflows, `overflow` stays set
/// and `value` means nothing. For sizes derived from shapes and strides.
struct CheckedSize {
  std::int64_t value = 0;
  bool overflow = false;
  // Implicit: plain int64 operands mix in (CheckedSize(rows) * dv * 2).
  CheckedSize(std::int64_t initial = 0) noexcept : value(initial) {}
  friend CheckedSize operator+(CheckedSize a, CheckedSize b) noexcept {
    a.overflow |= b.overflow || __builtin_add_overflow(a.value, b.value, &a.value);
    return a;
  }
  friend CheckedSize operator*(CheckedSize a, CheckedSize b) noexcept {
    a.overflow |= b.overflow || __builtin_mul_overflow(a.value, b.value, &a.value);
    return a;
  }
};

/// The largest softmax scale any attention call accepts. Scores are scale * q.k in fp32 (times
/// log2(e) in the kernels' base-2 softmax): a larger scale overflows them to infinity for
/// ordinary inputs (scale FLT_MAX gave zeros on one backend and NaN on another), so it is
/// refused up front on every backend alike. 2^16 is far above any temperature in use (1/sqrt(D)
/// <= 1, learned logit scales <= 100).
inline constexpr float kMaxSoftmaxScale = 65536.f;

/// `scale`, or `fallback` when absent, if finite, > 0 and <= kMaxSoftmaxScale; otherwise Error
/// naming `call` and `name` ("scale", "options.scale").
float check_softmax_scale(const char* call, const char* name, const std::optional<float>& scale,
                          float fallback);

std::int64_t numel(const TensorView& view) noexcept;
/// "[2, 3, 4]"
std::string shape_string(const TensorView& view);

/// A well-formed view: min_rank <= rank <= max_rank, shape and strides non-negative, the byte
/// extent representable in int64, data non-null (unless it has no elements), and a contiguous
/// last dimension (stride 1), which every kernel streams.
void check_view(const Arg& arg, int min_rank, int max_rank);
void check_dtype(const Arg& arg, std::initializer_list<DType> allowed);
void check_same_dtype(const Arg& arg, const Arg& like);
/// arg.shape[dim] == like.shape[like_dim]
void check_dim(const Arg& arg, int dim, const Arg& like, int like_dim);
/// Every dimension equal.
void check_same_shape(const Arg& arg, const Arg& like);
/// An output whose distinct indices never share memory (no zero or interleaved strides).
void check_writable(const Arg& out);
/// out and in do not share memory, or (when identical_ok) they are the very same view. Judged by
/// address ranges: views that interleave without sharing an element are refused too ("may
/// overlap").
void check_no_overlap(const Arg& out, const Arg& in, bool identical_ok);

}  // namespace ditops::core
