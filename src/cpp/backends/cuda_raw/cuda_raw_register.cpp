// Registration of the cuda_raw backend: xpuruntime's own CUDA kernels for the elementwise, activation, cast,
// softmax, layer_norm, reduce, data-movement (transpose, concat, slice, gather, expand), where and comparison
// ops (kernel name "cuda_raw"), and flash attention ("flash_v2", flash_attention.cu). Every float kernel computes
// in fp32 (Note [fp32 compute] in cuda_raw_common.cuh); every kernel uses no atomics (deterministic) and needs
// contiguous inputs (the functional API makes them so).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/flash_attention.h"
#include "core/conv_layout.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "engines/native/passes/pass_utils.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

using cuda_raw::BinaryOp;
using cuda_raw::ReduceOp;
using cuda_raw::UnaryOp;

// The oldest architecture the kernels were compiled for (CMAKE_CUDA_ARCHITECTURES), 0 when unknown.
constexpr int kMinArch = XPURT_CUDA_RAW_MIN_ARCH;

using detail::shape_str;

bool is_kernel_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// The input dtypes a cuda_raw kernel takes (the op schema has validated the exact combination already).
enum class DTypes : std::uint8_t {
  kFloat,        // float32, float16, bfloat16: the float math
  kFloatAndInt,  // those and int32, int64: add, sub, mul, div, neg
  kAll,          // every dtype but uint16/uint32/uint64: data movement, where, comparisons, logical_not, cast
};

// The dtypes data.cu instantiates its kernels for: every dtype of Tensor except the unsigned 16/32/64-bit
// integers, which run on the cpu backend.
bool is_cuda_raw_dtype(DType dtype) {
  return data_ops::is_any_supported_dtype(dtype) && dtype != DType::kUInt16 && dtype != DType::kUInt32 &&
         dtype != DType::kUInt64;
}

bool takes(DTypes dtypes, DType dtype) {
  switch (dtypes) {
    case DTypes::kFloat: return is_kernel_float(dtype);
    case DTypes::kFloatAndInt: return is_kernel_float(dtype) || data_ops::is_arithmetic_int_dtype(dtype);
    case DTypes::kAll: return is_cuda_raw_dtype(dtype);
  }
  return false;
}

const char* dtypes_text(DTypes dtypes) {
  switch (dtypes) {
    case DTypes::kFloat: return "float32, float16 and bfloat16";
    case DTypes::kFloatAndInt: return "float32, float16, bfloat16, int32 and int64";
    case DTypes::kAll: return "every dtype except uint16, uint32 and uint64";
  }
  return "";
}

// What every cuda_raw kernel needs: a CUDA device it was built for, no int8 precision, and contiguous inputs of
// the dtypes `dtypes`. `names`: the schema's input names, for the messages (the last one repeats for variadic
// inputs).
Support check_common(const OpDescriptor& desc, const ExecutionPolicy& policy, const std::vector<std::string>& names,
                     DTypes dtypes = DTypes::kFloat) {
  if (!desc.device.is_cuda()) {
    return Support::no(detail::str_cat("runs on CUDA devices; the input is on ", desc.device.str()));
  }
  if (policy.precision == Precision::kInt8) {
    return Support::no("cuda_raw has no int8 kernels; use precision fp32, tf32, fp16 or bf16");
  }
  if (kMinArch > 0 && desc.compute_capability > 0 && desc.compute_capability < kMinArch) {
    return Support::no(detail::str_cat("cuda_raw kernels were built for sm_", kMinArch,
                                       " and newer, this device is sm_", desc.compute_capability,
                                       "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", desc.compute_capability));
  }
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& input = desc.inputs[k];
    if (!input.present) continue;
    const std::string name = k < names.size() ? names[k] : names.empty() ? std::string("input") : names.back();
    if (!input.device.is_cuda()) {
      return Support::no(detail::str_cat("runs on CUDA devices; input '", name, "' is on ", input.device.str()));
    }
    if (!takes(dtypes, input.dtype)) {
      return Support::no(detail::str_cat("cuda_raw '", desc.op, "' supports ", dtypes_text(dtypes), ", got ",
                                         dtype_name(input.dtype), " for input '", name,
                                         "'; cast it or use the cpu kernel"));
    }
    if (input.numel() != 0 && !input.is_contiguous()) {  // an empty tensor has no layout to speak of
      return Support::no(detail::str_cat("needs contiguous input '", name, "' (shape ", shape_str(input.shape),
                                         ", strides ", shape_str(input.strides), "); call contiguous() first"));
    }
  }
  return Support::yes();
}

