// Thin wrappers of the PTX instructions the cuda_raw tensor-core kernels share (sm_80+): cp.async copies into shared
// memory and ldmatrix fragment loads. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace xpuruntime::cuda_raw::ptx {

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// kBytes (16 or 4) global -> shared; `src_bytes` 0 writes zeros (and reads nothing from `src`, which must still be a
// valid global address). 16-byte copies bypass L1 (.cg); 4-byte ones go through it, as cp.async of fewer than 16
// bytes must (.ca).
template <int kBytes>
__device__ __forceinline__ void cp_async(std::uint32_t dst, const void* src, int src_bytes) {
  static_assert(kBytes == 16 || kBytes == 4, "cp.async copies of 16 or 4 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
  }
#else
  (void)dst;
  (void)src;
  (void)src_bytes;
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  cp_async<16>(dst, src, src_bytes);
}
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src, int src_bytes) {
  cp_async<4>(dst, src, src_bytes);
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each): lane l gives the address of row l % 8 of matrix
// l / 8, and register i of lane l receives the 4 bytes at row l / 4, bytes 4 (l % 4) .. + 3 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#else
  (void)address;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// d += a (16 x 32 bytes, row-major) * b (32 x 8 bytes, column-major), int32 accumulators that wrap: mma.sync
// m16n8k32 s8.s8 (u8.s8 when kUnsigned). Fragments (lane = 4 group + quad): a[0] = A[group][4 quad ..], a[1] =
// A[group + 8][4 quad ..], a[2] = A[group][16 + 4 quad ..], a[3] = A[group + 8][16 + 4 quad ..]; b0 = B[4 quad ..][group],
// b1 = B[16 + 4 quad ..][group]; d[0], d[1] = D[group][2 quad, 2 quad + 1], d[2], d[3] = D[group + 8][...].
template <bool kUnsigned>
__device__ __forceinline__ void mma_s8_16x8x32(int (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kUnsigned) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d;
  (void)a;
  (void)b0;
  (void)b1;
  __trap();  // the launchers keep older devices away (sm_80+)
#endif
}

}  // namespace xpuruntime::cuda_raw::ptx
