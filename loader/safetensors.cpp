#include "loader/safetensors.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ditops/quant_model.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ops/core/check.hpp"
#include "ops/core/file.hpp"
#include "ops/core/scratch.hpp"

namespace ditops::loader {
namespace {

struct DTypeName {
  const char* name;
  std::int64_t size;
};
// Every dtype the format defines (the reference implementation's list).
constexpr DTypeName kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

std::string in_quotes(std::string_view text) { return "\"" + std::string(text) + "\""; }

[[noreturn]] void fail_file(const std::string& path, const std::string& problem) {
  throw Error("safetensors file " + path + ": " + problem);
}
[[noreturn]] void fail_tensor(const std::string& path, std::string_view tensor,
                              const std::string& problem) {
  fail_file(path, "tensor " + in_quotes(tensor) + ": " + problem);
}

/// A non-negative JSON integer that fits int64, or nullopt.
std::optional<std::int64_t> non_negative(const nlohmann::json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const std::uint64_t number = value.get<std::uint64_t>();
  if (number > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<std::int64_t>(number);
}

std::string offsets_string(std::int64_t begin, std::int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(shape[d]);
  }
  return text + "]";
}

/// shape product × element size, or nullopt on overflow.
std::optional<std::int64_t> byte_count(const std::vector<std::int64_t>& shape,
                                       std::int64_t element_bytes) {
  core::CheckedSize bytes = element_bytes;
  for (const std::int64_t extent : shape) bytes = bytes * extent;
  if (bytes.overflow) return std::nullopt;
  return bytes.value;
}

/// A tensor entry of the header, before its bytes are located in the mapping.
struct Entry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info,
                  std::int64_t data_bytes) {
  Entry entry;
  entry.name = name;
  if (!info.is_object()) fail_tensor(path, name, "its header entry is not a JSON object");
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) {
    fail_tensor(path, name, "\"dtype\" is missing or not a string");
  }
  entry.dtype = dtype->get<std::string>();
  const std::int64_t element_bytes = safetensors_dtype_size(entry.dtype);
  if (element_bytes == 0) fail_tensor(path, name, "unknown \"dtype\" " + in_quotes(entry.dtype));

  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) {
    fail_tensor(path, name, "\"shape\" is missing or not an array");
  }
  for (const nlohmann::json& extent : *shape) {
    const auto value = non_negative(extent);
    if (!value) fail_tensor(path, name, "\"shape\" " + shape->dump() + " has a bad extent");
    entry.shape.push_back(*value);
  }

  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !non_negative((*offsets)[0]) || !non_negative((*offsets)[1])) {
    fail_tensor(path, name,
                "\"data_offsets\" must be [begin, end] of non-negative integers, not " +
                    (offsets == info.end() ? std::string("missing") : offsets->dump()));
  }
  entry.begin = *non_negative((*offsets)[0]);
  entry.end = *non_negative((*offsets)[1]);
  const std::string offsets_text = "\"data_offsets\" " + offsets_string(entry.begin, entry.end);
  if (entry.begin > entry.end) fail_tensor(path, name, offsets_text + " begin after end");
  if (entry.end > data_bytes) {
    fail_tensor(path, name,
                offsets_text + " run past the end of the file (its data section holds " +
                    std::to_string(data_bytes) + " bytes; truncated?)");
  }
  const auto expected = byte_count(entry.shape, element_bytes);
  if (!expected) {
    fail_tensor(path, name, "\"shape\" " + shape_string(entry.shape) + " overflows a byte count");
  }
  if (*expected != entry.end - entry.begin) {
    fail_tensor(path, name,
                "\"shape\" " + shape_string(entry.shape) + " of " + entry.dtype + " needs " +
                    std::to_string(*expected) + " bytes but " + offsets_text + " hold " +
                    std::to_string(entry.end - entry.begin));
  }
  return entry;
}

/// Throws Error naming both tensors if two non-empty byte ranges overlap.
void check_no_overlap(const std::string& path, std::vector<const Entry*> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  const Entry* furthest = nullptr;  // the tensor reaching furthest so far
  for (const Entry* entry : entries) {
    if (entry->begin == entry->end) continue;
    if (furthest && entry->begin < furthest->end) {
      fail_tensor(path, entry->name,
                  "\"data_offsets\" " + offsets_string(entry->begin, entry->end) +
                      " overlap tensor " + in_quotes(furthest->name) + "'s " +
                      offsets_string(furthest->begin, furthest->end));
    }
    if (!furthest || entry->end > furthest->end) furthest = entry;
  }
}

}  // namespace

