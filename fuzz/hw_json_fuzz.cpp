// ditops-sim's --hw parser (sim/hw.hpp hw_from_json) on any text: SimError or parameters that
// print back to a file which parses to the same parameters; accepted parameters then run a small
// MLA decode program through the engine (a program the CLI would run with that file), which must
// finish or stop with SimError, never crash or hang.

#include <sanitizer/common_interface_defs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/engine.hpp"
#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace {

[[noreturn]] void failure(const std::string& what) {
  __sanitizer_report_error_summary(("ditops fuzz: " + what).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops::sim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  HwParams hw;
  try {
    hw = hw_from_json(text);
  } catch (const SimError&) {
    return 0;
  }
  const std::string printed = hw_to_json(hw);
  HwParams again;
  try {
    again = hw_from_json(printed);
  } catch (const SimError& error) {
    failure(std::string("hw_to_json printed a file hw_from_json refuses: ") + error.what());
  }
  if (hw_to_json(again) != printed) failure("hw_to_json(hw_from_json(x)) is not a fixed point");
  MlaConfig config;
  config.batch = 1;
  config.kv = 256;
  config.heads = 16;
  config.cores = 2;
  try {
    validate(config, hw);
    simulate(build_mla_program(config, hw), hw);
  } catch (const SimError&) {
  }
  return 0;
}
