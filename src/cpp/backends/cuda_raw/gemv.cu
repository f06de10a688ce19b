// gemv: the cuda_raw backend's kernel of op "linear" for a few rows of x (M <= 8: decode steps, batch-1 inference),
// where a GEMM is a stream over the weight's bytes (Note [Linear as a weight stream]).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/cuda_utils.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {

// Note [Linear as a weight stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// linear(x [M, K], W) with M <= kGemvMaxRows reads each weight element once and does M multiply-adds with it: the
// weight's bytes over the memory bandwidth are the floor, and the kernel's job is to keep enough 16-byte loads in
// flight on every SM. cuBLASLt's GEMMs reached about 60% of that floor on a 1B Llama's decode steps (docs/
// benchmarks.md); the two kernels here are the classic weight streams, one per weight layout:
//   nk (W [N, K], rows over K): a warp per output column n; its lanes walk the row in 16-byte vectors (four in flight),
//     multiply each with the same K positions of the M rows of x (read through L1: every warp reads the same x), and
//     reduce the M sums over the warp; lane 0 adds the bias and the residual, applies the activation and stores.
//   kn (W [K, N], rows over N, what MatMul exports carry): a thread per 8 adjacent columns (one 16-byte vector of a
//     weight row), the block's four warps on interleaved rows of one range of K (four consecutive rows, 2 KiB, per
//     step), x's slice of that range staged in shared memory as float; the warps' sums meet in shared memory in a
//     fixed order. When the columns alone give too few blocks to fill the device, K is split among `splits` blocks
//     (about two blocks per SM in all) that write float32 partial sums to the workspace, and a second kernel adds
//     them in split order and applies the epilogue; otherwise the block applies it.
// Both accumulate in float32 in a fixed order (deterministic). The epilogue is linear's: act(x W^T + bias +
// residual). The dispatcher times the kernel against cuBLASLt's at the node's shapes and keeps the faster (Note
// [Timed first choices] in core/dispatcher.cpp): where cuBLASLt's GEMM wins, it runs.

// Note [Weight bytes in flight]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream reaches the memory's bandwidth only with about its latency times its bandwidth in loads outstanding
// (3.3 TB/s x ~0.7 us: over 2 MB on an H100, some 18 KB an SM). A kn block with four rows in flight a warp held 8 KB,
// two blocks an SM 16 KB; a 1B Llama's decode step spent 0.79 ms in kn GEMVs and 0.21 ms in their combines on an
// H100 (llama_generation_bench --profile, 2026-12-06). A warp now loads eight rows before using them, and the
// combine kernel eight splits' partial sums before adding them (it had one load outstanding a thread, the splits one
// after another); the sums keep their order. Not measured on that model yet: with its weights timed from memory
// (Note [Weights timed from memory] in core/dispatcher.cpp) cuBLASLt's GEMMs won all of its projections.

namespace {

using xpuruntime::detail::str_cat;

constexpr int kGemvMaxRows = 8;
constexpr int kWarps = 4;                 // kn: warps of a block; nk: columns of a block is 2 x this
constexpr int kNkWarps = 8;
constexpr int kKnColumns = 32 * 8;        // columns of a kn block: 32 lanes x 8
constexpr int kKnMaxRange = 512;          // rows of K one kn block stages (x's slice: 512 x 8 floats = 16 KiB)
constexpr int kKnRowsInFlight = 8;        // rows a kn warp loads before using them (Note [Weight bytes in flight])
constexpr int kCombineInFlight = 8;       // partial sums a combine thread loads before adding them

enum class Act : int { kNone, kRelu, kGelu, kGeluTanh };

struct GemvArgs {
  const void* x = nullptr;         // [M, K]
  const void* w = nullptr;         // [N, K] (nk) or [K, N] (kn)
  const void* bias = nullptr;      // [N] or null
  const void* residual = nullptr;  // [M, N] or null
  void* y = nullptr;               // [M, N]
  int m = 0;
  int n = 0;
  int k = 0;
  Act act = Act::kNone;
  int splits = 1;     // kn: blocks along K
  int range = 0;      // kn: rows of K per split (a multiple of kWarps)
};

__device__ __forceinline__ float activate(float v, Act act) {
  switch (act) {
    case Act::kRelu: return detail::relu(v);
    case Act::kGelu: return detail::gelu_erf(v);
    case Act::kGeluTanh: return detail::gelu_tanh(v);
    default: return v;
  }
}

template <typename T>
__device__ __forceinline__ void store_output(const GemvArgs& a, int row, int col, float sum) {
  if (a.bias != nullptr) sum += detail::to_float(static_cast<const T*>(a.bias)[col]);
  const std::int64_t at = static_cast<std::int64_t>(row) * a.n + col;
  if (a.residual != nullptr) sum += detail::to_float(static_cast<const T*>(a.residual)[at]);
  static_cast<T*>(a.y)[at] = detail::from_float<T>(activate(sum, a.act));
}

// Eight T of a 16-byte vector as float.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&out)[8]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = detail::to_float(e[i]);
}

