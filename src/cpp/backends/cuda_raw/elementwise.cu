// Elementwise kernels: the math unary ops, the binary ops with NumPy broadcasting, and cast.
//
// Note [Coalesced geometry]
// A binary op's operands are described by one stride table per operand over the output's shape (stride 0
// along broadcast dimensions). Before launching, size-1 dimensions are dropped and neighbouring dimensions
// are merged wherever every operand steps through them as through one dimension (outer stride == inner stride
// * inner size). [3,1,5] + [1,4,1] stays three dimensions, [8,128,64] + [64] becomes [1024,64] + [64]
// (stride 0, 1), and same-shape operands become one dimension, which takes the vectorized kernel. The index
// math then costs one division per remaining dimension. kMaxDims (8) merged dimensions are supported; that
// covers any broadcast of tensors up to rank 8 and most beyond.
//
// Note [Vectorized broadcast]
// The general broadcast kernel moves one element per thread and pays the index divisions per element, which
// holds it near a third of the copy bandwidth for 16-bit types. When the output's innermost (merged) dimension
// is a multiple of the 16-byte vector width kVec, a thread instead handles whole output vectors: the kVec
// elements of a vector share all outer indices, so one offset computation serves the vector. Each operand
// must either run along the innermost dimension (stride 1: one 16-byte load, which needs its pointer 16-byte
// aligned and its other strides non-negative multiples of kVec) or be broadcast along it (stride 0: one scalar
// load, used for all kVec lanes; other strides non-negative), and at least one operand must run along it. The
// offsets come from an OffsetCalculator over the geometry with the innermost size divided by kVec and the
// innermost strides multiplied by kVec, so the vector index maps straight to the element offsets of the
// vector's first element. Two shapes that matter: bias over rows, [R, C] + [C] (both operands vectors, the
// bias re-read from cache), and a per-channel gate, [N, C, H, W] * [N, C, 1, 1] (merged to [N*C, H*W] with the
// gate broadcast along the inner dimension). Each thread issues the loads of kBroadcastUnroll vectors, a
// block's width apart, before computing any, to keep more bytes in flight. On an H200 (float16, 64M outputs) both
// shapes went from 203 us to 68 us (about 95% of the copy bandwidth) in a standalone program launching the kernel,
// and from 210 to 99-101 us through xrt.ops.call in benchmarks/kernel_roofline_bench.py. The path uses int32
// indices, so it takes only geometries that fits_int32 accepts; their vector count is under a quarter of
// INT32_MAX, which leaves room for the grid-stride step (at most kMaxBlocks tiles). Every other case (an
// innermost size that is not a multiple of kVec, misaligned pointers, other or negative strides, 64-bit offsets)
// takes the general kernel.
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

template <UnaryOp kOp>
struct MathFn {
  __device__ __forceinline__ float operator()(float x) const {
    if constexpr (kOp == UnaryOp::kExp) {
      return expf(x);
    } else if constexpr (kOp == UnaryOp::kLog) {
      return logf(x);
    } else if constexpr (kOp == UnaryOp::kSqrt) {
      return sqrtf(x);
    } else if constexpr (kOp == UnaryOp::kNeg) {
      return -x;
    } else if constexpr (kOp == UnaryOp::kAbs) {
      return fabsf(x);
    } else if constexpr (kOp == UnaryOp::kErf) {
      return erff(x);
    } else {
      static_assert(kOp == UnaryOp::kReciprocal, "activations live in activation.cu");
      return 1.0f / x;
    }
  }
};

template <BinaryOp kOp>
__device__ __forceinline__ float apply_binary(float a, float b) {
  if constexpr (kOp == BinaryOp::kAdd) {
    return a + b;
  } else if constexpr (kOp == BinaryOp::kSub) {
    return a - b;
  } else if constexpr (kOp == BinaryOp::kMul) {
    return a * b;
  } else if constexpr (kOp == BinaryOp::kDiv) {
    return a / b;
  } else if constexpr (kOp == BinaryOp::kPow) {
    return powf(a, b);
  } else if constexpr (kOp == BinaryOp::kMaximum) {
    return max_nan(a, b);
  } else {
    static_assert(kOp == BinaryOp::kMinimum, "unknown binary op");
    return min_nan(a, b);
  }
}

