// The cuda_raw data-movement kernels and their registration: transpose, concat, slice, gather, expand, where and
// comparisons (data.cu), non_zero and non_max_suppression (data_dependent.cu), gather_elements and gather_nd (data.cu),
// pad (pad.cu), resize (resize.cu), one_hot, trilu, tile and scatter_nd (generate.cu).
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/conv_layout.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"

namespace xpuruntime::cuda_raw {

namespace {

// A kernel whose workspace follows from the descriptor alone (data_dependent.cu): a SplitKernel whose plan is `run`
// with that workspace, described as "cuda_raw <op>: workspace <bytes> B".
std::unique_ptr<Kernel> scratch_kernel(const std::string& op, const std::string& summary,
                                       std::vector<std::string> names, DTypes dtypes, Extra extra,
                                       std::function<std::size_t(const OpDescriptor&)> workspace,
                                       FunctionKernel::RunFn run) {
  return std::make_unique<SplitKernel>(
      op, summary, std::move(extra),
      [workspace = std::move(workspace), run = std::move(run)](const OpDescriptor& desc, const ExecutionPolicy&) {
        const std::size_t bytes = workspace(desc);
        return std::make_unique<SplitPlan>(bytes, detail::str_cat("cuda_raw ", desc.op, ": workspace ", bytes, " B"),
                                           run);
      },
      dtypes, std::move(names));
}

cuda_raw::NmsGeometry nms_geometry(const OpDescriptor& desc) {
  const Attributes& a = desc.attrs;
  cuda_raw::NmsGeometry g;
  g.batches = desc.inputs[0].shape[0];
  g.boxes = desc.inputs[0].shape[1];
  g.classes = desc.inputs[1].shape[1];
  g.max_per_class = std::min(std::max<std::int64_t>(a.get_int("max_output_boxes_per_class", 0), 0), g.boxes);
  g.center_point_box = a.get_int("center_point_box", 0) != 0;
  g.iou_threshold = a.get_float("iou_threshold", 0.0);
  g.has_score_threshold = a.has("score_threshold");
  g.score_threshold = a.get_float("score_threshold", 0.0);
  return g;
}


cuda_raw::PadMode pad_mode(const std::string& mode) {
  if (mode == "constant") return cuda_raw::PadMode::kConstant;
  if (mode == "reflect") return cuda_raw::PadMode::kReflect;
  if (mode == "edge") return cuda_raw::PadMode::kEdge;
  XPURT_CHECK(mode == "wrap", "op 'pad': mode must be constant, reflect, edge or wrap, got '", mode, "'");
  return cuda_raw::PadMode::kWrap;
}

cuda_raw::ResizeParams resize_params(const OpDescriptor& desc) {
  const Attributes& attrs = desc.attrs;
  cuda_raw::ResizeParams p;
  const std::string mode = attrs.get_string("mode", "nearest");
  p.mode = mode == "linear" ? cuda_raw::ResizeMode::kLinear
                            : mode == "cubic" ? cuda_raw::ResizeMode::kCubic : cuda_raw::ResizeMode::kNearest;
  const std::string coordinates = attrs.get_string("coordinate_transformation_mode", "half_pixel");
  using C = cuda_raw::ResizeCoordinates;
  if (coordinates == "half_pixel") {
    p.coordinates = C::kHalfPixel;
  } else if (coordinates == "half_pixel_symmetric") {
    p.coordinates = C::kHalfPixelSymmetric;
  } else if (coordinates == "pytorch_half_pixel") {
    p.coordinates = C::kPytorchHalfPixel;
  } else if (coordinates == "align_corners") {
    p.coordinates = C::kAlignCorners;
  } else if (coordinates == "asymmetric") {
    p.coordinates = C::kAsymmetric;
  } else if (coordinates == "tf_half_pixel_for_nn") {
    p.coordinates = C::kTfHalfPixelForNn;
  } else {
    throw UnsupportedOperationError(detail::str_cat("cuda_raw resize has no coordinate_transformation_mode '",
                                                    coordinates, "' (tf_crop_and_resize runs on the cpu kernel)"));
  }
  const std::string nearest = attrs.get_string("nearest_mode", "round_prefer_floor");
  using N = cuda_raw::ResizeNearest;
  p.nearest = nearest == "round_prefer_ceil" ? N::kRoundPreferCeil
              : nearest == "floor"           ? N::kFloor
              : nearest == "ceil"            ? N::kCeil
                                             : N::kRoundPreferFloor;
  p.cubic_a = static_cast<float>(attrs.get_float("cubic_coeff_a", -0.75));
  p.exclude_outside = attrs.get_int("exclude_outside", 0) != 0;
  p.in_shape = desc.inputs[0].shape;
  p.out_shape = attrs.get_ints("sizes", {});
  for (const double scale : attrs.get_floats("scales", {})) p.scales.push_back(static_cast<float>(scale));
  return p;
}

}  // namespace

// transpose, concat, slice, gather, expand, where, equal/less/greater, logical_not.
void register_data(KernelRegistry& registry) {
  add_kernel(
      registry, "transpose",
      "permutation: 32x32 shared-memory tiles when the innermost dim moves, 16-byte vectorized runs otherwise",
      {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        const auto rank = static_cast<std::int64_t>(x.dim());
        std::vector<std::int64_t> perm = launch.desc->attrs.get_ints("perm", {});
        if (!launch.desc->attrs.has("perm")) {
          for (std::int64_t k = rank - 1; k >= 0; --k) perm.push_back(k);
        }
        for (auto& p : perm) p = normalized_axis(p, static_cast<int>(rank));
        cuda_raw::transpose(x.data_ptr(), launch.output(0).data_ptr(), x.element_size(), x.shape(), perm,
                            launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "concat", "concatenation: one 2-D async copy per input", {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        Tensor& y = launch.output(0);
        const std::size_t axis = axis_of(*launch.desc, y.dim());
        const auto es = static_cast<std::int64_t>(y.element_size());
        std::vector<const void*> inputs;
        std::vector<std::int64_t> row_bytes;
        for (std::size_t k = 0; k < launch.num_inputs; ++k) {
          const Tensor& x = launch.input(k);
          inputs.push_back(x.data_ptr());
          row_bytes.push_back(product(x.shape(), axis, x.shape().size()) * es);
        }
        cuda_raw::concat(inputs, row_bytes, y.data_ptr(), product(y.shape(), 0, axis), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "slice", "ONNX Slice as a strided gather (negative steps too), 16-byte vectors along unit steps",
      {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        const Attributes& attrs = launch.desc->attrs;
        const int rank = x.dim();
        const std::vector<std::int64_t> starts = attrs.get_ints("starts", {});
        const std::vector<std::int64_t> ends = attrs.get_ints("ends", {});
        std::vector<std::int64_t> axes = attrs.get_ints("axes", {});
        if (!attrs.has("axes")) {
          for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
        }
        const std::vector<std::int64_t> steps = attrs.get_ints("steps", std::vector<std::int64_t>(starts.size(), 1));
        const std::vector<std::int64_t> in_strides = data_ops::contiguous_strides_of(x.shape());
        std::vector<std::int64_t> strides = in_strides;
        std::int64_t offset = 0;
        for (std::size_t k = 0; k < starts.size(); ++k) {
          const auto axis = static_cast<std::size_t>(normalized_axis(axes[k], rank));
          const data_ops::SliceDim dim = data_ops::resolve_slice(x.shape()[axis], starts[k], ends[k], steps[k]);
          offset += dim.start * in_strides[axis];
          strides[axis] = in_strides[axis] * dim.step;
        }
        if (y.numel() == 0) return;
        cuda_raw::strided_gather(
            static_cast<const char*>(x.data_ptr()) + offset * static_cast<std::int64_t>(x.element_size()),
            y.data_ptr(), x.element_size(), y.shape(), strides, launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "gather",
      "ONNX Gather: tiles of long rows in 16-byte vectors (embedding lookups, outer-axis selects), a thread per "
      "element for short rows; "
      "an out-of-range index writes zeros and sets a device flag (XPURT_CUDA_RAW_CHECK_INDICES=1 raises)",
      {"data", "indices"}, nullptr,
      [](const KernelLaunch& launch) {
        const Tensor& data = launch.input(0);
        const Tensor& indices = launch.input(1);
        const std::size_t axis = axis_of(*launch.desc, data.dim());
        cuda_raw::gather(data.data_ptr(), indices.data_ptr(), indices.dtype(), launch.output(0).data_ptr(),
                         data.element_size(), product(data.shape(), 0, axis), data.shape()[axis], indices.numel(),
                         product(data.shape(), axis + 1, data.shape().size()), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "expand", "ONNX Expand as a broadcast strided gather", {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        cuda_raw::strided_gather(x.data_ptr(), y.data_ptr(), x.element_size(), y.shape(),
                                 data_ops::broadcast_strides(x.shape(), y.shape()), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "where",
      "cond ? a : b with NumPy broadcasting (stride tables, up to 8 merged dims); 16-byte vectors for equal shapes",
      {"cond", "a", "b"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        cuda_raw::WhereGeometry geometry;
        std::string why_not;
        if (!cuda_raw::where_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape,
                                      desc.outputs[0].shape, &geometry, &why_not)) {
          return Support::no(why_not);
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& a = launch.input(1);
        Tensor& y = launch.output(0);
        cuda_raw::WhereGeometry geometry;
        std::string why_not;
        if (!cuda_raw::where_geometry(launch.input(0).shape(), a.shape(), launch.input(2).shape(), y.shape(),
                                      &geometry, &why_not)) {
          throw UnsupportedOperationError(why_not);
        }
        cuda_raw::where(launch.input(0).data_ptr(), a.data_ptr(), launch.input(2).data_ptr(), y.data_ptr(),
                        a.element_size(), geometry, launch.stream.handle);
      },
      DTypes::kAll);
  const std::pair<const char*, cuda_raw::CompareOp> comparisons[] = {{"equal", cuda_raw::CompareOp::kEqual},
                                                                     {"less", cuda_raw::CompareOp::kLess},
                                                                     {"greater", cuda_raw::CompareOp::kGreater}};
  for (const auto& [op, kind] : comparisons) {
    add_kernel(
        registry, op, std::string(op) + "(a, b) -> bool with NumPy broadcasting (16-bit floats compared as fp32)",
        {"a", "b"}, two_operand_geometry,
        [kind = kind](const KernelLaunch& launch) {
          const Tensor& a = launch.input(0);
          const Tensor& b = launch.input(1);
          Tensor& y = launch.output(0);
          cuda_raw::compare(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry_of(a, b, y),
                            launch.stream.handle);
        },
        DTypes::kAll);
  }
  add_kernel(
      registry, "logical_not", "!x for bool x, grid-stride kernel", {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        cuda_raw::logical_not(launch.input(0).data_ptr(), launch.output(0).data_ptr(), launch.input(0).numel(),
                              launch.stream.handle);
      },
      DTypes::kAll);
}


// non_zero and non_max_suppression.
void register_data_dependent(KernelRegistry& registry) {
  registry.add_kernel(scratch_kernel(
      "non_zero",
      "NonZero into the bounded output: per-tile counts, one-block scan, per-tile writes (row-major order, "
      "deterministic); no host synchronization",
      std::vector<std::string>{"x"}, DTypes::kAll,
      [](const OpDescriptor& desc) {
        if (desc.inputs[0].dim() > cuda_raw::kNonZeroMaxRank) {
          return Support::no(detail::str_cat("cuda_raw non_zero takes rank up to ", cuda_raw::kNonZeroMaxRank));
        }
        return Support::yes();
      },
      [](const OpDescriptor& desc) { return cuda_raw::non_zero_workspace_bytes(desc.inputs[0].numel()); },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        cuda_raw::non_zero(x.data_ptr(), x.dtype(), x.shape(), launch.output(0).data_ptr(),
                           launch.output(1).data_ptr(), launch.workspace, launch.stream.handle);
      }));
  registry.add_kernel(scratch_kernel(
      "non_max_suppression",
      "NonMaxSuppression into the bounded output: a block per (batch, class) ranks the candidates by counting "
      "(stable), then suppresses greedily (IoU in double); no host synchronization",
      std::vector<std::string>{"boxes", "scores"}, DTypes::kFloat, nullptr,
      [](const OpDescriptor& desc) { return cuda_raw::nms_workspace_bytes(nms_geometry(desc)); },
      [](const KernelLaunch& launch) {
        cuda_raw::non_max_suppression(launch.input(0).data_ptr(), launch.input(1).data_ptr(), launch.input(0).dtype(),
                                      nms_geometry(*launch.desc), launch.output(0).data_ptr(),
                                      launch.output(1).data_ptr(), launch.workspace, launch.stream.handle);
      }));
}

// gather_elements and gather_nd.
void register_index(KernelRegistry& registry) {
  add_kernel(
      registry, "gather_elements",
      "ONNX GatherElements: a thread per output element; an out-of-range index writes zero and sets the gather flag",
      {"data", "indices"},
      [](const OpDescriptor& desc) {
        if (desc.inputs[0].dim() > cuda_raw::kMaxDims) {
          return Support::no(detail::str_cat("cuda_raw gather_elements takes ranks up to ", cuda_raw::kMaxDims));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& data = launch.input(0);
        const Tensor& indices = launch.input(1);
        cuda_raw::gather_elements(data.data_ptr(), data.shape(), indices.data_ptr(), indices.dtype(), indices.shape(),
                                  static_cast<std::int64_t>(axis_of(*launch.desc, data.dim())),
                                  launch.output(0).data_ptr(), data.element_size(), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "gather_nd",
      "ONNX GatherND (batch_dims): a thread per output element; an out-of-range index writes zero and sets the gather "
      "flag",
      {"data", "indices"},
      [](const OpDescriptor& desc) {
        if (desc.inputs[1].shape.empty() || desc.inputs[1].shape.back() > cuda_raw::kMaxDims) {
          return Support::no(detail::str_cat("cuda_raw gather_nd takes index tuples of 1 to ", cuda_raw::kMaxDims,
                                             " entries"));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& data = launch.input(0);
        const Tensor& indices = launch.input(1);
        const auto b = static_cast<std::size_t>(launch.desc->attrs.get_int("batch_dims", 0));
        const std::int64_t depth = indices.shape().back();
        const std::vector<std::int64_t> rest(data.shape().begin() + static_cast<std::ptrdiff_t>(b), data.shape().end());
        cuda_raw::gather_nd(data.data_ptr(), rest, indices.data_ptr(), indices.dtype(), product(data.shape(), 0, b),
                            product(indices.shape(), b, indices.shape().size() - 1), depth,
                            launch.output(0).data_ptr(), data.element_size(), launch.stream.handle);
      },
      DTypes::kAll);
}

// pad (constant, reflect, edge, wrap).
void register_pad(KernelRegistry& registry) {
  add_kernel(
      registry, "pad",
      "ONNX Pad (constant, reflect, edge, wrap; negative pads crop): 16-byte chunks of merged output rows with "
      "32-bit index math, interior runs read as whole 16-byte words (Note [Pad rows]), else a thread per element",
      {"x"},
      [](const OpDescriptor& desc) {
        if (desc.inputs[0].dim() > cuda_raw::kMaxDims) {
          return Support::no(detail::str_cat("cuda_raw pad takes ranks up to ", cuda_raw::kMaxDims));
        }
        pad_mode(desc.attrs.get_string("mode", "constant"));
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        const std::vector<std::int64_t> pads = launch.desc->attrs.get_ints("pads", {});
        const std::vector<std::int64_t> begins(pads.begin(), pads.begin() + x.dim());
        cuda_raw::pad(x.data_ptr(), y.data_ptr(), x.element_size(), x.shape(), y.shape(), begins,
                      pad_mode(launch.desc->attrs.get_string("mode", "constant")),
                      value_bits(launch.desc->attrs.get_float("value", 0.0), x.dtype()), launch.stream.handle);
      },
      DTypes::kAll);
}

// resize (nearest, linear, cubic).
void register_resize(KernelRegistry& registry) {
  add_kernel(
      registry, "resize",
      "ONNX Resize (nearest, linear, cubic; up to 3 resized dims): nearest and linear by output rows with 32-bit "
      "index math, nearest rows kept or doubled in whole words (Note [Resize rows]), else a thread per output "
      "element; fp32 weights",
      {"x"},
      [](const OpDescriptor& desc) {
        if (desc.attrs.get_int("antialias", 0) != 0) {
          return Support::no("cuda_raw resize has no antialias filter; the cpu kernel has");
        }
        std::string why_not;
        if (!cuda_raw::resize_supported(resize_params(desc), &why_not)) return Support::no(why_not);
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        cuda_raw::resize(resize_params(*launch.desc), launch.input(0).data_ptr(), launch.output(0).data_ptr(),
                         launch.input(0).dtype(), launch.stream.handle);
      });
}

namespace {

// The pooling of `desc` on `x` (logical NCHW dims from either layout) into `y`'s sizes.
PoolParams pool_params(const OpDescriptor& desc, const std::vector<std::int64_t>& x_shape,
                       const std::vector<std::int64_t>& y_shape) {
  PoolParams p;
  p.nhwc = detail::is_nhwc(desc.attrs, desc.op);
  const std::vector<std::int64_t> x = detail::as_nchw(x_shape, p.nhwc);
  const std::vector<std::int64_t> y = detail::as_nchw(y_shape, p.nhwc);
  p.n = x[0];
  p.c = x[1];
  p.h = x[2];
  p.w = x[3];
  p.out_h = y[2];
  p.out_w = y[3];
  p.max = desc.op == "max_pool2d";
  const detail::PoolWindow w = detail::pool_window(desc.attrs, desc.op);
  std::copy_n(w.kernel, 2, p.kernel);
  std::copy_n(w.stride, 2, p.stride);
  std::copy_n(w.pad_begin, 2, p.pad_begin);
  std::copy_n(w.pad_end, 2, p.pad_end);
  std::copy_n(w.dilation, 2, p.dilation);
  p.count_include_pad = !p.max && desc.attrs.get_int("count_include_pad", 0) != 0;
  return p;
}

}  // namespace

// max_pool2d and avg_pool2d: after cuDNN's (registered first), for the windows it declines (ceil_mode sizes,
// asymmetric pads, dilations).
void register_pool(KernelRegistry& registry) {
  for (const char* op : {"max_pool2d", "avg_pool2d"}) {
    add_kernel(
        registry, op,
        "pooling of every window (ceil_mode sizes, asymmetric pads, dilations, PyTorch's divisors; NCHW or NHWC): "
        "a thread per output element, fp32 compute",
        {"x"}, nullptr, [](const KernelLaunch& launch) {
          cuda_raw::pool2d(pool_params(*launch.desc, launch.input(0).shape(), launch.output(0).shape()),
                           launch.input(0).data_ptr(), launch.output(0).data_ptr(), launch.input(0).dtype(),
                           launch.stream.handle);
        });
  }
}

// one_hot, trilu, tile and scatter_nd.
void register_generate(KernelRegistry& registry) {
  add_kernel(
      registry, "one_hot", "ONNX OneHot: a thread per output element", {"indices"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        if (!is_cuda_raw_dtype(desc.outputs[0].dtype)) {
          return Support::no(detail::str_cat("cuda_raw one_hot cannot write ", dtype_name(desc.outputs[0].dtype)));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& indices = launch.input(0);
        Tensor& y = launch.output(0);
        const Attributes& attrs = launch.desc->attrs;
        const auto axis = static_cast<std::size_t>(normalized_axis(attrs.get_int("axis", -1), y.dim()));
        cuda_raw::one_hot(indices.data_ptr(), indices.dtype(), y.data_ptr(), y.element_size(),
                          product(y.shape(), 0, axis), y.shape()[axis], inner_of(y.shape(), axis),
                          value_bits(attrs.get_float("on", 1.0), y.dtype()),
                          value_bits(attrs.get_float("off", 0.0), y.dtype()), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "trilu", "ONNX Trilu: a thread per element", {"x"}, nullptr,
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        const auto& shape = x.shape();
        cuda_raw::trilu(x.data_ptr(), launch.output(0).data_ptr(), x.element_size(),
                        product(shape, 0, shape.size() - 2), shape[shape.size() - 2], shape.back(),
                        launch.desc->attrs.get_int("k", 0), launch.desc->attrs.get_int("upper", 1) != 0,
                        launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "tile",
      "ONNX Tile: a thread per output word (up to 16 bytes, unrepeated inner dims merged), the input read modulo "
      "its shape",
      {"x"},
      [](const OpDescriptor& desc) {
        if (desc.inputs[0].dim() > cuda_raw::kMaxDims) {
          return Support::no(detail::str_cat("cuda_raw tile takes ranks up to ", cuda_raw::kMaxDims));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        cuda_raw::tile(x.data_ptr(), y.data_ptr(), x.element_size(), x.shape(), y.shape(), launch.stream.handle);
      },
      DTypes::kAll);
  add_kernel(
      registry, "scatter_nd",
      "ONNX ScatterND: a copy of data, then a thread per slice element applies the updates in tuple order "
      "(reduction none: the last duplicate wins; add/mul/max/min: combined step by step in fp32 or the integer "
      "type, as the reference); out-of-range tuples are skipped",
      {"data", "indices", "updates"},
      [](const OpDescriptor& desc) {
        if (desc.inputs[1].shape.back() > cuda_raw::kMaxDims) {
          return Support::no(detail::str_cat("cuda_raw scatter_nd takes index tuples of up to ", cuda_raw::kMaxDims,
                                             " entries"));
        }
        const DType dtype = desc.inputs[0].dtype;
        if (desc.attrs.get_string("reduction", "none") != "none" && !is_kernel_float(dtype) &&
            dtype != DType::kInt32 && dtype != DType::kInt64) {
          return Support::no(detail::str_cat("cuda_raw scatter_nd reduces float32, float16, bfloat16, int32 and "
                                             "int64, got ", dtype_name(dtype)));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& data = launch.input(0);
        const Tensor& indices = launch.input(1);
        const std::int64_t depth = indices.shape().back();
        const std::string reduction = launch.desc->attrs.get_string("reduction", "none");
        const int code = reduction == "add" ? 1 : reduction == "mul" ? 2 : reduction == "max" ? 3
                         : reduction == "min" ? 4 : 0;
        cuda_raw::scatter_nd(data.data_ptr(), indices.data_ptr(), indices.dtype(), launch.input(2).data_ptr(),
                             launch.output(0).data_ptr(), data.element_size(), data.shape(),
                             product(indices.shape(), 0, indices.shape().size() - 1), depth, launch.stream.handle,
                             data.dtype(), code);
      },
      DTypes::kAll);
}

}  // namespace xpuruntime::cuda_raw
