// The flash kernel's K^T panel packing (transpose_k_panel) of the kernel variant this process
// runs (the suite runs once per DITOPS_ISA level): every element lands at panel[d][key], for
// head dims that are whole register transposes, leave a tail or are shorter than one, from rows
// that start anywhere (16 bytes past a line, unequal gaps), and nothing is written past the
// panel's dk rows.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/core/scratch.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

TEST(AttentionPacking, TransposeKPanelPutsEveryElementAtItsKeyAndDim) {
  const auto transpose = attention::attention_kernels().transpose_k_panel;
  constexpr std::int64_t kKeys = attention::kPanel;
  constexpr float kUntouched = -1.f;
  for (const std::int64_t dk : {1, 7, 8, 9, 15, 16, 17, 33, 64, 72, 128, 130}) {
    SCOPED_TRACE("dk " + std::to_string(dk) + " on " + active_isa_name());
    // Key rows at unequal gaps, each 4 floats (16 bytes) past a 64-byte boundary or more.
    std::vector<float> source(static_cast<std::size_t>(kKeys * (dk + 40) + 64));
    const float* rows[kKeys];
    std::int64_t at = 4;
    for (std::int64_t key = 0; key < kKeys; ++key) {
      for (std::int64_t d = 0; d < dk; ++d) {
        source[static_cast<std::size_t>(at + d)] = static_cast<float>(key * 1000 + d);
      }
      rows[key] = source.data() + at;
      at += dk + 16 + key % 3;
    }
    const std::int64_t panel_floats = dk * kKeys;
    auto panel = core::aligned_array<float>(panel_floats + kKeys);
    std::fill(panel.get(), panel.get() + panel_floats + kKeys, kUntouched);
    transpose(rows, dk, panel.get());
    int wrong = 0;
    for (std::int64_t d = 0; d < dk; ++d) {
      for (std::int64_t key = 0; key < kKeys; ++key) {
        wrong += panel[d * kKeys + key] != static_cast<float>(key * 1000 + d);
      }
    }
    EXPECT_EQ(wrong, 0);
    for (std::int64_t i = panel_floats; i < panel_floats + kKeys; ++i) {
      EXPECT_EQ(panel[i], kUntouched) << "written past the panel at " << i;
    }
  }
}

}  // namespace
}  // namespace ditops::test