template <typename T, int kM>
__global__ void __launch_bounds__(kNkWarps * 32) gemv_nk_kernel(const GemvArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int col = static_cast<int>(blockIdx.x) * kNkWarps + static_cast<int>(threadIdx.x) / 32;
  if (col >= a.n) return;
  const int chunks = a.k / 8;
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const T*>(a.w) + static_cast<std::int64_t>(col) * a.k);
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  float sum[kM] = {};
  constexpr int kInFlight = 4;
  int c = lane;
  for (; c + 32 * (kInFlight - 1) < chunks; c += 32 * kInFlight) {
    uint4 wv[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) wv[u] = __ldg(w + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      float wf[8];
      unpack8<T>(wv[u], wf);
#pragma unroll
      for (int r = 0; r < kM; ++r) {
        if (r >= a.m) break;
        float xf[8];
        unpack8<T>(__ldg(x + static_cast<std::int64_t>(r) * chunks + c + 32 * u), xf);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum[r] += wf[i] * xf[i];
      }
    }
  }
  for (; c < chunks; c += 32) {
    float wf[8];
    unpack8<T>(__ldg(w + c), wf);
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r >= a.m) break;
      float xf[8];
      unpack8<T>(__ldg(x + static_cast<std::int64_t>(r) * chunks + c), xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[r] += wf[i] * xf[i];
    }
  }
#pragma unroll
  for (int r = 0; r < kM; ++r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], offset);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r < a.m) store_output<T>(a, r, col, sum[r]);
    }
  }
}

