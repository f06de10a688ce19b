// flash_v2: the fused attention forward of the cuda_raw backend (op "attention", docs/ops.md). FlashAttention-2
// on tensor cores: the Sq x Sk scores never leave registers (Note [flash_v2 tiling] in flash_attention_kernel.cuh).
//
// What it runs (supports() says why not otherwise): CUDA devices of compute capability >= 8.0 that the build has
// code for; q, k, v float16 or bfloat16, contiguous, 16-byte aligned, each (and the output) [B, H, S, D] or
// [B, S, H, D] (the `bshd` attribute, Note [Attention layouts]); head dim D = Dv in {32, 64, 128}; H % Hkv == 0;
// any Sq and Sk >= 1; `causal` and `scale` as docs/ops.md defines them; an optional additive mask in q's dtype,
// broadcastable to [B, H, Sq, Sk] (any strides: dims of size 1 are read with stride 0). A query row whose every
// score is -inf (only a mask can do that) gives NaN, like the cpu reference and PyTorch's SDPA, or 0 with
// fully_masked_rows="zero" (Note [Fully masked attention rows] in cpu_attention.cpp). With return_lse=1
// it also writes the second output lse [B, H, Sq] float32 (Note [flash_v2 log-sum-exp] in flash_attention_kernel.cuh).
//
// Deterministic: one CTA owns each output row and accumulates in a fixed order; no atomics, no split-K.
// Plans are immutable; run() may be called from several threads at once.
#include "backends/cuda_raw/flash_attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/flash_attention_kernel.cuh"
#include "backends/cuda_raw/flash_decode.cuh"
#include "core/attention_layout.h"
#include "core/cuda_utils.h"
#include "xpuruntime/exceptions.h"

#ifndef XPURT_CUDA_RAW_MIN_ARCH
#define XPURT_CUDA_RAW_MIN_ARCH 0
#endif

