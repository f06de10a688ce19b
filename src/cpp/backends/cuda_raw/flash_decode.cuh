// flash_decode: the split-K attention of decode steps ("flash-decoding"), the cuda_raw backend's second kernel of op
// "attention" (Note [Split-K decode attention] in flash_decode.cu). Declarations shared by flash_attention.cu, which
// registers the kernel beside flash_v2 and reuses its descriptor checks, and flash_decode.cu, which has the kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backends/cuda_raw/flash_attention_kernel.cuh"
#include "xpuruntime/dtype.h"

namespace xpuruntime::flash {

constexpr int kDecodeRows = 8;   // query rows per thread block: heads of one KV group x query positions
constexpr int kDecodeMaxSeqQ = 8;  // the query positions a decode step may have (speculative steps included)

// How one descriptor's keys are split: `splits` blocks per (batch, KV head, chunk of kDecodeRows rows), each over
// `keys_per_split` keys (a multiple of 32; the last block over what is left).
struct DecodeSplit {
  int splits = 1;
  int keys_per_split = 0;
  int row_chunks = 1;  // ceil(H / Hkv * Sq / kDecodeRows)
};

// The split for `params` on a device of `multiprocessors` SMs: enough blocks for about two per SM, each over at least
// 128 keys (one pass of its four warps).
DecodeSplit decode_split(const Params& params, int multiprocessors);

// The float32 workspace the split needs: per split and query row, the unnormalised output (D values), the row's
// running max and its sum (Note [Split-K decode attention]); 0 for one split.
std::size_t decode_workspace_bytes(const Params& params, int head_dim, const DecodeSplit& split);

// Launches the split blocks and, with more than one split, the combining kernel. `mask`: Params::mask is read (an
// explicit additive mask). Params::causal must be false. dtype float16 or bfloat16, head_dim 32, 64 or 128.
cudaError_t launch_flash_decode(const Params& params, DType dtype, int head_dim, bool mask, const DecodeSplit& split,
                                float* workspace, cudaStream_t stream);

}  // namespace xpuruntime::flash
