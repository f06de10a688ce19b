// Shape inference, constant folding and the optimization pipeline (see shape_inference.h).
#include "engines/native/inference/shape_inference.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_set>

#include "core/build_clock.h"
#include "core/node_kernels.h"
#include "engines/native/lowering/lowering.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime::runtime {
namespace {

bool is_random(const Node& n) {
  static const std::unordered_set<std::string> random = {"RandomUniform", "RandomNormal", "RandomUniformLike",
                                                         "RandomNormalLike", "Bernoulli", "Multinomial"};
  return random.count(n.op_type) != 0;
}

ValueType type_of_tensor(const Tensor& t) {
  ValueType vt;
  vt.dtype = t.dtype();
  vt.has_shape = true;
  for (auto d : t.shape()) vt.shape.emplace_back(d);
  return vt;
}

Tensor int64_vector(const std::vector<std::int64_t>& values, bool scalar) {
  Tensor t = Tensor::empty(scalar ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{
                                                                      static_cast<std::int64_t>(values.size())},
                           DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

ValueType scalar_type(DType dtype) {
  ValueType vt;
  vt.dtype = dtype;
  vt.has_shape = true;
  return vt;
}

ValueType unshaped(ValueType vt) {
  vt.has_shape = false;
  vt.shape.clear();
  return vt;
}

// The types of the outputs of a node that makes or reads sequences and optionals (value.h), from its inputs'
// types and its attributes; empty entries where nothing is known. ONNX's own inference rules, minus the shapes
// that only a run knows.
std::vector<std::optional<ValueType>> sequence_output_types(const Node& node,
                                                            const std::vector<const ValueType*>& types) {
  std::vector<std::optional<ValueType>> out(node.outputs.size());
  if (!node.domain.empty() || out.empty()) return out;
  const ValueType* in0 = types.empty() ? nullptr : types[0];
  const std::string& op = node.op_type;
  if (op == "SequenceEmpty") {
    DType dtype = DType::kFloat32;
    if (dtype_from_onnx_type(node.attrs.get_int("dtype", 1), &dtype)) {
      out[0] = ValueType::sequence_of(unshaped(scalar_type(dtype)));
    }
  } else if (op == "SequenceConstruct" || op == "SplitToSequence") {
    if (in0 && in0->is_tensor()) out[0] = ValueType::sequence_of(unshaped(*in0));
  } else if (op == "SequenceInsert" || op == "SequenceErase") {
    if (in0 && in0->kind == ValueKind::kSequence) out[0] = unshaped(*in0);
  } else if (op == "SequenceAt" || op == "ConcatFromSequence") {
    if (in0 && in0->kind == ValueKind::kSequence) out[0] = unshaped(in0->element());
  } else if (op == "SequenceLength") {
    out[0] = scalar_type(DType::kInt64);
  } else if (op == "OptionalHasElement") {
    out[0] = scalar_type(DType::kBool);
  } else if (op == "Optional") {
    auto type = node.type_attrs.find("type");
    if (in0 && in0->kind != ValueKind::kOptional) {
      out[0] = ValueType::optional_of(*in0);
    } else if (type != node.type_attrs.end() && type->second.kind != ValueKind::kOptional) {
      out[0] = ValueType::optional_of(type->second);
    }
  } else if (op == "OptionalGetElement") {
    if (in0) out[0] = in0->kind == ValueKind::kOptional ? in0->element() : *in0;
  } else if (op == "Identity") {
    if (in0 && !in0->is_tensor()) out[0] = *in0;
  } else if (op == "SequenceMap" || op == "If" || op == "Loop") {
    // Sequence and optional outputs as the body declares them (If: the then branch; Loop: after the condition).
    const char* attr = op == "If" ? "then_branch" : "body";
    auto it = node.graph_attrs.find(attr);
    if (it == node.graph_attrs.end() || !it->second) return out;
    const Graph& body = *it->second;
    const std::size_t skip = op == "Loop" ? 1 : 0;
    for (std::size_t i = 0; i < out.size() && i + skip < body.outputs.size(); ++i) {
      const ValueType* vt = body.type(body.outputs[i + skip]);
      if (op == "SequenceMap") {
        if (vt && vt->is_tensor()) out[i] = ValueType::sequence_of(*vt);
      } else if (vt && !vt->is_tensor()) {
        out[i] = *vt;
      }
    }
  }
  return out;
}

// Note [Shapes without stand-ins]
// Running a node on stand-ins (Note [Shapes through the reference library]) costs what the node costs: at batch 16
// Whisper's first 1-D Conv (before op_decomposition makes it 2-D) ran 700 ms on the CPU, and GPT-2's twelve
// qkv Splits 120 ms, in every plan build (Note [Build phases]). The ops that exporters leave for the passes to
// rewrite get their output shapes from ONNX's formulas instead; the stand-in remains for the rest.
std::optional<std::vector<ValueType>> formula_output_types(const Node& node, std::int64_t opset,
                                                          const std::vector<const ValueType*>& types,
                                                          const std::vector<const Tensor*>& constants) {
  if (!node.domain.empty() || types.empty() || types[0] == nullptr) return std::nullopt;
  const std::vector<std::int64_t> x = types[0]->sizes();
  const auto rank = static_cast<std::int64_t>(x.size());
  const auto typed = [&](std::vector<std::int64_t> shape) {
    ValueType vt;
    vt.dtype = types[0]->dtype;
    vt.has_shape = true;
    for (std::int64_t d : shape) vt.shape.emplace_back(d);
    return vt;
  };
  if (node.op_type == "DequantizeLinear") {
    // x's shape in the scale's type: the weights' DequantizeLinear the folding keeps for quantized_fusion and
    // int4_weight_fusion would otherwise be run whole at every type inference until those passes run.
    if (types.size() < 2 || types[1] == nullptr) return std::nullopt;
    ValueType vt = typed(x);
    vt.dtype = types[1]->dtype;
    return std::vector<ValueType>{vt};
  }
  if (node.op_type == "MatMulInteger") {
    // numpy's matmul of the shapes, int32: a run-time zero point (DynamicQuantizeLinear's, a scalar) would make the
    // stand-ins refuse the node, and the shapes of everything after ONNX Runtime's dynamically quantized MatMuls
    // would be known only at run time (so refused on CUDA), the int8 fusion of the next MatMulInteger included.
    if (types.size() < 2 || types[1] == nullptr || rank < 1) return std::nullopt;
    const std::vector<std::int64_t> b = types[1]->sizes();
    if (b.empty()) return std::nullopt;
    std::vector<std::int64_t> y;
    if (b.size() == 1) {
      y.assign(x.begin(), x.end() - 1);
    } else if (x.size() == 1) {
      y.assign(b.begin(), b.end() - 2);
      y.push_back(b.back());
    } else {
      const std::vector<std::int64_t> xb(x.begin(), x.end() - 2), bb(b.begin(), b.end() - 2);
      const std::size_t batch = std::max(xb.size(), bb.size());
      for (std::size_t i = 0; i < batch; ++i) {
        const std::int64_t dx = i + xb.size() >= batch ? xb[i + xb.size() - batch] : 1;
        const std::int64_t db = i + bb.size() >= batch ? bb[i + bb.size() - batch] : 1;
        if (dx != db && dx != 1 && db != 1) return std::nullopt;  // the library says what is wrong
        y.push_back(dx == 1 ? db : dx);
      }
      y.push_back(x[x.size() - 2]);
      y.push_back(b.back());
    }
    ValueType vt = typed(y);
    vt.dtype = DType::kInt32;
    return std::vector<ValueType>{vt};
  }
  if (node.op_type == "Conv") {
    if (types.size() < 2 || types[1] == nullptr || rank < 3) return std::nullopt;
    const std::vector<std::int64_t> w = types[1]->sizes();
    const std::size_t spatial = x.size() - 2;
    if (w.size() != x.size()) return std::nullopt;
    const auto kernel = node.attrs.get_ints("kernel_shape", std::vector<std::int64_t>(w.begin() + 2, w.end()));
    const auto strides = node.attrs.get_ints("strides", std::vector<std::int64_t>(spatial, 1));
    const auto dilations = node.attrs.get_ints("dilations", std::vector<std::int64_t>(spatial, 1));
    const auto pads = node.attrs.get_ints("pads", std::vector<std::int64_t>(2 * spatial, 0));
    const std::string auto_pad = node.attrs.get_string("auto_pad", "NOTSET");
    if (kernel.size() != spatial || strides.size() != spatial || dilations.size() != spatial ||
        pads.size() != 2 * spatial) {
      return std::nullopt;
    }
    std::vector<std::int64_t> y = {x[0], w[0]};
    for (std::size_t i = 0; i < spatial; ++i) {
      // Fuzzed attributes reach here before the library's checks: every step is checked for overflow.
      const std::int64_t in = x[2 + i], s = strides[i];
      std::int64_t extent = 0, padded = 0;
      if (s <= 0 || in < 0 || kernel[i] <= 0 || __builtin_mul_overflow(dilations[i], kernel[i] - 1, &extent) ||
          __builtin_add_overflow(extent, 1, &extent) || extent <= 0 ||
          __builtin_add_overflow(in, pads[i], &padded) || __builtin_add_overflow(padded, pads[i + spatial], &padded)) {
        return std::nullopt;
      }
      std::int64_t out = 0;
      if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
        out = in / s + (in % s != 0 ? 1 : 0);
      } else if (auto_pad == "VALID") {
        out = in >= extent ? (in - extent) / s + 1 : 0;
      } else if (auto_pad == "NOTSET") {
        out = padded >= extent ? (padded - extent) / s + 1 : 0;
      } else {
        return std::nullopt;
      }
      if (out <= 0) return std::nullopt;  // the library says what is wrong
      y.push_back(out);
    }
    return std::vector<ValueType>{typed(y)};
  }
  if (node.op_type == "Split") {
    std::int64_t axis = node.attrs.get_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || node.outputs.empty()) return std::nullopt;
    std::vector<std::int64_t> sizes;
    if (opset >= 13 && node.has_input(1)) {
      if (constants.size() < 2 || constants[1] == nullptr || constants[1]->dtype() != DType::kInt64) return std::nullopt;
      const Tensor split = constants[1]->contiguous();
      const auto* v = static_cast<const std::int64_t*>(split.data_ptr());
      sizes.assign(v, v + split.numel());
    } else if (opset < 13 && node.attrs.has("split")) {
      sizes = node.attrs.get_ints("split", {});
    } else {
      const auto parts = static_cast<std::int64_t>(node.outputs.size());
      // A ceiling division without x[axis] + parts - 1, which overflows for a fuzzed extent near INT64_MAX.
      const std::int64_t chunk = x[axis] / parts + (opset >= 18 && x[axis] % parts != 0 ? 1 : 0);
      if (opset < 18 && x[axis] % parts != 0) return std::nullopt;
      for (std::int64_t k = 0, left = x[axis]; k < parts; ++k, left -= chunk) sizes.push_back(std::min(chunk, left));
    }
    // Each size is checked against the extent before it is added: fuzzed split sizes cannot overflow the sum.
    std::int64_t total = 0;
    for (std::int64_t d : sizes) {
      if (d < 0 || d > x[axis] - total) return std::nullopt;
      total += d;
    }
    if (sizes.size() != node.outputs.size() || total != x[axis]) return std::nullopt;
    std::vector<ValueType> out;
    for (std::int64_t d : sizes) {
      std::vector<std::int64_t> shape = x;
      shape[static_cast<std::size_t>(axis)] = d;
      out.push_back(typed(shape));
    }
    return out;
  }
  return std::nullopt;
}

// Note [Shapes through the reference library]
// A plan is specialised to its inputs' shapes, so every value's shape is known while the plan is built unless a
// node's output shape depends on run-time values. Ops the registry has no schema for (GatherND, And, IsNaN,
// Trilu, ... in the attention-mask code every transformers export carries) would otherwise end the known shapes
// there, and everything downstream would be dispatched at run time (or refused on CUDA). For such a node whose
// output shape follows from its inputs' shapes and constants alone, the reference library runs it once on
// zero-filled stand-ins for its non-constant inputs and its outputs' shapes and types are taken. Excluded:
// data-dependent ops (NonZero, NonMaxSuppression, Unique, Compress, control flow, random), sequences, and any
// non-constant input of rank <= 1 with few elements unless the op only reads data from it (such an input may be
// a shape, sizes, pads, axes, repeats or k, whose values the output shape depends on).
bool shape_follows_from_shapes(const Node& node, const std::vector<const ValueType*>& types,
                               const std::vector<const Tensor*>& constants) {
  static const std::unordered_set<std::string> data_dependent = {
      "NonZero", "NonMaxSuppression", "Unique", "Compress", "If", "Loop", "Scan", "StringNormalizer",
      "TfIdfVectorizer", "SequenceMap"};
  // Ops whose every input is data (its values never change the output shape).
  static const std::unordered_set<std::string> pure_data = {
      "And", "Or", "Xor", "Not", "IsNaN", "IsInf", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
      "BitwiseNot", "GatherND", "GatherElements", "ScatterND", "ScatterElements", "Where", "Equal", "Less",
      "Greater", "LessOrEqual", "GreaterOrEqual", "Sum", "Mean", "Min", "Max", "Add", "Sub", "Mul", "Div", "Pow",
      "PRelu", "Sign", "Floor", "Ceil", "Round", "Sin", "Cos", "Trilu", "CumSum", "Einsum", "HardSwish",
      "HardSigmoid", "Clip", "LeakyRelu", "Elu", "Softplus", "LogSoftmax", "ArgMax", "ArgMin", "OneHot"};
  if (!node.domain.empty() || !node.graph_attrs.empty() || is_random(node) || data_dependent.count(node.op_type)) {
    return false;
  }
  // OneHot's depth (input 1) sets the output's size.
  const bool pure = pure_data.count(node.op_type) != 0 && node.op_type != "OneHot";
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (!node.has_input(i)) continue;
    const ValueType* vt = types[i];
    if (vt == nullptr || !vt->is_tensor() || !vt->fully_known()) return false;
    std::int64_t n = 1;
    for (auto d : vt->sizes()) {
      // A declared size whose element count overflows int64 is no stand-in (it was undefined behaviour: UBSan in
      // the structural fuzzing of the native engine).
      if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
    }
    if (constants[i] != nullptr) continue;
    const bool shape_like = vt->shape.size() <= 1 && n <= 64;
    if (shape_like && !(pure || (node.op_type == "OneHot" && i != 1))) return false;
    bytes += static_cast<std::size_t>(n) * dtype_size(vt->dtype);
  }
  return bytes <= (std::size_t{256} << 20);  // stand-ins of at most 256 MiB
}