// Operands of the output's shape: 16-byte vectors when all three pointers allow it, then a scalar tail.
template <typename T, BinaryOp kOp>
__global__ void binary_same_shape_kernel(const T* a, const T* b, T* y, std::int64_t n, bool vectorized) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    constexpr int kVec = kVec16<T>;
    using V = Vec<T, kVec>;
    const std::int64_t vectors = n / kVec;
    for (std::int64_t i = first; i < vectors; i += stride) {
      const V va = reinterpret_cast<const V*>(a)[i];
      const V vb = reinterpret_cast<const V*>(b)[i];
      V out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = from_float<T>(apply_binary<kOp>(to_float(va.v[k]), to_float(vb.v[k])));
      reinterpret_cast<V*>(y)[i] = out;
    }
    tail = vectors * kVec;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) {
    y[i] = from_float<T>(apply_binary<kOp>(to_float(a[i]), to_float(b[i])));
  }
}

// General broadcasting: y (contiguous) at linear index i reads a and b at the offsets of the stride tables.
template <typename T, BinaryOp kOp, typename Index>
__global__ void binary_broadcast_kernel(const T* a, const T* b, T* y, Index n, OffsetCalculator<2, Index> calc) {
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[2];
    calc.offsets(i, offsets);
    y[i] = from_float<T>(apply_binary<kOp>(to_float(a[offsets[0]]), to_float(b[offsets[1]])));
  }
}

// Vectors of output handled by each thread per grid step in binary_broadcast_vector_kernel.
constexpr int kBroadcastUnroll = 4;

