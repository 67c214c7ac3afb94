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

}  // namespace
}  // namespace ditops::test
