#pragma once
// Several model instances in one process, each on its own physical cores: the CPU form of
// running several instances of a model on one device at once. Weights are shared by reference
// (a QuantLinear copy shares its packed weights), so a second instance costs its activations,
// not another copy of the model.

#include <functional>
#include <memory>
#include <vector>

namespace ditops {

/// A share of the machine's physical cores with its own threads. Every ditops call made inside
/// run() uses exactly these cores: as many threads as the share has cores, each bound to one of
/// them, and scratch of those threads (so two instances never share a thread or a buffer).
class Instance {
 public:
  /// `count` instances on disjoint sets of physical cores (hwloc, within the process's CPU
  /// binding), split as evenly as possible. Error if count < 1 or count > physical cores:
  /// two instances on one core would only take turns.
  static std::vector<Instance> partition(int count);

  /// Runs `work` on this instance's own thread (bound to its first core) and waits for it; the
  /// ditops calls inside use the instance's cores. An exception `work` throws is rethrown here.
  /// Calls from several threads on one instance run one after the other; a call from inside
  /// this instance's own work runs `work` there, inline.
  void run(const std::function<void()>& work) const;

  /// The physical cores (hwloc's logical core indices) of this instance.
  const std::vector<int>& cores() const noexcept;

  struct State;

 private:
  explicit Instance(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace ditops