std::int64_t safetensors_dtype_size(std::string_view dtype) noexcept {
  for (const DTypeName& known : kDTypes) {
    if (dtype == known.name) return known.size;
  }
  return 0;
}

const char* safetensors_dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i8:
      return "I8";
    case DType::u8:
      return "U8";
    case DType::i32:
      return "I32";
    case DType::boolean:
      return "BOOL";
  }
  return "?";
}

std::int64_t SafetensorsTensor::numel() const noexcept {
  std::int64_t count = 1;
  for (const std::int64_t extent : shape) count *= extent;  // validated: bytes fit int64
  return count;
}

std::string SafetensorsTensor::shape_string() const { return loader::shape_string(shape); }

TensorView SafetensorsTensor::view(const std::string& file) const {
  static const std::map<std::string_view, DType> kViewable = {
      {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},   {"I8", DType::i8},
      {"U8", DType::u8},   {"I32", DType::i32}, {"BOOL", DType::boolean}};
  const auto viewable = kViewable.find(dtype);
  if (viewable == kViewable.end()) {
    fail_tensor(file, name, "dtype " + this->dtype + " has no ditops tensor type");
  }
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    fail_tensor(file, name,
                "rank " + std::to_string(shape.size()) + " exceeds " + std::to_string(kMaxRank));
  }
  TensorView result;
  result.data = const_cast<std::byte*>(data);  // read-only mapping: callers only read inputs
  result.dtype = viewable->second;
  result.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = result.rank - 1; d >= 0; --d) {
    result.shape[d] = shape[d];
    result.strides[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 1);  // bounded by the validated byte count
  }
  return result;
}

float SafetensorsTensor::float_at(std::int64_t index) const noexcept {
  if (dtype == "F32") {
    float value;
    std::memcpy(&value, data + index * 4, sizeof value);
    return value;
  }
  std::uint16_t bits;
  std::memcpy(&bits, data + index * 2, sizeof bits);
  return dtype == "F16" ? f16{bits}.to_float() : bf16{bits}.to_float();
}

std::vector<float> SafetensorsTensor::to_floats(const std::string& file) const {
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16") {
    fail_tensor(file, name, "has dtype " + dtype + ", expected F32, F16 or BF16");
  }
  core::check_allocation(numel(), sizeof(float));
  std::vector<float> values(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) values[static_cast<std::size_t>(i)] = float_at(i);
  return values;
}

