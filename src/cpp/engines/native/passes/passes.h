// Graph passes of the native engine: rewrites of a validated Graph that fold constants, drop no-op nodes and
// fuse ONNX node patterns into the com.xpuruntime nodes that lower onto one KernelRegistry op each
// (docs/native_engine.md, section "Graph passes", lists every pass, its pattern and the fused nodes' semantics).
//
//   passes::PassContext ctx;
//   ctx.infer_types = [&](Graph& g) { engine_shape_inference(g); };
//   std::vector<passes::PassResult> log = passes::run_passes(graph, ctx, /*disabled=*/{"gemm_fusion"});
//
// Contract: a pass takes a graph that validate() accepts and leaves one that validate() accepts, with the same
// graph inputs and outputs (names, order) and the same numerics (fp32: relative 1e-4). A pattern is rewritten
// only when everything it needs is known (constant weights, static shapes, element types in graph.types);
// anything unknown leaves the nodes as they are. Fused nodes are made only for the element types their registry
// op takes (float32, float16, bfloat16). Intermediate values of a fused pattern must have no reader outside the
// pattern and must not be graph outputs.
//
// Ownership: passes rewrite the graph in place; new constants are new CPU tensors (existing ones are never
// written). Thread-safety: none (build-time); distinct graphs may be rewritten concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"

