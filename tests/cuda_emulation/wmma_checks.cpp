// The argument rules of nvcuda::wmma::load_matrix_sync and store_matrix_sync (CUDA Programming
// Guide, "Warp Matrix Functions"): the pointer 256-bit aligned, the leading dimension a multiple of
// 16 bytes (8 bf16 / half elements, 4 floats). A GPU gives undefined results or a fault for a
// violation, perhaps only on some architectures; the emulation fails the launch.
#include <cstdint>
#include <cstdio>

#include <mma.h>

namespace nvcuda::wmma::detail {

void check_pointer(const char* what, const void* ptr, unsigned ldm, std::size_t element_bytes) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % 32 != 0) {
    char text[200];
    std::snprintf(text, sizeof text, "%s: pointer %p is not 32-byte (256-bit) aligned", what, ptr);
    lattn_emu::device_fail(text);
  }
  if ((std::size_t(ldm) * element_bytes) % 16 != 0)
    lattn_emu::device_fail(std::string(what) + ": leading dimension " + std::to_string(ldm) + " elements of " +
                           std::to_string(element_bytes) + " bytes is not a multiple of 16 bytes");
}

}  // namespace nvcuda::wmma::detail
