// The pass list and run_passes (see passes.h).
#include "engines/native/passes/passes.h"

#include <chrono>
#include <string>

#include "core/build_clock.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

const std::vector<PassInfo>& all_passes() {
  // The order matters: folding first (fusions look for constant weights), then the clean-up that lets patterns
  // match (an Identity or a dead reader between two nodes hides a pattern), then conv_bn_folding before
  // conv_fusion, and gelu_fusion before gemm_fusion (Linear takes the fused Gelu as its activation).
  static const std::vector<PassInfo> passes = {
      {"constant_folding", "nodes whose inputs are all constants become constants (not Random*/Bernoulli)",
       constant_folding},
      {"shape_folding", "Shape/Size of values with known shapes become constants; folds what follows, to a fixed point",
       shape_folding},
      {"predicate_reduction",
       "ReduceMax/ReduceMin of Cast(bool -> T) -> Cast(ReduceMax/ReduceMin of the bools -> T) (any, all), and "
       "IsInf/IsNaN of a widening float Cast read the narrower value (Note [Reductions of predicates])",
       predicate_reduction},
      {"identity_elimination", "removes Identity, inference Dropout, Cast to the same type, Reshape to the same shape, "
                               "Mul/Div by 1, Pad by zeros, Expand before a broadcasting op",
       identity_elimination},
      {"dead_node_elimination", "removes nodes whose outputs nobody reads, and unused constants",
       dead_node_elimination},
      {"tensor_parallel",
       "ExecutionPolicy.tensor_parallel > 1: this rank's shard (column/row-parallel GEMMs, attention heads split, an "
       "all_reduce after each row-parallel GEMM; docs/distributed.md)",
       tensor_parallel},
      {"op_decomposition",
       "Split -> Slices, 1-D Conv -> 2-D Conv between views (pointwise ones -> MatMul), LayerNormalization's "
       "constants in X's float type: "
       "ops every device runs",
       op_decomposition},
      {"group_query_attention_decomposition",
       "com.microsoft GroupQueryAttention -> MatMul/Softmax/Where/GatherElements... on devices without a "
       "group_query_attention kernel (Note [Group query attention decomposed])",
       group_query_attention_decomposition},
      {"int4_weight_fusion",
       "DequantizeLinear(constant int4/uint4 weight, blocks along K) -> MatMul/Gemm [+ bias], and com.microsoft "
       "MatMulNBits (bits 4, no g_idx) -> com.xpuruntime:MatMulNBits (registry op matmul_nbits: the packed codes "
       "dequantized in registers)",
       int4_weight_fusion},
      {"quantized_fusion",
       "DequantizeLinear(int8) x and constant weight -> MatMul/Gemm/Conv [+ bias] [+ Relu] [+ QuantizeLinear] -> "
       "com.xpuruntime:QLinear / QConv (int8 registry ops qlinear / qconv2d; per-tensor activations, symmetric "
       "per-channel int8 weights); QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger -> the same",
       quantized_fusion},
      {"conv_bn_folding",
       "Conv + BatchNormalization (inference, constant parameters) -> Conv with folded weights; CUDA: the other "
       "inference BatchNormalizations -> Mul + Add by per-channel constants (Note [Batch norms without a convolution "
       "become an affine map])",
       conv_bn_folding},
      {"gelu_fusion", "the erf and tanh GELU formulas and ONNX Gelu -> com.xpuruntime:Gelu", gelu_fusion},
      {"layer_norm_fusion",
       "the LayerNorm formula over the last axis and ONNX LayerNormalization -> "
       "com.xpuruntime:LayerNormalization",
       layer_norm_fusion},
      {"residual_layer_norm_fusion",
       "Add(a, b) read only by a fused LayerNormalization -> its residual input (one kernel: layer_norm(a + b))",
       residual_layer_norm_fusion},
      {"post_norm_residual_fusion",
       "Add(r, y) of a fused LayerNormalization's y that only it reads -> its addend input (one kernel: "
       "r + layer_norm(x), the res-post-norm block's residual add)",
       post_norm_residual_fusion},
      {"attention_fusion", "MatMul(Q, K^T) [scale] [+ mask] Softmax MatMul(., V) -> com.xpuruntime:Attention",
       attention_fusion},
      {"patch_embedding_gemm",
       "Conv whose kernel equals its stride (at least 8 x 8, no padding: ViT's patch embedding) -> one Transpose of the "
       "image's patches + Linear; with the models' flatten + transpose after it, the Linear writes the tokens",
       patch_embedding_gemm},
      {"gemm_fusion", "MatMul/Gemm with constant weights [+ bias] [+ Relu/Gelu] -> com.xpuruntime:Linear", gemm_fusion},
      {"qkv_fusion",
       "three Linears of one input projecting an Attention's q, k and v -> one Linear, read by the Attention as its "
       "packed projection (qkv_parts)",
       qkv_fusion},
      {"attention_head_padding",
       "CUDA: an Attention of a head dim that is not a multiple of 8, reading a packed projection and read by an "
       "output projection -> heads padded with zeros in those Linears' weights, for the fused kernels",
       attention_head_padding},
      {"conv_fusion", "2-D Conv [+ bias] [+ residual] [+ Relu], 3-D Conv + bias [+ residual] [+ Relu] -> "
                      "com.xpuruntime:FusedConv", conv_fusion},
      {"nhwc_layout",
       "CUDA, float16/bfloat16: FusedConv (channels multiple of 8, one group; a stem of 2 to 7 channels on its input "
       "padded to 8) and the pools after it run channels-last (NHWC), weights permuted once, Transposes only where "
       "NCHW readers remain; the int8 QConv (input channels multiple of 16, one group) too, for the tensor cores",
       nhwc_layout},
      {"quantized_constant_folding",
       "QLinear / QConv with constant weight, w_scale and bias: alpha = x_scale * w_scale and the zero point's "
       "correction (int32 bias) computed once as constants (Note [Quantized constants folded at build time]), not "
       "by a prologue kernel at every GPU launch",
       quantized_constant_folding},
      {"linear_epilogue_fusion",
       "Linear [+ Mul(per-feature constant: layer scale)] [+ Add(per-feature constant)] [+ Add(residual)] -> the "
       "Linear with its weights and bias scaled and shifted at build time and the residual as its C operand; "
       "Reshapes between them (the features kept last before a per-feature constant) become one after the Linear",
       linear_epilogue_fusion},
      {"norm_affine_folding",
       "LayerNormalization over the last axis [+ Reshapes] + Mul/Add of a constant that varies only within a row -> "
       "the norm with the map folded into its scale and bias, the Reshapes one after it (Note [Affine maps after a "
       "layer norm folded into it]: PoolFormer's GroupNorm(1) affine)",
       norm_affine_folding},
      {"elementwise_fusion",
       "chains of elementwise ops of one shape and float dtype (intermediates read by nobody else) -> "
       "com.xpuruntime:FusedElementwise, one generated kernel (Note [Fused elementwise programs]); a KernelPolicy "
       "rule for an op or its family keeps its nodes out",
       elementwise_fusion},
      {"fused_input_views",
       "a FusedElementwise input made by Slices / Transposes / Reshapes that copy reads their source through a "
       "strided view instead (Note [Fused nodes read their inputs' views]): the copies go",
       fused_input_views},
      {"attention_part_padding",
       "CUDA: an Attention reading q, k and v as per-head parts of one projection with keys narrower than values "
       "(LeViT) -> q and k padded to v's width with zeros in the projection's weights, one packed view, for the fused "
       "kernels",
       attention_part_padding},
      {"concat_fusion",
       "CUDA: a Concat of FusedElementwise values only it reads, or of values that view ops copied -> one "
       "FusedElementwise whose pieces write the concatenation in place (Note [Concats of fused values]); a "
       "KernelPolicy rule for concat keeps them",
       concat_fusion},
  };
  return passes;
}

std::string pass_names() {
  std::string names;
  for (const PassInfo& p : all_passes()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

std::vector<PassResult> run_passes(Graph& g, const PassContext& ctx, const std::set<std::string>& disabled) {
  for (const std::string& name : disabled) {
    bool known = false;
    for (const PassInfo& p : all_passes()) known = known || p.name == name;
    XPURT_CHECK(known, "unknown graph pass '", name, "' in the disabled passes; valid names: ", pass_names());
  }
  g.validate();
  std::vector<PassResult> results;
  for (const PassInfo& p : all_passes()) {
    if (disabled.count(p.name)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    PassResult r = p.run(g, ctx);
    r.pass = p.name;
    if (r.rewrites > 0 && ctx.infer_types) ctx.infer_types(g);
    r.ms = detail::ms_since(t0);
    results.push_back(std::move(r));
  }
  g.validate();
  return results;
}

}  // namespace xpuruntime::passes

namespace xpuruntime {

std::vector<GraphPassInfo> graph_passes() {
  std::vector<GraphPassInfo> out;
  for (const passes::PassInfo& p : passes::all_passes()) out.push_back({p.name, p.doc});
  return out;
}

}  // namespace xpuruntime
