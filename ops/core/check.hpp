#pragma once
// Argument validation shared by every public call. Each check throws ditops::Error with a
// message "call: argument ..." that names the call, the argument and the offending values.

#include <cstdint>
#include <ditops/tensor.hpp>
#include <initializer_list>
#include <string>

namespace ditops::core {

/// A tensor argument of a public call, named for error messages.
struct Arg {
  const char* call;
  const char* name;
  const TensorView& view;
};

[[noreturn]] void fail(const char* call, const std::string& message);

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
/// out and in do not share memory, or (when identical_ok) they are the very same view.
void check_no_overlap(const Arg& out, const Arg& in, bool identical_ok);

}  // namespace ditops::core
