// ONNX reference ops (nn group): see backends/cpu/onnx/onnx_kernels.h. This file holds the helpers of
// onnx_nn_common.h, MatMul and Gemm, and register_nn_ops, which registers the other onnx_nn_*.cpp files.
#include <algorithm>
#include <sstream>

#include "backends/cpu/cpu_common.h"
#include "core/shape_str.h"
#include "core/window_geometry.h"
#include "backends/cpu/onnx/onnx_nn_common.h"
#include "xpuruntime/execution_policy.h"

namespace xpuruntime::onnx_ref {
namespace nn {

std::string shape_str(const std::vector<std::int64_t>& shape) { return detail::shape_str(shape, ","); }

namespace {

// The GEMM context of the reference ops: the default policy's (all cores; OpenBLAS when built with it). Fixed
// once; the context is a plain value, safe to share between threads.
const cpu::CpuContext& gemm_context() {
  static const cpu::CpuContext context = cpu::make_context(ExecutionPolicy{});
  return context;
}

}  // namespace

template <typename C>
void nn_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda, const C* b,
             std::int64_t ldb, C* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  cpu::gemm<C>(gemm_context(), trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}
template void nn_gemm<float>(bool, std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t, const float*,
                             std::int64_t, float*, std::int64_t);
template void nn_gemm<double>(bool, std::int64_t, std::int64_t, std::int64_t, const double*, std::int64_t,
                              const double*, std::int64_t, double*, std::int64_t);

Window read_window(const OpContext& ctx, std::size_t spatial_rank, const std::vector<std::int64_t>& default_kernel) {
  Window w;
  w.kernel = ctx.attr_ints("kernel_shape", default_kernel);
  XPURT_CHECK(w.kernel.size() == spatial_rank, ctx.where(), ": kernel_shape ", shape_str(w.kernel), " must have ",
              spatial_rank, " values (one per spatial dim of the input)");
  for (std::int64_t k : w.kernel) XPURT_CHECK(k > 0, ctx.where(), ": kernel_shape values must be > 0, got ", k);
  const std::vector<std::int64_t> ones(spatial_rank, 1);
  w.strides = ctx.attr_ints("strides", ones);
  w.dilations = ctx.attr_ints("dilations", ones);
  XPURT_CHECK(w.strides.size() == spatial_rank, ctx.where(), ": strides ", shape_str(w.strides), " must have ",
              spatial_rank, " values");
  XPURT_CHECK(w.dilations.size() == spatial_rank, ctx.where(), ": dilations ", shape_str(w.dilations), " must have ",
              spatial_rank, " values");
  for (std::size_t d = 0; d < spatial_rank; ++d) {
    XPURT_CHECK(w.strides[d] > 0, ctx.where(), ": strides must be > 0, got ", shape_str(w.strides));
    XPURT_CHECK(w.dilations[d] > 0, ctx.where(), ": dilations must be > 0, got ", shape_str(w.dilations));
  }
  const std::vector<std::int64_t> pads = ctx.attr_ints("pads", std::vector<std::int64_t>(2 * spatial_rank, 0));
  XPURT_CHECK(pads.size() == 2 * spatial_rank, ctx.where(), ": pads ", shape_str(pads), " must have ", 2 * spatial_rank,
              " values (begins then ends)");
  for (std::int64_t p : pads) XPURT_CHECK(p >= 0, ctx.where(), ": pads must be >= 0, got ", shape_str(pads));
  w.pads_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(spatial_rank));
  w.pads_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(spatial_rank), pads.end());
  return w;
}

std::int64_t geometry_add(const OpContext& ctx, std::int64_t a, std::int64_t b) {
  return detail::window_add(a, b, [&ctx] { return ctx.where(); });
}

std::int64_t geometry_mul(const OpContext& ctx, std::int64_t a, std::int64_t b) {
  return detail::window_mul(a, b, [&ctx] { return ctx.where(); });
}

std::int64_t window_span(const OpContext& ctx, const Window& w, std::size_t d, std::int64_t in) {
  const std::int64_t extent = geometry_add(ctx, geometry_mul(ctx, w.kernel[d] - 1, w.dilations[d]), 1);
  const std::int64_t padded = geometry_add(ctx, geometry_add(ctx, in, w.pads_begin[d]), w.pads_end[d]);
  return padded - extent;  // both >= 0 (kernel >= 1, dilations >= 1, pads >= 0; a size is >= 0): no overflow
}

