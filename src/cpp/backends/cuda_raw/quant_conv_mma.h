// The pipelined tensor-core int8 convolution (quant_conv_mma.cu, Note [Pipelined int8 convolution]): qconv2d's
// kPipelined and kPipelined64 paths (quant_conv.h), launched by qconv2d().
#pragma once

#include <cstddef>

#include "backends/cuda_raw/quant_conv.h"
#include "core/device_kernels.h"

namespace xpuruntime::cuda_raw {

// The sizes qconv2d's kernels read (quant_conv.cu and quant_conv_mma.cu; 32-bit: qconv2d_fits_int32). k: one output
// channel's reduction length, C/groups x kh x kw; m: the output pixels, N x OH x OW.
struct QConvDims {
  int n, c, h, w, o, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, groups, cg, og, k, m;
};

inline QConvDims qconv_dims_of(const QConvGeometry& g) {
  QConvDims d{};
  d.n = g.batch;
  d.c = g.channels;
  d.h = g.in_h;
  d.w = g.in_w;
  d.o = g.out_channels;
  d.oh = g.out_h;
  d.ow = g.out_w;
  d.kh = g.kernel_h;
  d.kw = g.kernel_w;
  d.sh = g.stride_h;
  d.sw = g.stride_w;
  d.pt = g.pad_top;
  d.pl = g.pad_left;
  d.dh = g.dilation_h;
  d.dw = g.dilation_w;
  d.groups = g.groups;
  d.cg = g.channels / g.groups;
  d.og = g.out_channels / g.groups;
  d.k = d.cg * d.kh * d.kw;
  d.m = g.batch * g.out_h * g.out_w;
  return d;
}

// How a pipelined launch covers the output: 128 x 128 or 64 x 64 tiles (`small_tiles`), and the reduction split
// into `splits` ranges of `steps_per_split` steps of 64 bytes each (1: no split).
struct QConvPipeline {
  bool small_tiles = false;
  int splits = 1;
  int steps_per_split = 0;
};

// The tiles and split for `g` on a device of `sms` multiprocessors: large tiles when they fill the device, else small
// ones, split along the reduction until about two waves of blocks run (each split keeping at least 4 steps).
// `small_tiles` forces the small tiles (kPipelined64); `splits` > 0 forces a split count (clamped to the steps).
QConvPipeline qconv2d_pipeline(const QConvGeometry& g, bool small_tiles, int sms, int splits = 0);
// The device workspace a split launch takes besides qconv2d's own (int32 partial sums of the whole output and one
// arrival counter per tile); 0 without a split.
std::size_t qconv2d_pipeline_workspace_bytes(const QConvGeometry& g, const QConvPipeline& pipeline);
// The launch: x (int8, or uint8 when x_unsigned) NHWC, w int8 OHWI, one group, channels a multiple of 16; the epilogue
// `p` in registers (or after the split's last block); `workspace` of qconv2d_pipeline_workspace_bytes when split.
void qconv2d_pipelined(const QConvGeometry& g, const void* x, bool x_unsigned, int x_zero_point, const std::int8_t* w,
                       void* y, const QuantEpilogueParams& p, const QConvPipeline& pipeline, void* workspace,
                       void* stream);

}  // namespace xpuruntime::cuda_raw
