// GEMM of the cpu backend (OpenBLAS or the blocked fallback below) and the ops built directly on it: matmul
// (batch dims broadcast), linear (weight layout nk/kn, bias, activation) and linear_grad_weight.
//
// Note [Fallback GEMM]
// Builds without OpenBLAS (the GPU machines) use this GEMM, so it is tested on its own against a naive loop
// (tests/cpp/backends/cpu/test_cpu_backend.cpp, XPURT_CPU_GEMM=fallback). It is the GotoBLAS blocking: C is cut into
// kBlockM x kBlockN tiles, spread over the threads (independent outputs, so the result does not depend on the
// thread count). For each tile, K is walked in kBlockK slices in increasing order; each slice of A is packed
// into micro-panels of kMicroM rows stored column by column, and each slice of op(B) into micro-panels of
// kMicroN columns stored row by row (which also makes a transposed B unit-stride), zero-padded at the edges.
// The micro-kernel keeps a kMicroM x kMicroN block of C in registers over the whole slice (one broadcast of A
// and one vector load of B per step, auto-vectorized), then adds it to C. Each element of C is therefore
// the sum, in order, of its per-slice partial sums, each accumulated in order of k: fixed, whatever the
// thread count.
//
// Note [Parallel GEMM blocks]
// OpenBLAS runs on one thread (set once, the first time a GEMM goes to it): its own pool of pthreads spin-yields
// after every call and, beside the backend's pool, oversubscribes the cores (Note [CPU worker threads] in
// cpu_threads.cpp). With more than one thread, a product of at least kBlasBlockWork * 2 multiply-adds is instead
// cut into a grid of blocks of C, each one cblas call on the backend's pool: a side of the blocks is halved while
// there are at most kBlasBlocksPerThread blocks per thread (a worker that starts late still finds one) and each
// keeps kBlasBlockWork multiply-adds or more, 128 rows and 512 columns (each call packs its own panels of A and B,
// so many small blocks pack the same data again; and calls on fewer columns ran at 40% of the speed on this Zen
// machine: a fresh process's 128-column calls to Debian's OpenBLAS 0.3.21 reach 14 GFLOP/s, 512-column ones
// 28-32). On one thread a GEMM is one call. The blocks depend on the shape and the thread count only, so a GEMM
// gives the same bits run after run for a given intra_op_threads (as it did with OpenBLAS's own threads, whose
// partition followed OPENBLAS_NUM_THREADS), not across thread counts: OpenBLAS does not give an element of C the
// same bits in every block that contains it. The fallback GEMM's bits never depend on the thread count.
//
// Note [Packed GEMM]
// On an x86 CPU with AVX2 or AVX-512, float GEMMs run on the backend's own packed GEMM (XPURT_CPU_GEMM=auto;
// "packed" asks for it on any CPU, "blas" for OpenBLAS), but for the small ones below. Debian's OpenBLAS 0.3.21 reached
// about 100 GFLOP/s per core on this project's Zen 5 machine (its Cooper Lake kernels), half of what the core's two
// 512-bit FMA pipes give and of what ONNX Runtime's MLAS reached in the same process. The GEMM is the GotoBLAS
// structure with the micro-kernel written once in cpu_isa_kernels.inc through GCC's vector extension and compiled
// per instruction set (Note [CPU instruction sets] in cpu_isa_baseline.cpp): C is cut into tiles of kPackedTileM
// rows x kPackedTileN columns spread over the pool's threads (independent outputs: the bits do not depend on the
// thread count); in a tile, K is walked in slices of gemm_kc, A's slice is packed into micro-panels of gemm_mr rows
// and op(B)'s into micro-panels of gemm_nr columns (a transposed B becomes unit-stride there), and each gemm_mr x
// gemm_nr micro-tile of C is summed in registers over the slice (AVX-512: 6 x 64 floats in 24 zmm registers, one
// broadcast of A and four loads of B per step) and then added to C. Fewer than 8 rows or 8 columns (GEMV-like
// products: a linear layer at batch 1, a 1x1 convolution of a 1x1 image) stay on OpenBLAS when the build has it:
// packing all of B for one row of A (or all of A for one column of B) would triple the bytes moved. So do products
// of fewer than 64K multiply-adds (a windowed attention's 49 x 49 x 8 batches), whose packing and scratch cost
// more than OpenBLAS's small-matrix kernels. float64 GEMMs stay on OpenBLAS or the blocked fallback.
//
// Note [OpenBLAS older than the CPU]
// OpenBLAS picks its kernels by the CPU model it knows at load time; Debian's 0.3.21 does not know Emerald Rapids
// (family 6, model 207) and falls back to its Prescott kernels (SSE3): on such a machine the small products above ran
// at a third of ONNX Runtime's speed (a [16, 12, 24, 64] attention 2179 against 770 us, one thread; 915 us with
// OPENBLAS_CORETYPE=SkylakeX). When OpenBLAS's core (openblas_get_corename) is one without AVX2 while the CPU has
// it, the packed GEMM takes the small products too (1446-1728 us there), and the plan's summary says why. Products of
// fewer than 8 rows or columns take the skinny kernels then (Note [Skinny GEMM]). OPENBLAS_CORETYPE set to the CPU's
// generation (SkylakeX, Haswell, Zen) before the process starts is better still; docs/native_engine.md says so.
//
// Note [Skinny GEMM]
// A product with fewer than 8 rows or columns (a linear layer at batch 1, a convolution of a 2x2 plane) is a few dot
// products or a few AXPYs per output, which the packed GEMM's micro-tiles would mostly waste. Where OpenBLAS is older
// than the CPU (above) or absent, or XPURT_CPU_GEMM=packed asks for the backend's own GEMMs, they run on two kernels
// of their own, compiled per instruction set:
//   - fewer than 8 columns: C[i, j] is the dot product of A's row i and op(B)'s column j, which is B's row j when
//     B is transposed and a row of B transposed into scratch otherwise (k x n floats: a few KiB);
//   - fewer than 8 rows, B transposed: C[i, j] is the dot product of B's row j and A's row i, the same kernel with the
//     roles swapped; B not transposed: the rows of C are summed over the depth in registers, a few vectors of columns
//     at a time (AXPYs of B's rows).
// Rows (or columns) are spread over the pool's threads; each output is summed by one thread in a fixed order, so the
// bits do not depend on the thread count. The tiny suite ResNet's 2x2 convolutions (32 x 4 x 144) ran on OpenBLAS's
// Prescott kernels at a quarter of its run on this machine.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"