struct SafetensorsFile::State {
  std::string path;
  void* mapping = MAP_FAILED;
  std::size_t mapped_bytes = 0;
  std::map<std::string, SafetensorsTensor, std::less<>> tensors;
  std::map<std::string, std::string> metadata;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (mapping != MAP_FAILED) ::munmap(mapping, mapped_bytes);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const core::RegularFile file = core::RegularFile::open(path, /*follow_symlink=*/true);
  if (file.status() != core::FileStatus::ok) fail_file(path, file.problem());
  if (file.size() < 8) {
    fail_file(path, "is " + std::to_string(file.size()) +
                        " bytes, shorter than the 8-byte header length that starts the format");
  }
  auto state = std::make_shared<State>();
  state->path = path;
  state->mapped_bytes = static_cast<std::size_t>(file.size());
  state->mapping = ::mmap(nullptr, state->mapped_bytes, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (state->mapping == MAP_FAILED) {
    fail_file(path, std::string("cannot be mapped: ") + std::strerror(errno));
  }
  const auto* bytes = static_cast<const std::byte*>(state->mapping);

  std::uint64_t header_length = 0;  // little-endian, whatever the host
  for (int i = 7; i >= 0; --i)
    header_length = header_length << 8 | std::to_integer<unsigned>(bytes[i]);
  if (header_length > static_cast<std::uint64_t>(kMaxSafetensorsHeaderBytes)) {
    fail_file(path, "header length " + std::to_string(header_length) + " exceeds the limit of " +
                        std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_length > static_cast<std::uint64_t>(file.size() - 8)) {
    fail_file(path, "header length " + std::to_string(header_length) +
                        " runs past the end of the file (" + std::to_string(file.size()) +
                        " bytes; truncated?)");
  }
  const auto* header = reinterpret_cast<const char*>(bytes + 8);
  const std::int64_t data_offset = 8 + static_cast<std::int64_t>(header_length);
  const std::int64_t data_bytes = file.size() - data_offset;

  // nlohmann keeps the last of two equal keys; a tensor named twice is an error instead.
  std::set<std::string> top_keys;
  std::string repeated;
  const nlohmann::json::parser_callback_t note_keys =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
            !top_keys.insert(parsed.get<std::string>()).second && repeated.empty()) {
          repeated = parsed.get<std::string>();
        }
        return true;
      };
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(header, header + header_length, note_keys);
  } catch (const nlohmann::json::exception& error) {
    fail_file(path, std::string("header is not valid JSON: ") + error.what());
  }
  if (!document.is_object()) fail_file(path, "header is not a JSON object");
  if (!repeated.empty()) fail_tensor(path, repeated, "named twice in the header");

  std::vector<Entry> entries;
  core::checked_reserve(entries, static_cast<std::int64_t>(document.size()));
  for (const auto& [name, info] : document.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) fail_file(path, "\"__metadata__\" is not a JSON object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          fail_file(path, "\"__metadata__\" entry " + in_quotes(key) + " is not a string");
        }
        state->metadata[key] = value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, info, data_bytes));
  }
  std::vector<const Entry*> ranges;
  for (const Entry& entry : entries) ranges.push_back(&entry);
  check_no_overlap(path, std::move(ranges));

  for (Entry& entry : entries) {
    SafetensorsTensor tensor;
    tensor.name = entry.name;
    tensor.dtype = std::move(entry.dtype);
    tensor.shape = std::move(entry.shape);
    tensor.bytes = entry.end - entry.begin;
    tensor.data = tensor.bytes > 0 ? bytes + data_offset + entry.begin : nullptr;
    state->tensors.emplace(std::move(entry.name), std::move(tensor));
  }
  return SafetensorsFile(std::move(state));
}

SafetensorsFile SafetensorsFile::of_memory(std::string label,
                                           std::vector<SafetensorsTensor> tensors) {
  auto state = std::make_shared<State>();
  state->path = std::move(label);
  for (SafetensorsTensor& tensor : tensors) {
    const std::int64_t element_bytes = safetensors_dtype_size(tensor.dtype);
    if (element_bytes == 0) {
      fail_tensor(state->path, tensor.name, "unknown dtype " + in_quotes(tensor.dtype));
    }
    const auto expected = byte_count(tensor.shape, element_bytes);
    if (!expected || *expected != tensor.bytes || (tensor.bytes > 0 && !tensor.data)) {
      fail_tensor(state->path, tensor.name,
                  "shape " + shape_string(tensor.shape) + " of " + tensor.dtype + " does not " +
                      "match its " + std::to_string(tensor.bytes) + " bytes");
    }
    if (tensor.name == "__metadata__" || state->tensors.count(tensor.name)) {
      fail_tensor(state->path, tensor.name, "named twice or a reserved name");
    }
    std::string name = tensor.name;
    state->tensors.emplace(std::move(name), std::move(tensor));
  }
  return SafetensorsFile(std::move(state));
}

const std::string& SafetensorsFile::path() const noexcept { return state_->path; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(state_->tensors.size());
  for (const auto& entry : state_->tensors) names.push_back(entry.first);
  return names;
}

