// Test main: every test binary runs once per ISA level (ctest sets DITOPS_ISA). A level the CPU
// lacks is skipped; a level it has must be the one dispatch uses, or the cap is broken.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ditops/runtime.hpp>
#include <string>

#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {

std::string active_isa_name() { return cpu_info().isa; }

namespace {
int level_of(const std::string& name) {
  for (int level = 0; level < core::kIsaCount; ++level) {
    if (name == core::isa_name(static_cast<core::Isa>(level))) return level;
  }
  return -1;
}

/// Skips every test, saying so on a line of its own that ctest reads (tests/CMakeLists.txt:
/// SKIP_REGULAR_EXPRESSION), so a run of a variant the CPU lacks counts as skipped, not passed.
void skip_suite(const std::string& why) {
  std::printf("[ ditops ] suite skipped: %s\n", why.c_str());
  std::fflush(stdout);
  GTEST_SKIP() << why;
}

class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("DITOPS_ISA");
    const std::string active = cpu_info().isa;
    std::printf(
        "[ ditops ] dispatch isa: %s, kernel variant: %s, amx int8: %s, amx bf16: %s, threads: %d, "
        "streaming "
        "from %lld bytes\n",
        active.c_str(), core::kernel_variant_name(),
        core::amx_usable(core::AmxUnit::int8) ? "used" : core::amx_reason(core::AmxUnit::int8),
        core::amx_usable(core::AmxUnit::bf16) ? "used" : core::amx_reason(core::AmxUnit::bf16),
        num_threads(), static_cast<long long>(core::streaming_store_bytes()));
    // amx, or empty: the best the CPU has, as when unset (dispatch reads them so too).
    if (env == nullptr || *env == '\0' || std::string(env) == "amx") return;
    // avx512bw is the avx512 level without its BF16/VNNI kernel variant, avxvnni the avx2
    // level with its AVX-VNNI one.
    const bool plain_avx512 = std::string(env) == "avx512bw";
    const bool avx_vnni = std::string(env) == "avxvnni";
    const std::string requested = plain_avx512 ? "avx512" : avx_vnni ? "avx2" : env;
    if (level_of(requested) < 0) FAIL() << "unknown DITOPS_ISA=" << env;
    if (level_of(requested) > level_of(active)) {
      skip_suite("this CPU lacks ISA level " + requested + " (best: " + active + ")");
      return;
    }
    // Not the avx2 variant again under another name (ctest would count it as a pass).
    if (avx_vnni && !core::avx_vnni_supported()) {
      skip_suite("this CPU lacks AVX-VNNI");
      return;
    }
    ASSERT_EQ(active, requested) << "DITOPS_ISA did not cap dispatch";
    const CpuInfo info = cpu_info();
    if (requested == "avx512") {
      const bool extension = info.avx512_bf16 && info.avx512_vnni && !plain_avx512;
      ASSERT_EQ(core::kernel_variant() == core::kAvx512Bf16Variant, extension)
          << "wrong AVX-512 kernel variant for DITOPS_ISA=" << env;
    }
    if (requested == "avx2") {
      ASSERT_EQ(core::kernel_variant() == core::kAvx2VnniVariant, avx_vnni)
          << "wrong AVX2 kernel variant for DITOPS_ISA=" << env;
    }
  }
};
}  // namespace
}  // namespace ditops::test

int main(int argc, char** argv) {
  // Streaming stores from 2 MiB written instead of 32: the streaming paths run on outputs of
  // 3 MiB (a tenth of the time at every ISA level). Set in the environment, the variable wins.
  setenv("DITOPS_STREAMING_STORE_BYTES", "2097152", /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new ditops::test::IsaEnvironment);
  return RUN_ALL_TESTS();
}