#if XPURT_WITH_BLAS
#include <cblas.h>
#endif

namespace xpuruntime::cpu {

namespace {

constexpr std::int64_t kBlockM = 64;
constexpr std::int64_t kBlockN = 256;
constexpr std::int64_t kBlockK = 256;
constexpr std::int64_t kMicroM = 4;
constexpr std::int64_t kMicroN = 8;
static_assert(kBlockM % kMicroM == 0 && kBlockN % kMicroN == 0, "tiles are whole micro-panels");

// A[row0 .. row0 + rows, col0 .. col0 + depth) as micro-panels of kMicroM rows, each stored column by column
// (panel[(i / kMicroM) * kMicroM * depth + p * kMicroM + i % kMicroM]); rows past the edge are zero.
template <typename T>
void pack_a(const T* a, std::int64_t lda, std::int64_t row0, std::int64_t col0, std::int64_t rows, std::int64_t depth,
            T* panel) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += kMicroM) {
    T* out = panel + r0 * depth;
    for (std::int64_t i = 0; i < kMicroM; ++i) {
      if (r0 + i < rows) {
        const T* src = a + (row0 + r0 + i) * lda + col0;
        for (std::int64_t p = 0; p < depth; ++p) out[p * kMicroM + i] = src[p];
      } else {
        for (std::int64_t p = 0; p < depth; ++p) out[p * kMicroM + i] = T(0);
      }
    }
  }
}

// op(B)[row0 .. row0 + depth, col0 .. col0 + cols) as micro-panels of kMicroN columns, each stored row by row
// (panel[(j / kMicroN) * kMicroN * depth + p * kMicroN + j % kMicroN]); columns past the edge are zero.
// trans: op(B) = B^T with B stored [n, k].
template <typename T>
void pack_b(bool trans, const T* b, std::int64_t ldb, std::int64_t row0, std::int64_t col0, std::int64_t depth,
            std::int64_t cols, T* panel) {
  for (std::int64_t c0 = 0; c0 < cols; c0 += kMicroN) {
    T* out = panel + c0 * depth;
    const std::int64_t width = std::min(kMicroN, cols - c0);
    if (!trans) {
      for (std::int64_t p = 0; p < depth; ++p) {
        const T* src = b + (row0 + p) * ldb + col0 + c0;
        for (std::int64_t j = 0; j < kMicroN; ++j) out[p * kMicroN + j] = j < width ? src[j] : T(0);
      }
    } else {
      for (std::int64_t j = 0; j < kMicroN; ++j) {
        if (j < width) {
          const T* src = b + (col0 + c0 + j) * ldb + row0;  // a row of B is a column of op(B)
          for (std::int64_t p = 0; p < depth; ++p) out[p * kMicroN + j] = src[p];
        } else {
          for (std::int64_t p = 0; p < depth; ++p) out[p * kMicroN + j] = T(0);
        }
      }
    }
  }
}

// c[0 .. rows, 0 .. cols) += a_panel (kMicroM x depth) * b_panel (depth x kMicroN), rows <= kMicroM and
// cols <= kMicroN (the valid part of a zero-padded micro-tile).
template <typename T>
void micro_kernel(const T* __restrict a_panel, const T* __restrict b_panel, std::int64_t depth, T* c, std::int64_t ldc,
                  std::int64_t rows, std::int64_t cols) {
  T acc[kMicroM][kMicroN] = {};
  for (std::int64_t p = 0; p < depth; ++p) {
    const T* __restrict a = a_panel + p * kMicroM;
    const T* __restrict b = b_panel + p * kMicroN;
    for (std::int64_t i = 0; i < kMicroM; ++i) {
      for (std::int64_t j = 0; j < kMicroN; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  if (rows == kMicroM && cols == kMicroN) {
    for (std::int64_t i = 0; i < kMicroM; ++i) {
      for (std::int64_t j = 0; j < kMicroN; ++j) c[i * ldc + j] += acc[i][j];
    }
    return;
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) c[i * ldc + j] += acc[i][j];
  }
}

// The threads a product of m x n x k multiply-adds runs on: small products do not pay for waking threads.
int gemm_threads(int threads, std::int64_t m, std::int64_t n, std::int64_t k) {
  return m * n * k < (std::int64_t{1} << 18) ? 1 : threads;
}

// C (zeroed by the caller) += A * op(B); see Note [Fallback GEMM].
template <typename T>
void fallback_gemm(int threads, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
                   std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  const std::int64_t tiles_m = (m + kBlockM - 1) / kBlockM;
  const std::int64_t tiles_n = (n + kBlockN - 1) / kBlockN;
  parallel_for(tiles_m * tiles_n, gemm_threads(threads, m, n, k), 1, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<T> panel_a(static_cast<std::size_t>(kBlockM * kBlockK));
    ScratchVector<T> panel_b(static_cast<std::size_t>(kBlockK * kBlockN));
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const std::int64_t i0 = (tile / tiles_n) * kBlockM;
      const std::int64_t j0 = (tile % tiles_n) * kBlockN;
      const std::int64_t rows = std::min(kBlockM, m - i0);
      const std::int64_t cols = std::min(kBlockN, n - j0);
      for (std::int64_t p0 = 0; p0 < k; p0 += kBlockK) {
        const std::int64_t depth = std::min(kBlockK, k - p0);
        pack_a(a, lda, i0, p0, rows, depth, panel_a.data());
        pack_b(trans_b, b, ldb, p0, j0, depth, cols, panel_b.data());
        for (std::int64_t jr = 0; jr < cols; jr += kMicroN) {
          for (std::int64_t ir = 0; ir < rows; ir += kMicroM) {
            micro_kernel(panel_a.data() + ir * depth, panel_b.data() + jr * depth, depth, c + (i0 + ir) * ldc + j0 + jr,
                         ldc, std::min(kMicroM, rows - ir), std::min(kMicroN, cols - jr));
          }
        }
      }
    }
  });
}

}  // namespace