// Note [Plan-time reference runs under a budget]
// Shape inference and constant folding run nodes in the reference library while a plan is built. A node whose
// output size follows from values (a Range from a constant to a stand-in's 0 in tiny steps, a Tile or Expand of a
// folded shape) can ask for more memory than the machine has: the structural fuzzer found a Range of 2^31 int64
// values (16 GiB) at plan time. Each such run takes a MemoryBudget (Note [Run memory budgets]): 512 MiB for shape
// inference (its stand-ins are at most 256 MiB), at least twice max_folded_bytes for folding; an allocation past
// it raises OutOfMemoryError before anything is allocated, and the node is left as written (its types as
// declared, not folded), to report what it does when it runs under the run's own budget.
constexpr std::size_t kReferenceRunBytes = std::size_t{512} << 20;  // the stand-ins' 256 MiB and as much again

// The outputs' types of `node` from one reference run on zero-filled stand-ins (Note [Shapes through the
// reference library]); empty when the library cannot run it.
std::vector<std::optional<ValueType>> reference_output_types(const Node& node, std::int64_t opset,
                                                             const std::vector<const ValueType*>& types,
                                                             const std::vector<const Tensor*>& constants) {
  std::vector<std::optional<ValueType>> out(node.outputs.size());
  try {
    // Note [Plan-time reference runs under a budget]
    const MemoryBudgetScope budget(std::make_shared<MemoryBudget>(
        kReferenceRunBytes, std::string("shape inference's reference run of one node (512 MiB)")));
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (!node.has_input(i)) {
        inputs.emplace_back();
      } else if (constants[i] != nullptr) {
        inputs.push_back(*constants[i]);
      } else {
        inputs.push_back(Tensor::zeros(types[i]->sizes(), types[i]->dtype));
      }
    }
    std::vector<Tensor> outs = onnx_ref::run_node(node, opset, inputs);
    for (std::size_t o = 0; o < out.size() && o < outs.size(); ++o) {
      if (outs[o].defined()) out[o] = type_of_tensor(outs[o]);
    }
  } catch (const XpuRuntimeError&) {
    // The library rejects the stand-ins (or lacks the op): the node's output types stay as declared.
  }
  return out;
}

