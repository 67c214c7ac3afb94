#pragma once
// The one exception type of the simulator. Messages are complete sentences a user can act on
// (they name the parameter, buffer, core, pipe or flag); the CLI prints them as one line.

#include <stdexcept>

namespace ditops::sim {

class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ditops::sim