// Note [OpenBLAS older than the CPU]: OpenBLAS's cores without AVX2 (its names, lowercase).
bool blas_core_lacks_avx2(const std::string& core) {
  static const char* const kOld[] = {"prescott", "core2",     "penryn",  "dunnington", "nehalem", "atom",
                                     "katmai",   "coppermine", "northwood", "banias",   "opteron", "opteron_sse3",
                                     "barcelona", "bobcat",    "sandybridge", "bulldozer", "piledriver", "unknown"};
  return std::any_of(std::begin(kOld), std::end(kOld), [&](const char* name) { return core == name; });
}

namespace {

#if XPURT_WITH_BLAS
bool fits_blas_int(std::int64_t value) { return value <= static_cast<std::int64_t>(INT_MAX); }

// Note [Parallel GEMM blocks].
constexpr std::int64_t kBlasBlockWork = std::int64_t{1} << 21;
constexpr std::int64_t kBlasMaxBlocks = 64;
constexpr std::int64_t kBlasBlocksPerThread = 2;
constexpr std::int64_t kBlasMinBlockRows = 128;
constexpr std::int64_t kBlasMinBlockCols = 512;
constexpr std::int64_t kBlasBlockAlign = 16;

void use_one_blas_thread() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

void blas_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
               const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), 0.0f, c, static_cast<blasint>(ldc));
}

void blas_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda,
               const double* b, std::int64_t ldb, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), 0.0, c, static_cast<blasint>(ldc));
}

void blas_gemv(bool trans, std::int64_t rows, std::int64_t cols, const float* a, std::int64_t lda, const float* x,
               std::int64_t incx, float* y, std::int64_t incy) {
  cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows), static_cast<blasint>(cols),
              1.0f, a, static_cast<blasint>(lda), x, static_cast<blasint>(incx), 0.0f, y, static_cast<blasint>(incy));
}

void blas_gemv(bool trans, std::int64_t rows, std::int64_t cols, const double* a, std::int64_t lda, const double* x,
               std::int64_t incx, double* y, std::int64_t incy) {
  cblas_dgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows), static_cast<blasint>(cols),
              1.0, a, static_cast<blasint>(lda), x, static_cast<blasint>(incx), 0.0, y, static_cast<blasint>(incy));
}

// Note [GEMV through OpenBLAS's gemv]
// A product of one row (a linear layer at batch 1) or one column went to cblas_sgemm, which in Debian's OpenBLAS
// 0.3.21 packs op(B) (or A) whole for that one row: 2.5-5x ONNX Runtime's time on [1, 4099] x [4099, 4093]
// (2026-12-07), the weight's bytes moved three times. cblas_sgemv reads them once. The outputs are cut into blocks
// on the pool, as Note [Parallel GEMM blocks] does (kBlasBlockAlign-aligned, at least kBlasMinGemvBlock outputs, two
// per thread): the blocks depend on the shape and the thread count only.
constexpr std::int64_t kBlasMinGemvBlock = 256;

// y[0, outputs) = the gemv of the outputs' block: `block(first, count)` computes outputs [first, first + count).
template <typename Block>
void blocked_gemv(int threads, std::int64_t outputs, std::int64_t depth, Block&& block) {
  const std::int64_t most = std::max<std::int64_t>(1, std::min<std::int64_t>(2 * threads, outputs / kBlasMinGemvBlock));
  const std::int64_t blocks = threads <= 1 || outputs * depth < 2 * kBlasBlockWork ? 1 : most;
  const auto edge = [&](std::int64_t i) {
    return i == blocks ? outputs : outputs * i / blocks / kBlasBlockAlign * kBlasBlockAlign;
  };
  if (blocks == 1) {
    block(0, outputs);
    return;
  }
  parallel_for(blocks, threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) block(edge(i), edge(i + 1) - edge(i));
  });
}