// Folds `node` (every input constant) by running it in the reference library: its outputs become constants unless
// they exceed options.max_folded_bytes or the library cannot run it. Returns whether it was folded.
bool fold_node(Graph& g, const Node& node, std::int64_t opset, const std::vector<const Tensor*>& constants,
               const InferOptions& options) {
  if (options.keep_quantized_weights && passes::is_quantized_weight_dequantize(g, node)) return false;
  if (options.keep_int4_weights && passes::is_int4_weight_dequantize(g, node)) return false;
  const std::optional<std::size_t> predicted = passes::predicted_fold_bytes(g, node);
  if (predicted && *predicted > options.max_folded_bytes) return false;
  try {
    // Note [Plan-time reference runs under a budget]: outputs past max_folded_bytes are not kept anyway
    const MemoryBudgetScope budget(std::make_shared<MemoryBudget>(
        std::max(kReferenceRunBytes, 2 * options.max_folded_bytes),
        std::string("constant folding's reference run of one node")));
    std::vector<Tensor> inputs;
    for (const Tensor* t : constants) inputs.push_back(t ? *t : Tensor());
    std::vector<Tensor> outs = onnx_ref::run_node(node, opset, inputs);
    std::size_t bytes = 0;
    bool complete = true;
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i].empty()) continue;
      if (i >= outs.size() || !outs[i].defined()) complete = false;
      else bytes += outs[i].nbytes();
    }
    if (!complete || bytes > options.max_folded_bytes) return false;
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i].empty()) continue;
      g.types[node.outputs[i]] = type_of_tensor(outs[i]);
      g.initializers[node.outputs[i]] = outs[i];
    }
    return true;
  } catch (const XpuRuntimeError&) {
    // Not foldable here (op missing from the reference library, or it rejects the inputs): the node stays
    // and reports its error when it runs.
    return false;
  }
}

