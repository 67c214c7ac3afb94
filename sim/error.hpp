#pragma once
// The one exception type of the simulator. Messages are complete sentences a user can act on
// (they name the parameter, buffer, core, pipe or flag); the CLI prints them as one line.

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ditops::sim {

class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A number in a message: exact for whole numbers below 1e10 ("1048576"), else short ("1e+15",
/// "0.0001"); never std::to_string's 300 digits.
inline std::string number_text(double value) {
  char text[32];
  const bool whole = value == std::floor(value) && std::fabs(value) < 1e10;
  std::snprintf(text, sizeof text, whole ? "%.0f" : "%.6g", value);
  return text;
}

}  // namespace ditops::sim
