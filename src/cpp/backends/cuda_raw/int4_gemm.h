// The launchers of matmul_nbits' cuda_raw kernel (int4_gemm.cu; Note [Int4 weight-only GEMM] in
// core/op_schemas_int4.cpp, Note [Int4 GEMM on the GPU] in int4_gemm.cu). The contract of cuda_raw_ops.h holds:
// the current device is the operands' device, the stream is a cudaStream_t as void*, nothing synchronizes, zero-sized
// work enqueues nothing, errors are typed. Internal to the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xpuruntime/dtype.h"

namespace xpuruntime::cuda_raw {

// One matmul_nbits problem: y[m, n] = x[m, k] @ W^T (+ bias), W from the packed codes (all pointers on the device,
// contiguous, in the op's layout).
struct Int4GemmArgs {
  const void* x = nullptr;                     // [m, k] of x_dtype
  const std::uint8_t* weight = nullptr;        // [n, blocks, block / 2]
  const void* scales = nullptr;                // [n, blocks] of scale_dtype
  const std::uint8_t* zero_points = nullptr;   // [n, ceil(blocks / 2)], or null (8)
  const void* bias = nullptr;                  // [n] of bias_dtype, or null
  void* y = nullptr;                           // [m, n] of x_dtype
  DType x_dtype = DType::kFloat16;
  DType scale_dtype = DType::kFloat16;
  DType bias_dtype = DType::kFloat16;
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t block = 32;                     // a power of two >= 16
  std::int64_t blocks() const { return (k + block - 1) / block; }
};

// The tensor-core kernel's grid: `tiles` tiles of 8 output columns per block (1, 2 or 4), K cut into `splits` parts
// (each block's float32 partial sums in the workspace when splits > 1, summed by a second kernel in a fixed order);
// `stream`: the streaming kernel of m <= 16 (tiles 2 or 4; Note [Int4 GEMM streamed through shared memory]), which
// the launch replaces by the other kernel of the same grid when m > 16 or blocks are of 16 codes; `gemv`: the GEMV
// kernel of m <= 4 (tiles 2: 16 columns per block; Note [Int4 GEMV with sub-blocks as the MMA's columns]), which the
// launch replaces by the streaming kernel where it does not take the problem.
// What the streaming kernel's prologue copies into shared memory where it fits (Note [x in shared memory for the
// streaming kernel]): x and the scales (with the zero points), the scales only, x only, or nothing (every operand read
// from global memory in the loop). Records name the last three ("staging": "scales" / "x" / "none"), for tests and
// timings.
enum class Int4Staging : int { kAll = 0, kScales = 1, kX = 2, kNone = 3 };

struct Int4MmaConfig {
  int tiles = 4;
  int splits = 1;
  bool stream = false;
  bool gemv = false;
  int ring = 0;  // the streaming kernel's ring of chunks per warp in bytes: 0 its default (4096), or 8192 (4 tiles,
                 // m <= 8; elsewhere the default ring runs)
  Int4Staging staging = Int4Staging::kAll;  // what the streaming kernel's prologue may copy into shared memory
  std::size_t workspace_bytes = 0;
};

constexpr int kInt4MaxSplits = 8;

// Whether the tensor-core kernel takes `args` (null: it does; else the reason): x float16 or bfloat16, compute
// capability 8.0 or newer, rows of the packed weight a multiple of 16 bytes (block_size >= 32, or an even number of
// 16-blocks) and every operand 16-byte aligned, sizes within int32.
const char* int4_gemm_mma_refusal(const Int4GemmArgs& args, int compute_capability);
// Every grid the kernel can take for `args` on the current device (its SM count and the kernel's occupancy, queried
// once per device), the default first and the others for autotuning; and the grid of given tiles and splits (valid
// values only: checked by the caller; stream with tiles 2 or 4, or gemv with tiles 2; ring 8192 with stream and 4
// tiles).
std::vector<Int4MmaConfig> int4_gemm_mma_configs(const Int4GemmArgs& args);
Int4MmaConfig int4_gemm_mma_config(const Int4GemmArgs& args, int tiles, int splits, bool stream, bool gemv = false,
                                   int ring = 0, Int4Staging staging = Int4Staging::kAll);
// The tensor-core kernel (Note [Int4 GEMM on the GPU]): any m, meant for small ones; `workspace` holds
// config.workspace_bytes.
void int4_gemm_mma(const Int4GemmArgs& args, const Int4MmaConfig& config, void* workspace, void* stream);

// Rows [n0, n0 + rows) of W dequantized in float32 and rounded once to `out_dtype` (float32, float16, bfloat16) into
// `out` [rows, k]: what the library GEMM of large m multiplies by. rows <= 65535.
void int4_dequantize_rows(const Int4GemmArgs& args, std::int64_t n0, std::int64_t rows, void* out, DType out_dtype,
                          void* stream);
// y[m, n] += bias[n] in float32, rounded once to x_dtype (after the library GEMM).
void int4_add_bias(const Int4GemmArgs& args, void* stream);

}  // namespace xpuruntime::cuda_raw
