# Makes a .cu compile as host C++ against the emulation (docs/cuda.md, "Emulation on the CPU"):
#   cmake -DINPUT=kernels/<op>/cuda.cu -DOUTPUT=build/.../x.cpp [-DBARRIER_BEFORE=<text>] -P emulate_cu.cmake
# The .cu itself is never edited; its copy is rewritten mechanically, so that the emulation
# always runs the code as it is:
#   - `#include <cuda_runtime.h>` first, as nvcc does, and a #line so messages name the .cu;
#   - every kernel gets a first parameter, lattn_emu::Kernel<"name", Bounds{launch bounds}>,
#     from which the launcher takes the kernel's name and its __launch_bounds__;
#   - `k<<<grid, block, shared, stream>>>(args)` becomes `lattn_emu::launch(k, grid, block, shared, stream)(args)`;
#   - `extern __shared__ T name[];` becomes a pointer to the block's dynamic shared memory, and
#     `__shared__ T name[...];` a reference to the block's storage for that declaration.
# Whatever of those the patterns miss is an error here, not a silently different program.
# BARRIER_BEFORE (the missing-barrier test): the text of one line that occurs once in the file;
# the __syncthreads() right before it (only blank space between) is taken out.
if(NOT INPUT OR NOT OUTPUT)
  message(FATAL_ERROR "emulate_cu.cmake: INPUT and OUTPUT are required")
endif()
file(READ "${INPUT}" text)
set(ws "[ \t\r\n]")
set(id "[A-Za-z_][A-Za-z0-9_]*")
set(type "[A-Za-z_][A-Za-z0-9_: ]*[A-Za-z0-9_]")

if(BARRIER_BEFORE)
  string(FIND "${text}" "${BARRIER_BEFORE}" at)
  string(FIND "${text}" "${BARRIER_BEFORE}" last REVERSE)
  if(at EQUAL -1 OR NOT at EQUAL last)
    message(FATAL_ERROR "emulate_cu.cmake: '${BARRIER_BEFORE}' must occur exactly once in ${INPUT}")
  endif()
  string(SUBSTRING "${text}" 0 ${at} before)
  string(SUBSTRING "${text}" ${at} -1 after)
  string(FIND "${before}" "__syncthreads();" barrier REVERSE)
  if(barrier EQUAL -1)
    message(FATAL_ERROR "emulate_cu.cmake: no __syncthreads() before '${BARRIER_BEFORE}' in ${INPUT}")
  endif()
  math(EXPR gap_start "${barrier} + 16")
  string(SUBSTRING "${before}" ${gap_start} -1 gap)
  if(NOT gap MATCHES "^${ws}*$")
    message(FATAL_ERROR "emulate_cu.cmake: the __syncthreads() before '${BARRIER_BEFORE}' is not right before it")
  endif()
  string(SUBSTRING "${before}" 0 ${barrier} head)
  set(text "${head}/* barrier removed (missing-barrier test) */${gap}${after}")
endif()

# Shared memory: __align__(n) becomes __shared__<n> first (CMake's regex numbers nested groups
# wrongly), then dynamic shared memory, then static (whose patterns would match the extern form).
string(REGEX REPLACE "__shared__[ \t]+__align__\\(([0-9]+)\\)" "__shared__<\\1>" text "${text}")
string(REGEX REPLACE "extern[ \t]+__shared__([<>0-9]*)[ \t]+(${type})[ \t]+(${id})\\[\\][ \t]*;"
       "\\2* const \\3 = static_cast<\\2*>(::lattn_emu::dynamic_shared_memory(::lattn_emu::parse_align(\"\\1\")));" text "${text}")
string(REGEX REPLACE "__shared__([<>0-9]*)[ \t]+(${type})[ \t]+(${id})((\\[[^];]*\\])+)[ \t]*;"
       "\\2 (&\\3)\\4 = ::lattn_emu::static_shared<\\2\\4, ::lattn_emu::parse_align(\"\\1\")>([] {});" text "${text}")
string(REGEX REPLACE "__shared__([<>0-9]*)[ \t]+(${type})[ \t]+(${id})[ \t]*;"
       "\\2& \\3 = ::lattn_emu::static_shared<\\2, ::lattn_emu::parse_align(\"\\1\")>([] {});" text "${text}")

# Kernels: the ones with launch bounds first (the second pattern then no longer sees them).
string(REGEX REPLACE "__global__(${ws}+)void(${ws}+)__launch_bounds__\\(([^()]*)\\)(${ws}*)(${id})\\("
       "void\\1\\2\\4\\5(::lattn_emu::Kernel<\"\\5\", ::lattn_emu::Bounds{\\3}>, " text "${text}")
string(REGEX REPLACE "__global__(${ws}+)void(${ws}+)(${id})\\("
       "void\\1\\2\\3(::lattn_emu::Kernel<\"\\3\", ::lattn_emu::Bounds{}>, " text "${text}")
string(REPLACE "::lattn_emu::Bounds{}>, )" "::lattn_emu::Bounds{}>)" text "${text}")

# Launches: the kernel expression (a name, perhaps with template arguments) and the configuration.
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*>)?)[ \t]*<<<([^<>;]*)>>>"
       "::lattn_emu::launch(\\1, \\3)" text "${text}")

foreach(left "<<<" "__shared__" "__global__" "__launch_bounds__")
  string(FIND "${text}" "${left}" found)
  if(NOT found EQUAL -1)
    string(SUBSTRING "${text}" ${found} 120 context)
    message(FATAL_ERROR "emulate_cu.cmake: ${INPUT}: '${left}' left after the rewrite, at: ${context}")
  endif()
endforeach()

file(WRITE "${OUTPUT}.tmp" "#include <cuda_runtime.h>\n#line 1 \"${INPUT}\"\n${text}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
