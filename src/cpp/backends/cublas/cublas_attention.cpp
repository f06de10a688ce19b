// The "unfused" kernel of attention: S = scale * Q K^T (one strided-batch GEMM), P = softmax(S + mask) in place
// (the cuda_raw attention_softmax kernel, causal masking included), O = P V (a second strided-batch GEMM). The
// scores S live in the workspace: B * H * Sq * Sk elements. Any head dim, fp32 / fp16 / bf16, GQA. With
// fully_masked_rows="zero" the softmax writes a row that is -inf everywhere as 0, so O's row is 0 (Note [Fully masked
// attention rows] in cpu_attention.cpp).
//
// Note [Unfused attention precision]
// S is stored in the input dtype; both GEMMs accumulate in fp32 and round once. The scale is applied by the
// first GEMM (alpha) rather than by the softmax: the fp32 accumulator is scaled before the rounding, so fp16
// scores do not overflow where |q.k| exceeds 65504 but |q.k| * scale does not, and the softmax then runs with
// scale 1 (mask and causal masking are applied after scaling either way, as docs/ops.md defines). The softmax
// computes in fp32 and writes P in the input dtype, which is what the second GEMM consumes. This is the
// precision of PyTorch's math SDPA for 16-bit inputs (scores and probabilities in the input dtype); an fp32 S
// would need conversions cuBLAS cannot do in the GEMM (its A and B types must match).
//
// Note [GQA as one batched GEMM]
// With H = Hkv * G query heads sharing each K/V head, the G query heads of one (batch, kv head) are adjacent
// in q[B, H, Sq, D]: together one contiguous [G * Sq, D] matrix. So S for those heads is one GEMM
// [G * Sq, D] x K^T[D, Sk] -> [G * Sq, Sk], which is again contiguous in S[B, H, Sq, Sk], and all of them form
// one strided batch of B * Hkv GEMMs. O = P V likewise. No per-head pointer arrays, no loop.
//
// Note [Unfused attention stages other layouts]
// The strided batch needs [B, H, S, D] heads. q, k, v held as [B, S, H, D] (Note [Attention layouts]) are copied
// into that layout in the workspace first (cuda_raw::strided_copy), and an output wanted as [B, S, H, D] is computed
// there and copied out: the transposes the layout saves elsewhere, done here, so the kernel stays correct for every
// layout (flash_v2 and cudnn read them in place).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cublas/cublas_kernels.h"
#include "core/attention_layout.h"
#include "core/cublas_utils.h"
#include "core/device_kernels.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublas {

namespace {

struct AttentionGeometry {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, sq = 0, sk = 0, d = 0, dv = 0;
  AttentionLayout layout;          // Note [Attention layouts]
  std::array<AttentionLayout::View, 4> views;  // where q, k, v and the output's elements are
  // Whether tensor t is staged (Note [Unfused attention stages other layouts]): not [B, H, S, D] itself.
  bool staged(std::size_t t) const { return layout.bshd[t] || layout.packed(t); }
  std::int64_t group() const { return kv_heads > 0 ? heads / kv_heads : 0; }
  std::int64_t scores() const { return batch * heads * sq * sk; }
  // The [B, H, S, D] dims of q, k, v and the output.
  std::vector<std::int64_t> dims(std::size_t tensor) const {
    switch (tensor) {
      case AttentionLayout::kQ: return {batch, heads, sq, d};
      case AttentionLayout::kK: return {batch, kv_heads, sk, d};
      case AttentionLayout::kV: return {batch, kv_heads, sk, dv};
      default: return {batch, heads, sq, dv};
    }
  }
};

AttentionGeometry geometry_of(const OpDescriptor& desc) {
  AttentionGeometry g;
  g.layout = AttentionLayout::of(desc.attrs);
  const auto dims = g.layout.dims(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  const std::vector<std::int64_t>& q = dims[0];
  const std::vector<std::int64_t>& k = dims[1];
  const std::vector<std::int64_t>& v = dims[2];
  g.batch = q[0];
  g.heads = q[1];
  g.sq = q[2];
  g.d = q[3];
  g.kv_heads = k[1];
  g.sk = k[2];
  g.dv = v[3];
  g.views = g.layout.views(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  return g;
}

// The workspace staged tensor t takes (Note [Unfused attention stages other layouts]), 256-byte aligned; 0 when
// it is not staged.
std::size_t staged_bytes(const AttentionGeometry& g, std::size_t t, DType dtype) {
  if (!g.staged(t)) return 0;
  std::size_t numel = 1;
  for (std::int64_t dim : g.dims(t)) numel *= static_cast<std::size_t>(dim);
  return round_up(numel * dtype_size(dtype), 256);
}
std::size_t staged_bytes(const AttentionGeometry& g, DType dtype) {
  std::size_t bytes = 0;
  for (std::size_t t = 0; t < 4; ++t) bytes += staged_bytes(g, t, dtype);
  return bytes;
}

// S^T = K Q^T per (batch, kv head): cuBLAS's first operand is K (row-major [Sk, D], so op = T), its second Q.
GemmShape scores_shape(const AttentionGeometry& g) {
  GemmShape shape;
  shape.m = g.sk;
  shape.n = g.group() * g.sq;
  shape.k = g.d;
  shape.transpose_lhs = true;
  shape.ld_lhs = std::max<std::int64_t>(1, g.d);
  shape.ld_rhs = std::max<std::int64_t>(1, g.d);
  shape.ld_out = std::max<std::int64_t>(1, g.sk);
  shape.batch = g.batch * g.kv_heads;
  shape.stride_lhs = g.sk * g.d;
  shape.stride_rhs = g.group() * g.sq * g.d;
  shape.stride_out = g.group() * g.sq * g.sk;
  return shape;
}

// O^T = V^T P^T per (batch, kv head): cuBLAS's first operand is V (row-major [Sk, Dv]), its second P.
GemmShape output_shape(const AttentionGeometry& g) {
  GemmShape shape;
  shape.m = g.dv;
  shape.n = g.group() * g.sq;
  shape.k = g.sk;
  shape.transpose_lhs = false;
  shape.ld_lhs = std::max<std::int64_t>(1, g.dv);
  shape.ld_rhs = std::max<std::int64_t>(1, g.sk);
  shape.ld_out = std::max<std::int64_t>(1, g.dv);
  shape.batch = g.batch * g.kv_heads;
  shape.stride_lhs = g.sk * g.dv;
  shape.stride_rhs = g.group() * g.sq * g.sk;
  shape.stride_out = g.group() * g.sq * g.dv;
  return shape;
}

// The mask's strides over [B, H, Sq, Sk] (0 along broadcast dims), for a contiguous mask of rank <= 4.
std::vector<std::int64_t> mask_strides_of(const TensorDesc& mask) {
  std::vector<std::int64_t> strides(4, 0);
  const std::size_t rank = mask.shape.size();
  std::int64_t stride = 1;
  for (std::size_t j = rank; j-- > 0;) {
    strides[4 - rank + j] = mask.shape[j] == 1 ? 0 : stride;
    stride *= mask.shape[j];
  }
  return strides;
}

class UnfusedAttentionPlan final : public KernelPlan {
 public:
  UnfusedAttentionPlan(AttentionGeometry geometry, DType dtype, cublasComputeType_t compute, float scale, bool causal,
                       FullyMaskedRows rows, bool has_mask, std::vector<std::int64_t> mask_strides, int device,
                       std::size_t cublas_workspace)
      : geometry_(geometry),
        dtype_(dtype),
        compute_(compute),
        scale_(scale),
        causal_(causal),
        rows_(rows),
        has_mask_(has_mask),
        mask_strides_(std::move(mask_strides)),
        device_(device),
        scores_bytes_(round_up(static_cast<std::size_t>(geometry.scores()) * dtype_size(dtype), 256)),
        cublas_workspace_(cublas_workspace) {
    std::size_t offset = scores_bytes_;
    for (std::size_t t = 0; t < 4; ++t) {
      stage_offset_[t] = offset;
      offset += staged_bytes(geometry_, t, dtype);
    }
    stage_offset_[4] = offset;
  }

  void run(const KernelLaunch& launch) const override {
    const AttentionGeometry& g = geometry_;
    Tensor& out = launch.output(0);
    if (g.batch == 0 || g.heads == 0 || g.sq == 0 || g.dv == 0) return;  // an empty output
    XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                          "unfused attention needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    // The scores first, then the staged tensors, cuBLAS's workspace after them (bind_workspace aligns it to 256
    // bytes itself).
    char* workspace = static_cast<char*>(launch.workspace);
    void* scores = workspace;
    // Note [Unfused attention stages other layouts]: q, k, v and the output in [B, H, S, D].
    void* data[4] = {launch.input(0).data_ptr(), launch.input(1).data_ptr(), launch.input(2).data_ptr(),
                     out.data_ptr()};
    for (std::size_t t = 0; t < 4; ++t) {
      if (!g.staged(t)) continue;
      void* staged = workspace + stage_offset_[t];
      if (t < 3) copy_layout(data[t], staged, t, /*to_bhsd=*/true, launch.stream.handle);
      data[t] = staged;
    }
    void* cublas_space = workspace + stage_offset_[4];
    const std::size_t cublas_bytes = launch.workspace_bytes - stage_offset_[4];

    const cublasHandle_t handle = thread_cublas_handle(device_, stream);
    bind_workspace(handle, cublas_space, cublas_bytes);
    if (g.d == 0) {
      XPURT_CUDA_CHECK(cudaMemsetAsync(scores, 0, static_cast<std::size_t>(g.scores()) * dtype_size(dtype_), stream));
    } else {
      gemm(handle, scores_shape(g), dtype_, compute_, data[1], data[0], scores, scale_);
    }
    const void* mask = has_mask_ ? launch.input(3).data_ptr() : nullptr;
    const auto attention_softmax =
        required_device_kernel(device_kernels().attention_softmax, "attention_softmax", "the unfused attention");
    attention_softmax(scores, dtype_, g.batch * g.heads, g.heads, g.sq, g.sk, 1.0f, causal_, rows_, mask,
                      mask_strides_, launch.stream.handle);
    gemm(handle, output_shape(g), dtype_, compute_, data[2], scores, data[3]);
    if (g.staged(3)) copy_layout(data[3], out.data_ptr(), 3, /*to_bhsd=*/false, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override {
    const AttentionGeometry& g = geometry_;
    if (g.batch == 0 || g.heads == 0 || g.sq == 0 || g.dv == 0) return 0;
    return stage_offset_[4] + cublas_workspace_;
  }

  std::string describe() const override {
    const AttentionGeometry& g = geometry_;
    return detail::str_cat("unfused attention: S = scale QK^T (cublasGemmStridedBatchedEx, batch ",
                           g.batch * g.kv_heads, " of [", g.group() * g.sq, "x", g.d, "]x[", g.d, "x", g.sk,
                           "]), cuda_raw attention_softmax", causal_ ? " causal" : "", has_mask_ ? " + mask" : "",
                           rows_ == FullyMaskedRows::kZero      ? " (fully masked rows 0)"
                           : rows_ == FullyMaskedRows::kUniform ? " (fully masked rows the mean of v)"
                                                                : "", ", O = PV; scores ", dtype_name(dtype_), " [",
                           g.batch, ",", g.heads, ",", g.sq, ",", g.sk, "] in the workspace; compute ",
                           compute_type_name(compute_), staged_note());
  }

 private:
  AttentionGeometry geometry_;
  DType dtype_;
  cublasComputeType_t compute_;
  float scale_;
  bool causal_;
  FullyMaskedRows rows_;  // Note [Fully masked attention rows]
  bool has_mask_;
  std::vector<std::int64_t> mask_strides_;
  int device_;
  std::size_t scores_bytes_;
  std::size_t cublas_workspace_;
  std::size_t stage_offset_[5] = {};  // workspace offsets of the staged q, k, v, output; [4]: cuBLAS's share

  std::string staged_note() const {  // Note [Unfused attention stages other layouts]
    std::string names;
    for (std::size_t t = 0; t < 4; ++t) {
      if (geometry_.staged(t)) names += (names.empty() ? "" : ", ") + std::string(AttentionLayout::name(t));
    }
    return names.empty() ? "" : "; " + names + " staged from/to their layouts in the workspace";
  }

  // Copies tensor t between where its view says its elements are and [B, H, S, D] (to_bhsd: stored -> staged,
  // `src` its stored tensor's start; else staged -> stored, `dst` the stored tensor's start).
  void copy_layout(const void* src, void* dst, std::size_t t, bool to_bhsd, void* stream) const {
    const std::vector<std::int64_t> dims = geometry_.dims(t);
    const AttentionLayout::View& view = geometry_.views[t];
    const std::vector<std::int64_t> stored = {view.stride_b, view.stride_h, view.stride_s, 1};
    const std::vector<std::int64_t> bhsd = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    const std::size_t offset = static_cast<std::size_t>(view.offset) * dtype_size(dtype_);
    const auto strided_copy =
        required_device_kernel(device_kernels().strided_copy, "strided_copy", "the unfused attention");
    if (to_bhsd) {
      strided_copy(static_cast<const char*>(src) + offset, dst, dtype_, dims, stored, bhsd, stream);
    } else {
      strided_copy(src, static_cast<char*>(dst) + offset, dtype_, dims, bhsd, stored, stream);
    }
  }
};

class UnfusedAttentionKernel final : public Kernel {
 public:
  UnfusedAttentionKernel()
      : Kernel(KernelInfo{"attention", "unfused", "cublas", DeviceType::kCUDA, true,
                          "cuBLAS GEMM + cuda_raw softmax + cuBLAS GEMM, the Sq x Sk scores in the workspace",
                          gemm_declaration("attention", "unfused attention")}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (Support device = check_gemm_device(desc, "unfused attention"); !device) return device;
    if (desc.attrs.get_int("return_lse", 0) != 0) {
      return Support::no("unfused attention does not output the log-sum-exp (return_lse=1); use flash_v2 or cpu");
    }
    const AttentionLayout layout = AttentionLayout::of(desc.attrs);
    const auto rank_ok = [&](std::size_t t) { return desc.inputs[t].dim() == (layout.packed(t) ? 5 : 4); };
    if (desc.inputs.size() < 3 || !rank_ok(0) || !rank_ok(1) || !rank_ok(2)) {
      return Support::no("unfused attention needs q[B, H, Sq, D], k[B, Hkv, Sk, D], v[B, Hkv, Sk, Dv]");
    }
    const AttentionGeometry g = geometry_of(desc);
    if (g.kv_heads == 0 || g.heads % g.kv_heads != 0) {
      return Support::no(
          detail::str_cat("unfused attention needs Hkv dividing H; got H=", g.heads, ", Hkv=", g.kv_heads));
    }
    if (g.sk == 0 && g.batch * g.heads * g.sq * g.dv > 0) {
      return Support::no("unfused attention: a softmax over zero keys (Sk = 0) is undefined");
    }
    if (desc.inputs.size() > 3 && desc.inputs[3].present && desc.inputs[3].dim() > 4) {
      return Support::no("unfused attention: the mask must have rank <= 4");
    }
    if (Support fits = check_int32(scores_shape(g), "unfused attention"); !fits) return fits;
    if (Support fits = check_int32(output_shape(g), "unfused attention"); !fits) return fits;
    const std::uint64_t scores_bytes = static_cast<std::uint64_t>(g.scores()) * dtype_size(desc.inputs[0].dtype) +
                                       staged_bytes(g, desc.inputs[0].dtype);
    if (policy.workspace_limit > 0 && scores_bytes > policy.workspace_limit) {
      return Support::no(detail::str_cat("unfused attention keeps the B*H*Sq*Sk = ", g.scores(),
                                         " scores (and the tensors it stages in [B, H, S, D]) in its workspace (",
                                         scores_bytes, " bytes), above the policy's workspace_limit of ",
                                         policy.workspace_limit, " bytes; raise the limit or use flash_v2"));
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw UnsupportedOperationError(
          detail::str_cat("the unfused attention kernel makes no choices and has no plan record, but was given one: '",
                          record, "' (a record of another kernel?)"));
    }
    const AttentionGeometry g = geometry_of(desc);
    const DType dtype = desc.inputs[0].dtype;
    double scale = desc.attrs.get_float("scale", 0.0);
    if (scale == 0.0) scale = g.d > 0 ? 1.0 / std::sqrt(static_cast<double>(g.d)) : 1.0;
    const bool causal = desc.attrs.get_int("causal", 0) != 0;
    const bool has_mask = desc.inputs.size() > 3 && desc.inputs[3].present;
    std::vector<std::int64_t> mask_strides =
        has_mask ? mask_strides_of(desc.inputs[3]) : std::vector<std::int64_t>(4, 0);
    // cuBLAS's share of the workspace: its recommendation, within what the scores leave of the limit.
    const std::uint64_t scores_bytes =
        round_up(static_cast<std::size_t>(g.scores()) * dtype_size(dtype), 256) + staged_bytes(g, dtype);
    std::size_t cublas_workspace = default_cublas_workspace(desc.compute_capability, 0);
    if (policy.workspace_limit > 0) {
      cublas_workspace = policy.workspace_limit > scores_bytes
                             ? static_cast<std::size_t>(
                                   std::min<std::uint64_t>(cublas_workspace, policy.workspace_limit - scores_bytes))
                             : 0;
    }
    return std::make_unique<UnfusedAttentionPlan>(g, dtype, compute_type(dtype, desc.precision),
                                                  static_cast<float>(scale), causal,
                                                  fully_masked_rows_of(desc.attrs), has_mask,
                                                  std::move(mask_strides), desc.device.index, cublas_workspace);
  }
};

}  // namespace

std::unique_ptr<Kernel> make_unfused_attention_kernel() { return std::make_unique<UnfusedAttentionKernel>(); }

}  // namespace xpuruntime::cublas