std::int64_t normalized_axis(std::int64_t axis, int rank) { return axis < 0 ? axis + rank : axis; }

std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

// ---- FunctionKernel registration ----

using Extra = std::function<Support(const OpDescriptor&)>;

// Adds the "cuda_raw" kernel of `op`: the common checks, then `extra` (null: none), then `run` on the launch's
// device and stream. `supports` never throws: a malformed attribute becomes the reason.
void add_kernel(KernelRegistry& registry, const std::string& op, const std::string& summary,
                std::vector<std::string> names, Extra extra, FunctionKernel::RunFn run,
                DTypes dtypes = DTypes::kFloat) {
  auto supports = [names = std::move(names), extra = std::move(extra), dtypes](
                      const OpDescriptor& desc, const ExecutionPolicy& policy) -> Support {
    try {
      Support common = check_common(desc, policy, names, dtypes);
      if (!common) return common;
      return extra ? extra(desc) : Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  };
  auto guarded_run = [run = std::move(run)](const KernelLaunch& launch) {
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    run(launch);
  };
  registry.add_kernel(std::make_unique<FunctionKernel>(
      KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary}, std::move(supports),
      std::move(guarded_run)));
}

void add_unary(KernelRegistry& registry, const std::string& op, UnaryOp kind, const std::string& what) {
  add_kernel(registry, op, what + ", 16-byte vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr,
             [kind](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               cuda_raw::unary(kind, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                               launch.stream.handle);
             });
}

void add_binary(KernelRegistry& registry, const std::string& op, BinaryOp kind) {
  const bool takes_int =
      kind == BinaryOp::kAdd || kind == BinaryOp::kSub || kind == BinaryOp::kMul || kind == BinaryOp::kDiv;
  add_kernel(
      registry, op,
      op + "(a, b) with NumPy broadcasting (stride tables, up to 8 merged dims); 16-byte vectors for equal shapes "
               "and along a contiguous or broadcast innermost dim" +
          (takes_int ? "; int32/int64 wrap, division truncates (by zero: 0)" : ""),
      {"a", "b"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.outputs[0].shape,
                                          &geometry, &why_not)) {
          return Support::no(why_not);
        }
        return Support::yes();
      },
      [kind](const KernelLaunch& launch) {
        const Tensor& a = launch.input(0);
        const Tensor& b = launch.input(1);
        Tensor& y = launch.output(0);
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(a.shape(), b.shape(), y.shape(), &geometry, &why_not)) {
          throw UnsupportedOperationError(why_not);
        }
        if (data_ops::is_arithmetic_int_dtype(a.dtype())) {
          cuda_raw::integer_binary(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry,
                                   launch.stream.handle);
        } else {
          cuda_raw::binary(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry, launch.stream.handle);
        }
      },
      takes_int ? DTypes::kFloatAndInt : DTypes::kFloat);
}

// ---- reductions: a Kernel with a plan (the geometry and its workspace) ----

std::vector<bool> reduced_flags(const OpDescriptor& desc) {
  const int rank = desc.inputs[0].dim();
  const auto axes = desc.attrs.get_ints("axes", {});
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (const std::int64_t axis : axes) {
    const std::int64_t a = normalized_axis(axis, rank);
    XPURT_CHECK(a >= 0 && a < rank, "op '", desc.op, "': axis ", axis, " is out of range for rank ", rank);
    reduced[static_cast<std::size_t>(a)] = true;
  }
  return reduced;
}

class ReducePlan final : public KernelPlan {
 public:
  ReducePlan(std::string op, ReduceOp kind, cuda_raw::ReduceGeometry geometry)
      : op_(std::move(op)), kind_(kind), geometry_(std::move(geometry)) {}

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= geometry_.workspace_bytes(), "cuda_raw ", op_, ": the plan needs ",
                geometry_.workspace_bytes(), " bytes of workspace (workspace_bytes()), the launch gives ",
                launch.workspace_bytes);
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    const Tensor& x = launch.input(0);
    if (data_ops::is_arithmetic_int_dtype(x.dtype())) {
      cuda_raw::integer_reduce(kind_, geometry_, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(),
                               launch.stream.handle);
      return;
    }
    cuda_raw::reduce(kind_, geometry_, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), launch.workspace,
                     launch.stream.handle);
  }
  std::size_t workspace_bytes() const override { return geometry_.workspace_bytes(); }
  std::string describe() const override { return "cuda_raw " + op_ + ": " + geometry_.str(); }

 private:
  std::string op_;
  ReduceOp kind_;
  cuda_raw::ReduceGeometry geometry_;
};

