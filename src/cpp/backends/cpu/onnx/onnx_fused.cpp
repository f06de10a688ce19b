// The cpu node kernels of the com.xpuruntime nodes made by the native engine's graph passes: each node is one
// registry op (docs/native_engine.md, "Graph passes", gives the mapping) called on the CPU.
#include <string>
#include <vector>

#include "backends/cpu/onnx/onnx_kernels.h"
#include "core/attention_layout.h"
#include "core/fused_elementwise.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/ops.h"

namespace xpuruntime::onnx_ref {

namespace {

std::vector<Tensor> inputs_of(const OpContext& ctx, std::size_t count) {
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < count; ++i) inputs.push_back(ctx.has_input(i) ? ctx.input(i) : Tensor());
  return inputs;
}

void run_registry_op(OpContext& ctx, const std::string& op, std::vector<Tensor> inputs,
                     const Attributes& attrs) {
  std::vector<Tensor> out = ops::call(op, inputs, attrs);
  XPURT_INTERNAL_ASSERT(out.size() == 1, ctx.where(), ": registry op ", op, " returned ", out.size(), " outputs");
  ctx.set_output(0, std::move(out[0]));
}

}  // namespace

void register_fused_ops(NodeKernelRegistrar& kernels) {
  kernels.add(kXpurtDomain, "FusedConv", [](OpContext& ctx) {
    Attributes attrs;
    if (ctx.input(1).dim() == 5) {  // Note [3-D convolutions fused] (fusion_conv_gemm.cpp)
      attrs.set("strides", ctx.attr_ints("strides", {1, 1, 1}))
          .set("pads", ctx.attr_ints("pads", {0, 0, 0, 0, 0, 0}))
          .set("dilations", ctx.attr_ints("dilations", {1, 1, 1}))
          .set("groups", ctx.attr_int("group", 1))
          .set("activation", ctx.attr_string("activation", "none"));
      run_registry_op(ctx, "conv3d", inputs_of(ctx, 4), attrs);
      return;
    }
    attrs.set("strides", ctx.attr_ints("strides", {1, 1}))
        .set("pads", ctx.attr_ints("pads", {0, 0, 0, 0}))
        .set("dilations", ctx.attr_ints("dilations", {1, 1}))
        .set("groups", ctx.attr_int("group", 1))
        .set("activation", ctx.attr_string("activation", "none"))
        .set("layout", ctx.attr_string("layout", "NCHW"));
    run_registry_op(ctx, "conv2d", inputs_of(ctx, 4), attrs);
  });
  // The channels-last pools of the nhwc_layout pass (explicit pads, no auto_pad).
  for (const char* op_type : {"MaxPool", "AveragePool"}) {
    const bool max = std::string(op_type) == "MaxPool";
    kernels.add(kXpurtDomain, op_type, [max](OpContext& ctx) {
      Attributes attrs;
      const auto kernel = ctx.attr_ints("kernel_shape", {});
      attrs.set("kernel_shape", kernel)
          .set("strides", ctx.attr_ints("strides", {1, 1}))
          .set("pads", ctx.attr_ints("pads", {0, 0, 0, 0}))
          .set("ceil_mode", ctx.attr_int("ceil_mode", 0))
          .set("layout", ctx.attr_string("layout", "NCHW"));
      if (max) {
        attrs.set("dilations", ctx.attr_ints("dilations", {1, 1}));
      } else {
        attrs.set("count_include_pad", ctx.attr_int("count_include_pad", 0));
      }
      run_registry_op(ctx, max ? "max_pool2d" : "avg_pool2d", inputs_of(ctx, 1), attrs);
    });
  }
  kernels.add(kXpurtDomain, "GlobalAveragePool", [](OpContext& ctx) {
    run_registry_op(ctx, "global_avg_pool", inputs_of(ctx, 1),
                    Attributes().set("layout", ctx.attr_string("layout", "NCHW")));
  });
  kernels.add(kXpurtDomain, "FusedElementwise", [](OpContext& ctx) {  // Note [Fused elementwise programs]
    run_registry_op(ctx, "fused_elementwise", inputs_of(ctx, ctx.num_inputs()),
                    fused::registry_attributes(ctx.node().attrs));
  });
  kernels.add(kXpurtDomain, "Linear", [](OpContext& ctx) {
    Attributes attrs;
    attrs.set("weight_layout", ctx.attr_string("weight_layout", "nk"))
        .set("activation", ctx.attr_string("activation", "none"));
    run_registry_op(ctx, "linear", inputs_of(ctx, 4), attrs);
  });
  // The quantized_fusion pass's int8 nodes: their attributes are the registry op's (Note [Quantized registry ops]).
  kernels.add(kXpurtDomain, "QLinear", [](OpContext& ctx) {
    run_registry_op(ctx, "qlinear", inputs_of(ctx, 5), ctx.node().attrs);
  });
  kernels.add(kXpurtDomain, "QConv", [](OpContext& ctx) {
    run_registry_op(ctx, "qconv2d", inputs_of(ctx, 4), ctx.node().attrs);
  });
  kernels.add(kXpurtDomain, "QLinearFp8", [](OpContext& ctx) {  // Note [Float8 quantized linear]
    run_registry_op(ctx, "qlinear_fp8", inputs_of(ctx, 4), ctx.node().attrs);
  });
  // The int4_weight_fusion pass's node: its attributes are the registry op's (Note [Int4 weight-only GEMM]).
  kernels.add(kXpurtDomain, "MatMulNBits", [](OpContext& ctx) {
    run_registry_op(ctx, "matmul_nbits", inputs_of(ctx, 5), ctx.node().attrs);
  });
  kernels.add(kXpurtDomain, "Gelu", [](OpContext& ctx) {
    run_registry_op(ctx, "gelu", inputs_of(ctx, 1),
                    Attributes().set("approximate", ctx.attr_string("approximate", "none")));
  });
  kernels.add(kXpurtDomain, "LayerNormalization", [](OpContext& ctx) {
    Attributes attrs;
    attrs.set("axis", ctx.attr_int("axis", -1)).set("epsilon", ctx.attr_float("epsilon", 1e-5));
    if (ctx.attr_int("row_affine", 0) != 0) {  // Note [Per-row affine of a layer norm]
      attrs.set("row_affine", std::int64_t{1}).set("affine_run", ctx.attr_int("affine_run", 0));
    }
    run_registry_op(ctx, "layer_norm", inputs_of(ctx, 5), attrs);
  });
  kernels.add(kXpurtDomain, "Attention", [](OpContext& ctx) {
    Attributes attrs;
    attrs.set("scale", ctx.attr_float("scale", 0.0)).set("causal", ctx.attr_int("causal", 0));
    AttentionLayout::forward(ctx.node().attrs, &attrs);  // Note [Attention layouts]
    forward_fully_masked_rows(ctx.node().attrs, &attrs);  // Note [Fully masked attention rows]
    run_registry_op(ctx, "attention", inputs_of(ctx, 4), attrs);
  });
}

}  // namespace xpuruntime::onnx_ref