namespace xpuruntime {

namespace {

using flash::MaskMode;

// The oldest architecture this build has code for (CMAKE_CUDA_ARCHITECTURES), 0 when unknown.
constexpr int kMinArch = XPURT_CUDA_RAW_MIN_ARCH;
// Sequence lengths, batch and heads are int on the device, with a tile of slack for the last block's indices.
constexpr std::int64_t kMaxExtent = std::numeric_limits<int>::max() - 256;
constexpr const char* kInputNames[] = {"q", "k", "v", "mask"};

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
  return out + "]";
}

// Element strides of a mask broadcast (NumPy rules, right-aligned) to [B, H, Sq, Sk]: 0 along the dims where it
// has size 1 or no dim at all. Empty `strides` in the descriptor mean contiguous.
std::vector<std::int64_t> mask_strides_of(const TensorDesc& mask) {
  std::vector<std::int64_t> strides = mask.strides;
  if (strides.size() != mask.shape.size()) strides = contiguous_strides(mask.shape);
  std::vector<std::int64_t> out(4, 0);
  const std::size_t rank = mask.shape.size();
  for (std::size_t k = 0; k < rank && k < 4; ++k) {
    const std::size_t dim = rank - 1 - k;
    out[3 - k] = mask.shape[dim] == 1 ? 0 : strides[dim];
  }
  return out;
}

// The launch geometry of one descriptor, fixed at build time.
struct FlashConfig {
  DType dtype = DType::kFloat16;
  int head_dim = 0;
  MaskMode mode = MaskMode::kNone;
  bool return_lse = false;  // output 1 is lse [B, H, Sq] float32
  flash::Params params;     // everything but the pointers
  std::int64_t offsets[4] = {};  // elements from each of q, k, v, o's start to its first (Note [Attention layouts])
};

bool returns_lse(const OpDescriptor& desc) { return desc.attrs.get_int("return_lse", 0) != 0; }

FlashConfig config_of(const OpDescriptor& desc) {
  const AttentionLayout layout = AttentionLayout::of(desc.attrs);  // Note [Attention layouts]
  const auto dims = layout.dims(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  const std::vector<std::int64_t>& q = dims[0];
  const std::vector<std::int64_t>& k = dims[1];
  FlashConfig config;
  config.dtype = desc.inputs[0].dtype;
  config.head_dim = static_cast<int>(q[3]);
  flash::Params& params = config.params;
  params.batch = static_cast<int>(q[0]);
  params.heads = static_cast<int>(q[1]);
  params.seq_q = static_cast<int>(q[2]);
  params.kv_heads = static_cast<int>(k[1]);
  params.seq_k = static_cast<int>(k[2]);
  const auto views = layout.views(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  std::int64_t* strides[4] = {params.q_stride, params.k_stride, params.v_stride, params.o_stride};
  for (std::size_t t = 0; t < 4; ++t) {
    strides[t][0] = views[t].stride_b;
    strides[t][1] = views[t].stride_h;
    strides[t][2] = views[t].stride_s;
    config.offsets[t] = views[t].offset;
  }
  double scale = desc.attrs.get_float("scale", 0.0);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim));
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  params.causal = desc.attrs.get_int("causal", 0) != 0;
  const bool has_mask = desc.inputs.size() > 3 && desc.inputs[3].present;
  if (has_mask) {
    const std::vector<std::int64_t> strides = mask_strides_of(desc.inputs[3]);
    params.mask_stride_b = strides[0];
    params.mask_stride_h = strides[1];
    params.mask_stride_q = strides[2];
    params.mask_stride_k = strides[3];
  }
  config.mode = has_mask ? MaskMode::kExplicit : (params.causal ? MaskMode::kCausal : MaskMode::kNone);
  const FullyMaskedRows masked_rows = fully_masked_rows_of(desc.attrs);  // Note [Fully masked attention rows]
  params.zero_fully_masked_rows = masked_rows == FullyMaskedRows::kZero;
  params.uniform_fully_masked_rows = masked_rows == FullyMaskedRows::kUniform;
  config.return_lse = returns_lse(desc);
  return config;
}

// The policy's precision and determinism are read from the descriptor (copies of them): this file is compiled
// as C++17 CUDA, where execution_policy.h (C++20) cannot be included.
Support check_flash(const OpDescriptor& desc) {
  if (!desc.device.is_cuda()) {
    return Support::no(detail::str_cat("runs on CUDA devices; the input is on ", desc.device.str()));
  }
  if (desc.inputs.size() < 3 || !desc.inputs[0].present || !desc.inputs[1].present || !desc.inputs[2].present) {
    return Support::no("flash_v2 needs the inputs q, k and v");
  }
  if (desc.precision == Precision::kInt8) {
    return Support::no("flash_v2 has no int8 path; use precision fp16 or bf16 (or fp32/tf32 with 16-bit inputs)");
  }
  if (desc.compute_capability > 0 && desc.compute_capability < 80) {
    return Support::no(detail::str_cat("flash_v2 needs compute capability 8.0 or newer (bf16 mma.sync, cp.async, "
                                       "ldmatrix); this device is sm_", desc.compute_capability,
                                       "; use the 'unfused' kernel"));
  }
  if (kMinArch > 0 && desc.compute_capability > 0 && desc.compute_capability < kMinArch) {
    return Support::no(detail::str_cat("cuda_raw kernels were built for sm_", kMinArch, " and newer, this device is "
                                       "sm_", desc.compute_capability, "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=",
                                       desc.compute_capability));
  }
  TensorDesc q = desc.inputs[0];
  if (q.dtype != DType::kFloat16 && q.dtype != DType::kBFloat16) {
    return Support::no(detail::str_cat("flash_v2 supports float16 and bfloat16, got ", dtype_name(q.dtype),
                                       "; cast q, k, v (and the mask) or use the 'unfused' kernel"));
  }
  // The [B, H, S, D] views (Note [Attention layouts]); the stored tensors are what must be contiguous below.
  const AttentionLayout layout = AttentionLayout::of(desc.attrs);
  for (std::size_t i = 0; i < desc.inputs.size() && i < 4; ++i) {
    const TensorDesc& input = desc.inputs[i];
    if (!input.present) continue;
    if (!input.device.is_cuda()) {
      return Support::no(detail::str_cat("runs on CUDA devices; input '", kInputNames[i], "' is on ",
                                         input.device.str()));
    }
    if (input.dtype != q.dtype) {
      return Support::no(detail::str_cat("flash_v2 needs one dtype for all inputs; '", kInputNames[i], "' is ",
                                         dtype_name(input.dtype), ", q is ", dtype_name(q.dtype)));
    }
    if (i < 3 && input.dim() != (layout.packed(i) ? 5 : 4)) {
      return Support::no(detail::str_cat("flash_v2 needs 4-d q, k, v ([B, H, S, D] or [B, S, H, D]; 5-d [B, S, P, H, "
                                         "D] when packed); '", kInputNames[i], "' is ", input.str()));
    }
  }
  const auto dims = layout.dims(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  TensorDesc k = desc.inputs[1], v = desc.inputs[2];
  q.shape = dims[0];
  k.shape = dims[1];
  v.shape = dims[2];
  const std::int64_t head_dim = q.shape[3];
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) {
    return Support::no(detail::str_cat("flash_v2 supports head dims 32, 64 and 128, got ", head_dim,
                                       "; use the 'unfused' kernel"));
  }
  if (k.shape[3] != head_dim || v.shape[3] != head_dim) {
    return Support::no(detail::str_cat("flash_v2 needs k and v with q's head dim (D = Dv = ", head_dim, "), got k ",
                                       shape_str(k.shape), ", v ", shape_str(v.shape), "; use the 'unfused' kernel"));
  }
  if (k.shape[1] < 1 || q.shape[1] % k.shape[1] != 0 || v.shape[1] != k.shape[1] || k.shape[0] != q.shape[0] ||
      v.shape[0] != q.shape[0] || v.shape[2] != k.shape[2]) {
    return Support::no(detail::str_cat("flash_v2 needs q [B, H, Sq, D], k and v [B, Hkv, Sk, D] with Hkv dividing "
                                       "H; got q ", shape_str(q.shape), ", k ", shape_str(k.shape), ", v ",
                                       shape_str(v.shape)));
  }
  const std::int64_t batch = q.shape[0], heads = q.shape[1], seq_q = q.shape[2], seq_k = k.shape[2];
  if (seq_k < 1 && batch * heads * seq_q > 0) {
    return Support::no("flash_v2: a softmax over zero keys (Sk = 0) is undefined");
  }
  for (std::size_t i = 0; i < 3; ++i) {
    const TensorDesc& input = desc.inputs[i];
    if (input.numel() == 0) continue;  // nothing to read
    if (!input.is_contiguous()) {
      return Support::no(detail::str_cat("needs contiguous input '", kInputNames[i], "' (", input.str(),
                                         "); call contiguous() first"));
    }
    if (input.alignment < 16) {
      return Support::no(detail::str_cat("flash_v2 needs 16-byte aligned q, k and v (it copies 16-byte rows with "
                                         "cp.async); '", kInputNames[i], "' is only ", input.alignment,
                                         "-byte aligned; pass a fresh contiguous copy"));
    }
  }
  if (batch > kMaxExtent || heads > kMaxExtent || seq_q > kMaxExtent || seq_k > kMaxExtent) {
    return Support::no(detail::str_cat("flash_v2 handles B, H, Sq and Sk up to ", kMaxExtent, "; got q ",
                                       shape_str(q.shape), ", k ", shape_str(k.shape)));
  }
  if (flash::flash_forward_blocks(static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(seq_q)) >
      std::numeric_limits<int>::max()) {
    return Support::no(detail::str_cat("flash_v2 launches ceil(Sq / 128) * B * H thread blocks, which must stay "
                                       "below 2^31; got q ", shape_str(q.shape), "; split the batch"));
  }
  if (desc.inputs.size() > 3 && desc.inputs[3].present) {
    const TensorDesc& mask = desc.inputs[3];
    if (mask.dim() > 4) {
      return Support::no(detail::str_cat("flash_v2: the mask must have rank <= 4, got ", mask.str()));
    }
    const std::vector<std::int64_t> full = {batch, heads, seq_q, seq_k};
    for (int k_dim = 0; k_dim < mask.dim(); ++k_dim) {
      const std::int64_t size = mask.shape[mask.dim() - 1 - k_dim];
      if (size != 1 && size != full[3 - k_dim]) {
        return Support::no(detail::str_cat("flash_v2: mask ", shape_str(mask.shape),
                                           " does not broadcast to the scores' shape ", shape_str(full)));
      }
    }
    if (mask.alignment < 2) {
      return Support::no(detail::str_cat("flash_v2 needs an element-aligned mask; it is ", mask.alignment,
                                         "-byte aligned"));
    }
  }
  // Output 0 is y; output 1 (lse [B, H, Sq] float32) exists iff return_lse=1, as the op schema infers.
  const std::size_t expected_outputs = returns_lse(desc) ? 2 : 1;
  if (desc.outputs.size() != expected_outputs) {
    return Support::no(detail::str_cat("flash_v2 writes ", expected_outputs, " output(s) for return_lse=",
                                       returns_lse(desc) ? 1 : 0, ", the descriptor has ", desc.outputs.size()));
  }
  if (expected_outputs == 2) {
    const TensorDesc& lse = desc.outputs[1];
    const std::vector<std::int64_t> lse_shape = {batch, heads, seq_q};
    if (lse.dtype != DType::kFloat32 || lse.shape != lse_shape) {
      return Support::no(detail::str_cat("flash_v2 writes the log-sum-exp as float32 ", shape_str(lse_shape),
                                         "; output 1 is ", lse.str()));
    }
  }
  return Support::yes();
}

const char* mode_name(MaskMode mode, bool causal) {
  switch (mode) {
    case MaskMode::kNone: return "no mask";
    case MaskMode::kCausal: return "causal";
    case MaskMode::kExplicit: return causal ? "explicit mask + causal" : "explicit mask";
  }
  return "?";
}

template <typename T, int kHeadDim>
cudaError_t launch_for_mode(const flash::Params& params, MaskMode mode, cudaStream_t stream) {
  switch (mode) {
    case MaskMode::kNone: return flash::launch_flash_forward<T, kHeadDim, MaskMode::kNone>(params, stream);
    case MaskMode::kCausal: return flash::launch_flash_forward<T, kHeadDim, MaskMode::kCausal>(params, stream);
    case MaskMode::kExplicit: return flash::launch_flash_forward<T, kHeadDim, MaskMode::kExplicit>(params, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_for_head_dim(const flash::Params& params, int head_dim, MaskMode mode, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return launch_for_mode<T, 32>(params, mode, stream);
    case 64: return launch_for_mode<T, 64>(params, mode, stream);
    default: return launch_for_mode<T, 128>(params, mode, stream);
  }
}

bool is_aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// The launch's pointers in a copy of `config`'s Params, checked against what the plan was built for: the kernels of
// flash_v2 and flash_decode read them.
flash::Params bind_pointers(const FlashConfig& config, const KernelLaunch& launch, const char* kernel) {
  const flash::Params& shape = config.params;
  flash::Params params = shape;
  // 16-bit elements; packed inputs start at their part (Note [Attention layouts]).
  const auto at = [&](const void* base, int tensor) {
    return static_cast<const void*>(static_cast<const std::uint16_t*>(base) + config.offsets[tensor]);
  };
  params.q = at(launch.input(0).data_ptr(), 0);
  params.k = at(launch.input(1).data_ptr(), 1);
  params.v = at(launch.input(2).data_ptr(), 2);
  params.o = launch.output(0).data_ptr();
  if (config.mode == MaskMode::kExplicit) params.mask = launch.input(3).data_ptr();
  if (config.return_lse) {
    XPURT_CHECK(launch.num_outputs == 2 && launch.output(1).dtype() == DType::kFloat32 &&
                    launch.output(1).numel() == static_cast<std::int64_t>(shape.batch) * shape.heads * shape.seq_q,
                kernel, " with return_lse=1 writes a second output lse, float32 [B, H, Sq]; run the plan on the "
                "outputs it was built for");
    params.lse = static_cast<float*>(launch.output(1).data_ptr());
    XPURT_CHECK(reinterpret_cast<std::uintptr_t>(params.lse) % alignof(float) == 0,
                kernel, " needs a 4-byte aligned lse output, but it starts at address ",
                reinterpret_cast<std::uintptr_t>(params.lse));
  }
  // The descriptor promised this (the plan is keyed on it); a launch with other tensors must not corrupt memory.
  const void* pointers[] = {params.q, params.k, params.v, params.o};
  const char* names[] = {"q", "k", "v", "the output"};
  for (int i = 0; i < 4; ++i) {
    XPURT_CHECK(is_aligned_16(pointers[i]), kernel, " needs 16-byte aligned q, k, v and output, but ", names[i],
                " starts at address ", reinterpret_cast<std::uintptr_t>(pointers[i]),
                "; run the plan on the tensors it was built for");
  }
  return params;
}

// What a plan's describe() adds for the log-sum-exp output and the fully masked rows.
std::string output_options(const FlashConfig& config) {
  return detail::str_cat(config.return_lse ? ", log-sum-exp output" : "",
                         config.params.zero_fully_masked_rows ? ", fully masked rows give 0" : "",
                         config.params.uniform_fully_masked_rows ? ", fully masked rows give the mean of v" : "");
}

class FlashAttentionPlan final : public KernelPlan {
 public:
  FlashAttentionPlan(FlashConfig config, int device) : config_(config), device_(device) {}

  void run(const KernelLaunch& launch) const override {
    const flash::Params& shape = config_.params;
    if (static_cast<std::int64_t>(shape.batch) * shape.heads * shape.seq_q == 0) return;  // empty output
    const flash::Params params = bind_pointers(config_, launch, "flash_v2");
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    const cudaError_t status =
        config_.dtype == DType::kBFloat16
            ? launch_for_head_dim<__nv_bfloat16>(params, config_.head_dim, config_.mode, stream)
            : launch_for_head_dim<__half>(params, config_.head_dim, config_.mode, stream);
    XPURT_CUDA_CHECK(status);
  }

  std::string describe() const override {
    const bool explicit_mask = config_.mode == MaskMode::kExplicit;
    const int block_n = config_.head_dim <= 64 && !explicit_mask ? 128 : 64;
    const int smem_kib = (128 + 4 * block_n) * config_.head_dim * 2 / 1024;
    return detail::str_cat("flash_v2 ", dtype_name(config_.dtype), " D=", config_.head_dim, ", ",
                           mode_name(config_.mode, config_.params.causal), ", 128x", block_n,
                           " tiles, 4 warps, K/V double-buffered, ", smem_kib, " KiB shared memory",
                           output_options(config_));
  }

 private:
  FlashConfig config_;
  int device_;
};

// Note [Split-K decode attention] (flash_decode.cu): decode steps' attention, split over the keys.
class FlashDecodePlan final : public KernelPlan {
 public:
  FlashDecodePlan(FlashConfig config, int device, flash::DecodeSplit split)
      : config_(config), device_(device), split_(split) {}

  std::size_t workspace_bytes() const override {
    return flash::decode_workspace_bytes(config_.params, config_.head_dim, split_);
  }

  void run(const KernelLaunch& launch) const override {
    const flash::Params& shape = config_.params;
    if (static_cast<std::int64_t>(shape.batch) * shape.heads * shape.seq_q == 0) return;  // empty output
    const flash::Params params = bind_pointers(config_, launch, "flash_decode");
    XPURT_CHECK(launch.workspace_bytes >= workspace_bytes() && (workspace_bytes() == 0 || launch.workspace != nullptr),
                "flash_decode needs ", workspace_bytes(), " bytes of workspace for its ", split_.splits,
                " splits, the launch has ", launch.workspace_bytes);
    detail::CudaDeviceGuard guard(device_);
    XPURT_CUDA_CHECK(flash::launch_flash_decode(params, config_.dtype, config_.head_dim,
                                                config_.mode == MaskMode::kExplicit, split_,
                                                static_cast<float*>(launch.workspace),
                                                static_cast<cudaStream_t>(launch.stream.handle)));
  }

  std::string describe() const override {
    return detail::str_cat("flash_decode ", dtype_name(config_.dtype), " D=", config_.head_dim, ", ",
                           mode_name(config_.mode, false), ", ", split_.splits, " split(s) of ", split_.keys_per_split,
                           " keys, ", flash::kDecodeRows, " query rows of a KV group a block, 4 warps",
                           output_options(config_));
  }

 private:
  FlashConfig config_;
  int device_;
  flash::DecodeSplit split_;
};

Support check_flash_decode(const OpDescriptor& desc) {
  const Support flash = check_flash(desc);  // the same inputs, layouts and limits
  if (!flash) return Support::no(detail::str_cat("flash_decode: ", flash.reason()));
  const flash::Params& p = config_of(desc).params;
  if (p.seq_q > flash::kDecodeMaxSeqQ) {
    return Support::no(detail::str_cat("flash_decode is for decode steps of up to ", flash::kDecodeMaxSeqQ,
                                       " query positions, got Sq = ", p.seq_q, "; flash_v2 runs longer queries"));
  }
  if (p.causal) {
    return Support::no("flash_decode has no causal mask (a decode step's query sees every cached key); flash_v2 "
                       "runs causal attention");
  }
  const flash::DecodeSplit split = flash::decode_split(p, 1);
  if (p.kv_heads > 65535 || static_cast<std::int64_t>(p.batch) * split.row_chunks > 65535) {
    return Support::no(detail::str_cat("flash_decode launches Hkv x B x ceil(H / Hkv * Sq / ", flash::kDecodeRows,
                                       ") blocks in grid dimensions of at most 65535; got Hkv = ", p.kv_heads,
                                       ", B = ", p.batch));
  }
  return Support::yes();
}

class FlashDecodeKernel final : public Kernel {
 public:
  FlashDecodeKernel()
      : Kernel(KernelInfo{"attention", "flash_decode", "cuda_raw", DeviceType::kCUDA, true,
                          "split-K attention for decode steps (Sq <= 8, no causal mask): one block per KV group and "
                          "key range, the splits merged by a second kernel (fp16/bf16, head dim 32/64/128, mask, GQA, "
                          "log-sum-exp output, fully masked rows NaN, 0 or uniform)",
                          KernelDecl{}}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/) const override {
    return check_flash_decode(desc);
  }

  // Every descriptor it takes is a decode step, where flash_v2 runs one block per head and no split of the keys
  // (Note [Split-K decode attention]). On an H200 (docs/benchmarks.md, 2026-12-05) it ran 8.4x faster than flash_v2
  // at one row over 4,096 keys and 1.4x faster than cuDNN's fused attention for MQA, but 2.5-3.3x slower than cuDNN
  // where batch x KV heads alone fill the device (64 x 8 over 576 keys, 16 x 8 over 4,096): there the dispatcher
  // times it against the others at the node's shapes and keeps the fastest (Note [Timed first choices]).
  static constexpr std::int64_t kTimedFromBlocks = 64;
  std::string ranks_first(const OpDescriptor& desc) const override {
    (void)desc;
    return "a decode step (Sq <= 8): split-K over the keys, one block per KV group and key range";
  }
  std::string timed_against_others(const OpDescriptor& desc) const override {
    const flash::Params& p = config_of(desc).params;
    const flash::DecodeSplit split = flash::decode_split(p, 1);
    if (static_cast<std::int64_t>(p.batch) * p.kv_heads * split.row_chunks < kTimedFromBlocks) return {};
    return "batch x KV heads fill the device without a split: cuDNN's fused attention may be faster";
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw UnsupportedOperationError(detail::str_cat(
          "flash_decode makes no recorded choices and has no plan record, but was given one: '", record, "'"));
    }
    const Support support = check_flash_decode(desc);
    if (!support) throw UnsupportedOperationError(detail::str_cat("cannot run ", desc.signature(), ": ",
                                                                  support.reason()));
    int multiprocessors = 0;
    XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, desc.device.index));
    const FlashConfig config = config_of(desc);
    return std::make_unique<FlashDecodePlan>(config, desc.device.index,
                                             flash::decode_split(config.params, multiprocessors));
  }
};

