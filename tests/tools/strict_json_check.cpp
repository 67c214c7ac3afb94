// strict_json_check FILE...: whether each file is strict JSON, as nlohmann::json's default parser
// reads it (no NaN or Infinity, no comments, nothing after the value). Prints one line per file
// that is not and exits 1; exits 0 when every file is. For tests/tools/demo_pipeline_test.sh: a
// shell script has no JSON parser of its own, and python may not be installed.

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: strict_json_check FILE...\n");
    return 2;
  }
  int rejected = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i]);
    try {
      if (!in) throw std::runtime_error("cannot read it");
      const nlohmann::json document = nlohmann::json::parse(in);
      (void)document;
    } catch (const std::exception& error) {
      std::printf("%s: not strict JSON: %s\n", argv[i], error.what());
      ++rejected;
    }
  }
  std::printf("strict_json_check: %d of %d files are strict JSON\n", argc - 1 - rejected, argc - 1);
  return rejected == 0 ? 0 : 1;
}
