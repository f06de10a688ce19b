// Registration of matmul_nbits' "cuda_raw" kernel (Note [Int4 weight-only GEMM] in core/op_schemas_int4.cpp): two
// plans behind one kernel, chosen when the plan is built (Note [Int4 GEMM on the GPU] in int4_gemm.cu):
//  * m <= kMmaMaxRows with float16/bfloat16 x: the tensor-core kernel that streams the packed weight once (its
//    workspace holds the float32 partial sums of a K split, when it splits);
//  * otherwise (large m, float32 x, layouts the tensor-core kernel does not take): the weight dequantized, rows
//    kDequantizeBudget bytes at a time, into the workspace in x's dtype, each slice multiplied by cuBLAS's GEMM
//    (cublasGemmEx, the compute type of the cublas kernel: float32 accumulation, TF32 for float32 only where the
//    policy allows it) into its columns of y, then the bias.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "backends/cuda_raw/int4_gemm.h"
#include "core/cublas_utils.h"
#include "core/cuda_utils.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {

namespace {

// The largest m the tensor-core kernel takes: it re-reads the weight once per 16 rows of x (from L2 mostly), which
// beats dequantizing it into memory for the GEMM up to a few such slices.
constexpr std::int64_t kMmaMaxRows = 64;
// Dequantized weight rows per GEMM of the large-m path, in bytes: enough columns that cuBLAS runs at speed, while the
// workspace stays small next to the weight in float16.
constexpr std::size_t kDequantizeBudget = std::size_t{64} << 20;
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The problem of a descriptor (no pointers).
Int4GemmArgs args_of(const OpDescriptor& desc) {
  Int4GemmArgs a;
  const TensorDesc& x = desc.inputs[0];
  a.x_dtype = x.dtype;
  a.scale_dtype = desc.inputs[2].dtype;
  a.k = x.shape.back();
  a.n = desc.inputs[1].shape[0];
  a.m = a.k > 0 ? x.numel() / a.k : 0;
  a.block = desc.attrs.get_int("block_size", 32);
  if (desc.inputs.size() > 4 && desc.inputs[4].present) a.bias_dtype = desc.inputs[4].dtype;
  return a;
}

// ... with the launch's pointers.
Int4GemmArgs args_of(const KernelLaunch& launch) {
  Int4GemmArgs a = args_of(*launch.desc);
  a.x = launch.input(0).data_ptr();
  a.weight = static_cast<const std::uint8_t*>(launch.input(1).data_ptr());
  a.scales = launch.input(2).data_ptr();
  if (launch.num_inputs > 3 && launch.input(3).defined()) {
    a.zero_points = static_cast<const std::uint8_t*>(launch.input(3).data_ptr());
  }
  if (launch.num_inputs > 4 && launch.input(4).defined()) a.bias = launch.input(4).data_ptr();
  a.y = launch.output(0).data_ptr();
  return a;
}

class Int4MmaPlan final : public KernelPlan {
 public:
  Int4MmaPlan(Int4MmaConfig config, int device) : config_(config), device_(device) {}

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const Int4GemmArgs args = args_of(launch);
    const char* refusal = int4_gemm_mma_refusal(args, 0);
    XPURT_INTERNAL_ASSERT(refusal == nullptr, "matmul_nbits tensor-core plan: ", refusal);
    XPURT_INTERNAL_ASSERT(launch.workspace_bytes >= config_.workspace_bytes, "matmul_nbits needs ",
                          config_.workspace_bytes, " bytes of workspace, got ", launch.workspace_bytes);
    int4_gemm_mma(args, config_, launch.workspace, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override { return config_.workspace_bytes; }

  std::string record() const override { return record_of(config_); }

  std::string describe() const override {
    if (config_.gemv) {
      return detail::str_cat("int4 tensor-core GEMV of m <= 4 (mma.sync m16n8k16 on the raw codes, sub-blocks as its "
                             "columns, scales after it), ",
                             8 * config_.tiles, " columns per block",
                             config_.splits > 1 ? detail::str_cat(", K in ", config_.splits, " splits") : "");
    }
    return detail::str_cat("int4 tensor-core GEMV/GEMM (mma.sync m16n8k16, weights dequantized in registers",
                           config_.stream ? ", streamed through shared memory" : "",
                           config_.ring != 0 ? detail::str_cat(" in a ring of ", config_.ring, " bytes a warp") : "",
                           config_.staging == Int4Staging::kAll
                               ? ""
                               : detail::str_cat(", staging in shared memory: ", staging_name(config_.staging)),
                           "), ", 8 * config_.tiles,
                           " columns per block",
                           config_.splits > 1 ? detail::str_cat(", K in ", config_.splits, " splits") : "");
  }

  static const char* staging_name(Int4Staging staging) {
    return staging == Int4Staging::kNone ? "none" : staging == Int4Staging::kX ? "x" : "scales";
  }

  static std::string record_of(const Int4MmaConfig& config) {
    nlohmann::json json;
    json["tiles"] = config.tiles;
    json["splits"] = config.splits;
    if (config.stream) json["kernel"] = "stream";
    if (config.gemv) json["kernel"] = "gemv";
    if (config.ring != 0) json["ring"] = config.ring;
    if (config.staging != Int4Staging::kAll) json["staging"] = staging_name(config.staging);
    return json.dump();
  }

 private:
  Int4MmaConfig config_;
  int device_;
};

// The grid a plan record names ({"tiles": 1 | 2 | 4, "splits": 1..kInt4MaxSplits, optionally "kernel": "stream" with
// tiles 2 or 4, or "gemv" with tiles 2; with "stream" and tiles 4 optionally "ring": 8192, the deep ring; with
// "stream" optionally "staging": "none" | "scales" | "x", or the older "x": "global" for "none"});
// InvalidArgumentError otherwise.
Int4MmaConfig config_from_record(const Int4GemmArgs& a, const std::string& record) {
  const nlohmann::json json = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  const auto field = [&](const char* key, int lo, int hi) {
    if (!json.is_object() || !json.contains(key) || !json[key].is_number_integer() ||
        json[key].get<std::int64_t>() < lo || json[key].get<std::int64_t>() > hi) {
      throw InvalidArgumentError(detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('", key,
                                                 "' must be an integer ", lo, "..", hi, "): ", record));
    }
    return static_cast<int>(json[key].get<std::int64_t>());
  };
  const int tiles = field("tiles", 1, 4);
  if (tiles == 3) {
    throw InvalidArgumentError(
        detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('tiles' must be 1, 2 or 4): ", record));
  }
  const int splits = field("splits", 1, kInt4MaxSplits);
  bool stream = false, gemv = false;
  if (json.contains("kernel")) {
    stream = json["kernel"] == "stream";
    gemv = json["kernel"] == "gemv";
    if ((!stream && !gemv) || tiles == 1 || (gemv && tiles != 2)) {
      throw InvalidArgumentError(detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('kernel' must be "
                                                 "\"stream\" with 'tiles' 2 or 4, or \"gemv\" with 'tiles' 2): ",
                                                 record));
    }
  }
  int ring = 0;
  if (json.contains("ring")) {
    if (!stream || tiles != 4 || !json["ring"].is_number_integer() || json["ring"].get<std::int64_t>() != 8192) {
      throw InvalidArgumentError(detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('ring' must be 8192, ",
                                                 "with \"kernel\": \"stream\" and 'tiles' 4): ", record));
    }
    ring = 8192;
  }
  Int4Staging staging = Int4Staging::kAll;
  if (json.contains("staging")) {
    const nlohmann::json& value = json["staging"];
    if (!stream || (value != "none" && value != "scales" && value != "x")) {
      throw InvalidArgumentError(detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('staging' must be ",
                                                 "\"none\", \"scales\" or \"x\", with \"kernel\": \"stream\"): ",
                                                 record));
    }
    staging = value == "none" ? Int4Staging::kNone : value == "x" ? Int4Staging::kX : Int4Staging::kScales;
  } else if (json.contains("x")) {  // records of 2026-12-07 09:42-12:00 UTC: x (and the scales) from global memory
    if (!stream || json["x"] != "global") {
      throw InvalidArgumentError(detail::str_cat("cuda_raw matmul_nbits: invalid plan record ('x' must be \"global\", ",
                                                 "with \"kernel\": \"stream\"): ", record));
    }
    staging = Int4Staging::kNone;
  }
  return int4_gemm_mma_config(a, tiles, splits, stream, gemv, ring, staging);
}

class Int4DequantizeGemmPlan final : public KernelPlan {
 public:
  Int4DequantizeGemmPlan(std::int64_t rows_per_gemm, cublasComputeType_t compute, std::size_t cublas_workspace,
                         std::size_t slice_bytes, int device)
      : rows_per_gemm_(rows_per_gemm),
        compute_(compute),
        cublas_workspace_(cublas_workspace),
        slice_bytes_(slice_bytes),
        device_(device) {}

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const Int4GemmArgs args = args_of(launch);
    if (args.m == 0 || args.n == 0) return;
    XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                          "matmul_nbits needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    char* slice = static_cast<char*>(launch.workspace);
    const cublasHandle_t handle = cublas::thread_cublas_handle(device_, stream);
    cublas::bind_workspace(handle, slice + slice_bytes_, launch.workspace_bytes - slice_bytes_);
    const std::size_t element = dtype_size(args.x_dtype);
    for (std::int64_t n0 = 0; n0 < args.n; n0 += rows_per_gemm_) {
      const std::int64_t rows = std::min(rows_per_gemm_, args.n - n0);
      int4_dequantize_rows(args, n0, rows, slice, args.x_dtype, launch.stream.handle);
      // y[:, n0:n0 + rows] = x [m, k] @ slice[rows, k]^T, column-major: C^T [rows, m] (ld n) = slice^T-op x
      // (Note [Row-major GEMM through column-major cuBLAS] in core/cublas_utils.cpp).
      cublas::GemmShape shape;
      shape.m = rows;
      shape.n = args.m;
      shape.k = args.k;
      shape.transpose_lhs = true;
      shape.ld_lhs = args.k;
      shape.ld_rhs = args.k;
      shape.ld_out = args.n;
      cublas::gemm(handle, shape, args.x_dtype, compute_, slice, args.x,
                   static_cast<char*>(args.y) + n0 * static_cast<std::int64_t>(element));
    }
    int4_add_bias(args, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override { return slice_bytes_ + cublas_workspace_; }

  std::string describe() const override {
    return detail::str_cat("int4 weights dequantized ", rows_per_gemm_, " rows at a time + cuBLAS GemmEx, compute ",
                           cublas::compute_type_name(compute_));
  }

 private:
  std::int64_t rows_per_gemm_;
  cublasComputeType_t compute_;
  std::size_t cublas_workspace_;
  std::size_t slice_bytes_;
  int device_;
};

// The dequantized rows per GEMM within `budget` bytes: all of N when they fit, else a multiple of 64 (aligned
// columns of y), at least one row, at most 65535 (a grid dimension of the dequantize kernel).
std::int64_t rows_per_gemm(const Int4GemmArgs& a, std::size_t budget) {
  const std::size_t row_bytes = static_cast<std::size_t>(a.k) * dtype_size(a.x_dtype);
  std::int64_t rows = static_cast<std::int64_t>(budget / std::max<std::size_t>(row_bytes, 1));
  rows = std::min<std::int64_t>({rows, a.n, 65535});
  if (rows < a.n && rows >= 64) rows = rows / 64 * 64;
  return std::max<std::int64_t>(rows, 1);
}

class Int4GemmKernel final : public Kernel {
 public:
  Int4GemmKernel() : Kernel(info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (desc.outputs.empty()) return Support::no("cuda_raw matmul_nbits needs the op's outputs inferred first");
    const Int4GemmArgs a = args_of(desc);
    if (a.x_dtype == DType::kBFloat16 && desc.compute_capability > 0 && desc.compute_capability < 80) {
      return Support::no("cuda_raw matmul_nbits: bfloat16 needs compute capability 8.0 or newer");
    }
    if (use_mma(desc, a)) return Support::yes();
    cublas::GemmShape shape;
    shape.m = std::min<std::int64_t>(a.n, 65535);
    shape.n = a.m;
    shape.k = a.k;
    shape.ld_lhs = shape.ld_rhs = a.k;
    shape.ld_out = a.n;
    if (Support fits = cublas::check_int32(shape, "cuda_raw matmul_nbits"); !fits) return fits;
    const std::size_t row = static_cast<std::size_t>(a.k) * dtype_size(a.x_dtype);
    if (policy.workspace_limit > 0 && policy.workspace_limit < align_up(row)) {
      return Support::no(detail::str_cat("cuda_raw matmul_nbits dequantizes weight rows of ", row,
                                         " bytes into its workspace, above the policy's workspace_limit of ",
                                         policy.workspace_limit, " bytes"));
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    detail::CudaDeviceGuard guard(desc.device.index);
    const Int4GemmArgs a = args_of(desc);
    if (!record.empty()) {
      if (!use_mma(desc, a)) {
        throw UnsupportedOperationError(detail::str_cat(
            "cuda_raw matmul_nbits: plan record '", record, "' names a tensor-core grid, but ", desc.inputs[0].str(),
            " takes the dequantize + cuBLAS plan, which has no record"));
      }
      const Int4MmaConfig config = config_from_record(a, record);
      if (policy.workspace_limit > 0 && config.workspace_bytes > policy.workspace_limit) {
        throw UnsupportedOperationError(detail::str_cat("cuda_raw matmul_nbits: plan record '", record, "' needs ",
                                                        config.workspace_bytes,
                                                        " bytes of workspace, above the policy's workspace_limit"));
      }
      return std::make_unique<Int4MmaPlan>(config, desc.device.index);
    }
    if (use_mma(desc, a)) {
      // The best grid whose split fits the workspace limit (the unsplit ones always do).
      for (const Int4MmaConfig& config : int4_gemm_mma_configs(a)) {
        if (policy.workspace_limit == 0 || config.workspace_bytes <= policy.workspace_limit) {
          return std::make_unique<Int4MmaPlan>(config, desc.device.index);
        }
      }
    }
    std::size_t cublas_workspace = cublas::default_cublas_workspace(desc.compute_capability, policy.workspace_limit);
    std::size_t budget = kDequantizeBudget;
    if (policy.workspace_limit > 0) {  // accepts() saw room for one row
      cublas_workspace = std::min<std::size_t>(cublas_workspace, policy.workspace_limit / 4);
      const std::size_t left = policy.workspace_limit - cublas_workspace;
      budget = std::min<std::size_t>(budget, left > kAlign ? left - kAlign : 0);
    }
    const std::int64_t rows = rows_per_gemm(a, budget);
    const std::size_t slice = align_up(static_cast<std::size_t>(rows * a.k) * dtype_size(a.x_dtype));
    return std::make_unique<Int4DequantizeGemmPlan>(rows, cublas::compute_type(a.x_dtype, desc.precision),
                                                    cublas_workspace, slice, desc.device.index);
  }

  // The tensor-core kernel's other grids (tiles per block, K splits), for autotuning (Note [Tactics]).
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (!supports(desc, policy)) return {};
    detail::CudaDeviceGuard guard(desc.device.index);
    const Int4GemmArgs a = args_of(desc);
    if (!use_mma(desc, a)) return {};
    std::vector<std::string> out;
    for (const Int4MmaConfig& config : int4_gemm_mma_configs(a)) {
      if (policy.workspace_limit > 0 && config.workspace_bytes > policy.workspace_limit) continue;
      out.push_back(Int4MmaPlan::record_of(config));
    }
    return out;
  }

 private:
  static KernelInfo info() {
    KernelDecl decl = declaration("matmul_nbits", {"x", "weight", "scales", "zero_points", "bias"}, DTypes::kAll);
    const DTypeSet floats{{DType::kFloat32, DType::kFloat16, DType::kBFloat16}, "float32, float16 or bfloat16"};
    const DTypeSet bytes{{DType::kUInt8}, "uint8"};
    decl.input_dtypes = {floats, bytes, floats, bytes, floats};
    return KernelInfo{"matmul_nbits", "cuda_raw", "cuda_raw", DeviceType::kCUDA, true,
                      "int4 weight-only GEMM: m <= 64 on tensor cores with the packed weight dequantized in registers "
                      "(Note [Int4 GEMM on the GPU]); larger m, or float32 x, dequantize into the workspace + cuBLAS",
                      std::move(decl)};
  }

  // The tensor-core kernel takes the problem (float16/bfloat16 x, small m, its layout and alignment).
  static bool use_mma(const OpDescriptor& desc, const Int4GemmArgs& a) {
    // The descriptor's alignment stands for the weight pointer's (args_of leaves it null, which passes).
    if (a.m > kMmaMaxRows || desc.inputs[1].alignment < 16) return false;
    return int4_gemm_mma_refusal(a, desc.compute_capability) == nullptr;
  }
};

}  // namespace

void register_int4_gemm(KernelRegistry& registry) { registry.add_kernel(std::make_unique<Int4GemmKernel>()); }

}  // namespace xpuruntime::cuda_raw