// Folds a Shape or Size node whose input's shape is fully known into a constant. Returns whether it was folded.
bool fold_shape_or_size(Graph& g, const Node& node, const std::vector<const ValueType*>& types) {
  if (!node.domain.empty() || (node.op_type != "Shape" && node.op_type != "Size") || types.size() != 1 ||
      !types[0] || !types[0]->fully_known() || node.outputs.empty()) {
    return false;
  }
  std::vector<std::int64_t> sizes = types[0]->sizes();
  Tensor t;
  if (node.op_type == "Size") {
    std::int64_t n = 1;
    for (auto d : sizes) {
      if (__builtin_mul_overflow(n, d, &n)) return false;  // a fuzzed shape: the library says what is wrong
    }
    t = int64_vector({n}, /*scalar=*/true);
  } else {
    const auto rank = static_cast<std::int64_t>(sizes.size());
    std::int64_t start = node.attrs.get_int("start", 0);
    std::int64_t end = node.attrs.get_int("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<std::int64_t>(start, 0, rank);
    end = std::clamp<std::int64_t>(end, 0, rank);
    std::vector<std::int64_t> dims;
    for (std::int64_t i = start; i < end; ++i) dims.push_back(sizes[i]);
    t = int64_vector(dims, false);
  }
  g.types[node.outputs[0]] = type_of_tensor(t);
  g.initializers[node.outputs[0]] = t;
  return true;
}

// The output types of a node lowered onto registry op `lowered.op`, from the op's shape inference, when every
// input's shape is known and the op takes them (else they stay: the reference library's types come later).
void infer_registry_types(Graph& g, const Node& node, const Lowered& lowered,
                          const std::vector<const ValueType*>& types, const KernelRegistry& registry) {
  OpDescriptor desc;
  desc.op = lowered.op;
  desc.attrs = lowered.attrs;
  for (int idx : lowered.inputs) {
    if (idx < 0) {
      desc.inputs.emplace_back();
      continue;
    }
    const ValueType* vt = types[idx];
    if (!vt || !vt->fully_known()) return;
    desc.inputs.push_back(TensorDesc::contiguous(vt->sizes(), vt->dtype, Device::cpu()));
  }
  try {
    registry.infer(desc);
    for (std::size_t o = 0; o < desc.outputs.size() && o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      ValueType vt;
      vt.dtype = desc.outputs[o].dtype;
      vt.has_shape = true;
      for (auto d : desc.outputs[o].shape) vt.shape.emplace_back(d);
      g.types[node.outputs[o]] = vt;
    }
  } catch (const XpuRuntimeError&) {
    // The registry op does not take these inputs: the node runs in the reference library (the plan says
    // why); its output types come from the reference library below.
  }
}

}  // namespace