template <typename T, int kM>
__global__ void __launch_bounds__(kWarps * 32) gemv_kn_kernel(const GemvArgs a, float* partial) {
  __shared__ float x_s[kKnMaxRange][kM];
  __shared__ float red[2][32][kM * 8];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int col = static_cast<int>(blockIdx.x) * kKnColumns + lane * 8;
  const int k_begin = static_cast<int>(blockIdx.y) * a.range;
  const int k_end = min(a.k, k_begin + a.range);
  const T* x = static_cast<const T*>(a.x);
  for (int idx = static_cast<int>(threadIdx.x); idx < (k_end - k_begin) * kM; idx += kWarps * 32) {
    const int kk = idx / kM, r = idx % kM;
    x_s[kk][r] = r < a.m ? detail::to_float(x[static_cast<std::int64_t>(r) * a.k + k_begin + kk]) : 0.f;
  }
  __syncthreads();
  float acc[kM][8] = {};
  if (col < a.n) {
    const T* w = static_cast<const T*>(a.w) + col;
    constexpr int kInFlight = kKnRowsInFlight;
    int k = k_begin + warp;
    for (; k + kWarps * (kInFlight - 1) < k_end; k += kWarps * kInFlight) {
      uint4 wv[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        wv[u] = __ldg(reinterpret_cast<const uint4*>(w + static_cast<std::int64_t>(k + kWarps * u) * a.n));
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        float wf[8];
        unpack8<T>(wv[u], wf);
        const float* xr = x_s[k + kWarps * u - k_begin];
#pragma unroll
        for (int r = 0; r < kM; ++r) {
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][i] += xr[r] * wf[i];
        }
      }
    }
    for (; k < k_end; k += kWarps) {
      float wf[8];
      unpack8<T>(__ldg(reinterpret_cast<const uint4*>(w + static_cast<std::int64_t>(k) * a.n)), wf);
      const float* xr = x_s[k - k_begin];
#pragma unroll
      for (int r = 0; r < kM; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][i] += xr[r] * wf[i];
      }
    }
  }
  // The four warps' sums in a fixed order: 2 and 3 into 0 and 1, then 1 into 0.
  for (int round = 2; round >= 1; round /= 2) {
    if (warp >= round && warp < 2 * round) {
#pragma unroll
      for (int r = 0; r < kM; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) red[warp - round][lane][r * 8 + i] = acc[r][i];
      }
    }
    __syncthreads();
    if (warp < round) {
#pragma unroll
      for (int r = 0; r < kM; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][i] += red[warp][lane][r * 8 + i];
      }
    }
    __syncthreads();
  }
  if (warp != 0 || col >= a.n) return;
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    if (r >= a.m) break;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (gridDim.y == 1) {
        store_output<T>(a, r, col + i, acc[r][i]);
      } else {
        partial[(static_cast<std::int64_t>(blockIdx.y) * a.m + r) * a.n + col + i] = acc[r][i];
      }
    }
  }
}

// The splits' partial sums of element (row, col) added in split order, then the epilogue.
template <typename T>
__global__ void gemv_combine_kernel(const GemvArgs a, const float* partial) {
  const std::int64_t total = static_cast<std::int64_t>(a.m) * a.n;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    int s = 0;
    for (; s + kCombineInFlight <= a.splits; s += kCombineInFlight) {  // loaded together, added in split order
      float part[kCombineInFlight];
#pragma unroll
      for (int u = 0; u < kCombineInFlight; ++u) part[u] = partial[(s + u) * total + i];
#pragma unroll
      for (int u = 0; u < kCombineInFlight; ++u) sum += part[u];
    }
    for (; s < a.splits; ++s) sum += partial[s * total + i];
    store_output<T>(a, static_cast<int>(i / a.n), static_cast<int>(i % a.n), sum);
  }
}

template <typename T, int kM>
void launch_rows(const GemvArgs& a, bool kn, float* workspace, cudaStream_t stream) {
  if (!kn) {
    gemv_nk_kernel<T, kM><<<static_cast<unsigned>((a.n + kNkWarps - 1) / kNkWarps), kNkWarps * 32, 0, stream>>>(a);
    return;
  }
  const dim3 grid(static_cast<unsigned>((a.n + kKnColumns - 1) / kKnColumns), static_cast<unsigned>(a.splits));
  gemv_kn_kernel<T, kM><<<grid, kWarps * 32, 0, stream>>>(a, workspace);
  if (a.splits > 1) {
    const std::int64_t total = static_cast<std::int64_t>(a.m) * a.n;
    gemv_combine_kernel<T><<<detail::grid_for(total, 256, 1024), 256, 0, stream>>>(a, workspace);
  }
}

template <typename T>
void launch_typed(const GemvArgs& a, bool kn, float* workspace, cudaStream_t stream) {
  if (a.m <= 1) return launch_rows<T, 1>(a, kn, workspace, stream);
  if (a.m <= 2) return launch_rows<T, 2>(a, kn, workspace, stream);
  if (a.m <= 4) return launch_rows<T, 4>(a, kn, workspace, stream);
  return launch_rows<T, 8>(a, kn, workspace, stream);
}

Act act_of(const std::string& name) {
  if (name == "relu") return Act::kRelu;
  if (name == "gelu") return Act::kGelu;
  if (name == "gelu_tanh") return Act::kGeluTanh;
  return Act::kNone;
}

