#pragma once
// The reference backend: the oracle the other backends are tested against.

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

/// Per (sequence, head, block of 128 query rows) the fp32 scores are materialized by an Eigen
/// GEMM, masked, soft-maxed (std::exp) and multiplied by V.
void run_reference(const FlashProblem& p, float scale, int threads);

}  // namespace ditops::attention