// C = A * op(B) through OpenBLAS, in blocks on the backend's pool when the product is large (Note [Parallel GEMM
// blocks]); one row or one column through its gemv (Note [GEMV through OpenBLAS's gemv]).
template <typename T>
void blocked_blas_gemm(int threads, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
                       std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  use_one_blas_thread();
  if (m == 1) {  // c[j] = sum_p a[p] op(B)[p, j]: B [k, n] transposed by gemv, or B [n, k] as it is
    blocked_gemv(threads, n, k, [&](std::int64_t first, std::int64_t count) {
      if (trans_b) {
        blas_gemv(false, count, k, b + first * ldb, ldb, a, 1, c + first, 1);
      } else {
        blas_gemv(true, k, count, b + first, ldb, a, 1, c + first, 1);
      }
    });
    return;
  }
  if (n == 1) {  // c[i] = sum_p A[i, p] op(B)[p]: op(B)'s column is B's column (stride ldb) or B's row
    blocked_gemv(threads, m, k, [&](std::int64_t first, std::int64_t count) {
      blas_gemv(false, count, k, a + first * lda, lda, b, trans_b ? 1 : ldb, c + first * ldc, ldc);
    });
    return;
  }
  // The grid: rows_split x cols_split blocks, halving a side of the blocks while there are at most
  // kBlasBlocksPerThread per thread (kBlasMaxBlocks in all) of kBlasBlockWork multiply-adds or more and their sides
  // stay kBlasMinBlockRows / kBlasMinBlockCols or longer. One thread: one call.
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const std::int64_t most_blocks = std::min<std::int64_t>(kBlasMaxBlocks, kBlasBlocksPerThread * threads);
  std::int64_t rows_split = 1, cols_split = 1;
  for (;;) {
    const std::int64_t blocks = 2 * rows_split * cols_split;
    const bool small = work / static_cast<double>(blocks) < static_cast<double>(kBlasBlockWork);
    if (threads <= 1 || blocks > most_blocks || small) break;
    const bool rows_can = m / (2 * rows_split) >= kBlasMinBlockRows;
    const bool cols_can = n / (2 * cols_split) >= kBlasMinBlockCols;
    if (!rows_can && !cols_can) break;
    // The longer side relative to its minimum first.
    const bool split_rows =
        rows_can && (!cols_can || m / rows_split * kBlasMinBlockCols > n / cols_split * kBlasMinBlockRows);
    (split_rows ? rows_split : cols_split) *= 2;
  }
  if (rows_split * cols_split == 1) {
    blas_gemm(trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  // Edges of block i of `split` over `extent`, on multiples of kBlasBlockAlign.
  const auto edge = [](std::int64_t extent, std::int64_t split, std::int64_t i) {
    return i == split ? extent : extent * i / split / kBlasBlockAlign * kBlasBlockAlign;
  };
  parallel_for(rows_split * cols_split, threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t block = begin; block < end; ++block) {
      const std::int64_t r = block / cols_split, q = block % cols_split;
      const std::int64_t row = edge(m, rows_split, r), rows = edge(m, rows_split, r + 1) - row;
      const std::int64_t col = edge(n, cols_split, q), cols = edge(n, cols_split, q + 1) - col;
      blas_gemm(trans_b, rows, cols, k, a + row * lda, lda, trans_b ? b + col * ldb : b + col, ldb, c + row * ldc + col,
                ldc);
    }
  });
}
#endif

// Note [Packed GEMM]: fewer rows or columns than this, or fewer multiply-adds, go to OpenBLAS (when the build has it).
constexpr std::int64_t kPackedMinRows = 8;
constexpr std::int64_t kPackedMinWork = std::int64_t{1} << 16;
constexpr std::int64_t kPackedTileMicroRows = 32;  // tile rows = 32 micro-tiles of gemm_mr (192 on AVX-512)
constexpr std::int64_t kPackedTileN = 512;         // a multiple of every gemm_nr (8, 16, 64)

// Products with fewer than kPackedMinRows rows or columns on the skinny kernels (Note [Skinny GEMM]).
void skinny_gemm(const CpuContext& context, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  const IsaKernels& isa = *context.isa;
  const int threads = gemm_threads(context.threads, m, n, k);
  // The grain of a loop whose items hold `work` multiply-adds each: a chunk holds at least 16K.
  const auto grain = [](std::int64_t work) { return std::max<std::int64_t>(1, (std::int64_t{1} << 14) / work); };
  if (n < kPackedMinRows) {  // dot products of A's rows with op(B)'s n columns
    const float* few = b;
    std::int64_t ld_few = ldb;
    UninitScratch<float> transposed;
    if (!trans_b) {
      transposed.resize(static_cast<std::size_t>(n * k));
      for (std::int64_t p = 0; p < k; ++p) {
        for (std::int64_t j = 0; j < n; ++j) transposed[static_cast<std::size_t>(j * k + p)] = b[p * ldb + j];
      }
      few = transposed.data();
      ld_few = k;
    }
    parallel_for(m, threads, grain(n * k),
                 [&](std::int64_t begin, std::int64_t end) {
                   isa.gemm_dots_f32(a + begin * lda, lda, end - begin, few, ld_few, static_cast<int>(n), k,
                                     c + begin * ldc, ldc, 1);
                 });
    return;
  }
  if (trans_b) {  // fewer rows than kPackedMinRows: dot products of B's rows with A's m rows
    parallel_for(n, threads, grain(m * k),
                 [&](std::int64_t begin, std::int64_t end) {
                   isa.gemm_dots_f32(b + begin * ldb, ldb, end - begin, a, lda, static_cast<int>(m), k, c + begin, 1,
                                     ldc);
                 });
    return;
  }
  constexpr std::int64_t kColumnBlock = 64;  // the AXPY form's columns per item of the loop
  const std::int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  parallel_for(blocks, threads, grain(kColumnBlock * m * k),
               [&](std::int64_t begin, std::int64_t end) {
                 const std::int64_t j0 = begin * kColumnBlock, j1 = std::min(n, end * kColumnBlock);
                 isa.gemm_few_rows_f32(a, lda, static_cast<int>(m), b + j0, ldb, j1 - j0, k, c + j0, ldc);
               });
}

