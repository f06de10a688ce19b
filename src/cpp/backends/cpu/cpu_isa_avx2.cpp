// The cpu_isa.h kernels compiled for avx2 (this file's -march: src/cpp/backends/cpu/CMakeLists.txt).
#define XPURT_CPU_ISA_NS isa_avx2
#define XPURT_CPU_ISA_NAME "avx2"
#define XPURT_CPU_VEC_BYTES 32
#include "backends/cpu/cpu_isa_kernels.inc"