// Broadcasting in 16-byte output vectors (Note [Vectorized broadcast]): `vectors` output vectors, `calc` over
// the vector geometry (innermost size / kVec). An operand loaded as a vector when kAVector / kBVector, else as
// one element broadcast over the vector's lanes. Launched with kThreads threads per block.
template <typename T, BinaryOp kOp, bool kAVector, bool kBVector>
__global__ void __launch_bounds__(kThreads)
    binary_broadcast_vector_kernel(const T* a, const T* b, T* y, std::int32_t vectors,
                                   OffsetCalculator<2, std::int32_t> calc) {
  constexpr int kVec = kVec16<T>;
  using V = Vec<T, kVec>;
  constexpr std::int32_t kTile = kThreads * kBroadcastUnroll;
  const std::int32_t grid_step = static_cast<std::int32_t>(gridDim.x) * kTile;
  for (std::int32_t first = static_cast<std::int32_t>(blockIdx.x) * kTile + static_cast<std::int32_t>(threadIdx.x);
       first < vectors; first += grid_step) {
    V va[kBroadcastUnroll];
    V vb[kBroadcastUnroll];
#pragma unroll
    for (int u = 0; u < kBroadcastUnroll; ++u) {
      const std::int32_t v = first + u * kThreads;
      if (v < vectors) {
        std::int32_t offsets[2];
        calc.offsets(v, offsets);
        if constexpr (kAVector) {
          va[u] = *reinterpret_cast<const V*>(a + offsets[0]);
        } else {
          va[u].v[0] = a[offsets[0]];
        }
        if constexpr (kBVector) {
          vb[u] = *reinterpret_cast<const V*>(b + offsets[1]);
        } else {
          vb[u].v[0] = b[offsets[1]];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBroadcastUnroll; ++u) {
      const std::int32_t v = first + u * kThreads;
      if (v < vectors) {
        V out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float x = to_float(va[u].v[kAVector ? k : 0]);
          out.v[k] = from_float<T>(apply_binary<kOp>(x, to_float(vb[u].v[kBVector ? k : 0])));
        }
        reinterpret_cast<V*>(y)[v] = out;
      }
    }
  }
}

// How an operand is read by the vectorized broadcast kernel (Note [Vectorized broadcast]).
enum class VectorRead { kNone, kVector, kScalar };

// kVector when `strides` run along the innermost dimension with 16-byte aligned vectors from `pointer`, kScalar
// when they are broadcast along it, kNone otherwise (the general kernel).
VectorRead vector_read(const void* pointer, const std::vector<std::int64_t>& strides, std::int64_t vec) {
  const std::int64_t inner = strides.back();
  if (inner != 0 && (inner != 1 || !is_aligned(pointer, 16))) return VectorRead::kNone;
  for (std::size_t d = 0; d + 1 < strides.size(); ++d) {
    if (strides[d] < 0 || (inner == 1 && strides[d] % vec != 0)) return VectorRead::kNone;
  }
  return inner == 1 ? VectorRead::kVector : VectorRead::kScalar;
}

// Launches binary_broadcast_vector_kernel when the geometry and pointers allow it (Note [Vectorized
// broadcast]); returns false, launching nothing, otherwise.
template <typename T, BinaryOp kOp>
bool try_launch_binary_vectorized(const T* a, const T* b, T* y, const BroadcastGeometry& geometry,
                                  cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const std::int64_t n = geometry.numel();
  if (geometry.shape.empty() || geometry.shape.back() % kVec != 0 || !is_aligned(y, 16)) return false;
  if (!fits_int32(n, geometry.shape, {&geometry.a_strides, &geometry.b_strides})) return false;
  const VectorRead read_a = vector_read(a, geometry.a_strides, kVec);
  const VectorRead read_b = vector_read(b, geometry.b_strides, kVec);
  if (read_a == VectorRead::kNone || read_b == VectorRead::kNone) return false;
  if (read_a != VectorRead::kVector && read_b != VectorRead::kVector) return false;
  // The vector geometry: kVec times fewer innermost indices, each kVec elements apart for a vector operand.
  std::vector<std::int64_t> shape = geometry.shape;
  std::vector<std::int64_t> a_strides = geometry.a_strides;
  std::vector<std::int64_t> b_strides = geometry.b_strides;
  shape.back() /= kVec;
  a_strides.back() *= kVec;
  b_strides.back() *= kVec;
  const std::vector<std::int64_t>* const strides[2] = {&a_strides, &b_strides};
  const auto calc = make_offset_calculator<2, std::int32_t>(shape, strides);
  const auto vectors = static_cast<std::int32_t>(n / kVec);
  const unsigned blocks = grid_for(vectors, kThreads * kBroadcastUnroll);
  if (read_a == VectorRead::kVector && read_b == VectorRead::kVector) {
    binary_broadcast_vector_kernel<T, kOp, true, true><<<blocks, kThreads, 0, stream>>>(a, b, y, vectors, calc);
  } else if (read_a == VectorRead::kVector) {
    binary_broadcast_vector_kernel<T, kOp, true, false><<<blocks, kThreads, 0, stream>>>(a, b, y, vectors, calc);
  } else {
    binary_broadcast_vector_kernel<T, kOp, false, true><<<blocks, kThreads, 0, stream>>>(a, b, y, vectors, calc);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  return true;
}

template <typename T, BinaryOp kOp>
void launch_binary(const void* a_ptr, const void* b_ptr, void* y_ptr, const BroadcastGeometry& geometry,
                   cudaStream_t stream) {
  const auto* a = static_cast<const T*>(a_ptr);
  const auto* b = static_cast<const T*>(b_ptr);
  auto* y = static_cast<T*>(y_ptr);
  const std::int64_t n = geometry.numel();
  if (n <= 0) return;
  if (geometry.same_shape()) {
    const bool vectorized = is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(y, 16);
    const std::int64_t work = vectorized ? std::max<std::int64_t>(n / kVec16<T>, n % kVec16<T>) : n;
    binary_same_shape_kernel<T, kOp><<<grid_for(work, kThreads), kThreads, 0, stream>>>(a, b, y, n, vectorized);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    return;
  }
  if (try_launch_binary_vectorized<T, kOp>(a, b, y, geometry, stream)) return;
  const std::vector<std::int64_t>* const strides[2] = {&geometry.a_strides, &geometry.b_strides};
  if (fits_int32(n, geometry.shape, {&geometry.a_strides, &geometry.b_strides})) {
    const auto calc = make_offset_calculator<2, std::int32_t>(geometry.shape, strides);
    binary_broadcast_kernel<T, kOp, std::int32_t>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, y, static_cast<std::int32_t>(n), calc);
  } else {
    const auto calc = make_offset_calculator<2, std::int64_t>(geometry.shape, strides);
    binary_broadcast_kernel<T, kOp, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, y, n, calc);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

template <typename T>
void dispatch_binary(BinaryOp op, const void* a, const void* b, void* y, const BroadcastGeometry& geometry,
                     cudaStream_t stream) {
  switch (op) {
    case BinaryOp::kAdd: return launch_binary<T, BinaryOp::kAdd>(a, b, y, geometry, stream);
    case BinaryOp::kSub: return launch_binary<T, BinaryOp::kSub>(a, b, y, geometry, stream);
    case BinaryOp::kMul: return launch_binary<T, BinaryOp::kMul>(a, b, y, geometry, stream);
    case BinaryOp::kDiv: return launch_binary<T, BinaryOp::kDiv>(a, b, y, geometry, stream);
    case BinaryOp::kPow: return launch_binary<T, BinaryOp::kPow>(a, b, y, geometry, stream);
    case BinaryOp::kMaximum: return launch_binary<T, BinaryOp::kMaximum>(a, b, y, geometry, stream);
    case BinaryOp::kMinimum: return launch_binary<T, BinaryOp::kMinimum>(a, b, y, geometry, stream);
  }
  XPURT_INTERNAL_ASSERT(false, "unknown binary op ", static_cast<int>(op));
}

// ---- cast ----

template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<From, To>) {
    return v;
  } else if constexpr (std::is_same_v<From, double>) {
    if constexpr (std::is_same_v<To, float>) {
      return static_cast<float>(v);
    } else if constexpr (std::is_same_v<To, __half>) {
      return __double2half(v);
    } else {
      return __double2bfloat16(v);
    }
  } else if constexpr (std::is_same_v<To, double>) {
    return static_cast<double>(to_float(v));
  } else {
    return from_float<To>(to_float(v));
  }
}