// C = A * op(B), or with rows.rows, C = A * B with B given by rows (Note [Packed GEMM]).
void packed_gemm(const CpuContext& context, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, const RowsOfB& rows, float* c,
                 std::int64_t ldc, const float* packed_a, const float* packed_b = nullptr) {
  const IsaKernels& isa = *context.isa;
  const auto round_up = [](std::int64_t value, std::int64_t step) { return (value + step - 1) / step * step; };
  // Row tiles of at most kPackedTileMicroRows micro-rows, as even as whole micro-rows allow (256 rows: 132 and 124,
  // not 192 and 64, which two threads shared 3:1).
  const auto even_rows = [&](std::int64_t count) {  // the height of `count` row tiles, in whole micro-rows
    return std::max(round_up((m + count - 1) / count, isa.gemm_mr), isa.gemm_mr);
  };
  std::int64_t tile_m = even_rows((m + kPackedTileMicroRows * isa.gemm_mr - 1) / (kPackedTileMicroRows * isa.gemm_mr));
  std::int64_t tiles_m = (m + tile_m - 1) / tile_m;
  const int used_threads = gemm_threads(context.threads, m, n, k);
  // Note [Balanced GEMM tiles]
  // Tiles were kPackedTileN columns wide whatever the threads: a BERT-base projection (128 x 768 -> 768) made one
  // tile of 512 columns and one of 256, so two threads split it 2:1, and a 512-column product at most 192 rows ran on
  // one thread. When C has fewer tiles than kChunksPerThread per thread, its columns are now cut into the fewest
  // tiles of whole micro-panels (at most kPackedTileN) whose count is a multiple of the threads. (Packing A once
  // for all the tiles of its rows instead of once per tile was slower: that packing is serial.) Which tile computes a
  // column does not change its sums (each depth slice is added in order), so the bits do not depend on the thread
  // count.
  std::int64_t tile_n = kPackedTileN;
  if (used_threads > 1 && tiles_m * ((n + tile_n - 1) / tile_n) < kChunksPerThread * used_threads) {
    // The first count of column tiles from the default one up whose whole-micro-panel width gives a tile count that is
    // a multiple of the threads (rounding the width to micro-panels can change the count: 3136 columns in 8 tiles of
    // 392 are 7 of 448).
    for (std::int64_t wanted = (n + kPackedTileN - 1) / kPackedTileN; wanted <= n / isa.gemm_nr + 1; ++wanted) {
      const std::int64_t width = std::max(round_up((n + wanted - 1) / wanted, isa.gemm_nr), isa.gemm_nr);
      if (width <= kPackedTileN && (tiles_m * ((n + width - 1) / width)) % used_threads == 0) {
        tile_n = width;
        break;
      }
    }
  }
  const std::int64_t tiles_n = (n + tile_n - 1) / tile_n;
  // Columns too few to cut (ResNet-50's last convolutions: 49 pixels, one micro-panel) leave the rows: 512 of them in
  // tiles of 192 were 3 tiles on 2 threads, one thread idle a third of the time. The first count of row tiles from the
  // default one up whose whole-micro-row height makes the tile count a multiple of the threads (the same sums: which
  // tile computes a row does not change them).
  if (used_threads > 1 && (tiles_m * tiles_n) % used_threads != 0 &&
      tiles_m * tiles_n < kChunksPerThread * used_threads) {
    for (std::int64_t wanted = tiles_m; wanted <= m / isa.gemm_mr + 1; ++wanted) {
      const std::int64_t height = even_rows(wanted);
      const std::int64_t count = (m + height - 1) / height;
      if (height <= tile_m && (count * tiles_n) % used_threads == 0) {
        tile_m = height;
        tiles_m = count;
        break;
      }
    }
  }
  parallel_for(tiles_m * tiles_n, used_threads, 1, [&](std::int64_t begin, std::int64_t end) {
    // Sized to the product, not zero-filled (packing writes every element a micro-tile reads).
    const std::int64_t depth = std::max<std::int64_t>(1, std::min(k, isa.gemm_kc));
    UninitScratch<float> pack_a(
        packed_a != nullptr ? 0 : static_cast<std::size_t>(round_up(std::min(tile_m, m), isa.gemm_mr) * depth));
    UninitScratch<float> pack_b(packed_b != nullptr || rows.in_place  // B already packed, or read in place
                                    ? 0
                                    : static_cast<std::size_t>(round_up(std::min(tile_n, n), isa.gemm_nr) * depth));
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const std::int64_t i0 = (tile / tiles_n) * tile_m;
      const std::int64_t j0 = (tile % tiles_n) * tile_n;
      GemmTile t;
      t.rows = std::min(tile_m, m - i0);
      t.cols = std::min(tile_n, n - j0);
      t.depth = k;
      t.a = a + i0 * lda;
      t.lda = lda;
      t.b = b == nullptr ? nullptr : (trans_b ? b + j0 * ldb : b + j0);
      t.ldb = ldb;
      t.trans_b = trans_b;
      t.b_rows = rows;
      t.b_rows.col0 = rows.col0 + j0;
      t.c = c + i0 * ldc + j0;
      t.ldc = ldc;
      t.pack_a = pack_a.data();
      t.pack_b = pack_b.data();
      t.packed_a = packed_a;
      t.packed_a_rows = round_up(m, isa.gemm_mr);
      t.packed_a_row0 = i0;
      t.packed_b = packed_b;
      t.packed_b_cols = round_up(n, isa.gemm_nr);
      t.packed_b_col0 = j0;
      isa.gemm_tile_f32(t);
    }
  });
}

}  // namespace

bool gemm_is_packed(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k) {
  const bool fits_packed = m >= kPackedMinRows && n >= kPackedMinRows &&
                           (m * n * k >= kPackedMinWork || context.packed_small_gemms);
  const bool skinny = m < kPackedMinRows || n < kPackedMinRows;
  return m > 0 && n > 0 && k > 0 && context.gemm == GemmImpl::kPacked && !(context.skinny_gemms && skinny) &&
         (fits_packed || !XPURT_WITH_BLAS);
}

