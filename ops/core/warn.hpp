#pragma once
// Warnings the library prints itself (a setting it cannot honour, a cache file it ignores): on
// stderr, once per process per distinct message, so a call repeated in a loop warns once.

#include <string>

namespace ditops::core {

/// Prints `message` to stderr the first time it is passed in this process.
void warn_once(const std::string& message);

}  // namespace ditops::core