// The problem of a descriptor, without pointers; kn's split for a device of `multiprocessors` SMs.
GemvArgs args_of(const OpDescriptor& desc, int multiprocessors) {
  GemvArgs a;
  const bool kn = desc.attrs.get_string("weight_layout", "nk") == "kn";
  const TensorDesc& x = desc.inputs[0];
  a.k = static_cast<int>(x.shape.back());
  a.m = a.k > 0 ? static_cast<int>(x.numel() / a.k) : 0;
  a.n = static_cast<int>(desc.inputs[1].shape[kn ? 1 : 0]);
  a.act = act_of(desc.attrs.get_string("activation", "none"));
  if (kn) {
    const int column_blocks = (a.n + kKnColumns - 1) / kKnColumns;
    const int wanted = 2 * std::max(multiprocessors, 1);
    int splits = std::max((wanted + column_blocks - 1) / column_blocks, (a.k + kKnMaxRange - 1) / kKnMaxRange);
    splits = std::max(1, std::min(splits, (a.k + 31) / 32));  // at least 32 rows (8 a warp) a split
    a.range = ((a.k + splits - 1) / splits + kWarps - 1) / kWarps * kWarps;
    a.range = std::min(a.range, kKnMaxRange);
    a.splits = (a.k + a.range - 1) / a.range;
  }
  return a;
}

std::size_t workspace_of(const GemvArgs& a) {
  return a.splits > 1 ? static_cast<std::size_t>(a.splits) * a.m * a.n * sizeof(float) : 0;
}

Support check_gemv(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  if (x.dtype != DType::kFloat16 && x.dtype != DType::kBFloat16) {
    return Support::no(str_cat("gemv takes float16 and bfloat16, got ", dtype_name(x.dtype)));
  }
  for (const TensorDesc& t : desc.inputs) {
    if (!t.present) continue;
    if (t.dtype != x.dtype) return Support::no("gemv needs one dtype for x, the weight, the bias and the residual");
    if (!t.is_contiguous()) return Support::no(str_cat("gemv needs contiguous inputs, got ", t.str()));
  }
  const bool kn = desc.attrs.get_string("weight_layout", "nk") == "kn";
  const std::int64_t k = x.shape.back();
  const std::int64_t m = k > 0 ? x.numel() / k : 0;
  const std::int64_t n = w.shape[kn ? 1 : 0];
  if (m < 1 || m > kGemvMaxRows) {
    return Support::no(str_cat("gemv streams the weight for 1 to ", kGemvMaxRows, " rows of x, got ", m,
                               "; larger M is a GEMM (cublasLt)"));
  }
  if (k < 1 || n < 1 || k > (1 << 30) || n > (1 << 30) || m * n > (std::int64_t{1} << 31)) {
    return Support::no(str_cat("gemv needs 1 <= K, N < 2^30; got K = ", k, ", N = ", n));
  }
  if ((kn ? n : k) % 8 != 0) {
    return Support::no(str_cat("gemv reads weight rows in 16-byte vectors: ", kn ? "N" : "K",
                                       " must be a multiple of 8, got ", kn ? n : k));
  }
  if (w.alignment < 16 || (!kn && x.alignment < 16)) {
    return Support::no("gemv needs 16-byte aligned weights (and x, for weight_layout=nk)");
  }
  const std::string act = desc.attrs.get_string("activation", "none");
  if (act != "none" && act != "relu" && act != "gelu" && act != "gelu_tanh") {
    return Support::no(str_cat("gemv applies none, relu, gelu or gelu_tanh, got '", act, "'"));
  }
  return Support::yes();
}

class GemvPlan final : public KernelPlan {
 public:
  GemvPlan(GemvArgs args, bool kn, DType dtype, int device) : args_(args), kn_(kn), dtype_(dtype), device_(device) {}

  std::size_t workspace_bytes() const override { return kn_ ? workspace_of(args_) : 0; }

