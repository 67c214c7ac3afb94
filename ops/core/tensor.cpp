// Element types and view construction (include/ditops/tensor.hpp).

#include <bit>
#include <ditops/tensor.hpp>

namespace ditops {

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i32:
      return "i32";
    case DType::boolean:
      return "bool";
  }
  return "unknown";
}

bf16 bf16::from_float(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign and payload top, make it quiet
    return bf16{static_cast<std::uint16_t>((bits >> 16) | 0x40u)};
  }
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

float bf16::to_float() const noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

f16 f16::from_float(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u)};  // NaN
  // 65520 is halfway between the largest f16 (65504) and 2^16; ties go to even, i.e. infinity.
  if (magnitude >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (magnitude >= 0x38800000u) {  // normal f16 (>= 2^-14): rebias, round off 13 mantissa bits
    const std::uint32_t exponent = (magnitude >> 23) - 127 + 15;
    std::uint32_t half = (exponent << 10) | ((magnitude & 0x7fffffu) >> 13);
    const std::uint32_t dropped = magnitude & 0x1fffu;
    if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;  // may carry to inf
    return f16{static_cast<std::uint16_t>(sign | half)};
  }
  if (magnitude < 0x33000000u) return f16{sign};  // below half the smallest subnormal
  // Subnormal f16: count units of 2^-24, rounding the dropped bits to nearest even.
  const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - (magnitude >> 23);  // 14..24
  std::uint32_t units = mantissa >> shift;
  const std::uint32_t dropped = mantissa & ((1u << shift) - 1);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (units & 1u))) ++units;
  return f16{static_cast<std::uint16_t>(sign | units)};
}

float f16::to_float() const noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

namespace detail {
void check_view_rank(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(kMaxRank)) {
    throw Error("view: " + std::string(what) + " has " + std::to_string(count) +
                " dimensions, more than kMaxRank (" + std::to_string(kMaxRank) + ")");
  }
}
}  // namespace detail

}  // namespace ditops
