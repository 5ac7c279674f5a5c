// SHA-256 (FIPS 180-4) of a file, as lowercase hex: what a result file records of each plugin it
// loaded, so that two results name the same build of a kernel or visibly do not. Small enough to
// write here rather than add a crypto library for one digest per plugin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lattn {

std::string sha256_hex(const void* data, std::size_t bytes);
// Throws RuntimeFailure when the file cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace lattn
