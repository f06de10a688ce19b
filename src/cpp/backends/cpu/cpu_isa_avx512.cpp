// The cpu_isa.h kernels compiled for avx512 (this file's -march: src/cpp/backends/cpu/CMakeLists.txt).
#define XPURT_CPU_ISA_NS isa_avx512
#define XPURT_CPU_ISA_NAME "avx512"
#define XPURT_CPU_VEC_BYTES 64
#include "backends/cpu/cpu_isa_kernels.inc"