// Four elements per step: one 8- or 16-byte access on each side when both pointers allow it.
template <typename From, typename To>
__global__ void cast_kernel(const From* x, To* y, std::int64_t n, bool vectorized) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    constexpr int kVec = 4;
    const std::int64_t vectors = n / kVec;
    for (std::int64_t i = first; i < vectors; i += stride) {
      const Vec<From, kVec> in = reinterpret_cast<const Vec<From, kVec>*>(x)[i];
      Vec<To, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = convert<To>(in.v[k]);
      reinterpret_cast<Vec<To, kVec>*>(y)[i] = out;
    }
    tail = vectors * kVec;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) y[i] = convert<To>(x[i]);
}

// Calls `body(T{})` for the storage type of a cast's dtype (the kernel floats and float64).
template <typename Body>
void dispatch_cast_dtype(DType dtype, Body&& body) {
  if (dtype == DType::kFloat64) {
    body(double{});
  } else {
    dispatch_float(dtype, "cast", body);
  }
}

}  // namespace

// ---- unary ----

void unary(UnaryOp op, const void* x, void* y, DType dtype, std::int64_t n, void* stream) {
  if (op >= UnaryOp::kRelu) {
    activation(op, x, y, dtype, n, stream);
    return;
  }
  dispatch_float(dtype, "elementwise op", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case UnaryOp::kExp: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kExp>{}, stream);
      case UnaryOp::kLog: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kLog>{}, stream);
      case UnaryOp::kSqrt: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kSqrt>{}, stream);
      case UnaryOp::kNeg: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kNeg>{}, stream);
      case UnaryOp::kAbs: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kAbs>{}, stream);
      case UnaryOp::kErf: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kErf>{}, stream);
      case UnaryOp::kReciprocal: return launch_unary<T>(x, y, n, MathFn<UnaryOp::kReciprocal>{}, stream);
      default: XPURT_INTERNAL_ASSERT(false, "unary op ", static_cast<int>(op), " is an activation");
    }
  });
}

