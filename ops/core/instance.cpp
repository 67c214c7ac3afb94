// Instance: a thread of its own per instance (bound to the instance's first core) that runs the
// work handed to run(); the thread's placement makes every ditops call inside use the
// instance's cores (ops/core/threads.hpp), and libgomp gives each such thread its own pool of
// OpenMP workers, so instances never share a thread.

#include <condition_variable>
#include <ditops/instance.hpp>
#include <ditops/tensor.hpp>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "ops/core/threads.hpp"

namespace ditops {

struct Instance::State {
  explicit State(std::vector<int> cores) {
    placement.cores = std::move(cores);
    thread = std::thread([this] { serve(); });
  }
  ~State() {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    // The last copy of an Instance dropped inside its own work: the thread cannot join itself.
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }

  void run(const std::function<void()>& work) {
    // run() from inside this instance's own work runs inline: handing it to the thread that is
    // busy running the caller would wait forever.
    if (std::this_thread::get_id() == thread.get_id()) {
      work();
      return;
    }
    const std::lock_guard<std::mutex> one_at_a_time(run_mutex);
    std::unique_lock<std::mutex> lock(mutex);
    job = &work;
    failure = nullptr;
    wake.notify_all();
    wake.wait(lock, [this] { return job == nullptr; });
    if (failure) std::rethrow_exception(failure);
  }

  void serve() {
    core::bind_current_thread(placement.cores.front());
    core::set_current_placement(&placement);
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait(lock, [this] { return stopping || job != nullptr; });
      if (job == nullptr) return;  // stopping, nothing left to run
      lock.unlock();
      std::exception_ptr caught;
      try {
        (*job)();
      } catch (...) {
        caught = std::current_exception();
      }
      lock.lock();
      failure = caught;
      job = nullptr;
      wake.notify_all();
    }
  }

  core::Placement placement;
  std::mutex run_mutex;  ///< one run() at a time
  std::mutex mutex;      ///< guards job, failure, stopping
  std::condition_variable wake;
  const std::function<void()>* job = nullptr;
  std::exception_ptr failure;
  bool stopping = false;
  std::thread thread;  ///< last: started once the members above exist
};

std::vector<Instance> Instance::partition(int count) {
  const int cores = core::physical_cores();
  if (count < 1 || count > cores) {
    throw Error("Instance::partition: count (" + std::to_string(count) + ") must be from 1 to " +
                "the " + std::to_string(cores) +
                " physical cores (instances sharing a core would only take turns)");
  }
  std::vector<Instance> instances;
  for (int i = 0; i < count; ++i) {
    std::vector<int> share;
    for (int core = i * cores / count; core < (i + 1) * cores / count; ++core)
      share.push_back(core);
    instances.push_back(Instance(std::make_shared<State>(std::move(share))));
  }
  return instances;
}

void Instance::run(const std::function<void()>& work) const { state_->run(work); }

const std::vector<int>& Instance::cores() const noexcept { return state_->placement.cores; }

}  // namespace ditops
