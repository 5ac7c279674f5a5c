// Writes float32 arrays as NumPy .npy files (format version 1.0) for --dump, atomically
// (src/results/report.hpp's write_file_atomically).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lattn {

void write_npy(const std::string& path, const float* data, const std::vector<std::size_t>& shape);

}  // namespace lattn