template <typename T>
void gemm(const CpuContext& context, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    const bool skinny = m < kPackedMinRows || n < kPackedMinRows;
    if (context.skinny_gemms && skinny && k > 0) {
      skinny_gemm(context, trans_b, m, n, k, a, lda, b, ldb, c, ldc);  // Note [Skinny GEMM]
      return;
    }
    if (gemm_is_packed(context, m, n, k)) {
      packed_gemm(context, trans_b, m, n, k, a, lda, b, ldb, RowsOfB{}, c, ldc, nullptr);
      return;
    }
  }
#if XPURT_WITH_BLAS
  if ((context.gemm == GemmImpl::kBlas || context.gemm == GemmImpl::kPacked) && k > 0 && fits_blas_int(m) &&
      fits_blas_int(n) && fits_blas_int(k) && fits_blas_int(lda) && fits_blas_int(ldb) && fits_blas_int(ldc)) {
    blocked_blas_gemm(context.threads, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
#endif
  for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  fallback_gemm(context.threads, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

std::string packed_gemm_limits(const CpuContext& context) {
  if (context.packed_small_gemms) {
    return detail::str_cat("skinny kernels under ", kPackedMinRows,
                           " rows or columns, small products packed too: openblas's ", blas_core_name(),
                           " kernels lack this CPU's ", context.isa->name, ", Note [OpenBLAS older than the CPU]");
  }
  if (context.skinny_gemms) {
    return detail::str_cat("skinny kernels under ", kPackedMinRows, " rows or columns, openblas under ",
                           kPackedMinWork / 1024, "K multiply-adds");
  }
  return detail::str_cat("openblas under ", kPackedMinRows, " rows, ", kPackedMinRows, " columns or ",
                         kPackedMinWork / 1024, "K multiply-adds");
}

std::string blas_core_name() {
#if XPURT_WITH_BLAS
  std::string core = openblas_get_corename() != nullptr ? openblas_get_corename() : "unknown";
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  return core;
#else
  return "none";
#endif
}

bool blas_older_than(const IsaKernels& isa) {
#if XPURT_WITH_BLAS
  static const bool lacks = blas_core_lacks_avx2(blas_core_name());
  return lacks && std::string(isa.name) != "baseline";
#else
  (void)isa;
  return false;
#endif
}

void gemm_rows(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
               std::int64_t lda, const RowsOfB& b, float* c, std::int64_t ldc, const float* packed_a) {
  XPURT_CHECK(context.gemm == GemmImpl::kPacked, "gemm_rows runs on the packed GEMM only");
  XPURT_CHECK(b.segment >= 1 && b.pitch >= b.segment, "gemm_rows: runs of ", b.segment, " every ", b.pitch);
  if (m <= 0 || n <= 0) return;
  packed_gemm(context, false, m, n, k, a, lda, nullptr, 0, b, c, ldc, packed_a);
}

void gemm_packed_a(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* packed_a,
                   const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  XPURT_CHECK(gemm_is_packed(context, m, n, k), "gemm_packed_a: a ", m, " x ", n, " x ", k,
              " product the packed GEMM does not take");
  packed_gemm(context, false, m, n, k, nullptr, 0, b, ldb, RowsOfB{}, c, ldc, packed_a);
}

ScratchVector<float> pack_gemm_b(const CpuContext& context, std::int64_t k, std::int64_t n, const float* b,
                                 std::int64_t ldb, bool trans) {
  const IsaKernels& isa = *context.isa;
  // Zero-filled: pack_b pads a micro-panel's columns only to the next whole vector, which is all a micro-tile reads.
  ScratchVector<float> packed(static_cast<std::size_t>((n + isa.gemm_nr - 1) / isa.gemm_nr * isa.gemm_nr * k), 0.0f);
  isa.pack_gemm_b_f32(b, ldb, trans, k, n, packed.data());
  return packed;
}

void gemm_packed_b(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                   std::int64_t lda, const float* packed_b, float* c, std::int64_t ldc) {
  XPURT_CHECK(gemm_is_packed(context, m, n, k), "gemm_packed_b: a ", m, " x ", n, " x ", k,
              " product the packed GEMM does not take");
  packed_gemm(context, false, m, n, k, a, lda, nullptr, 0, RowsOfB{}, c, ldc, nullptr, packed_b);
}

void gemm_packed_ab(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* packed_a,
                    const float* packed_b, float* c, std::int64_t ldc) {
  XPURT_CHECK(context.gemm == GemmImpl::kPacked, "gemm_packed_ab: the packed GEMM is not this context's");
  packed_gemm(context, false, m, n, k, nullptr, 0, nullptr, 0, RowsOfB{}, c, ldc, packed_a, packed_b);
}

// Note [Weights packed once per plan]
// The packed GEMM copies A and B into micro-panels before its micro-tiles read them (Note [Packed GEMM]). A
// convolution's A is its weights, so every call packed all of them again: serially, once per call in conv_windows,
// and once per tile of pixels in the 1x1 path; a linear layer's or MatMul's weights are its B, packed on every call.
// Where each weight meets few pixels or rows, the packing rivals the product: ResNet-50's last 3x3 convolution reads
// 9.4 MB of weights for 49 pixels, a linear layer at 16 tokens does 32 multiply-adds per weight it packs. The native
// engine marks the inputs a step reads from a constant of its plan (TensorDesc::constant: the same tensor, bytes
// unchanged, on every launch), and the cpu plans keep such packings in one PackedConstants store of the process: a
// packing made on the first call is kept while the source tensor's storage lives, keyed by that storage (held weakly:
// a storage freed and another allocated at the same address is a miss, never a stale hit), the data's address, a tag
// (the group; A or B and the weight layout) and the instruction set's GEMM (its panel sizes). One store, not one per
// plan: a model run at several input shapes has a plan per shape, and a copy of its weights per plan would grow with
// them; the constants are shared by those plans (the session's constant cache), so are their packings. The packed
// bytes are those of a per-call packing: same sums, same bits. The cost is memory: a packed copy of the float weights
// that take this path, as ONNX Runtime's pre-packed weights are. One thread, this machine (2026-12-07,
// benchmarks/cpu_suite_bench.py --sequential against the tree before, with Note [Few convolution tasks] and the
// balanced row tiles): ResNet-50's last 3x3 convolution 3.87 -> 2.67 ms, a 16 x 768 @ 768 x 3072 MatMul 1.33 ->
// 0.92 ms, a 3x3 stride-2 128 -> 256 convolution at 28x28 1.36 -> 1.14 ms.
const float* PackedConstants::get(const Tensor& source, std::int64_t tag, const void* layout,
                                  const std::function<ScratchVector<float>()>& pack) {
  const std::shared_ptr<Storage>& storage = source.storage();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<Entry>>& here = entries_[source.data_ptr()];  // stays valid: drop_expired keeps it
  for (const auto& e : here) {
    if (e->tag == tag && e->layout == layout && e->storage.lock() == storage) return e->packed.data();
  }
  auto entry = std::make_unique<Entry>();
  entry->storage = storage;
  entry->tag = tag;
  entry->layout = layout;
  entry->packed = pack();  // under the lock: concurrent first calls pack once
  const float* packed = entry->packed.data();
  here.push_back(std::move(entry));
  drop_expired();  // the packings of constants that died since (a closed session's): one scan per new packing
  return packed;
}

void PackedConstants::drop_expired() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& e) { return e->storage.expired(); }),
               list.end());
    it = list.empty() ? entries_.erase(it) : std::next(it);
  }
}

