// Sizes that grow with the problem and that no machine holds: broadcast inputs (stride 0) make a
// logical problem of any size from a few bytes. Every list, plan and workspace such a call would
// build is an Error naming the call and the size before it is allocated, never std::bad_alloc,
// an abort inside the thread team or a walk over 2^60 empty rows. The sizes exceed any machine,
// except the RainFusion plan (32 GiB), which skips itself on machines that could hold it.

#include <unistd.h>

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <vector>

#include "tests/support/expect_rejected.hpp"

namespace ditops::test {
namespace {

constexpr std::int64_t k2To44 = std::int64_t{1} << 44;

// K and V of 2^44 keys (one float each, broadcast): flash packs them in 2^38 jobs (6 TiB of job
// list before this was checked, built before the checked packing buffers), the reference
// materializes K (64 TiB) inside its thread team.
TEST(ProblemSize, KeysNoMachineHoldsAreAnErrorOnEveryBackend) {
  std::vector<float> one(1, 1.f);
  TestTensor<float> q({1, 16, 1, 1}), out({1, 16, 1, 1});
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for (const AttentionBackend backend :
         {AttentionBackend::reference, AttentionBackend::flash, AttentionBackend::flash_bf16,
          AttentionBackend::int8, AttentionBackend::automatic}) {
      AttentionOptions options;
      options.backend = backend;
      expect_rejected(
          [&] {
            attention_forward(q.view(), broadcast_row(one, 1, k2To44, 1),
                              broadcast_row(one, 1, k2To44, 1), out.view(), options);
          },
          "attention_forward: cannot allocate", out);
    }
  }
}

// 2^40 batch elements of 8 tokens, broadcast: one pattern per (batch, head) is 1 TiB.
TEST(ProblemSize, ClassifyingMoreHeadsThanMemoryIsAnError) {
  set_num_threads(1);
  std::vector<float> one(1, 1.f);
  RainFusionOptions rf;
  rf.video = {2, 2, 2, 0, true};
  TestTensor<float> untouched({1});
  expect_rejected(
      [&] {
        rainfusion_classify(broadcast_row(one, std::int64_t{1} << 40, 8, 1),
                            broadcast_row(one, std::int64_t{1} << 40, 8, 1), rf);
      },
      "rainfusion_classify: cannot allocate 1099511627776 bytes", untouched);
}

// A layout of 2^31 - 2^16 tokens: its plan (token order, positions, windows) is 32 GiB.
TEST(ProblemSize, PlanningALayoutLargerThanMemoryIsAnError) {
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  if (memory >= 32.0 * (1 << 30)) GTEST_SKIP() << "this machine could hold the plan";
  RainFusionOptions rf;
  rf.video = {(1 << 15) - 1, 1 << 8, 1 << 8, 0, true};
  TestTensor<float> untouched({1});
  expect_rejected([&] { rainfusion_density(HeadPattern::spatial, rf); },
                  "rainfusion_density: cannot allocate 34358689792 bytes", untouched);
}

// No query rows: q, k, v and out have no elements whatever the batch and head counts, so the
// call returns at once on every backend (it walked 2^40 x 2^20 empty rows).
TEST(ProblemSize, NoQueryRowsReturnsWithoutWalkingTheBatch) {
  set_num_threads(2);
  std::vector<float> one(1, 1.f);
  const TensorView q = broadcast_row(one, std::int64_t{1} << 40, 0, 1 << 20);
  const TensorView kv = broadcast_row(one, std::int64_t{1} << 40, 0, 1);
  TensorView out = q;
  out.data = nullptr;
  for (const AttentionBackend backend :
       {AttentionBackend::reference, AttentionBackend::flash, AttentionBackend::flash_bf16,
        AttentionBackend::int8, AttentionBackend::automatic}) {
    AttentionOptions options;
    options.backend = backend;
    EXPECT_NO_THROW(attention_forward(q, kv, kv, out, options)) << backend_name(backend);
  }
  EXPECT_NO_THROW(select_attention(q, kv, kv));
}

}  // namespace
}  // namespace ditops::test
