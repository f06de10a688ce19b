// The cuda_raw reductions and their registration: reduce_sum ... reduce_prod (reduce.cu), cum_sum (scan.cu), arg_max /
// arg_min (select.cu), each a Kernel with a plan (the split geometry and its workspace), and top_k (select.cu).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"

namespace xpuruntime::cuda_raw {

namespace {

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
    if (data_ops::is_arithmetic_int_dtype(x.dtype()) || x.dtype() == DType::kBool) {
      cuda_raw::integer_reduce(kind_, geometry_, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(),
                               launch.workspace, launch.stream.handle);
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

// What a reduction's declaration takes: floats (mean, sum of squares), and int32/int64 (sum, prod) or every dtype
// (max and min: accepts() keeps floats, int32, int64 and bools).
DTypes dtypes_of(ReduceOp kind) {
  if (kind == ReduceOp::kMean || kind == ReduceOp::kSumSquare) return DTypes::kFloat;
  return kind == ReduceOp::kMax || kind == ReduceOp::kMin ? DTypes::kAll : DTypes::kFloatAndInt;
}

class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(const std::string& op, ReduceOp kind)
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true,
                          op + " over any axes: a warp/block per row or a thread per column, split into two "
                               "deterministic passes when outputs are few; fp32 accumulation (int32/int64, max/min "
                               "of bools and products: a block per output or split of one, sums wrap)",
                          declaration(op, {"x"}, dtypes_of(kind))}),
        kind_(kind) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    try {
      const DType t = desc.inputs[0].dtype;
      if (!is_kernel_float(t) && !data_ops::is_arithmetic_int_dtype(t) && t != DType::kBool) {
        return Support::no(detail::str_cat("cuda_raw ", desc.op, " takes float, int32, int64 or (max/min) bool "
                                           "tensors, got ", dtype_name(t)));
      }
      cuda_raw::ReduceGeometry geometry;
      std::string why_not;
      if (!cuda_raw::reduce_geometry(desc.inputs[0].shape, reduced_flags(desc), policy.workspace_limit, &geometry,
                                     &why_not, block_kernel(desc),
                                     cuda_raw::block_chunk_scale(desc.inputs[0].dtype))) {
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
                                   &why_not, block_kernel(desc),
                                   cuda_raw::block_chunk_scale(desc.inputs[0].dtype))) {
      throw UnsupportedOperationError(why_not);
    }
    return std::make_unique<ReducePlan>(desc.op, kind_, std::move(geometry));
  }

 private:
  // Integer reductions, any/all of bools and products run the block kernel (Note [Block reductions] in reduce.cu).
  bool block_kernel(const OpDescriptor& desc) const {
    const DType t = desc.inputs[0].dtype;
    return kind_ == ReduceOp::kProd || data_ops::is_arithmetic_int_dtype(t) || t == DType::kBool;
  }

  ReduceOp kind_;
};


// ---- cum_sum, arg_max, arg_min: kernels whose plan has a split geometry and its workspace ----

}  // namespace

// reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, reduce_sum_square.
void register_reductions(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_sum", ReduceOp::kSum));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_mean", ReduceOp::kMean));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_max", ReduceOp::kMax));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_min", ReduceOp::kMin));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_prod", ReduceOp::kProd));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_sum_square", ReduceOp::kSumSquare));
}

// cum_sum.
void register_scan(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<SplitKernel>(
      "cum_sum",
      "inclusive/exclusive, forward/reverse scan: a thread per line, a block per line when the lines are few and "
      "short, or a thread per chunk of one in three passes when they are few and long (deterministic)",
      [](const OpDescriptor& desc) {
        const DType t = desc.inputs[0].dtype;
        if (t == DType::kFloat64 || is_kernel_float(t) || data_ops::is_arithmetic_int_dtype(t)) return Support::yes();
        return Support::no(detail::str_cat("cuda_raw cum_sum takes float and int32/int64 tensors, got ",
                                           dtype_name(t)));
      },
      [](const OpDescriptor& desc, const ExecutionPolicy& policy) -> std::unique_ptr<KernelPlan> {
        const std::vector<std::int64_t>& shape = desc.inputs[0].shape;
        const std::size_t axis = axis_of(desc, static_cast<int>(shape.size()));
        const cuda_raw::ScanGeometry geometry = cuda_raw::cum_sum_geometry(
            product(shape, 0, axis), shape[axis], product(shape, axis + 1, shape.size()), policy.workspace_limit);
        const bool exclusive = desc.attrs.get_int("exclusive", 0) != 0;
        const bool reverse = desc.attrs.get_int("reverse", 0) != 0;
        return std::make_unique<SplitPlan>(
            geometry.workspace_bytes(), "cuda_raw cum_sum: " + geometry.str(),
            [geometry, exclusive, reverse](const KernelLaunch& launch) {
              const Tensor& x = launch.input(0);
              cuda_raw::cum_sum(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), geometry, exclusive, reverse,
                                launch.workspace, launch.stream.handle);
            });
      }));
}