std::size_t PackedConstants::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_expired();
  std::size_t n = 0;
  for (const auto& [data, list] : entries_) n += list.size();
  return n;
}

PackedConstants& shared_packed_constants() {
  static PackedConstants* store = new PackedConstants();  // never destroyed: plans may run during static destruction
  return *store;
}

ScratchVector<float> pack_gemm_a(const CpuContext& context, std::int64_t m, std::int64_t k, const float* a,
                                 std::int64_t lda) {
  const IsaKernels& isa = *context.isa;
  ScratchVector<float> packed(static_cast<std::size_t>((m + isa.gemm_mr - 1) / isa.gemm_mr * isa.gemm_mr * k));
  isa.pack_gemm_a_f32(a, lda, m, k, packed.data());
  return packed;
}

template void gemm<float>(const CpuContext&, bool, std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t,
                          const float*, std::int64_t, float*, std::int64_t);
template void gemm<double>(const CpuContext&, bool, std::int64_t, std::int64_t, std::int64_t, const double*,
                           std::int64_t, const double*, std::int64_t, double*, std::int64_t);

namespace {

// y[m, n] = a[m, k] (lda k) * op(b) with op(b) the launch's constant input 1 packed once (Note [Weights packed once
// per plan]), b [n, k] when trans else [k, n]; false (nothing written) when input 1 is not constant, T is not float
// or the packed GEMM does not take the shape: the caller runs gemm().
template <typename T>
bool kept_b_gemm(const KernelLaunch& launch, const CpuContext& context, std::int64_t m, std::int64_t n,
                 std::int64_t k, const T* a, const T* b, bool trans, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    PackedConstants* store = constant_store(launch, 1);
    if (store == nullptr || !gemm_is_packed(context, m, n, k)) return false;
    const float* packed =
        store->get(launch.input(1), trans ? -2 : -1, context.isa,
                   [&] { return pack_gemm_b(context, k, n, b, trans ? k : n, trans); });
    gemm_packed_b(context, m, n, k, a, k, packed, y, n);
    return true;
  } else {
    (void)launch, (void)context, (void)m, (void)n, (void)k, (void)a, (void)b, (void)trans, (void)y;
    return false;
  }
}