std::vector<std::string> SafetensorsFile::names_with_prefix(std::string_view prefix) const {
  std::vector<std::string> names;
  for (auto it = state_->tensors.lower_bound(prefix);
       it != state_->tensors.end() && it->first.starts_with(prefix); ++it) {
    names.push_back(it->first);
  }
  return names;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const noexcept {
  const auto it = state_->tensors.find(name);
  return it == state_->tensors.end() ? nullptr : &it->second;
}

const SafetensorsTensor& SafetensorsFile::get(std::string_view name) const {
  if (const SafetensorsTensor* tensor = find(name)) return *tensor;
  fail_tensor(state_->path, name, "missing");
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const noexcept {
  return state_->metadata;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const auto fail = [&path](const std::string& problem) {
    throw Error("write_safetensors: " + path + ": " + problem);
  };
  std::set<std::string_view> names;
  for (const SafetensorsEntry& tensor : tensors) {
    const std::string which = "tensor " + in_quotes(tensor.name) + ": ";
    if (tensor.name.empty() || tensor.name == "__metadata__") fail(which + "reserved name");
    if (!names.insert(tensor.name).second) fail(which + "named twice");
    const std::int64_t element_bytes = safetensors_dtype_size(tensor.dtype);
    if (element_bytes == 0) fail(which + "unknown dtype " + in_quotes(tensor.dtype));
    for (const std::int64_t extent : tensor.shape) {
      if (extent < 0) fail(which + "negative extent in shape " + shape_string(tensor.shape));
    }
    const auto expected = byte_count(tensor.shape, element_bytes);
    if (!expected || *expected != static_cast<std::int64_t>(tensor.bytes.size())) {
      fail(which + "shape " + shape_string(tensor.shape) + " of " + tensor.dtype + " does not " +
           "match its " + std::to_string(tensor.bytes.size()) + " bytes");
    }
  }
  // Widest elements first: every tensor then starts at a multiple of its element size.
  std::vector<const SafetensorsEntry*> order;
  for (const SafetensorsEntry& tensor : tensors) order.push_back(&tensor);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const std::int64_t a_size = safetensors_dtype_size(a->dtype);
    const std::int64_t b_size = safetensors_dtype_size(b->dtype);
    return a_size != b_size ? a_size > b_size : a->name < b->name;
  });
  nlohmann::json header = nlohmann::json::object();
  std::int64_t offset = 0;
  for (const SafetensorsEntry* tensor : order) {
    const auto size = static_cast<std::int64_t>(tensor->bytes.size());
    header[tensor->name] = {{"dtype", tensor->dtype},
                            {"shape", tensor->shape},
                            {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string header_text = header.dump();
  // Padded with spaces (valid JSON whitespace) so the data starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(header_text.size() >> (8 * i) & 0xff);

  std::vector<std::string_view> parts = {std::string_view(length, 8), header_text};
  for (const SafetensorsEntry* tensor : order) parts.push_back(tensor->bytes);
  struct stat existing;
  const unsigned mode = ::stat(path.c_str(), &existing) == 0 ? existing.st_mode & 07777 : 0;
  const std::string failure = core::replace_file(path, parts, mode);
  if (!failure.empty()) fail(failure);
}

}  // namespace ditops::loader

namespace ditops {

namespace loader {

SafetensorsTensor tensor_of_view(const char* call, const std::string& where,
                                 const NamedTensor& named) {
  const TensorView& view = named.tensor;
  core::check_view({call, named.name.c_str(), view}, 0, kMaxRank);
  // The format holds the elements in row-major order, so the view must already be laid out so.
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    if (view.shape[d] > 1 && view.strides[d] != stride) {
      core::fail(call, where + ": tensor \"" + named.name + "\" of shape " +
                           core::shape_string(view) + " is not contiguous (strides " +
                           "must be row-major)");
    }
    stride *= view.shape[d];
  }
  SafetensorsTensor tensor;
  tensor.name = named.name;
  tensor.dtype = safetensors_dtype_name(view.dtype);
  tensor.shape.assign(view.shape.begin(), view.shape.begin() + view.rank);
  tensor.bytes = core::numel(view) * dtype_size(view.dtype);
  tensor.data = static_cast<const std::byte*>(view.data);
  return tensor;
}

}  // namespace loader

void write_safetensors(const std::string& path, std::span<const NamedTensor> tensors) {
  std::vector<loader::SafetensorsTensor> views;
  for (const NamedTensor& named : tensors) {
    views.push_back(loader::tensor_of_view("write_safetensors", path, named));
  }
  std::vector<loader::SafetensorsEntry> entries;
  for (const loader::SafetensorsTensor& view : views) {
    entries.push_back({view.name, view.dtype, view.shape,
                       std::string_view(reinterpret_cast<const char*>(view.data),
                                        static_cast<std::size_t>(view.bytes))});
  }
  loader::write_safetensors(path, entries);
}

}  // namespace ditops
