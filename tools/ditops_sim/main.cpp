// ditops-sim: the Ascend 910B pipeline simulator's command line.
//
//   ditops-sim mla | sweep | fa | hw | calibrate | validate [flags]       ditops-sim COMMAND --help
//   lists a command's flags
//
// Parsing (the command table in cli.cpp: every flag with its value and default), running
// (building and simulating programs) and reporting (tables, JSON, trace / CSV / SVG files) are
// separate steps. Bad flags or values print one line on stderr and exit with status 2; so do
// input files that are not regular files (a directory, /dev/zero, a FIFO) or are larger than
// 64 MiB, and output paths that exist but are not regular files.
//
// This file dispatches to the commands, one source file each (mla.cpp, sweep.cpp, fa.cpp,
// calibrate.cpp, validate.cpp, hw.cpp); the steps they share are in cli.cpp (parsing) and run.cpp
// (running, output files).

#include <exception>
#include <iostream>
#include <string>

#include "sim/error.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"

namespace {

using namespace ditops::tools::sim_cli;

constexpr int kExitUsage = 2;
constexpr int kExitIo = 1;

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
                    std::string(argv[1]) == "help")) {
    std::cout << general_usage();
    return 0;
  }
  try {
    const Options options = parse_args(argc, argv);
    if (options.help) {
      std::cout << command_help(*options.command);
      return 0;
    }
    if (options.is("mla")) return command_mla(options);
    if (options.is("sweep")) return command_sweep(options);
    if (options.is("fa")) return command_fa(options);
    if (options.is("calibrate")) return command_calibrate(options);
    if (options.is("validate")) return command_validate(options);
    return command_hw(options);
  } catch (const UsageError& error) {
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitUsage;
  } catch (const sim::SimError& error) {
    // Simulation errors (buffer overflow, deadlock) come from the user's parameters.
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitUsage;
  } catch (const std::exception& error) {
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitIo;
  }
}