class FlashAttentionKernel final : public Kernel {
 public:
  FlashAttentionKernel()
      : Kernel(KernelInfo{"attention", "flash_v2", "cuda_raw", DeviceType::kCUDA, true,
                          "fused FlashAttention-2 forward on tensor cores (fp16/bf16, head dim 32/64/128, causal, "
                          "mask, GQA, log-sum-exp output, fully masked rows NaN or 0), no Sq x Sk scores in memory",
                          KernelDecl{}}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/) const override {
    return check_flash(desc);
  }

  // Note [Timed attention]
  // flash_v2 is the first choice for the attention ops it takes, but not the fastest everywhere: on an H200
  // cuDNN's fused attention ran Phi-3's at batch 1 in 47 us a run against flash_v2's 66, an ALiBi bias [1, 16, 2048,
  // 2048] in 0.29 ms against 0.55, a full [16, 12, 512, 512] bias in 0.077 against 0.116, while flash_v2 won with a
  // key bias and CLIP's [77, 77] triangle (docs/benchmarks.md). No rule on the descriptor separates those, so the
  // dispatcher times the kernels that support the node at its shapes and keeps the fastest (Note [Timed first
  // choices] in core/dispatcher.cpp), once per descriptor and build cache. Timing builds every candidate, the unfused
  // kernel's B * H * Sq * Sk scores included, so it is asked for only while those stay within kTimedScoresBytes;
  // past that flash_v2 runs untimed, as before. Nor is a single query row timed (Sq = 1: a decode step, whose Sk
  // grows by one a step with a dynamic cache, so each step would be a new descriptor to time).
  static constexpr double kTimedScoresBytes = 512.0 * 1024 * 1024;
  std::string timed_against_others(const OpDescriptor& desc) const override {
    const flash::Params& p = config_of(desc).params;
    const double scores = static_cast<double>(p.batch) * p.heads * p.seq_q * p.seq_k * 2.0;
    if (scores > kTimedScoresBytes || p.seq_q <= 1) return {};
    return "flash_v2 or another attention kernel (cuDNN's) may be faster at this shape";
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& /*policy*/,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw UnsupportedOperationError(detail::str_cat(
          "flash_v2 makes no choices and has no plan record, but was given one: '", record,
          "' (a record of another kernel?)"));
    }
    const Support support = check_flash(desc);
    if (!support) throw UnsupportedOperationError(detail::str_cat("flash_v2 cannot run ", desc.signature(), ": ",
                                                                  support.reason()));
    return std::make_unique<FlashAttentionPlan>(config_of(desc), desc.device.index);
  }
};

}  // namespace

void register_flash_attention(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<FlashAttentionKernel>());
  registry.add_kernel(std::make_unique<FlashDecodeKernel>());
}

}  // namespace xpuruntime