int infer_types(Graph& g, const InferOptions& options) {
  const KernelRegistry& registry = options.registry ? *options.registry : KernelRegistry::global();
  int folded = 0;
  // Constants carry their own type (a hand-built graph may not list them in `types`).
  for (const auto& [name, t] : g.initializers) {
    if (g.types.count(name) == 0) g.types[name] = type_of_tensor(t);
  }
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (Node& node : g.nodes) {
    std::vector<const ValueType*> types;
    std::vector<const Tensor*> constants;
    bool all_constant = node.graph_attrs.empty() && !is_random(node);
    for (const auto& in : node.inputs) {
      types.push_back(in.empty() ? nullptr : g.type(in));
      auto c = g.initializers.find(in);
      const Tensor* value = in.empty() || c == g.initializers.end() ? nullptr : &c->second;
      constants.push_back(value);
      if (!in.empty() && value == nullptr) all_constant = false;
    }
    const std::int64_t opset = g.opset(node.domain);
    // Folding.
    if (options.fold_constants && all_constant && fold_node(g, node, opset, constants, options)) {
      ++folded;
      continue;
    }
    if (options.fold_constants && fold_shape_or_size(g, node, types)) {
      ++folded;
      continue;
    }
    // Sequences and optionals: kinds and element types (declared types win).
    const std::vector<std::optional<ValueType>> kinds = sequence_output_types(node, types);
    for (std::size_t o = 0; o < kinds.size(); ++o) {
      if (kinds[o] && !node.outputs[o].empty() && g.types.count(node.outputs[o]) == 0) {
        g.types[node.outputs[o]] = *kinds[o];
      }
    }
    // Types through the lowering.
    const Lowered lowered = lower_node(node, opset, types, constants);
    if (lowered.kind == Lowered::Kind::kView && types[0] && !node.outputs.empty()) {
      ValueType vt;
      vt.dtype = types[0]->dtype;
      vt.has_shape = true;
      for (auto d : lowered.view_shape) vt.shape.emplace_back(d);
      g.types[node.outputs[0]] = vt;
    } else if (lowered.kind == Lowered::Kind::kRegistry && registry.find_schema(lowered.op) != nullptr) {
      infer_registry_types(g, node, lowered, types, registry);
    }
    bool outputs_known = true;
    for (const auto& out : node.outputs) {
      if (out.empty()) continue;
      const ValueType* vt = g.type(out);
      outputs_known = outputs_known && vt != nullptr && (!vt->is_tensor() || vt->fully_known());
    }
    bool inputs_known = true;  // every present input a tensor of known shape (the formulas read sizes())
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (!node.has_input(i)) continue;
      const ValueType* vt = types[i];
      inputs_known = inputs_known && vt != nullptr && vt->is_tensor() && vt->fully_known();
    }
    std::optional<std::vector<ValueType>> formula;
    if (!outputs_known && lowered.kind != Lowered::Kind::kView && inputs_known) {
      formula = formula_output_types(node, opset, types, constants);  // Note [Shapes without stand-ins]
    }
    if (formula) {
      for (std::size_t o = 0; o < formula->size() && o < node.outputs.size(); ++o) {
        if (!node.outputs[o].empty()) g.types[node.outputs[o]] = (*formula)[o];
      }
    } else if (!outputs_known && lowered.kind != Lowered::Kind::kView &&
               shape_follows_from_shapes(node, types, constants)) {
      const std::vector<std::optional<ValueType>> inferred = reference_output_types(node, opset, types, constants);
      for (std::size_t o = 0; o < inferred.size(); ++o) {
        if (inferred[o] && !node.outputs[o].empty()) g.types[node.outputs[o]] = *inferred[o];
      }
    }
    kept.push_back(std::move(node));
  }
  g.nodes = std::move(kept);
  return folded;
}

