// The memory layout of the conv2d and pooling registry ops: the "layout" attribute, "NCHW" (the default, ONNX's)
// or "NHWC" (channels last: x [N, H, W, C], conv2d weight [O, kh, kw, C/groups], outputs [N, OH, OW, O]).
// Internal header shared by the op schemas and the kernels (docs/ops.md, "Layouts").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::detail {

// True for "NHWC", false for "NCHW" or no attribute; any other value -> InvalidArgumentError naming `op`.
inline bool is_nhwc(const Attributes& attrs, const std::string& op) {
  const std::string layout = attrs.get_string("layout", "NCHW");
  XPURT_CHECK(layout == "NCHW" || layout == "NHWC", "op '", op, "': attribute 'layout' must be \"NCHW\" or \"NHWC\", ",
              "got \"", layout, "\"");
  return layout == "NHWC";
}

// [N, H, W, C] -> [N, C, H, W] (and a conv2d weight [O, kh, kw, C/g] -> [O, C/g, kh, kw]).
inline std::vector<std::int64_t> nhwc_to_nchw(const std::vector<std::int64_t>& s) { return {s[0], s[3], s[1], s[2]}; }
// The logical NCHW dims of a 4-D shape stored in `nhwc` order or not (kernels read sizes through this and set the
// memory order on their descriptors).
inline std::vector<std::int64_t> as_nchw(const std::vector<std::int64_t>& s, bool nhwc) {
  return nhwc ? nhwc_to_nchw(s) : s;
}
// [N, C, H, W] -> [N, H, W, C].
inline std::vector<std::int64_t> nchw_to_nhwc(const std::vector<std::int64_t>& s) { return {s[0], s[2], s[3], s[1]}; }

// The window of a max_pool2d / avg_pool2d along H and W, with the ops' defaults (attribute lengths are the op
// schema's to validate): strides the kernel's, pads 0, dilations 1 (avg_pool2d takes none).
struct PoolWindow {
  std::int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, pad_begin[2] = {0, 0}, pad_end[2] = {0, 0};
  std::int64_t dilation[2] = {1, 1};
};

inline PoolWindow pool_window(const Attributes& attrs, const std::string& op) {
  const auto kernel = attrs.get_ints("kernel_shape", {1, 1});
  const auto strides = attrs.get_ints("strides", kernel);
  const auto pads = attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = op == "max_pool2d" ? attrs.get_ints("dilations", {1, 1}) : std::vector<std::int64_t>{1, 1};
  PoolWindow w;
  for (int d = 0; d < 2; ++d) {
    w.kernel[d] = kernel[d];
    w.stride[d] = strides[d];
    w.pad_begin[d] = pads[d];
    w.pad_end[d] = pads[d + 2];
    w.dilation[d] = dilations[d];
  }
  return w;
}

}  // namespace xpuruntime::detail
