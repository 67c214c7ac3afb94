#include "ops/core/check.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <utility>

namespace ditops::core {
namespace {

std::string dim_name(const Arg& arg, int dim) {
  return std::string(arg.name) + ".shape[" + std::to_string(dim) + "]";
}

/// Bytes from the first element to past the last one the view can touch (shapes and strides
/// non-negative), with overflow checks: strides near INT64_MAX must not wrap.
CheckedSize extent_bytes(const TensorView& view) {
  CheckedSize last_element = 0;
  for (int d = 0; d < view.rank; ++d) {
    if (view.shape[d] > 0) {
      last_element = last_element + CheckedSize(view.shape[d] - 1) * view.strides[d];
    }
  }
  return (last_element + 1) * dtype_size(view.dtype);
}

/// [first, last] byte addresses the view can touch; empty views span nothing (first > last).
/// For views check_view accepted.
std::pair<std::uintptr_t, std::uintptr_t> byte_span(const TensorView& view) {
  const auto first = reinterpret_cast<std::uintptr_t>(view.data);
  if (numel(view) == 0) return {first + 1, first};
  return {first, first + static_cast<std::uintptr_t>(extent_bytes(view).value) - 1};
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d) {
    if (a.shape[d] != b.shape[d]) return false;
    if (a.shape[d] > 1 && a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

}  // namespace

void fail(const char* call, const std::string& message) {
  throw Error(std::string(call) + ": " + message);
}

namespace {
thread_local const char* running_call = nullptr;
}  // namespace

CallScope::CallScope(const char* call) noexcept : outer_(running_call) { running_call = call; }
CallScope::~CallScope() { running_call = outer_; }
const char* current_call() noexcept { return running_call ? running_call : "ditops"; }

float check_softmax_scale(const char* call, const char* name, const std::optional<float>& scale,
                          float fallback) {
  const float value = scale.value_or(fallback);
  if (!(std::isfinite(value) && value > 0.f && value <= kMaxSoftmaxScale)) {
    char text[96];
    std::snprintf(text, sizeof text, " (%g) must be finite, > 0 and <= %g", value,
                  static_cast<double>(kMaxSoftmaxScale));
    fail(call, name + std::string(text));
  }
  return value;
}

std::int64_t numel(const TensorView& view) noexcept {
  std::int64_t count = 1;
  for (int d = 0; d < view.rank; ++d) count *= view.shape[d];
  return count;
}

std::string shape_string(const TensorView& view) {
  std::string text = "[";
  for (int d = 0; d < view.rank; ++d) {
    if (d) text += ", ";
    text += std::to_string(view.shape[d]);
  }
  return text + "]";
}

void check_view(const Arg& arg, int min_rank, int max_rank) {
  const TensorView& v = arg.view;
  if (v.rank < min_rank || v.rank > max_rank || v.rank > kMaxRank) {
    const std::string expected = min_rank == max_rank
                                     ? std::to_string(min_rank)
                                     : std::to_string(min_rank) + ".." + std::to_string(max_rank);
    fail(arg.call,
         std::string(arg.name) + " has rank " + std::to_string(v.rank) + ", expected " + expected);
  }
  CheckedSize elements = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] < 0) {
      fail(arg.call, dim_name(arg, d) + " (" + std::to_string(v.shape[d]) + ") is negative");
    }
    if (v.strides[d] < 0) {
      fail(arg.call, std::string(arg.name) + ".strides[" + std::to_string(d) + "] (" +
                         std::to_string(v.strides[d]) + ") is negative");
    }
    elements = elements * v.shape[d];
  }
  if (elements.overflow || extent_bytes(v).overflow) {
    fail(arg.call, std::string(arg.name) + " " + shape_string(v) +
                       " spans more bytes than int64 can address");
  }
  if (elements.value == 0) return;
  if (v.data == nullptr) fail(arg.call, std::string(arg.name) + ".data is null");
  if (v.rank > 0 && v.shape[v.rank - 1] > 1 && v.strides[v.rank - 1] != 1) {
    fail(arg.call, std::string(arg.name) + ".strides[" + std::to_string(v.rank - 1) + "] (" +
                       std::to_string(v.strides[v.rank - 1]) +
                       ") must be 1: the last dimension must be contiguous");
  }
}

