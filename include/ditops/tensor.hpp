#pragma once
// Tensor views, element types and the library's error type.

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace ditops {

enum class DType : std::uint8_t { f32, f16, bf16, i8, u8, i32, boolean };

/// Bytes per element of `dtype`.
constexpr std::int64_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::i8:
    case DType::u8:
    case DType::boolean:
      return 1;
  }
  return 0;
}

/// "f32", "bf16", ... as used in error messages and benchmark names.
const char* dtype_name(DType dtype) noexcept;

/// bfloat16 storage: the upper 16 bits of an IEEE float.
struct bf16 {
  std::uint16_t bits;
  /// Round to nearest even; NaN stays a (quiet) NaN.
  static bf16 from_float(float value) noexcept;
  float to_float() const noexcept;
};

/// IEEE 754 binary16 storage.
struct f16 {
  std::uint16_t bits;
  /// Round to nearest even, with overflow to infinity and gradual underflow.
  static f16 from_float(float value) noexcept;
  float to_float() const noexcept;
};

inline float to_float(bf16 value) noexcept { return value.to_float(); }
inline float to_float(f16 value) noexcept { return value.to_float(); }
inline float to_float(float value) noexcept { return value; }
/// from_float<bf16>(x), from_float<f16>(x), from_float<float>(x).
template <class T>
T from_float(float value) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return T::from_float(value);
  }
}

inline constexpr int kMaxRank = 6;

/// Non-owning strided view; strides are in elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};
  bool empty() const noexcept { return data == nullptr; }
};

/// Thrown by every public call on invalid arguments, before any memory is touched.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
template <class T>
constexpr DType dtype_of() noexcept {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return DType::f32;
  } else if constexpr (std::is_same_v<U, f16>) {
    return DType::f16;
  } else if constexpr (std::is_same_v<U, bf16>) {
    return DType::bf16;
  } else if constexpr (std::is_same_v<U, std::int8_t>) {
    return DType::i8;
  } else if constexpr (std::is_same_v<U, std::uint8_t>) {
    return DType::u8;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return DType::i32;
  } else if constexpr (std::is_same_v<U, bool>) {
    return DType::boolean;
  } else {
    static_assert(sizeof(U) == 0, "view(): unsupported element type");
    return DType::f32;
  }
}
/// Throws Error unless 0 <= count <= kMaxRank; used by view().
void check_view_rank(std::size_t count, const char* what);
}  // namespace detail

/// Row-major contiguous view of `data` with the given shape.
template <class T>
TensorView view(T* data, std::initializer_list<std::int64_t> shape) {
  detail::check_view_rank(shape.size(), "shape");
  TensorView v;
  v.data = const_cast<std::remove_const_t<T>*>(data);
  v.dtype = detail::dtype_of<T>();
  v.rank = static_cast<int>(shape.size());
  int d = 0;
  for (std::int64_t extent : shape) v.shape[d++] = extent;
  std::int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.strides[i] = stride;
    // Saturate instead of overflowing: the operator that receives the view reports the
    // overflowing shape with the argument's name.
    if (__builtin_mul_overflow(stride, v.shape[i] > 0 ? v.shape[i] : 1, &stride)) {
      stride = INT64_MAX;
    }
  }
  return v;
}

/// Strided view of `data`; strides in elements, one per dimension.
template <class T>
TensorView view(T* data, std::initializer_list<std::int64_t> shape,
                std::initializer_list<std::int64_t> strides) {
  detail::check_view_rank(shape.size(), "shape");
  if (strides.size() != shape.size()) {
    throw Error("view: strides has " + std::to_string(strides.size()) + " entries but shape has " +
                std::to_string(shape.size()));
  }
  TensorView v = view(data, shape);
  int d = 0;
  for (std::int64_t stride : strides) v.strides[d++] = stride;
  return v;
}

}  // namespace ditops