std::int64_t window_output_size(const OpContext& ctx, const Window& w, std::size_t d, std::int64_t in,
                                bool ceil_mode) {
  const std::int64_t span = window_span(ctx, w, d, in);
  if (span < 0) return 0;
  const std::int64_t s = w.strides[d];
  std::int64_t out = (ceil_mode ? geometry_add(ctx, span, s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + w.pads_begin[d]) --out;  // (out - 1) * s <= span: in range
  return out;
}

void apply_auto_pad(const OpContext& ctx, const std::vector<std::int64_t>& in, Window& w) {
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "NOTSET") return;
  if (auto_pad == "VALID") {
    std::fill(w.pads_begin.begin(), w.pads_begin.end(), 0);
    std::fill(w.pads_end.begin(), w.pads_end.end(), 0);
    return;
  }
  XPURT_CHECK(auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER", ctx.where(), ": auto_pad '", auto_pad,
              "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  for (std::size_t d = 0; d < w.rank(); ++d) {
    const std::int64_t out = (in[d] + w.strides[d] - 1) / w.strides[d];
    const std::int64_t extent = geometry_add(ctx, geometry_mul(ctx, w.kernel[d] - 1, w.dilations[d]), 1);
    // (out - 1) * strides <= in - 1: only adding the extent can leave int64.
    const std::int64_t total = std::max<std::int64_t>(0, geometry_add(ctx, (out - 1) * w.strides[d], extent) - in[d]);
    const std::int64_t small = total / 2;
    w.pads_begin[d] = auto_pad == "SAME_UPPER" ? small : total - small;
    w.pads_end[d] = total - w.pads_begin[d];
  }
}

namespace {

bool is_int_dtype(DType d) {
  return d == DType::kInt8 || d == DType::kUInt8 || d == DType::kInt16 || d == DType::kUInt16 || d == DType::kInt32 ||
         d == DType::kUInt32 || d == DType::kInt64 || d == DType::kUInt64;
}

// ---- MatMul ----

// Batched row-major product of float/double buffers: for each of `batches` (offsets into a and b), [m,k]x[k,n].
template <typename C>
void batched_matmul(const ScratchVector<C>& a, const ScratchVector<C>& b, C* out, std::int64_t m, std::int64_t n,
                    std::int64_t k, const std::vector<std::int64_t>& a_off, const std::vector<std::int64_t>& b_off) {
  // A shared B (a weight) with A's batches contiguous: one GEMM over all of A's rows.
  bool shared_b = true;
  for (std::size_t i = 0; i < a_off.size(); ++i) {
    shared_b = shared_b && b_off[i] == b_off[0] && a_off[i] == static_cast<std::int64_t>(i) * m * k;
  }
  if (shared_b && a_off.size() > 1) {
    nn_gemm<C>(false, static_cast<std::int64_t>(a_off.size()) * m, n, k, a.data(), k, b.data() + b_off[0], n, out, n);
    return;
  }
  for (std::size_t i = 0; i < a_off.size(); ++i) {
    nn_gemm<C>(false, m, n, k, a.data() + a_off[i], k, b.data() + b_off[i], n,
               out + static_cast<std::int64_t>(i) * m * n, n);
  }
}

void matmul(OpContext& ctx) {
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  XPURT_CHECK_TYPE(A.dtype() == B.dtype(), ctx.where(), ": A and B must have the same dtype, got ",
                   dtype_name(A.dtype()), " and ", dtype_name(B.dtype()));
  XPURT_CHECK_TYPE(A.dtype() != DType::kBool, ctx.where(), ": MatMul does not take bool tensors");
  XPURT_CHECK(A.dim() >= 1 && B.dim() >= 1, ctx.where(), ": A and B must have rank >= 1, got ", shape_str(A.shape()),
              " and ", shape_str(B.shape()));
  std::vector<std::int64_t> as = A.shape(), bs = B.shape();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  XPURT_CHECK(bs[bs.size() - 2] == k, ctx.where(), ": inner dimensions differ: A ", shape_str(A.shape()), " and B ",
              shape_str(B.shape()));
  const std::vector<std::int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const std::vector<std::int64_t> batch = broadcast_shapes(a_batch, b_batch, ctx.where());
  std::vector<std::int64_t> out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  Tensor& Y = ctx.allocate_output(0, out_shape, A.dtype());
  // Offsets of each batch's matrices.
  std::vector<std::int64_t> a_off, b_off;
  const auto sa = broadcast_strides(a_batch, batch), sb = broadcast_strides(b_batch, batch);
  const std::vector<std::int64_t> batch_iter = batch.empty() ? std::vector<std::int64_t>{1} : batch;
  const std::vector<std::int64_t> sa1 = batch.empty() ? std::vector<std::int64_t>{0} : sa;
  const std::vector<std::int64_t> sb1 = batch.empty() ? std::vector<std::int64_t>{0} : sb;
  for_each_index2(batch_iter, sa1, sb1, [&](std::int64_t oa, std::int64_t ob, std::int64_t) {
    a_off.push_back(oa * m * k);
    b_off.push_back(ob * k * n);
  });
  if (Y.numel() == 0) return;
  if (A.dtype() == DType::kFloat64) {
    batched_matmul<double>(load_values<double>(A), load_values<double>(B), data<double>(Y), m, n, k, a_off, b_off);
  } else if (A.dtype() == DType::kFloat32) {
    batched_matmul<float>(load_values<float>(A), load_values<float>(B), data<float>(Y), m, n, k, a_off, b_off);
  } else if (is_float_dtype(A.dtype())) {
    ScratchVector<float> y(static_cast<std::size_t>(Y.numel()));
    batched_matmul<float>(load_values<float>(A), load_values<float>(B), y.data(), m, n, k, a_off, b_off);
    store_values(Y, y.data());
  } else {
    // Integers: exact products accumulated in int64, wrapped to the dtype as two's complement.
    const ScratchVector<std::int64_t> a = load_values<std::int64_t>(A), b = load_values<std::int64_t>(B);
    ScratchVector<std::int64_t> y(static_cast<std::size_t>(Y.numel()), 0);
    for (std::size_t bi = 0; bi < a_off.size(); ++bi) {
      std::int64_t* yb = y.data() + static_cast<std::int64_t>(bi) * m * n;
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t p = 0; p < k; ++p) {
          const auto av = static_cast<std::uint64_t>(a[static_cast<std::size_t>(a_off[bi] + i * k + p)]);
          const std::int64_t* brow = b.data() + b_off[bi] + p * n;
          for (std::int64_t j = 0; j < n; ++j) {
            yb[i * n + j] = static_cast<std::int64_t>(static_cast<std::uint64_t>(yb[i * n + j]) +
                                                      av * static_cast<std::uint64_t>(brow[j]));
          }
        }
      }
    }
    visit_dtype(Y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        T* p = data<T>(Y);
        for (std::size_t i = 0; i < y.size(); ++i) p[i] = static_cast<T>(y[i]);
      }
    });
  }
}