// matmul: a[..., M, K] @ b[..., K, N] -> [..., M, N], batch dims broadcast (NumPy rules).
template <typename T>
void run_matmul(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& a_tensor = launch.input(0);
  const Tensor& b_tensor = launch.input(1);
  Tensor& y_tensor = launch.output(0);
  const auto& a_shape = a_tensor.shape();
  const auto& b_shape = b_tensor.shape();
  const auto& y_shape = y_tensor.shape();
  const std::int64_t m = a_shape[a_shape.size() - 2];
  const std::int64_t k = a_shape.back();
  const std::int64_t n = b_shape.back();
  InputBuffer<T> a(a_tensor);
  InputBuffer<T> b(b_tensor);
  OutputBuffer<T> y(y_tensor);

  const std::vector<std::int64_t> batch(y_shape.begin(), y_shape.end() - 2);
  const std::vector<std::int64_t> a_batch(a_shape.begin(), a_shape.end() - 2);
  const std::vector<std::int64_t> b_batch(b_shape.begin(), b_shape.end() - 2);
  const std::int64_t batch_count = product(batch, 0, batch.size());
  if (product(b_batch, 0, b_batch.size()) == 1) {
    // One B for every batch: fold a's batch dims into M (a single, larger GEMM).
    if (!kept_b_gemm(launch, context, batch_count * m, n, k, a.data(), b.data(), false, y.data())) {
      gemm<T>(context, false, batch_count * m, n, k, a.data(), k, b.data(), n, y.data(), n);
    }
    y.commit();
    return;
  }
  const auto a_strides = broadcast_strides(a_batch, batch);
  const auto b_strides = broadcast_strides(b_batch, batch);
  std::vector<std::int64_t> index(batch.size(), 0);
  for (std::int64_t bi = 0; bi < batch_count; ++bi) {
    std::int64_t a_offset = 0, b_offset = 0;
    for (std::size_t d = 0; d < batch.size(); ++d) {
      a_offset += index[d] * a_strides[d];
      b_offset += index[d] * b_strides[d];
    }
    gemm<T>(context, false, m, n, k, a.data() + a_offset * m * k, k, b.data() + b_offset * k * n, n,
            y.data() + bi * m * n, n);
    for (std::size_t d = batch.size(); d-- > 0;) {
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
  y.commit();
}

// linear: act(x[..., K] W^T + bias), W [N, K] ("nk") or [K, N] ("kn").
template <typename T>
void run_linear(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& x_tensor = launch.input(0);
  const Tensor& w_tensor = launch.input(1);
  const bool nk = desc.attrs.get_string("weight_layout", "nk") == "nk";
  const Activation activation = activation_from_name(desc.attrs.get_string("activation", "none"));
  const std::int64_t k = x_tensor.shape().back();
  const std::int64_t n = nk ? w_tensor.shape()[0] : w_tensor.shape()[1];
  const std::int64_t m = k > 0 ? x_tensor.numel() / k : product(x_tensor.shape(), 0, x_tensor.shape().size() - 1);
  InputBuffer<T> x(x_tensor);
  InputBuffer<T> w(w_tensor);
  InputBuffer<T> bias(launch.num_inputs > 2 ? launch.input(2) : Tensor());
  InputBuffer<T> residual(launch.num_inputs > 3 ? launch.input(3) : Tensor());
  OutputBuffer<T> y(launch.output(0));
  if (!kept_b_gemm(launch, context, m, n, k, x.data(), w.data(), nk, y.data())) {
    gemm<T>(context, nk, m, n, k, x.data(), k, w.data(), nk ? k : n, y.data(), n);
  }
  if (bias.data() != nullptr || residual.data() != nullptr || activation != Activation::kNone) {
    T* out = y.data();
    const T* b = bias.data();
    const T* r = residual.data();
    const bool vector_math = std::is_same_v<T, float> &&
                             (activation == Activation::kGelu || activation == Activation::kGeluTanh);
    const VectorMath math = activation == Activation::kGelu ? VectorMath::kGelu : VectorMath::kGeluTanh;
    const IsaKernels& isa = isa_of(context);
    parallel_for(m, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(n, 1)),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t i = begin; i < end; ++i) {
                     T* row = out + i * n;
                     const T* res = r != nullptr ? r + i * n : nullptr;
                     if (vector_math) {  // Note [Vectorised tanh, erf and GELU] (cpu_isa_baseline.cpp)
                       for (std::int64_t j = 0; j < n; ++j) {
                         T value = b != nullptr ? row[j] + b[j] : row[j];
                         row[j] = res != nullptr ? value + res[j] : value;
                       }
                       isa.math_f32(reinterpret_cast<float*>(row), reinterpret_cast<float*>(row), n, math);
                       continue;
                     }
                     for (std::int64_t j = 0; j < n; ++j) {
                       T value = b != nullptr ? row[j] + b[j] : row[j];
                       if (res != nullptr) value += res[j];
                       row[j] = apply_activation(activation, value);
                     }
                   }
                 });
  }
  y.commit();
}

// linear_grad_weight: grad_weight[N, K] = grad[M, N]^T @ x[M, K] over the flattened leading dims (grad is transposed
// into a buffer first: the GEMM reads a transposed right operand only), and with bias=1 grad_bias[N] = the column
// sums of grad, accumulated in the compute type in order of the rows.
template <typename T>
void run_linear_grad_weight(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& grad_tensor = launch.input(0);
  const Tensor& x_tensor = launch.input(1);
  const std::int64_t n = grad_tensor.shape().back();
  const std::int64_t k = x_tensor.shape().back();
  const std::int64_t m = product(x_tensor.shape(), 0, x_tensor.shape().size() - 1);
  InputBuffer<T> grad(grad_tensor);
  InputBuffer<T> x(x_tensor);
  ScratchVector<T> grad_t(static_cast<std::size_t>(n * m));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) grad_t[static_cast<std::size_t>(j * m + i)] = grad[i * n + j];
  }
  OutputBuffer<T> y(launch.output(0));
  gemm<T>(context, false, n, k, m, grad_t.data(), m, x.data(), k, y.data(), k);
  y.commit();
  if (launch.num_outputs > 1) {
    OutputBuffer<T> bias(launch.output(1));
    for (std::int64_t j = 0; j < n; ++j) {
      T sum = T(0);
      for (std::int64_t i = 0; i < m; ++i) sum += grad_t[static_cast<std::size_t>(j * m + i)];
      bias.data()[j] = sum;
    }
    bias.commit();
  }
}

}  // namespace

void register_gemm_kernels(KernelRegistry& registry) {
  const std::string engine =
      XPURT_WITH_BLAS ? "OpenBLAS sgemm/dgemm (or the built-in blocked GEMM)" : "the built-in blocked GEMM";
  add_cpu_kernel(registry, "matmul", "reference batched matmul through " + engine + ", fp32 accumulation",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_matmul<decltype(zero)>(launch, context); });
                 });
  add_cpu_kernel(registry, "linear",
                 "reference linear through " + engine + ", then bias, residual and activation in one pass",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_linear<decltype(zero)>(launch, context); });
                 });
  add_cpu_kernel(registry, "linear_grad_weight",
                 "reference linear weight gradient (grad^T @ x) through " + engine + ", bias gradient as column sums",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_linear_grad_weight<decltype(zero)>(launch, context); });
                 });
}

}  // namespace xpuruntime::cpu
