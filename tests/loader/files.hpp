#pragma once
// What the loader tests share to write model files: tensors' bytes, and safetensors files with
// headers the library's writer would never produce (malformed, misaligned).

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ditops::test {

/// The bytes of `values`, as one tensor's data.
template <class T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

/// A file of the 8-byte little-endian header length (`header`'s size unless `length` is given),
/// `header` and `data`, exactly as given.
inline void write_raw_safetensors(const std::string& path, const std::string& header,
                                  const std::string& data,
                                  std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
}

}  // namespace ditops::test