// ---- Gemm ----

template <typename C>
void gemm_float(OpContext& ctx, Tensor& Y, std::int64_t M, std::int64_t N, std::int64_t K, bool trans_a, bool trans_b,
                double alpha, double beta) {
  ScratchVector<C> a = load_values<C>(ctx.input(0));
  const ScratchVector<C> b = load_values<C>(ctx.input(1));
  if (trans_a) {
    ScratchVector<C> t(a.size());
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t p = 0; p < K; ++p)
        t[static_cast<std::size_t>(i * K + p)] = a[static_cast<std::size_t>(p * M + i)];
    }
    a.swap(t);
  }
  ScratchVector<C> y(static_cast<std::size_t>(M * N), C(0));
  nn_gemm<C>(trans_b, M, N, K, a.data(), K, b.data(), trans_b ? K : N, y.data(), N);
  for (C& v : y) v = static_cast<C>(alpha * static_cast<double>(v));
  if (ctx.has_input(2) && beta != 0.0) {
    const Tensor& Ct = ctx.input(2);
    const ScratchVector<C> c = load_values<C>(Ct);
    const auto sc = broadcast_strides(Ct.shape(), {M, N});
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        y[static_cast<std::size_t>(i * N + j)] +=
            static_cast<C>(beta * static_cast<double>(c[static_cast<std::size_t>(i * sc[0] + j * sc[1])]));
      }
    }
  }
  store_values(Y, y.data());
}