class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(const std::string& op, ReduceOp kind)
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true,
                          op + " over any axes: a warp/block per row or a thread per column, split into two "
                               "deterministic passes when outputs are few; fp32 accumulation (int32/int64: a block "
                               "per output, sums wrap)"}),
        kind_(kind) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    try {
      Support common =
          check_common(desc, policy, {"x"}, kind_ == ReduceOp::kMean ? DTypes::kFloat : DTypes::kFloatAndInt);
      if (!common) return common;
      cuda_raw::ReduceGeometry geometry;
      std::string why_not;
      if (!cuda_raw::reduce_geometry(desc.inputs[0].shape, reduced_flags(desc), policy.workspace_limit, &geometry,
                                     &why_not)) {
        return Support::no(why_not);
      }
      return Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  }

  // The geometry follows from the descriptor and the workspace limit alone, so nothing is recorded; a record is
  // accepted and ignored, as FunctionKernel does.
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string&) const override {
    cuda_raw::ReduceGeometry geometry;
    std::string why_not;
    if (!cuda_raw::reduce_geometry(desc.inputs[0].shape, reduced_flags(desc), policy.workspace_limit, &geometry,
                                   &why_not)) {
      throw UnsupportedOperationError(why_not);
    }
    return std::make_unique<ReducePlan>(desc.op, kind_, std::move(geometry));
  }

 private:
  ReduceOp kind_;
};

// ---- kernels whose workspace follows from the descriptor (data_dependent.cu) ----

using WorkspaceFn = std::function<std::size_t(const OpDescriptor&)>;

class ScratchPlan final : public KernelPlan {
 public:
  ScratchPlan(std::string op, std::size_t bytes, FunctionKernel::RunFn run)
      : op_(std::move(op)), bytes_(bytes), run_(std::move(run)) {}
  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= bytes_, "cuda_raw ", op_, ": the plan needs ", bytes_,
                " bytes of workspace (workspace_bytes()), the launch gives ", launch.workspace_bytes);
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    run_(launch);
  }
  std::size_t workspace_bytes() const override { return bytes_; }
  std::string describe() const override { return detail::str_cat("cuda_raw ", op_, ": workspace ", bytes_, " B"); }

 private:
  std::string op_;
  std::size_t bytes_;
  FunctionKernel::RunFn run_;
};

class ScratchKernel final : public Kernel {
 public:
  ScratchKernel(const std::string& op, const std::string& summary, std::vector<std::string> names, DTypes dtypes,
                Extra extra, WorkspaceFn workspace, FunctionKernel::RunFn run)
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary}),
        names_(std::move(names)),
        dtypes_(dtypes),
        extra_(std::move(extra)),
        workspace_(std::move(workspace)),
        run_(std::move(run)) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    try {
      Support common = check_common(desc, policy, names_, dtypes_);
      if (!common) return common;
      return extra_ ? extra_(desc) : Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  }
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    return std::make_unique<ScratchPlan>(desc.op, workspace_(desc), run_);
  }

 private:
  std::vector<std::string> names_;
  DTypes dtypes_;
  Extra extra_;
  WorkspaceFn workspace_;
  FunctionKernel::RunFn run_;
};

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