// ---- binary ----

std::int64_t BroadcastGeometry::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

bool BroadcastGeometry::same_shape() const {
  return shape.empty() || (shape.size() == 1 && a_strides[0] == 1 && b_strides[0] == 1);
}

bool broadcast_geometry(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                        const std::vector<std::int64_t>& out, BroadcastGeometry* geometry, std::string* why_not) {
  *geometry = BroadcastGeometry();
  std::int64_t numel = 1;
  for (const std::int64_t d : out) numel *= d;
  if (numel == 0) {  // nothing to compute; a one-dimensional geometry of zero elements
    geometry->shape = {0};
    geometry->a_strides = {1};
    geometry->b_strides = {1};
    return true;
  }
  // Right-aligned contiguous strides of an operand over the output's dimensions, 0 where it broadcasts.
  auto strides_over_out = [&](const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> strides(out.size(), 0);
    std::int64_t stride = 1;
    for (std::size_t k = 0; k < shape.size(); ++k) {
      const std::size_t d = shape.size() - 1 - k;     // operand dimension, innermost first
      const std::size_t o = out.size() - 1 - k;       // the output dimension it aligns with
      strides[o] = shape[d] == 1 ? 0 : stride;
      stride *= shape[d];
    }
    return strides;
  };
  const std::vector<std::int64_t> a_strides = strides_over_out(a);
  const std::vector<std::int64_t> b_strides = strides_over_out(b);
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;  // contributes nothing to any offset
    if (!geometry->shape.empty()) {
      const std::size_t last = geometry->shape.size() - 1;
      const bool mergeable = geometry->a_strides[last] == a_strides[d] * out[d] &&
                             geometry->b_strides[last] == b_strides[d] * out[d];
      if (mergeable) {
        geometry->shape[last] *= out[d];
        geometry->a_strides[last] = a_strides[d];
        geometry->b_strides[last] = b_strides[d];
        continue;
      }
    }
    geometry->shape.push_back(out[d]);
    geometry->a_strides.push_back(a_strides[d]);
    geometry->b_strides.push_back(b_strides[d]);
  }
  if (geometry->shape.size() > static_cast<std::size_t>(kMaxDims)) {
    *why_not = ::xpuruntime::detail::str_cat("cuda_raw broadcasts over at most ", kMaxDims,
                                             " dimensions after merging contiguous ones, these shapes need ",
                                             geometry->shape.size(), "; reshape the operands or use the cpu kernel");
    return false;
  }
  return true;
}

void binary(BinaryOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
            void* stream) {
  dispatch_float(dtype, "elementwise op", [&](auto tag) {
    dispatch_binary<decltype(tag)>(op, a, b, y, geometry, as_stream(stream));
  });
}

// ---- cast ----

void cast(const void* x, DType from, void* y, DType to, std::int64_t n, void* stream) {
  if (n <= 0) return;
  if (from == to) {
    XPURT_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * dtype_size(from), cudaMemcpyDeviceToDevice,
                                     as_stream(stream)));
    return;
  }
  dispatch_cast_dtype(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    dispatch_cast_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      const bool vectorized = is_aligned(x, 4 * sizeof(From)) && is_aligned(y, 4 * sizeof(To));
      const std::int64_t work = vectorized ? std::max<std::int64_t>(n / 4, n % 4) : n;
      cast_kernel<From, To><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
          static_cast<const From*>(x), static_cast<To*>(y), n, vectorized);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    });
  });
}

}  // namespace xpuruntime::cuda_raw
