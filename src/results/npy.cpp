#include "src/results/npy.hpp"

#include "src/results/report.hpp"

namespace lattn {

void write_npy(const std::string& path, const float* data, const std::vector<std::size_t>& shape) {
  std::string dims;
  std::size_t count = 1;
  for (std::size_t d : shape) {
    dims += std::to_string(d) + ",";
    count *= d;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // The magic, version, and header length take 10 bytes; the whole header pads to 64 and ends in \n.
  const std::size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';

  // Whole or not at all (a full disk must not leave a truncated array that numpy reads as damaged).
  const char prefix[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', '\x01', '\x00', char(header.size() & 0xff),
                           char(header.size() >> 8)};
  write_file_atomically(path, {std::string_view(prefix, sizeof prefix), header,
                               std::string_view(reinterpret_cast<const char*>(data), count * sizeof(float))});
}

}  // namespace lattn
