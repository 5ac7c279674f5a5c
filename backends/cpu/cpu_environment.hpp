// Two settings of the CPU backend that only the environment can make, because the libraries read
// it when they load, before main:
//
// - OpenBLAS 0.3.21 (Debian's DYNAMIC_ARCH build) picks its kernels from the CPU model number; a
//   model it does not know (family 6 model 207 under KVM here) falls back to "Prescott", i.e.
//   SSE3 kernels: sgemm ran at 19 GFLOP/s on one core here against 80-140 with the SkylakeX or
//   Cooperlake kernels. Only OPENBLAS_CORETYPE overrides the choice.
// - libgomp's threads spin (up to 300000 iterations) at every barrier and between parallel
//   regions unless told otherwise. On a machine whose cores other jobs share (this 2-core
//   machine, load 3-8), the spinning thread holds a core the other thread or another job needs,
//   and calls came out in multiples of the 4 ms scheduler tick: seq 512, D 64, 2 threads, scan fwd
//   12 ms spinning against 0.93 ms passive, seq 8192 25.6 against 18.3 ms. Passive (sleep at
//   once) costs a wake-up per parallel region instead, and under KVM waking an idle vCPU took
//   ~70 us: short calls ran up to 1.6x slower than with a short spin (scan fwd seq 512 D 32, 2
//   threads: 0.16-0.20 ms passive, 0.11-0.12 spinning). GOMP_SPINCOUNT=1000 (~0.1 ms) keeps
//   the workers awake across back-to-back calls and gives the core up soon after: idle, 1.0-1.4x
//   faster than passive; with another process busy on one of the two cores, 0.93-1.11x (10000
//   and 100000 there: down to 0.35x and 0.09x).
#pragma once

namespace lattn::cpu {

// Sets, when the user has not: OPENBLAS_CORETYPE to the core matching the CPU's flags
// (Cooperlake, SkylakeX, Haswell) when OpenBLAS fell back to Prescott; GOMP_SPINCOUNT=1000
// when neither it nor OMP_WAIT_POLICY is set. If it set anything it re-executes this program with
// the same argv (once: LATTN_ENV_SET names what was set) and does not return; else it returns.
void prepare_cpu_environment(char** argv);

}  // namespace lattn::cpu
