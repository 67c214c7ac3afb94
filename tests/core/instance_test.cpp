// Instance: disjoint core partitions, calls inside run() using the instance's cores, errors
// rethrown, and two instances running the same work concurrently getting the results of one at
// a time (the concurrency label runs this under ThreadSanitizer).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <ditops/attention.hpp>
#include <ditops/instance.hpp>
#include <ditops/linear.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

TEST(Instance, PartitionsAreDisjointAndCoverTheCores) {
  const int cores = cpu_info().physical_cores;
  EXPECT_THROW(Instance::partition(0), Error);
  EXPECT_THROW(Instance::partition(cores + 1), Error);
  for (int count = 1; count <= cores; ++count) {
    const std::vector<Instance> instances = Instance::partition(count);
    ASSERT_EQ(static_cast<int>(instances.size()), count);
    std::set<int> seen;
    for (const Instance& instance : instances) {
      EXPECT_FALSE(instance.cores().empty());
      for (int core : instance.cores()) {
        EXPECT_TRUE(seen.insert(core).second) << "core " << core << " in two instances";
        EXPECT_GE(core, 0);
        EXPECT_LT(core, cores);
      }
    }
    EXPECT_EQ(static_cast<int>(seen.size()), cores);
  }
}

TEST(Instance, CallsInsideRunUseTheInstancesCores) {
  const std::vector<Instance> instances = Instance::partition(1);
  int threads_inside = 0;
  std::thread::id inside;
  instances[0].run([&] {
    threads_inside = num_threads();
    inside = std::this_thread::get_id();
  });
  EXPECT_EQ(threads_inside, static_cast<int>(instances[0].cores().size()));
  EXPECT_NE(inside, std::this_thread::get_id()) << "run() must use the instance's own thread";
  EXPECT_THROW(instances[0].run([] { throw Error("from the work"); }), Error);
  EXPECT_THROW(instances[0].run([] { throw std::runtime_error("other"); }), std::runtime_error);
  int after = 0;
  instances[0].run([&] { after = 1; });  // still serving after a failure
  EXPECT_EQ(after, 1);
  int nested = 0;
  instances[0].run([&] { instances[0].run([&] { nested = num_threads(); }); });  // inline
  EXPECT_EQ(nested, static_cast<int>(instances[0].cores().size()));
}

/// A small attention and a linear layer: the work of one "model step".
struct Step {
  Step()
      : q({1, 40, 4, 32}), k({1, 40, 4, 32}), v({1, 40, 4, 32}), out({1, 40, 4, 32}), y({40, 24}) {
    std::mt19937 rng(41);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    weight.resize(24 * 128);
    std::normal_distribution<float> normal;
    for (float& w : weight) w = normal(rng);
    layer = QuantLinear::float_linear(view(weight.data(), {24, 128}), {});
  }
  void run() {
    attention_forward(q.view(), k.view(), v.view(), out.view());
    TensorView rows = out.view();
    rows.rank = 2;
    rows.shape = {40, 128};
    rows.strides = {128, 1};
    layer.forward(rows, y.view());
  }
  TestTensor<float> q, k, v, out, y;
  std::vector<float> weight;
  QuantLinear layer{nullptr};
};

TEST(Instance, ConcurrentInstancesMatchOneAtATime) {
  const int cores = cpu_info().physical_cores;
  if (cores < 2) GTEST_SKIP() << "one physical core: no two instances";
  const std::vector<Instance> instances = Instance::partition(2);
  Step alone;
  instances[0].run([&] { alone.run(); });
  Step first, second;
  std::thread other([&] {
    for (int i = 0; i < 5; ++i) instances[1].run([&] { second.run(); });
  });
  for (int i = 0; i < 5; ++i) instances[0].run([&] { first.run(); });
  other.join();
  for (Step* step : {&first, &second}) {
    EXPECT_TRUE(step->y.unchanged_since(alone.y.snapshot()));
    EXPECT_TRUE(step->out.unchanged_since(alone.out.snapshot()));
  }
}

}  // namespace
}  // namespace ditops::test