void check_dtype(const Arg& arg, std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), arg.view.dtype) != allowed.end()) return;
  // Lists may name a dtype twice ({f32, x.dtype}): each is said once.
  std::string names;
  int count = 0;
  for (auto d = allowed.begin(); d != allowed.end(); ++d) {
    if (std::find(allowed.begin(), d, *d) != d) continue;
    names += (count++ ? ", " : "") + std::string(dtype_name(*d));
  }
  fail(arg.call, std::string(arg.name) + ".dtype is " + dtype_name(arg.view.dtype) +
                     (count > 1 ? ", expected one of " : ", expected ") + names);
}

void check_same_dtype(const Arg& arg, const Arg& like) {
  if (arg.view.dtype == like.view.dtype) return;
  fail(arg.call, std::string(arg.name) + ".dtype (" + dtype_name(arg.view.dtype) + ") must equal " +
                     like.name + ".dtype (" + dtype_name(like.view.dtype) + ")");
}

void check_dim(const Arg& arg, int dim, const Arg& like, int like_dim) {
  const std::int64_t got = arg.view.shape[dim];
  const std::int64_t want = like.view.shape[like_dim];
  if (got == want) return;
  fail(arg.call, dim_name(arg, dim) + " (" + std::to_string(got) + ") must equal " +
                     dim_name(like, like_dim) + " (" + std::to_string(want) + ")");
}

void check_same_shape(const Arg& arg, const Arg& like) {
  if (arg.view.rank != like.view.rank) {
    fail(arg.call, std::string(arg.name) + " has shape " + shape_string(arg.view) + " but " +
                       like.name + " has shape " + shape_string(like.view));
  }
  for (int d = 0; d < arg.view.rank; ++d) check_dim(arg, d, like, d);
}

void check_writable(const Arg& out) {
  const TensorView& v = out.view;
  if (numel(v) == 0) return;
  // Sort the dimensions that have more than one index by stride; each must step past
  // everything the smaller dimensions cover, or two indices would write one element.
  std::array<int, kMaxRank> dims{};
  int count = 0;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] > 1) dims[count++] = d;
  }
  for (int i = 1; i < count; ++i) {  // insertion sort: at most kMaxRank entries
    for (int j = i; j > 0 && v.strides[dims[j]] < v.strides[dims[j - 1]]; --j) {
      std::swap(dims[j], dims[j - 1]);
    }
  }
  std::int64_t covered = 1;  // elements spanned by the dimensions seen so far
  for (int i = 0; i < count; ++i) {
    const int d = dims[i];
    if (v.strides[d] < covered) {
      fail(out.call, std::string(out.name) + " " + shape_string(v) + ": strides[" +
                         std::to_string(d) + "] (" + std::to_string(v.strides[d]) +
                         ") makes distinct indices write the same element");
    }
    covered = v.strides[d] * (v.shape[d] - 1) + covered;
  }
}

void check_no_overlap(const Arg& out, const Arg& in, bool identical_ok) {
  if (identical_ok && same_view(out.view, in.view)) return;
  const auto [out_first, out_last] = byte_span(out.view);
  const auto [in_first, in_last] = byte_span(in.view);
  if (out_first > out_last || in_first > in_last) return;
  if (out_last < in_first || in_last < out_first) return;
  // Address ranges, not elements: interleaved views may share no element and still fail here.
  fail(out.call,
       std::string(out.name) + " may overlap " + in.name + " (their address ranges intersect; " +
           (identical_ok ? "only the very same view is allowed)" : "they must not share memory)"));
}

}  // namespace ditops::core
