// Runtime calls (threads, cpu_info) and the shared argument checks.

#include <cstdlib>
#include <ditops/runtime.hpp>
#include <ditops/tensor.hpp>
#include <optional>
#include <string>

#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

TEST(Runtime, ThreadCountRoundTripsAndZeroMeansPhysicalCores) {
  const CpuInfo info = cpu_info();
  ASSERT_GE(info.physical_cores, 1);
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(0);
  EXPECT_EQ(num_threads(), info.physical_cores);
  try {
    set_num_threads(-1);
    ADD_FAILURE() << "negative thread count accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_num_threads: n (-1)"), std::string::npos);
  }
  EXPECT_EQ(num_threads(), info.physical_cores);
}

// 200000 threads overflowed libgomp's stack in the next attention call: the cap is an Error.
TEST(Runtime, ThreadCountsAboveTheCapAreRejectedNamingIt) {
  set_num_threads(1);
  for (const int n : {4097, 200000}) {
    try {
      set_num_threads(n);
      ADD_FAILURE() << n << " threads accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("set_num_threads: n (" + std::to_string(n) +
                                           ") must be from 0 to 4096"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(num_threads(), 1);
  }
  set_num_threads(4096);
  EXPECT_EQ(num_threads(), 4096);
  set_num_threads(1);
}

TEST(Runtime, StreamingThresholdFromTheEnvironment) {
  // The test main sets 2 MiB unless the environment already named a threshold.
  const char* env = std::getenv("DITOPS_STREAMING_STORE_BYTES");
  ASSERT_NE(env, nullptr);
  EXPECT_EQ(core::streaming_store_bytes(),
            core::streaming_store_bytes_from_env(env).value_or(std::int64_t{32} << 20));
  EXPECT_FALSE(core::use_streaming_stores(core::streaming_store_bytes() - 1));
  EXPECT_TRUE(core::use_streaming_stores(core::streaming_store_bytes()));
  EXPECT_EQ(core::streaming_store_bytes_from_env("0"), 0);
  EXPECT_EQ(core::streaming_store_bytes_from_env("33554432"), std::int64_t{32} << 20);
  EXPECT_EQ(core::streaming_store_bytes_from_env("1099511627776"), std::int64_t{1} << 40);
  for (const char* value : {"", "-1", "1099511627777", "32M", "1e6", "99999999999999999999"}) {
    testing::internal::CaptureStderr();
    EXPECT_EQ(core::streaming_store_bytes_from_env(value), std::nullopt) << value;
    const std::string warning = testing::internal::GetCapturedStderr();
    EXPECT_NE(warning.find(std::string("ignoring DITOPS_STREAMING_STORE_BYTES=") + value +
                           " (expected a byte count"),
              std::string::npos)
        << warning;
  }
}

TEST(Runtime, ThreadEnvironmentAboveTheCapIsIgnoredNamingIt) {
  EXPECT_EQ(core::threads_from_env("4096"), 4096);
  EXPECT_EQ(core::threads_from_env("0"), cpu_info().physical_cores);
  for (const char* value : {"4097", "-1", "99999999999999999999", "2x"}) {
    testing::internal::CaptureStderr();
    EXPECT_EQ(core::threads_from_env(value), std::nullopt) << value;
    const std::string warning = testing::internal::GetCapturedStderr();
    EXPECT_NE(warning.find(std::string("ignoring DITOPS_NUM_THREADS=") + value +
                           " (expected an integer from 0 to 4096"),
              std::string::npos)
        << warning;
  }
}

TEST(Runtime, CpuInfoIsConsistent) {
  const CpuInfo info = cpu_info();
  const std::string levels[] = {"scalar", "sse4.2", "avx2", "avx512"};
  EXPECT_NE(std::find(std::begin(levels), std::end(levels), info.isa), std::end(levels));
  if (info.isa == "avx512") {
    EXPECT_TRUE(info.avx512);
  }
  if (info.avx512) {
    EXPECT_TRUE(info.avx2);
  }
  if (info.avx512_vnni || info.avx512_bf16) {
    EXPECT_TRUE(info.avx512);
  }
  // Full-rate bf16 dot products are AVX512-BF16 on AMD or AMX-BF16, whose CPUs have AVX512-BF16.
  if (info.bf16_dot_full_rate) {
    EXPECT_TRUE(info.avx512_bf16 || core::amx_support().bf16);
  }
  if (info.avx512_bf16 && __builtin_cpu_is("amd")) {
    EXPECT_TRUE(info.bf16_dot_full_rate);
  }
}

// When the avx2+vnni kernel variant runs, and the reason ditops-info prints when it does not.
TEST(Runtime, AvxVnniVariantRunsOnlyAtTheAvx2Level) {
  using core::Isa;
  EXPECT_EQ(core::avx_vnni_blocker(false, nullptr, Isa::avx2), "the CPU has no AVX-VNNI");
  EXPECT_EQ(core::avx_vnni_blocker(true, nullptr, Isa::avx2), "");
  EXPECT_EQ(core::avx_vnni_blocker(true, "avxvnni", Isa::avx2), "");
  EXPECT_EQ(core::avx_vnni_blocker(true, "amx", Isa::avx2), "");
  EXPECT_EQ(core::avx_vnni_blocker(true, "avx2", Isa::avx2), "DITOPS_ISA=avx2 caps it");
  EXPECT_EQ(core::avx_vnni_blocker(true, "sse4.2", Isa::sse4_2), "DITOPS_ISA=sse4.2 caps it");
  EXPECT_EQ(core::avx_vnni_blocker(true, nullptr, Isa::avx512),
            "the avx512 level runs (avx2+vnni extends avx2)");
  // This process's variant agrees with its reason.
  const std::string reason = core::avx_vnni_blocker(core::avx_vnni_supported(),
                                                    std::getenv("DITOPS_ISA"), core::active_isa());
  EXPECT_EQ(core::kernel_variant() == core::kAvx2VnniVariant, reason.empty()) << reason;
  if (core::avx_vnni_supported()) {
    EXPECT_TRUE(cpu_info().avx2);
  }
}

}  // namespace
}  // namespace ditops::test
