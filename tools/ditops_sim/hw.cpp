// ditops-sim hw: the hardware parameters as JSON (a valid --hw file).

#include "sim/hw.hpp"

#include <iostream>

#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"

namespace ditops::tools::sim_cli {

int command_hw(const Options& options) {
  std::cout << sim::hw_to_json(load_hw(options));
  return 0;
}

}  // namespace ditops::tools::sim_cli
