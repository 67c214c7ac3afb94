// Runtime calls (threads, cpu_info) and the shared argument checks.

#include <ditops/runtime.hpp>
#include <ditops/tensor.hpp>

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
}

}  // namespace
}  // namespace ditops::test