namespace xpuruntime::passes {

struct XPURT_API PassContext {
  // Re-infers graph.types after a rewrite (supplied by the engine: its shape inference). May be empty (tests):
  // then passes rely on the types already in graph.types (and on the types of the constants they make).
  std::function<void(Graph&)> infer_types;
  // Constant folding skips nodes whose outputs would be bigger than this (in bytes). Default 64 MiB.
  std::size_t max_folded_bytes = static_cast<std::size_t>(64) << 20;
  // The device the plan runs on: device-specific passes (nhwc_layout: CUDA only) do nothing elsewhere.
  Device device;
  // Tensor parallelism (ExecutionPolicy.tensor_parallel): the graph becomes rank `tp_rank`'s shard of `tp_size`,
  // its all-reduces on the communicator of handle `tp_comm`. 1: the pass does nothing.
  int tp_size = 1;
  int tp_rank = 0;
  std::int64_t tp_comm = -1;
  // elementwise_fusion: whether the plan's device has a fused_elementwise kernel to run the groups (CUDA: the codegen
  // backend with NVRTC), and which registry ops the KernelPolicy keeps on kernels of their own (a rule for the op or
  // its family): those nodes are not fused. Empty: none.
  bool fuse_elementwise = true;
  std::function<bool(const std::string& registry_op)> keep_unfused;
  // quantized_fusion (Note [Quantized fusion] in passes/fusion_quantized.cpp): whether the plan's device has kernels
  // of the int8 ops qlinear and qconv2d (and the plan computes in float32 or float16 on one rank; keep_unfused rules
  // float ops: Note [Float pinned by the KernelPolicy]). keep_quantized_weights: the
  // pass will run (runtime::optimize sets it), so the folding keeps each DequantizeLinear of an int8/uint8 constant as
  // a node for it; the pass folds the ones it does not fuse.
  bool fuse_quantized = true;
  bool keep_quantized_weights = false;
  // ExecutionPolicy.fp8_fast_accumulation: the float8 GEMMs quantized_fusion makes take fast_accumulation=1.
  bool fp8_fast_accumulation = false;
  // int4_weight_fusion (Note [Int4 weight fusion] in passes/fusion_int4.cpp): whether the plan's device has a kernel of
  // matmul_nbits (and the plan runs on one rank). keep_int4_weights: the pass will run (runtime::optimize sets it), so
  // the folding keeps each DequantizeLinear of an int4/uint4 constant as a node for it; the pass folds the ones it
  // does not fuse.
  bool fuse_int4_weights = true;
  bool keep_int4_weights = false;
  // group_query_attention_decomposition (Note [Group query attention decomposed] in passes/decomposition_gqa.cpp):
  // the plan's device has no group_query_attention kernel (or XPURT_GQA_DECOMPOSE=1 asks for the decomposition).
  bool decompose_group_query_attention = false;
};

// What one pass did. `notes`: one line per rewrite, e.g. "fused Conv 'c1' + Relu 'r1' -> FusedConv 'c1'".
struct XPURT_API PassResult {
  std::string pass;
  int rewrites = 0;
  std::vector<std::string> notes;
  double ms = 0;  // wall time of the pass and of the type inference after it (run_passes)
};

struct XPURT_API PassInfo {
  std::string name;  // the user-facing switch name ("constant_folding", "conv_fusion", ...)
  std::string doc;   // one line: what the pass rewrites
  std::function<PassResult(Graph&, const PassContext&)> run;
};

// Every pass, in the order run_passes runs them (all on by default).
XPURT_API const std::vector<PassInfo>& all_passes();
// The names of all_passes(), comma separated (for messages and docs).
XPURT_API std::string pass_names();

// Validates `g`, runs every pass not named in `disabled` in order (re-inferring types through ctx.infer_types
// after each pass that rewrote something), validates the result. An unknown name in `disabled` ->
// InvalidArgumentError listing the valid names (before anything is rewritten).
XPURT_API std::vector<PassResult> run_passes(Graph& g, const PassContext& ctx,
                                             const std::set<std::string>& disabled = {});

// The passes one by one (what all_passes() holds); each expects a validated graph and leaves one sorted
// topologically.
XPURT_API PassResult constant_folding(Graph& g, const PassContext& ctx);
XPURT_API PassResult shape_folding(Graph& g, const PassContext& ctx);
XPURT_API PassResult predicate_reduction(Graph& g, const PassContext& ctx);
XPURT_API PassResult identity_elimination(Graph& g, const PassContext& ctx);
XPURT_API PassResult dead_node_elimination(Graph& g, const PassContext& ctx);
XPURT_API PassResult conv_bn_folding(Graph& g, const PassContext& ctx);
XPURT_API PassResult gelu_fusion(Graph& g, const PassContext& ctx);
XPURT_API PassResult layer_norm_fusion(Graph& g, const PassContext& ctx);
XPURT_API PassResult residual_layer_norm_fusion(Graph& g, const PassContext& ctx);
XPURT_API PassResult post_norm_residual_fusion(Graph& g, const PassContext& ctx);
XPURT_API PassResult attention_fusion(Graph& g, const PassContext& ctx);
// Conv with a kernel as large as its stride (8 x 8 or more, no padding: ViT's patch embedding) -> patch Transpose +
// Linear (Note [Patch embedding as a GEMM] in passes/patch_embedding.cpp).
XPURT_API PassResult patch_embedding_gemm(Graph& g, const PassContext& ctx);
XPURT_API PassResult gemm_fusion(Graph& g, const PassContext& ctx);
// Three Linears of one input projecting an Attention's q, k and v -> one Linear whose output the Attention reads as
// its packed projection (Note [One GEMM for q, k and v] in passes/fusion_transformer.cpp).
XPURT_API PassResult qkv_fusion(Graph& g, const PassContext& ctx);
// CUDA: an Attention whose head dim is not a multiple of 8 -> heads padded with zeros in the weights of its packed
// projection and output projection (Note [Head dims padded in the weights] in passes/attention_padding.cpp).
XPURT_API PassResult attention_head_padding(Graph& g, const PassContext& ctx);
XPURT_API PassResult conv_fusion(Graph& g, const PassContext& ctx);
XPURT_API PassResult op_decomposition(Graph& g, const PassContext& ctx);
// com.microsoft GroupQueryAttention (constant total_sequence_length, static shapes) -> ONNX ops every device runs,
// when ctx.decompose_group_query_attention (Note [Group query attention decomposed] in passes/decomposition_gqa.cpp).
XPURT_API PassResult group_query_attention_decomposition(Graph& g, const PassContext& ctx);
XPURT_API PassResult tensor_parallel(Graph& g, const PassContext& ctx);
XPURT_API PassResult nhwc_layout(Graph& g, const PassContext& ctx);
// Linear + Mul(per-feature constant) [+ Add(residual)] -> the Linear with scaled weights and the residual input
// (Note [Layer scale in the GEMM] in passes/fusion_conv_gemm.cpp); after nhwc_layout, which drops the permutes between.
XPURT_API PassResult linear_epilogue_fusion(Graph& g, const PassContext& ctx);
// Note [Affine maps after a layer norm folded into it] (norm_affine_folding.cpp).
XPURT_API PassResult norm_affine_folding(Graph& g, const PassContext& ctx);
// CUDA: an Attention reading q, k and v as per-head parts of one projection, keys narrower than values -> q and k
// padded to v's width in the projection's weights (Note [Unequal q, k and v parts padded in the weights] in
// passes/attention_padding.cpp); after fused_input_views.
XPURT_API PassResult attention_part_padding(Graph& g, const PassContext& ctx);
// Chains of elementwise ops (Add, Mul, Sigmoid, Erf, Gelu, ...) of one shape and float dtype whose intermediates
// nobody else reads -> com.xpuruntime:FusedElementwise with their program (Note [Fused elementwise programs]).
XPURT_API PassResult elementwise_fusion(Graph& g, const PassContext& ctx);
// A FusedElementwise's input made of Slices, Transposes and Reshapes of a tensor -> the tensor, read through a strided
// view (Note [Fused nodes read their inputs' views] in passes/fused_input_views.cpp).
XPURT_API PassResult fused_input_views(Graph& g, const PassContext& ctx);
// A Concat of FusedElementwise values only it reads, or of values view ops copied -> one FusedElementwise whose pieces
// write the concatenation (Note [Concats of fused values] in passes/fusion_concat.cpp).
XPURT_API PassResult concat_fusion(Graph& g, const PassContext& ctx);

// DequantizeLinear(int8 or uint8 constant) -> MatMul/Gemm/Conv (per-tensor activations, per-tensor or per-output-
// channel symmetric int8 weights) [+ bias] [+ Relu] [+ QuantizeLinear] -> com.xpuruntime:QLinear / QConv (the registry
// ops qlinear / qconv2d), and ONNX's QLinearMatMul/QLinearConv/MatMulInteger/ConvInteger -> the same nodes
// (runtime::lower_quantized_onnx's conditions; Note [Quantized fusion] in passes/fusion_quantized.cpp).
XPURT_API PassResult quantized_fusion(Graph& g, const PassContext& ctx);
// A DequantizeLinear of an int8/uint8 constant: what the folding keeps while PassContext::keep_quantized_weights.
XPURT_API bool is_quantized_weight_dequantize(const Graph& g, const Node& n);
// DequantizeLinear(constant int4/uint4 weight, blocked along K or per tensor/channel) -> MatMul/Gemm [+ bias], and
// com.microsoft MatMulNBits with 4-bit codes and no g_idx -> com.xpuruntime:MatMulNBits (the registry op
// matmul_nbits; Note [Int4 weight fusion] in passes/fusion_int4.cpp).
XPURT_API PassResult int4_weight_fusion(Graph& g, const PassContext& ctx);
// A DequantizeLinear of an int4/uint4 constant: what the folding keeps while PassContext::keep_int4_weights.
XPURT_API bool is_int4_weight_dequantize(const Graph& g, const Node& n);
// QLinear / QConv whose weight, w_scale and bias are constants -> the same node reading alpha (x_scale 1) and an int32
// bias holding the zero point's correction, made once here (Note [Quantized constants folded at build time] in
// passes/quantized_constants.cpp).
XPURT_API PassResult quantized_constant_folding(Graph& g, const PassContext& ctx);

// Whether a default-domain node has as many inputs and outputs as some version of its ONNX operator takes (true for
// other domains and for operators ONNX's schemas do not list). Every pattern a pass matches checks it first (Note
// [Patterns check arity] in passes/pass_utils.h).
XPURT_API bool has_onnx_arity(const Node& n);

// The bytes folding `n` would allocate, predicted from the graph's types (and, for ConstantOfShape, Expand, Tile
// and Range, from their constant inputs) before running it; nullopt when unknown.
std::optional<std::size_t> predicted_fold_bytes(const Graph& g, const Node& n);

}  // namespace xpuruntime::passes
