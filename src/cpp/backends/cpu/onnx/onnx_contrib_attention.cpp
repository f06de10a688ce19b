// ONNX Runtime's com.microsoft GroupQueryAttention as a node kernel: the registry op group_query_attention (Note
// [Group query attention] in core/op_schemas_gqa.cpp) with the value of the node's total_sequence_length input. It
// runs the nodes the native engine could not lower (total_sequence_length known only at run time, in a plan that
// cannot end a segment there). See backends/cpu/onnx/onnx_kernels.h.
#include <string>
#include <vector>

#include "backends/cpu/onnx/onnx_kernels.h"
#include "core/group_query_attention.h"
#include "xpuruntime/ops.h"

namespace xpuruntime::onnx_ref {

namespace {

void group_query_attention(OpContext& ctx) {
  gqa::check_supported(ctx.node());
  const Tensor& total = ctx.input(gqa::kTotalSequenceLengthInput);
  XPURT_CHECK_TYPE(total.dtype() == DType::kInt32, ctx.where(), ": input 'total_sequence_length' must be int32, got ",
                   dtype_name(total.dtype()));
  XPURT_CHECK(total.numel() == 1 && total.dim() <= 1, ctx.where(), ": input 'total_sequence_length' must hold one "
              "value, got ", total.numel(), " in rank ", total.dim());
  const std::int64_t total_length = *static_cast<const std::int32_t*>(total.data_ptr());
  std::vector<Tensor> inputs;
  for (std::size_t i : gqa::registry_inputs()) inputs.push_back(ctx.has_input(i) ? ctx.input(i) : Tensor());
  std::vector<Tensor> outputs =
      ops::call("group_query_attention", inputs, gqa::registry_attributes(ctx.node().attrs, total_length));
  for (std::size_t o = 0; o < outputs.size() && o < ctx.num_outputs(); ++o) {
    if (ctx.wants_output(o)) ctx.set_output(o, std::move(outputs[o]));
  }
}

}  // namespace

void register_contrib_attention_ops(NodeKernelRegistrar& kernels) {
  kernels.add("com.microsoft", "GroupQueryAttention", group_query_attention);
}

}  // namespace xpuruntime::onnx_ref
