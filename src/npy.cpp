#include "npy.hpp"

#include <fstream>

#include "core/error.hpp"

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

  std::ofstream out(path, std::ios::binary);
  if (!out) throw RuntimeFailure("cannot write " + path);
  const unsigned short header_len = static_cast<unsigned short>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(char(header_len & 0xff));
  out.put(char(header_len >> 8));
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(count * sizeof(float)));
  if (!out) throw RuntimeFailure("short write to " + path);
}

}  // namespace lattn
