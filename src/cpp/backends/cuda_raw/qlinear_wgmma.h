// qlinear's int8 GEMM by Hopper's warpgroup MMA (Note [int8 GEMM by wgmma] in qlinear_wgmma.cu). The kernel is
// compiled for sm_90a (the arch-specific wgmma instructions), so it runs on compute capability 9.0 devices only (H100,
// H200); the registration (qlinear_register.cpp) turns others away.
#pragma once

#include <cstdint>

#include "core/device_kernels.h"

namespace xpuruntime::cuda_raw {

struct QLinearWgmmaArgs {
  const void* x = nullptr;  // [M, K] int8 or uint8 (x_unsigned), 16-byte aligned
  bool x_unsigned = false;
  const std::int8_t* weight = nullptr;  // [N, K], 16-byte aligned
  void* out = nullptr;                  // [M, N] of epilogue.out_dtype
  std::int64_t m = 0, n = 0, k = 0;     // K a multiple of 16
  QuantEpilogueParams epilogue;
  int warpgroups = 2;  // 2: 256 threads, 1: 128 threads
  int row_tiles = 1;   // strips of 64 rows each warpgroup takes: tiles of 64 x warpgroups x row_tiles rows, 128 columns
  // The warp-specialized pipeline (Note [int8 GEMM by wgmma, fed by TMA]): a producer warpgroup copying by TMA beside
  // the `warpgroups` that multiply (one of them takes one strip); else the warps that multiply copy by cp.async.
  bool tma = false;
};

// Whether the kernel takes the sizes (M and K below 2^30, N at most 65535 x 128: the grid's y extent).
bool qlinear_wgmma_sizes_fit(std::int64_t m, std::int64_t n, std::int64_t k);
// The stages of K in the kernel's shared-memory ring for the tiles of `warpgroups` x `row_tiles` strips (`tma`: the
// warp-specialized pipeline's).
int qlinear_wgmma_stages(int warpgroups, int row_tiles, bool tma);
void qlinear_wgmma(const QLinearWgmmaArgs& args, void* stream);

}  // namespace xpuruntime::cuda_raw