  void run(const KernelLaunch& launch) const override {
    GemvArgs a = args_;
    a.x = launch.input(0).data_ptr();
    a.w = launch.input(1).data_ptr();
    if (launch.num_inputs > 2 && launch.input(2).defined()) a.bias = launch.input(2).data_ptr();
    if (launch.num_inputs > 3 && launch.input(3).defined()) a.residual = launch.input(3).data_ptr();
    a.y = launch.output(0).data_ptr();
    XPURT_CHECK(detail::is_aligned(a.w, 16) && (kn_ || detail::is_aligned(a.x, 16)),
                "gemv needs the 16-byte aligned tensors it was built for; run the plan on them");
    XPURT_CHECK(launch.workspace_bytes >= workspace_bytes() && (workspace_bytes() == 0 || launch.workspace),
                "gemv needs ", workspace_bytes(), " bytes of workspace, the launch has ", launch.workspace_bytes);
    xpuruntime::detail::CudaDeviceGuard guard(device_);
    const cudaStream_t stream = detail::as_stream(launch.stream.handle);
    auto* workspace = static_cast<float*>(launch.workspace);
    if (dtype_ == DType::kBFloat16) {
      launch_typed<__nv_bfloat16>(a, kn_, workspace, stream);
    } else {
      launch_typed<__half>(a, kn_, workspace, stream);
    }
    XPURT_CUDA_CHECK(cudaGetLastError());
  }

  std::string describe() const override {
    return kn_ ? str_cat("gemv kn: ", (args_.n + kKnColumns - 1) / kKnColumns, " column blocks x ",
                                 args_.splits, " split(s) of ", args_.range, " rows of K, M = ", args_.m)
               : str_cat("gemv nk: a warp per output column, M = ", args_.m);
  }

 private:
  GemvArgs args_;
  bool kn_;
  DType dtype_;
  int device_;
};

class GemvKernel final : public Kernel {
 public:
  explicit GemvKernel(KernelDecl decl)
      : Kernel(KernelInfo{"linear", "gemv", "cuda_raw", DeviceType::kCUDA, true,
                          "linear for 1 to 8 rows of x as a stream over the weight (nk: a warp per column; kn: 8 "
                          "columns a thread, K split across blocks), float32 sums in a fixed order, bias, residual "
                          "and relu/gelu/gelu_tanh fused (Note [Linear as a weight stream])",
                          std::move(decl)}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/) const override {
    return check_gemv(desc);
  }

  std::string ranks_first(const OpDescriptor& desc) const override {
    (void)desc;
    return "at most 8 rows of x: the weight's bytes are the cost";
  }

  std::string timed_against_others(const OpDescriptor& desc) const override {
    (void)desc;
    return "gemv or cuBLASLt's GEMM may be faster at this shape";
  }

  bool streams_weight(const OpDescriptor& desc) const override {  // Note [Weights timed from memory]
    (void)desc;
    return true;  // accepted only for 1 to 8 rows of x: the weight's bytes are the cost
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw UnsupportedOperationError(str_cat("gemv has no plan record, but was given one: '", record, "'"));
    }
    const Support support = check_gemv(desc);
    if (!support) throw UnsupportedOperationError(str_cat("gemv cannot run ", desc.signature(), ": ",
                                                                  support.reason()));
    int multiprocessors = 0;
    XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, desc.device.index));
    const bool kn = desc.attrs.get_string("weight_layout", "nk") == "kn";
    return std::make_unique<GemvPlan>(args_of(desc, multiprocessors), kn, desc.inputs[0].dtype, desc.device.index);
  }
};

}  // namespace

void register_gemv(KernelRegistry& registry) {
  KernelDecl decl = declaration("linear", {"x", "weight", "bias", "residual"});
  decl.subject = "gemv";
  decl.input_ranks = {{1, -1}, {2, 2}};
  registry.add_kernel(std::make_unique<GemvKernel>(std::move(decl)));
}

}  // namespace xpuruntime::cuda_raw
