// The launcher of qconv2d's cuda_raw kernels (quant_conv.cu; Note [Quantized registry ops] in core/op_schemas.cpp,
// Note [Int8 convolution on the GPU] in quant_conv.cu), for their registration (quant_conv_register.cpp). The contract
// of cuda_raw_kernels.h holds: current device, stream as void*, no synchronization, zero-sized work enqueues nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xpuruntime/dtype.h"

namespace xpuruntime::cuda_raw {

// One qconv2d's sizes, read as NCHW whatever the layout. `nhwc`: x [N, H, W, C], weight [O, kh, kw, C/groups], y [N,
// OH, OW, O]; else x [N, C, H, W], weight [O, C/groups, kh, kw], y [N, O, OH, OW]. Every element count fits in int32
// (qconv2d_fits_int32).
struct QConvGeometry {
  int batch = 0, channels = 0, in_h = 0, in_w = 0;
  int out_channels = 0, out_h = 0, out_w = 0;
  int kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dilation_h = 1,
      dilation_w = 1, groups = 1;
  bool nhwc = false;
};

// Its operands and epilogue (Note [Quantized registry ops]): x int8, or uint8 when `x_unsigned`, with x_zero_point;
// w int8; w_scale float32 [O] or one element (w_scale_count), null when absent; bias int32 [O] (`bias_int`) or
// float32 [O], null when absent; y of out_dtype (int8, uint8, float32, float16 or int32; y_scale and y_zero_point
// for int8/uint8). Device pointers of one device.
struct QConvArgs {
  const void* x = nullptr;
  bool x_unsigned = false;
  int x_zero_point = 0;
  float x_scale = 1.0f;
  const std::int8_t* w = nullptr;
  const float* w_scale = nullptr;
  std::int64_t w_scale_count = 0;
  const void* bias = nullptr;
  bool bias_int = false;
  // The attribute zero_point_folded: the int32 bias already holds -x_zero_point * sum_k w[o, k] (x_zero_point still
  // fills the padded positions; Note [Quantized constants folded at build time]).
  bool zero_point_folded = false;
  bool relu = false;
  float y_scale = 1.0f;
  int y_zero_point = 0;
  DType out_dtype = DType::kFloat32;
  void* y = nullptr;
};

// Which kernel runs it (Note [Int8 convolution on the GPU]).
enum class QConvPath : std::uint8_t {
  kDirect,       // one thread per output (depthwise and other small groups)
  kTiled,        // dp4a tiles of one group, any layout
  kTensorCore,   // mma.sync m16n8k32, NHWC, one group, 128 x 128 tiles
  kTensorCore64,  // the same with 64 x 64 tiles (problems too small to fill the GPU with the larger ones)
  kPipelined,     // mma.sync m16n8k32 fed by a 4-stage cp.async pipeline and ldmatrix, 128 x 128 tiles, split-K
                  // where the tiles do not fill the GPU (Note [Pipelined int8 convolution], quant_conv_mma.cu)
  kPipelined64    // the same with 64 x 64 tiles
};

// Whether every element count and offset of `g` fits in int32 (the kernels index in 32 bits).
bool qconv2d_fits_int32(const QConvGeometry& g);
// Whether the tensor-core kernel takes `g`: NHWC, one group, input channels a multiple of 16 (16-byte loads of
// whole channel runs; the data pointers 16-byte aligned is the kernel's declaration).
bool qconv2d_tensor_core_fits(const QConvGeometry& g);
// The path for `g`: the pipelined tensor-core kernel when `tensor_core` (and it fits), else kDirect or kTiled. `sms`:
// the device's multiprocessors (pick the tile and the split).
QConvPath qconv2d_path(const QConvGeometry& g, bool tensor_core, int sms);
// How many ranges a kPipelined/kPipelined64 launch splits the reduction into on a device of `sms` multiprocessors
// (1 for the other paths; Note [Pipelined int8 convolution]).
int qconv2d_splits(const QConvGeometry& g, QConvPath path, int sms);
const char* qconv2d_path_name(QConvPath path);
// The device workspace a launch takes: the per-channel alpha and folded int32 bias (Note [Int8 convolution on the
// GPU]), and a split launch's partial sums (`splits` > 1, pipelined paths).
std::size_t qconv2d_workspace_bytes(const QConvGeometry& g, QConvPath path = QConvPath::kDirect, int splits = 1);
// y = qconv2d(x, w) by `path` (and `splits`, pipelined paths), with `workspace` of qconv2d_workspace_bytes(g, path,
// splits) bytes.
void qconv2d(const QConvGeometry& g, const QConvArgs& args, QConvPath path, void* workspace, void* stream,
             int splits = 1);

}  // namespace xpuruntime::cuda_raw