// arg_max, arg_min and top_k.
void register_select(KernelRegistry& registry) {
  for (const char* op : {"arg_max", "arg_min"}) {
    registry.add_kernel(std::make_unique<SplitKernel>(
        op,
        std::string(op) + ": a warp (contiguous axis) or a thread (strided axis) per output, or per chunk of one "
                          "with a second pass when the outputs are few (ties: the first, or the last)",
        [](const OpDescriptor& desc) {
          const DType t = desc.inputs[0].dtype;
          if (t == DType::kFloat64 || is_kernel_float(t)) return Support::yes();
          return Support::no(detail::str_cat("cuda_raw arg_max/arg_min take float tensors, got ", dtype_name(t)));
        },
        [max = std::string(op) == "arg_max"](const OpDescriptor& desc,
                                             const ExecutionPolicy& policy) -> std::unique_ptr<KernelPlan> {
          const std::vector<std::int64_t>& shape = desc.inputs[0].shape;
          const auto axis = static_cast<std::size_t>(
              normalized_axis(desc.attrs.get_int("axis", 0), static_cast<int>(shape.size())));
          const cuda_raw::ArgReduceGeometry geometry = cuda_raw::arg_reduce_geometry(
              product(shape, 0, axis), shape[axis], inner_of(shape, axis), policy.workspace_limit);
          const bool last = desc.attrs.get_int("select_last_index", 0) != 0;
          return std::make_unique<SplitPlan>(
              geometry.workspace_bytes(), std::string("cuda_raw ") + (max ? "arg_max: " : "arg_min: ") + geometry.str(),
              [geometry, max, last](const KernelLaunch& launch) {
                const Tensor& x = launch.input(0);
                cuda_raw::arg_reduce(max, last, x.data_ptr(), x.dtype(), launch.output(0).data_ptr(), geometry,
                                     launch.workspace, launch.stream.handle);
              });
        }));
  }
  registry.add_kernel(std::make_unique<SplitKernel>(
      "top_k",
      "ONNX TopK along the last axis: a block per row, a radix select of the k largest (smallest) then a sort of them, "
      "or a sort of the whole row when k is a large part of it; few long rows a radix select per chunk, then one of "
      "the chunks' candidates (ties: the smaller index first)",
      [](const OpDescriptor& desc) {
        const TensorDesc& x = desc.inputs[0];
        if (normalized_axis(desc.attrs.get_int("axis", -1), x.dim()) != x.dim() - 1) {
          return Support::no("cuda_raw top_k runs along the last axis; transpose first or use the cpu kernel");
        }
        const std::int64_t cols = x.shape.back();
        const std::int64_t k = desc.attrs.get_int("k", 0);
        if (cols >= 0 && !cuda_raw::top_k_supports(std::max<std::int64_t>(cols, 1), k)) {
          return Support::no(detail::str_cat("cuda_raw top_k takes k <= ", cuda_raw::kTopKMaxSelected,
                                             " of a row over ", cuda_raw::kTopKMaxCols,
                                             " elements (any k of a shorter row), got k ", k, " of ", cols));
        }
        return Support::yes();
      },
      [](const OpDescriptor& desc, const ExecutionPolicy& policy) -> std::unique_ptr<KernelPlan> {
        const TensorDesc& in = desc.inputs[0];
        const std::int64_t cols = in.shape.empty() ? 1 : in.shape.back();
        const std::int64_t rows = cols == 0 ? 0 : in.numel() / cols;
        const cuda_raw::TopKSplit g = cuda_raw::top_k_split_geometry(rows, cols, desc.attrs.get_int("k", 0),
                                                                     in.dtype, policy.workspace_limit);
        const bool largest = desc.attrs.get_int("largest", 1) != 0;
        return std::make_unique<SplitPlan>(g.workspace_bytes(), "cuda_raw top_k: " + g.str(),
                                           [g, largest](const KernelLaunch& launch) {
                                             const Tensor& x = launch.input(0);
                                             cuda_raw::top_k(x.data_ptr(), x.dtype(), launch.output(0).data_ptr(),
                                                             launch.output(1).data_ptr(), g, largest,
                                                             launch.workspace, launch.stream.handle);
                                           });
      },
      DTypes::kFloat));
}

}  // namespace xpuruntime::cuda_raw
