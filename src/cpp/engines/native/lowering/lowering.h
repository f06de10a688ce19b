// Lowering: an ONNX node (or a com.xpuruntime fused node) -> one KernelRegistry op, a view, or the node's node kernel
// (Note [Two ways a node runs] in core/node_kernels.h). Internal header of the native engine.
//
// The lowering is a pure function of the node, its inputs' types and the values of its constant inputs: shapes
// given as inputs (Reshape's shape, Slice's starts, ReduceSum's axes, ...) must be constants to lower onto a
// registry op, whose attributes they become. Whatever cannot be lowered runs through the reference library on
// the CPU; `Lowered::reason` says why, and explain() shows it. So do nodes that read a sequence or an optional
// (value.h): registry ops take tensors only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpuruntime/graph.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::runtime {

struct Lowered {
  enum class Kind {
    kRegistry,   // run registry op `op` with `inputs` (node input indices, -1 = absent) and `attrs`
    kView,       // output 0 is input 0 with shape `view_shape` (same bytes): Reshape, Flatten, Squeeze, Identity...
    kReference,  // run the node through the ONNX reference library (CPU only)
  };
  Kind kind = Kind::kReference;
  std::string op;
  std::vector<int> inputs;
  Attributes attrs;
  std::vector<std::int64_t> view_shape;
  std::int64_t view_offset = 0;  // kView: where output 0 starts in input 0, in elements (Note [Views at an offset])
  std::string reason;  // for kReference: why it is not lowered; else empty
};

// `types[i]`: the type of node input i (null when absent or unknown); `constants[i]`: its value when it is a
// constant (null otherwise).
Lowered lower_node(const Node& node, std::int64_t opset, const std::vector<const ValueType*>& types,
                   const std::vector<const Tensor*>& constants);

// ONNX's QLinearMatMul, MatMulInteger, QLinearConv and ConvInteger -> qlinear / qconv2d (Note [Quantized registry ops]
// in core/op_schemas.cpp) when their parameters are what those ops take (per-tensor constant scales and zero points
// of x and y; a symmetric int8 weight, per tensor or per output channel), else kReference with the reason. Not in
// lower_node's table: the quantized_fusion pass makes com.xpuruntime QLinear/QConv nodes of them, so that turning the
// pass off leaves them to their node kernels.
Lowered lower_quantized_onnx(const Node& node, std::int64_t opset, const std::vector<const ValueType*>& types,
                             const std::vector<const Tensor*>& constants);

// ONNX Runtime's com.microsoft MatMulNBits (A, B, scales, zero_points, g_idx, bias) -> matmul_nbits (Note [Int4
// weight-only GEMM] in core/op_schemas_int4.cpp) when it is what that op takes: bits=4, no g_idx, packed uint8 zero
// points (or none), A float32/float16/bfloat16, B and the scales of the shapes K, N and block_size give; else
// kReference with the reason. The int4_weight_fusion pass calls it (so that disabling the pass leaves MatMulNBits to
// its node kernel); lower_node gives its reason for a MatMulNBits the pass left.
Lowered lower_matmul_nbits(const Node& node, const std::vector<const ValueType*>& types);

}  // namespace xpuruntime::runtime
