#include "tools/bench_json.hpp"

#include <cctype>
#include <ostream>
#include <utility>

#include "ops/core/file.hpp"

namespace ditops::tools {
namespace {

bool starts_with_word(const std::string& text, std::size_t at, const char* word) {
  std::size_t i = 0;
  for (; word[i] != '\0'; ++i) {
    if (at + i >= text.size() ||
        std::tolower(static_cast<unsigned char>(text[at + i])) != word[i]) {
      return false;
    }
  }
  return at + i == text.size() || !std::isalnum(static_cast<unsigned char>(text[at + i]));
}

/// Length of the non-finite number token at `at` ([+-]?(nan|inf|infinity), any case), or 0.
std::size_t non_finite_length(const std::string& text, std::size_t at) {
  if (at > 0 && std::isalnum(static_cast<unsigned char>(text[at - 1]))) return 0;
  const std::size_t sign = text[at] == '-' || text[at] == '+' ? 1 : 0;
  for (const char* word : {"infinity", "inf", "nan"}) {
    if (starts_with_word(text, at + sign, word)) return sign + std::char_traits<char>::length(word);
  }
  return 0;
}

}  // namespace

std::string null_non_finite_numbers(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];  // an escaped character, perhaps a quote, stays in the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    const std::size_t length = non_finite_length(text, i);
    if (length > 0) {
      out += "null";
      i += length - 1;
      continue;
    }
    in_string = c == '"';
    out += c;
  }
  return out;
}

BenchEntry::BenchEntry(std::string file, std::size_t index, nlohmann::json fields)
    : file_(std::move(file)), name_("#" + std::to_string(index)), fields_(std::move(fields)) {
  name_ = text("name", name_);
}

void BenchEntry::drop_nulls(const std::string& tool, std::ostream& warnings) {
  for (auto field = fields_.begin(); field != fields_.end();) {
    if (!field->is_null()) {
      ++field;
      continue;
    }
    warnings << tool << "warning: '" << file_ << "': entry '" << name_ << "': field '"
             << field.key() << "' is NaN or infinite, which JSON cannot hold; left out\n";
    field = fields_.erase(field);
  }
}

void BenchEntry::fail(const char* field, const std::string& problem) const {
  throw BenchJsonError("'" + file_ + "': entry '" + name_ + "': field '" + field + "' " + problem);
}

double BenchEntry::number(const char* field, double fallback) const {
  if (!has(field)) return fallback;
  if (!fields_.at(field).is_number()) fail(field, "is not a number");
  return fields_.at(field).get<double>();
}

std::string BenchEntry::text(const char* field, const std::string& fallback) const {
  if (!has(field)) return fallback;
  if (!fields_.at(field).is_string()) fail(field, "is not a string");
  return fields_.at(field).get<std::string>();
}

bool BenchEntry::flag(const char* field, bool fallback) const {
  if (!has(field)) return fallback;
  if (!fields_.at(field).is_boolean()) fail(field, "is not true or false");
  return fields_.at(field).get<bool>();
}

std::vector<BenchEntry> read_bench_json(const std::string& path, const std::string& tool,
                                        std::ostream& warnings) {
  // A directory or a device would otherwise fail inside the stream (a bare library message)
  // or never end (/dev/zero).
  const core::FileContents file =
      core::read_regular_file(path, core::kMaxInputFileBytes, /*follow_symlink=*/true);
  if (file.status != core::FileStatus::ok) {
    throw BenchJsonError("cannot read '" + path + "': it " + file.problem);
  }
  return parse_bench_json(file.text, path, tool, warnings);
}

std::vector<BenchEntry> parse_bench_json(const std::string& text, const std::string& path,
                                         const std::string& tool, std::ostream& warnings) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(null_non_finite_numbers(text));
  } catch (const nlohmann::json::exception& error) {
    // Not only parse_error: a number beyond double's range (1e400) is an out_of_range.
    throw BenchJsonError("'" + path + "' is not Google Benchmark JSON: " + error.what());
  }
  if (!document.is_object()) {
    throw BenchJsonError("'" + path + "' is not Google Benchmark JSON: not an object");
  }
  if (!document.contains("benchmarks")) return {};
  nlohmann::json& list = document["benchmarks"];
  if (!list.is_array()) {
    throw BenchJsonError("'" + path +
                         "' is not Google Benchmark JSON: 'benchmarks' is not an array");
  }
  std::vector<BenchEntry> entries;
  for (std::size_t index = 0; index < list.size(); ++index) {
    if (!list[index].is_object()) {
      throw BenchJsonError("'" + path + "': entry #" + std::to_string(index) + " is not an object");
    }
    entries.emplace_back(path, index, std::move(list[index]));
    entries.back().drop_nulls(tool, warnings);
  }
  return entries;
}

}  // namespace ditops::tools