void gemm_op(OpContext& ctx) {
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  XPURT_CHECK_TYPE(A.dtype() == B.dtype(), ctx.where(), ": A and B must have the same dtype, got ",
                   dtype_name(A.dtype()), " and ", dtype_name(B.dtype()));
  XPURT_CHECK_TYPE(is_float_dtype(A.dtype()) || is_int_dtype(A.dtype()), ctx.where(), ": unsupported dtype ",
                   dtype_name(A.dtype()));
  XPURT_CHECK(A.dim() == 2 && B.dim() == 2, ctx.where(), ": A and B must be 2-D, got ", shape_str(A.shape()), " and ",
              shape_str(B.shape()));
  const bool trans_a = ctx.attr_int("transA", 0) != 0, trans_b = ctx.attr_int("transB", 0) != 0;
  const std::int64_t M = trans_a ? A.shape()[1] : A.shape()[0];
  const std::int64_t K = trans_a ? A.shape()[0] : A.shape()[1];
  const std::int64_t KB = trans_b ? B.shape()[1] : B.shape()[0];
  const std::int64_t N = trans_b ? B.shape()[0] : B.shape()[1];
  XPURT_CHECK(K == KB, ctx.where(), ": inner dimensions differ: A ", shape_str(A.shape()),
              (trans_a ? " (transposed)" : ""), " and B ", shape_str(B.shape()), (trans_b ? " (transposed)" : ""));
  const double alpha = ctx.attr_float("alpha", 1.0), beta = ctx.attr_float("beta", 1.0);
  if (ctx.has_input(2)) {
    const Tensor& Ct = ctx.input(2);
    XPURT_CHECK(Ct.dim() <= 2, ctx.where(), ": C must have rank <= 2, got ", shape_str(Ct.shape()));
    // Unidirectional broadcast of C to [M, N].
    const std::vector<std::int64_t> bc = broadcast_shapes(Ct.shape(), {M, N}, ctx.where());
    XPURT_CHECK(bc == (std::vector<std::int64_t>{M, N}), ctx.where(), ": C ", shape_str(Ct.shape()),
                " cannot be broadcast to [", M, ",", N, "]");
  }
  Tensor& Y = ctx.allocate_output(0, {M, N}, A.dtype());
  if (Y.numel() == 0) return;
  if (A.dtype() == DType::kFloat64 || is_int_dtype(A.dtype())) {
    if (is_int_dtype(A.dtype())) {
      // Integer Gemm: exact int64 accumulation, then alpha/beta scaling in double.
      const auto a = load_values<std::int64_t>(A), b = load_values<std::int64_t>(B);
      ScratchVector<double> y(static_cast<std::size_t>(M * N), 0.0);
      const ScratchVector<std::int64_t> c =
          ctx.has_input(2) ? load_values<std::int64_t>(ctx.input(2)) : ScratchVector<std::int64_t>{};
      const auto sc =
          ctx.has_input(2) ? broadcast_strides(ctx.input(2).shape(), {M, N}) : std::vector<std::int64_t>{0, 0};
      for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < N; ++j) {
          std::uint64_t acc = 0;  // wraps like the integer type would
          for (std::int64_t p = 0; p < K; ++p) {
            const std::int64_t av =
                trans_a ? a[static_cast<std::size_t>(p * M + i)] : a[static_cast<std::size_t>(i * K + p)];
            const std::int64_t bv =
                trans_b ? b[static_cast<std::size_t>(j * K + p)] : b[static_cast<std::size_t>(p * N + j)];
            acc += static_cast<std::uint64_t>(av) * static_cast<std::uint64_t>(bv);
          }
          double v = alpha * static_cast<double>(static_cast<std::int64_t>(acc));
          if (!c.empty()) v += beta * static_cast<double>(c[static_cast<std::size_t>(i * sc[0] + j * sc[1])]);
          y[static_cast<std::size_t>(i * N + j)] = v;
        }
      }
      store_values(Y, y.data());
    } else {
      gemm_float<double>(ctx, Y, M, N, K, trans_a, trans_b, alpha, beta);
    }
  } else {
    gemm_float<float>(ctx, Y, M, N, K, trans_a, trans_b, alpha, beta);
  }
}

}  // namespace

void register_nn_matmul_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "MatMul", matmul);
  kernels.add("", "Gemm", gemm_op);
}

}  // namespace nn

void register_nn_ops(NodeKernelRegistrar& kernels) {
  nn::register_nn_matmul_ops(kernels);
  nn::register_nn_conv_ops(kernels);
  nn::register_nn_pool_ops(kernels);
  nn::register_nn_norm_ops(kernels);
  nn::register_nn_resize_ops(kernels);
  nn::register_nn_rnn_ops(kernels);
}

}  // namespace xpuruntime::onnx_ref