int eliminate_dead_nodes(Graph& g) {
  std::unordered_set<std::string> live(g.outputs.begin(), g.outputs.end());
  std::vector<bool> keep(g.nodes.size(), false);
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    for (const auto& out : n.outputs) keep[i] = keep[i] || (!out.empty() && live.count(out));
    if (!keep[i]) continue;
    for (const auto& in : n.inputs) live.insert(in);
    std::function<void(const Graph&)> scan = [&](const Graph& sub) {
      for (const Node& sn : sub.nodes) {
        for (const auto& in : sn.inputs) live.insert(in);
        for (const auto& [name, s2] : sn.graph_attrs) scan(*s2);
      }
      for (const auto& out : sub.outputs) live.insert(out);
    };
    for (const auto& [name, sub] : n.graph_attrs) scan(*sub);
  }
  std::vector<Node> kept;
  int removed = 0;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(g.nodes[i]));
    else ++removed;
  }
  g.nodes = std::move(kept);
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    if (!live.count(it->first)) it = g.initializers.erase(it);
    else ++it;
  }
  return removed;
}

std::vector<std::string> optimize(Graph& g, const InferOptions& options, const std::set<std::string>& disabled,
                                  std::vector<BuildPhase>* phases) {
  detail::PhaseClock clock(phases);
  std::vector<std::string> notes;
  InferOptions infer = options;
  if (disabled.count("constant_folding")) infer.fold_constants = false;
  // Note [Quantized fusion]: the weights' DequantizeLinear nodes stay for quantized_fusion, which folds what it leaves.
  infer.keep_quantized_weights = options.fuse_quantized && disabled.count("quantized_fusion") == 0;
  // Note [Int4 weight fusion]: likewise the int4 weights' DequantizeLinear nodes for int4_weight_fusion.
  infer.keep_int4_weights = options.fuse_int4_weights && disabled.count("int4_weight_fusion") == 0;
  const int folded = infer_types(g, infer);
  if (folded) notes.push_back(detail::str_cat("constant_folding: ", folded, " node(s) folded"));
  clock.mark("type inference and constant folding");
  passes::PassContext ctx;
  ctx.max_folded_bytes = options.max_folded_bytes;
  ctx.device = options.device;
  ctx.fuse_elementwise = options.fuse_elementwise;
  ctx.keep_unfused = options.keep_unfused;
  ctx.fuse_quantized = options.fuse_quantized;
  ctx.keep_quantized_weights = infer.keep_quantized_weights;
  ctx.fp8_fast_accumulation = options.fp8_fast_accumulation;
  ctx.fuse_int4_weights = options.fuse_int4_weights;
  ctx.keep_int4_weights = infer.keep_int4_weights;
  ctx.decompose_group_query_attention = options.decompose_group_query_attention;
  ctx.tp_size = options.tp_size;
  ctx.tp_rank = options.tp_rank;
  ctx.tp_comm = options.tp_comm;
  ctx.infer_types = [infer](Graph& graph) { infer_types(graph, infer); };
  for (const passes::PassResult& r : passes::run_passes(g, ctx, disabled)) {
    if (phases) phases->push_back({"pass " + r.pass, r.ms});
    if (r.rewrites == 0 && r.notes.empty()) continue;
    if (r.pass == "tensor_parallel") {
      // Every sharding decision is part of the explanation (Note [Sharding by propagation]).
      for (const std::string& note : r.notes) notes.push_back("tensor_parallel: " + note);
      continue;
    }
    if (r.pass == "quantized_fusion") {
      // Each chain the pass left as written, with its reason (a float8 shape cuBLASLt cannot take: Note [Float8
      // quantized fusion]; a KernelPolicy rule: Note [Float pinned by the KernelPolicy]; an ONNX quantized node).
      for (const std::string& note : r.notes) {
        if (note.rfind("kept ", 0) == 0) notes.push_back(r.pass + ": " + note);
      }
    }
    if (r.rewrites == 0) continue;
    std::string line = detail::str_cat(r.pass, ": ", r.rewrites, " rewrite(s)");
    if (!r.notes.empty()) line += " (" + r.notes.front() + (r.notes.size() > 1 ? ", ..." : "") + ")";
    notes.push_back(line);
  }
  clock.restart();
  infer_types(g, infer);
  if (!disabled.count("dead_node_elimination")) {
    const int removed = eliminate_dead_nodes(g);
    if (removed) notes.push_back(detail::str_cat("dead_node_elimination: ", removed, " node(s) removed"));
  }
  clock.mark("final type inference and dead nodes");
  return notes;
}

}  // namespace xpuruntime::runtime
