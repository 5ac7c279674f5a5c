// OpenBLAS 0.3.21 (Debian's DYNAMIC_ARCH build) picks its kernels from the CPU model number; a
// model it does not know (family 6 model 207 under KVM here) falls back to "Prescott", i.e. SSE3
// kernels: sgemm ran at 19 GFLOP/s on one core here against 80 with the SkylakeX kernels. The
// choice is made when the library loads, before main, and only OPENBLAS_CORETYPE overrides it.
#pragma once

namespace lattn::cpu {

// When OpenBLAS fell back to Prescott on a CPU with AVX2 or AVX-512 and OPENBLAS_CORETYPE is
// unset, sets it to the matching core (Cooperlake, SkylakeX, Haswell) and re-executes this
// program with the same argv; the fallback is recorded in LATTN_OPENBLAS_DETECTED. Returns
// normally otherwise (or when the re-exec fails).
void select_openblas_core(char** argv);

}  // namespace lattn::cpu
