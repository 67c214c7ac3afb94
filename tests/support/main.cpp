// Test main: every test binary runs once per ISA level (ctest sets DITOPS_ISA). A level the CPU
// lacks is skipped; a level it has must be the one dispatch uses, or the cap is broken.

#include <gtest/gtest.h>

#include <cstdlib>
#include <ditops/runtime.hpp>
#include <string>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

std::string active_isa_name() { return cpu_info().isa; }

namespace {
int level_of(const std::string& name) {
  const char* names[] = {"scalar", "sse4.2", "avx2", "avx512"};
  for (int i = 0; i < 4; ++i) {
    if (name == names[i]) return i;
  }
  return -1;
}

class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* requested = std::getenv("DITOPS_ISA");
    const std::string active = cpu_info().isa;
    std::printf("[ ditops ] dispatch isa: %s, threads: %d\n", active.c_str(), num_threads());
    if (requested == nullptr) return;
    if (level_of(requested) < 0) FAIL() << "unknown DITOPS_ISA=" << requested;
    if (level_of(requested) > level_of(active)) {
      GTEST_SKIP() << "this CPU lacks ISA level " << requested << " (best: " << active << ")";
    }
    ASSERT_EQ(active, requested) << "DITOPS_ISA did not cap dispatch";
  }
};
}  // namespace
}  // namespace ditops::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new ditops::test::IsaEnvironment);
  return RUN_ALL_TESTS();
}
