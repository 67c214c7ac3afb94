#pragma once
// Softmax kernels keep scores, running maxima and log-sum-exps in base 2 (exp2 is cheaper than
// exp): the scale is multiplied by log2(e) once, and an LSE is reported as its base-2 value
// times ln(2). Baseline-safe: any translation unit may include it.

#include <limits>

namespace ditops::core {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

}  // namespace ditops::core