void register_data_dependent_kernels(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<ScratchKernel>(
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
  registry.add_kernel(std::make_unique<ScratchKernel>(
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

// ---- data movement, where, comparisons (data.cu) ----

// The normalized value of an int attribute that names an axis of a tensor of rank `rank` (validated by the schema).
std::size_t axis_of(const OpDescriptor& desc, int rank) {
  return static_cast<std::size_t>(normalized_axis(desc.attrs.get_int("axis", 0), rank));
}

Support two_operand_geometry(const OpDescriptor& desc) {
  if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
  cuda_raw::BroadcastGeometry geometry;
  std::string why_not;
  if (!cuda_raw::broadcast_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.outputs[0].shape, &geometry,
                                    &why_not)) {
    return Support::no(why_not);
  }
  return Support::yes();
}

cuda_raw::BroadcastGeometry geometry_of(const Tensor& a, const Tensor& b, const Tensor& y) {
  cuda_raw::BroadcastGeometry geometry;
  std::string why_not;
  if (!cuda_raw::broadcast_geometry(a.shape(), b.shape(), y.shape(), &geometry, &why_not)) {
    throw UnsupportedOperationError(why_not);
  }
  return geometry;
}

void register_data_kernels(KernelRegistry& registry) {
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


// ---- the ONNX ops beyond the core set (pointwise.cu, scan.cu, pad.cu, resize.cu, data.cu) ----

// The bits of `value` converted to `dtype` (pad's constant, one_hot's on/off values), in the low bytes; the
// conversion is the graph passes' (from_doubles).
std::uint64_t value_bits(double value, DType dtype) {
  const Tensor element = passes::internal::from_doubles({}, dtype, {value});
  std::uint64_t bits = 0;
  std::memcpy(&bits, element.data_ptr(), element.element_size());
  return bits;
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

void register_onnx_kernels(KernelRegistry& registry) {
  using cuda_raw::PointwiseOp;
  struct Pointwise {
    const char* op;
    PointwiseOp kind;
    const char* alpha;  // the attribute read as alpha (null: none)
    double alpha_default;
    const char* beta;
    double beta_default;
    const char* what;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Pointwise pointwise[] = {
      {"clip", PointwiseOp::kClip, "min", -inf, "max", inf, "min(max(x, min), max), NaN kept"},
      {"hard_sigmoid", PointwiseOp::kHardSigmoid, "alpha", 0.2, "beta", 0.5, "max(0, min(1, alpha * x + beta))"},
      {"hard_swish", PointwiseOp::kHardSwish, nullptr, 0, nullptr, 0, "x * max(0, min(1, x / 6 + 1 / 2))"},
      {"leaky_relu", PointwiseOp::kLeakyRelu, "alpha", 0.01, nullptr, 0, "x >= 0 ? x : alpha * x"},
      {"elu", PointwiseOp::kElu, "alpha", 1.0, nullptr, 0, "x >= 0 ? x : alpha * (exp(x) - 1)"},
      {"softplus", PointwiseOp::kSoftplus, nullptr, 0, nullptr, 0, "log(1 + exp(x)), overflow-free"},
      {"sin", PointwiseOp::kSin, nullptr, 0, nullptr, 0, "sin(x)"},
      {"cos", PointwiseOp::kCos, nullptr, 0, nullptr, 0, "cos(x)"},
      {"floor", PointwiseOp::kFloor, nullptr, 0, nullptr, 0, "floor(x)"},
      {"ceil", PointwiseOp::kCeil, nullptr, 0, nullptr, 0, "ceil(x)"},
      {"round", PointwiseOp::kRound, nullptr, 0, nullptr, 0, "x rounded half to even"},
      {"sign", PointwiseOp::kSign, nullptr, 0, nullptr, 0, "-1, 0 or 1 (NaN kept)"},
      {"tan", PointwiseOp::kTan, nullptr, 0, nullptr, 0, "tan(x)"},
      {"asin", PointwiseOp::kAsin, nullptr, 0, nullptr, 0, "asin(x)"},
      {"acos", PointwiseOp::kAcos, nullptr, 0, nullptr, 0, "acos(x)"},
      {"atan", PointwiseOp::kAtan, nullptr, 0, nullptr, 0, "atan(x)"},
      {"sinh", PointwiseOp::kSinh, nullptr, 0, nullptr, 0, "sinh(x)"},
      {"cosh", PointwiseOp::kCosh, nullptr, 0, nullptr, 0, "cosh(x)"},
      {"asinh", PointwiseOp::kAsinh, nullptr, 0, nullptr, 0, "asinh(x)"},
      {"acosh", PointwiseOp::kAcosh, nullptr, 0, nullptr, 0, "acosh(x)"},
      {"atanh", PointwiseOp::kAtanh, nullptr, 0, nullptr, 0, "atanh(x)"},
      {"softsign", PointwiseOp::kSoftsign, nullptr, 0, nullptr, 0, "x / (1 + |x|)"},
      {"selu", PointwiseOp::kSelu, "alpha", 1.67326319217681884765625, "gamma", 1.05070102214813232421875,
       "gamma * (x > 0 ? x : alpha * (exp(x) - 1))"},
      {"celu", PointwiseOp::kCelu, "alpha", 1.0, nullptr, 0, "max(0, x) + min(0, alpha * (exp(x / alpha) - 1))"},
      {"thresholded_relu", PointwiseOp::kThresholdedRelu, "alpha", 1.0, nullptr, 0, "x > alpha ? x : 0"},
      {"mish", PointwiseOp::kMish, nullptr, 0, nullptr, 0, "x * tanh(softplus(x))"},
  };
  for (const Pointwise& p : pointwise) {
    add_kernel(registry, p.op, std::string(p.what) + ", 16-byte vectorized grid-stride kernel, fp32 compute", {"x"},
               nullptr, [p](const KernelLaunch& launch) {
                 const Tensor& x = launch.input(0);
                 const Attributes& attrs = launch.desc->attrs;
                 const auto alpha = static_cast<float>(p.alpha ? attrs.get_float(p.alpha, p.alpha_default) : 0.0);
                 const auto beta = static_cast<float>(p.beta ? attrs.get_float(p.beta, p.beta_default) : 0.0);
                 cuda_raw::pointwise(p.kind, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), alpha,
                                     beta, launch.stream.handle);
               });
  }
  // float64 too (T5's fp16 export checks float64 values for infinities); the schema admits only floats.
  add_kernel(registry, "is_nan", "isnan(x) -> bool, grid-stride kernel", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               cuda_raw::is_nan_or_inf(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), true, false,
                                       false, launch.stream.handle);
             },
             DTypes::kAll);
  add_kernel(registry, "is_inf", "x == +inf (detect_positive) or -inf (detect_negative) -> bool", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const Attributes& attrs = launch.desc->attrs;
               cuda_raw::is_nan_or_inf(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), false,
                                       attrs.get_int("detect_positive", 1) != 0,
                                       attrs.get_int("detect_negative", 1) != 0, launch.stream.handle);
             },
             DTypes::kAll);
  const std::pair<const char*, cuda_raw::CompareOp> logical[] = {{"logical_and", cuda_raw::CompareOp::kAnd},
                                                                 {"logical_or", cuda_raw::CompareOp::kOr},
                                                                 {"logical_xor", cuda_raw::CompareOp::kXor}};
  for (const auto& [op, kind] : logical) {
    add_kernel(
        registry, op, std::string(op) + "(a, b) of bools with NumPy broadcasting", {"a", "b"}, two_operand_geometry,
        [kind = kind](const KernelLaunch& launch) {
          const Tensor& a = launch.input(0);
          const Tensor& b = launch.input(1);
          Tensor& y = launch.output(0);
          cuda_raw::compare(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), DType::kBool, geometry_of(a, b, y),
                            launch.stream.handle);
        },
        DTypes::kAll);
  }
  add_kernel(
      registry, "cum_sum", "inclusive/exclusive, forward/reverse scan: a thread per line, in order (deterministic)",
      {"x"},
      [](const OpDescriptor& desc) {
        const DType t = desc.inputs[0].dtype;
        if (t == DType::kFloat64 || is_kernel_float(t) || data_ops::is_arithmetic_int_dtype(t)) return Support::yes();
        return Support::no(detail::str_cat("cuda_raw cum_sum takes float and int32/int64 tensors, got ",
                                           dtype_name(t)));
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        const Attributes& attrs = launch.desc->attrs;
        const std::size_t axis = axis_of(*launch.desc, x.dim());
        cuda_raw::cum_sum(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(x.shape(), 0, axis),
                          x.shape()[axis], product(x.shape(), axis + 1, x.shape().size()),
                          attrs.get_int("exclusive", 0) != 0, attrs.get_int("reverse", 0) != 0, launch.stream.handle);
      },
      DTypes::kAll);
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


// The last dims of `shape` from `axis` on, multiplied.
std::int64_t inner_of(const std::vector<std::int64_t>& shape, std::size_t axis) {
  return product(shape, axis + 1, shape.size());
}

void register_onnx_kernels_2(KernelRegistry& registry) {
  add_kernel(registry, "log_softmax", "x - max - log(sum(exp(x - max))) along any axis, the softmax kernels' layout",
             {"x"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               cuda_raw::log_softmax(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(x.shape(), 0, axis),
                                     x.shape()[axis], inner_of(x.shape(), axis), launch.stream.handle);
             });
  const std::pair<const char*, cuda_raw::BinaryExtOp> binaries[] = {{"prelu", cuda_raw::BinaryExtOp::kPrelu},
                                                                    {"mod", cuda_raw::BinaryExtOp::kMod}};
  for (const auto& [op, kind] : binaries) {
    add_kernel(
        registry, op,
        std::string(op) + "(a, b) with NumPy broadcasting (stride tables), fp32 compute; integer mod by zero: 0",
        {"a", "b"}, two_operand_geometry,
        [kind = kind](const KernelLaunch& launch) {
          const Tensor& a = launch.input(0);
          const Tensor& b = launch.input(1);
          Tensor& y = launch.output(0);
          cuda_raw::BinaryExtOp chosen = kind;
          if (chosen == cuda_raw::BinaryExtOp::kMod && launch.desc->attrs.get_int("fmod", 0) != 0) {
            chosen = cuda_raw::BinaryExtOp::kFmod;
          }
          cuda_raw::binary_ext(chosen, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry_of(a, b, y),
                               launch.stream.handle);
        },
        kind == cuda_raw::BinaryExtOp::kMod ? DTypes::kFloatAndInt : DTypes::kFloat);
  }
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
  for (const char* op : {"arg_max", "arg_min"}) {
    add_kernel(
        registry, op, std::string(op) + ": a thread per output walks the axis in order (ties: the first, or the last)",
        {"x"},
        [](const OpDescriptor& desc) {
          const DType t = desc.inputs[0].dtype;
          if (t == DType::kFloat64 || is_kernel_float(t)) return Support::yes();
          return Support::no(detail::str_cat("cuda_raw arg_max/arg_min take float tensors, got ", dtype_name(t)));
        },
        [max = std::string(op) == "arg_max"](const KernelLaunch& launch) {
          const Tensor& x = launch.input(0);
          const auto axis = static_cast<std::size_t>(
              normalized_axis(launch.desc->attrs.get_int("axis", 0), x.dim()));
          cuda_raw::arg_reduce(max, launch.desc->attrs.get_int("select_last_index", 0) != 0, x.data_ptr(), x.dtype(),
                               launch.output(0).data_ptr(), product(x.shape(), 0, axis), x.shape()[axis],
                               inner_of(x.shape(), axis), launch.stream.handle);
        },
        DTypes::kAll);
  }
  add_kernel(
      registry, "top_k",
      "ONNX TopK along the last axis: a block per row, bitonic sort in shared memory (rows up to 4096 elements; ties: "
      "the smaller index first)",
      {"x"},
      [](const OpDescriptor& desc) {
        const TensorDesc& x = desc.inputs[0];
        if (normalized_axis(desc.attrs.get_int("axis", -1), x.dim()) != x.dim() - 1) {
          return Support::no("cuda_raw top_k runs along the last axis; transpose first or use the cpu kernel");
        }
        if (x.shape.back() > cuda_raw::kTopKMaxCols) {
          return Support::no(detail::str_cat("cuda_raw top_k sorts rows of up to ", cuda_raw::kTopKMaxCols,
                                             " elements, got ", x.shape.back()));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        const std::int64_t cols = x.shape().empty() ? 1 : x.shape().back();
        cuda_raw::top_k(x.data_ptr(), x.dtype(), launch.output(0).data_ptr(), launch.output(1).data_ptr(),
                        cols == 0 ? 0 : x.numel() / cols, cols, launch.desc->attrs.get_int("k", 0),
                        launch.desc->attrs.get_int("largest", 1) != 0, launch.stream.handle);
      });
}

}  // namespace

// conv2d's "depthwise" kernel (depthwise.cu, Notes [Depthwise tiles] and [Channels-last depthwise]): registered
// before cudnn, so that it is the first choice for the depthwise convolutions it takes; `auto:BestPerformance` times
// it against cuDNN.
void register_cuda_raw_depthwise(KernelRegistry& registry) {
  auto depthwise_activation = [](const std::string& name) {
    if (name == "relu") return cuda_raw::DepthwiseActivation::kRelu;
    if (name == "silu") return cuda_raw::DepthwiseActivation::kSilu;
    if (name == "hard_swish") return cuda_raw::DepthwiseActivation::kHardSwish;
    return cuda_raw::DepthwiseActivation::kNone;
  };
  // The geometry of a conv2d descriptor, whatever its layout (sizes read as NCHW, Note [Channels last]).
  auto geometry = [](const OpDescriptor& desc) {
    const bool nhwc = detail::is_nhwc(desc.attrs, desc.op);
    const auto x = detail::as_nchw(desc.inputs[0].shape, nhwc);
    const auto w = detail::as_nchw(desc.inputs[1].shape, nhwc);
    const auto strides = desc.attrs.get_ints("strides", {1, 1});
    const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
    const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
    cuda_raw::DepthwiseGeometry g;
    g.batch = static_cast<int>(x[0]);
    g.channels = static_cast<int>(x[1]);
    g.in_h = static_cast<int>(x[2]);
    g.in_w = static_cast<int>(x[3]);
    if (!desc.outputs.empty()) {
      const auto y = detail::as_nchw(desc.outputs[0].shape, nhwc);
      g.out_h = static_cast<int>(y[2]);
      g.out_w = static_cast<int>(y[3]);
    } else {
      g.out_w = 32;
    }
    g.kernel_h = static_cast<int>(w[2]);
    g.kernel_w = static_cast<int>(w[3]);
    g.stride_h = static_cast<int>(strides[0]);
    g.stride_w = static_cast<int>(strides[1]);
    g.pad_top = static_cast<int>(pads[0]);
    g.pad_left = static_cast<int>(pads[1]);
    g.dilation_h = static_cast<int>(dilations[0]);
    g.dilation_w = static_cast<int>(dilations[1]);
    return g;
  };
  auto supports = [geometry](const OpDescriptor& desc, const ExecutionPolicy& policy) -> Support {
    try {
      Support common = check_common(desc, policy, {"x", "weight", "bias", "residual"});
      if (!common) return common;
      const bool nhwc = detail::is_nhwc(desc.attrs, desc.op);
      if (desc.inputs[0].shape.size() != 4 || desc.inputs[1].shape.size() != 4) {
        return Support::no("x and weight of rank 4 only");
      }
      const auto x = detail::as_nchw(desc.inputs[0].shape, nhwc);
      const auto w = detail::as_nchw(desc.inputs[1].shape, nhwc);
      const std::int64_t groups = desc.attrs.get_int("groups", 1);
      if (groups != x[1] || w[0] != x[1] || w[1] != 1 || groups == 1) {
        return Support::no("depthwise convolutions only (groups == channels == outputs, weight [C, 1, kh, kw], "
                           "NHWC [C, kh, kw, 1])");
      }
      for (const TensorDesc& t : desc.inputs) {
        if (t.present && t.dtype != desc.inputs[0].dtype) return Support::no("inputs of one dtype only");
      }
      const std::string activation = desc.attrs.get_string("activation", "none");
      if (activation != "none" && activation != "relu" && activation != "silu" && activation != "hard_swish") {
        return Support::no("activation none, relu, silu or hard_swish");
      }
      // The NCHW kernels stage a tile of the input; the channels-last ones read it directly.
      if (!nhwc && cuda_raw::depthwise_shared_bytes(geometry(desc)) > 48 * 1024) {
        return Support::no("the kernel's tile needs over 48 KiB");
      }
      return Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  };
  auto run = [geometry, depthwise_activation](const KernelLaunch& launch) {
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    const OpDescriptor& desc = *launch.desc;
    const cuda_raw::DepthwiseGeometry g = geometry(desc);
    const Tensor* bias = launch.num_inputs > 2 && launch.input(2).defined() ? &launch.input(2) : nullptr;
    const Tensor* residual = launch.num_inputs > 3 && launch.input(3).defined() ? &launch.input(3) : nullptr;
    cuda_raw::depthwise_conv2d(launch.input(0).data_ptr(), launch.input(1).data_ptr(),
                               bias ? bias->data_ptr() : nullptr, residual ? residual->data_ptr() : nullptr,
                               launch.output(0).data_ptr(), launch.input(0).dtype(), g,
                               depthwise_activation(desc.attrs.get_string("activation", "none")),
                               detail::is_nhwc(desc.attrs, desc.op), launch.stream.handle);
  };
  registry.add_kernel(std::make_unique<FunctionKernel>(
      KernelInfo{"conv2d", "depthwise", "cuda_raw", DeviceType::kCUDA, true,
                 "depthwise convolution, NCHW (input tile and weights staged in shared memory, one output per "
                 "thread) or NHWC (16-byte channel vectors, a row of outputs per thread); fp32 accumulation, bias, "
                 "residual and relu/silu/hard_swish fused (Notes [Depthwise tiles], [Channels-last depthwise])"},
      supports, run));
}

void register_cuda_raw(KernelRegistry& registry) {
  // ---- elementwise (math) ----
  add_unary(registry, "exp", UnaryOp::kExp, "exp(x)");
  add_unary(registry, "log", UnaryOp::kLog, "log(x)");
  add_unary(registry, "sqrt", UnaryOp::kSqrt, "sqrt(x)");
  add_kernel(registry, "neg", "-x, 16-byte vectorized grid-stride kernel, fp32 compute; int32/int64 wrap", {"x"},
             nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               if (data_ops::is_arithmetic_int_dtype(x.dtype())) {
                 cuda_raw::integer_neg(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                                       launch.stream.handle);
               } else {
                 cuda_raw::unary(UnaryOp::kNeg, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                                 launch.stream.handle);
               }
             },
             DTypes::kFloatAndInt);
  add_unary(registry, "abs", UnaryOp::kAbs, "|x|");
  add_unary(registry, "erf", UnaryOp::kErf, "erf(x)");
  add_unary(registry, "reciprocal", UnaryOp::kReciprocal, "1 / x");
  // ---- activations ----
  add_unary(registry, "relu", UnaryOp::kRelu, "max(x, 0) (NaN stays NaN)");
  add_unary(registry, "sigmoid", UnaryOp::kSigmoid, "1 / (1 + exp(-x))");
  add_unary(registry, "tanh", UnaryOp::kTanh, "tanh(x)");
  add_unary(registry, "silu", UnaryOp::kSilu, "x * sigmoid(x)");
  add_kernel(registry, "gelu", "GELU (erf form, or the tanh approximation with approximate='tanh'), 16-byte "
             "vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const bool tanh_form = launch.desc->attrs.get_string("approximate", "none") == "tanh";
               cuda_raw::unary(tanh_form ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x.data_ptr(),
                               launch.output(0).data_ptr(), x.dtype(), x.numel(), launch.stream.handle);
             });
  // ---- binary ----
  add_binary(registry, "add", BinaryOp::kAdd);
  add_binary(registry, "sub", BinaryOp::kSub);
  add_binary(registry, "mul", BinaryOp::kMul);
  add_binary(registry, "div", BinaryOp::kDiv);
  add_binary(registry, "pow", BinaryOp::kPow);
  add_binary(registry, "maximum", BinaryOp::kMaximum);
  add_binary(registry, "minimum", BinaryOp::kMinimum);
  // ---- cast ----
  add_kernel(
      registry, "cast",
      "conversion between any dtypes: floats round to nearest even (vectorized), float->int truncates toward zero "
      "(saturating, NaN -> 0), ->bool is x != 0",
      {"x"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        const DType to = desc.outputs[0].dtype;
        if (!is_cuda_raw_dtype(to)) {
          return Support::no(detail::str_cat("cuda_raw cannot cast to ", dtype_name(to), "; use the cpu kernel"));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        if (data_ops::is_float_dtype(x.dtype()) && data_ops::is_float_dtype(y.dtype())) {
          cuda_raw::cast(x.data_ptr(), x.dtype(), y.data_ptr(), y.dtype(), x.numel(), launch.stream.handle);
        } else {
          cuda_raw::cast_any(x.data_ptr(), x.dtype(), y.data_ptr(), y.dtype(), x.numel(), launch.stream.handle);
        }
      },
      DTypes::kAll);
  // ---- softmax ----
  add_kernel(registry, "softmax", "softmax along any axis: last-axis rows of up to 16384 halves / 8192 floats read "
             "once into registers (a group of 1-512 threads per row, Note [Register-cached softmax]), longer rows "
             "an online max/sum, a thread per column for inner axes; fp32 math", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const auto& shape = x.shape();
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               cuda_raw::softmax(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(shape, 0, axis),
                                 shape[axis], product(shape, axis + 1, shape.size()), launch.stream.handle);
             });
  // ---- layer_norm ----
  add_kernel(registry, "layer_norm", "layer norm over dims axis..end: rows of aligned 16-byte vectors cached in "
             "registers (a warp or a 128/512-thread block per row, one read of the row), other rows a warp (<= 1024 "
             "elements) or a block per row; two-pass mean/variance in fp32; an optional residual is added on the fly",
             {"x", "scale", "bias", "residual"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const Tensor residual = launch.num_inputs > 3 ? launch.input(3) : Tensor();
               const Tensor& scale = launch.input(1);
               const Tensor& bias = launch.input(2);
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               const auto epsilon = static_cast<float>(launch.desc->attrs.get_float("epsilon", 1e-5));
               cuda_raw::layer_norm(x.data_ptr(), residual.defined() ? residual.data_ptr() : nullptr,
                                    scale.defined() ? scale.data_ptr() : nullptr,
                                    bias.defined() ? bias.data_ptr() : nullptr, launch.output(0).data_ptr(), x.dtype(),
                                    product(x.shape(), 0, axis), product(x.shape(), axis, x.shape().size()), epsilon,
                                    launch.stream.handle);
             });
  // ---- reductions ----
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_sum", ReduceOp::kSum));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_mean", ReduceOp::kMean));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_max", ReduceOp::kMax));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_min", ReduceOp::kMin));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_prod", ReduceOp::kProd));
  // ---- data movement, where, comparisons (data.cu) ----
  register_data_kernels(registry);
  register_data_dependent_kernels(registry);
  // ---- the ONNX ops beyond the core set ----
  register_onnx_kernels(registry);
  register_onnx_kernels_2(registry);
  // ---- attention: flash_v2 (flash_attention.cu) ----
  register_flash_attention(registry);
}

}  // namespace xpuruntime
