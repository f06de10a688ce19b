// The QDQ writer (apply_quantization, include/xpuruntime/quantization.h), the opset upgrade it makes, and what an
// engine does with a policy's decisions (onnx_quantize.h).
//
// Note [Decisions, then the model]
// apply_quantization reads only the float model and the decisions: node keys, value names, dtypes, axes and scales
// (float32 values, which JSON numbers hold exactly). The values it writes are computed from those in float32 as
// QuantizeLinear computes them (division, round half to even, saturation), names come from a NameScope over the
// input graph, and the model is serialized with fields in field-number order (ONNX has no map fields, so protobuf's
// serialization is deterministic). So replaying a decisions file gives the bytes of the run that wrote it, whether
// the replay is xrt.quantize(decisions=...), a policy file's decisions in a C++ session, or the sensitivity
// analysis. This is the only writer: the Python quantizer calls it through the bindings.
#include "frontends/onnx/onnx_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <type_traits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#if XPURT_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

#include "frontends/onnx/onnx_check.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/quantization.h"

namespace xpuruntime {

namespace {

// TensorProto.DataType codes the writer uses.
constexpr int kFloat = 1;
constexpr int kUInt8 = 2;
constexpr int kInt8 = 3;
constexpr int kInt32 = 6;
constexpr int kInt64 = 7;
constexpr int kFloat8E4M3FN = 17;
constexpr int kInt4 = 22;

onnx::ModelProto parse_model(const std::string& bytes) {
  onnx::ModelProto model;
  XPURT_CHECK(bytes.size() < (std::size_t{1} << 31) &&
                  model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())),
              "model: the bytes are not a serialized ONNX model");
  return model;
}

std::string serialize(const onnx::ModelProto& model) {
  std::string out;
  XPURT_CHECK(model.SerializeToString(&out), "the quantized model does not serialize (over 2 GB?)");
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) out += (k ? ", " : "") + names[k];
  return out;
}

bool default_domain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

int default_opset(const onnx::ModelProto& model) {
  for (const auto& imp : model.opset_import()) {
    if (default_domain(imp.domain())) return static_cast<int>(imp.version());
  }
  return 0;
}

// Subgraphs of a node as the Python quantizer saw them: `g` when it has nodes, then every `graphs` entry.
template <typename Fn>
void for_each_subgraph(onnx::NodeProto& node, Fn&& fn) {
  for (auto& attr : *node.mutable_attribute()) {
    if (attr.g().node_size() > 0) fn(*attr.mutable_g());
    for (auto& g : *attr.mutable_graphs()) fn(g);
  }
}

// Every node of `graph` and of its subgraphs, depth first, with the graph that holds it.
template <typename Fn>
void for_each_node(onnx::GraphProto& graph, Fn&& fn) {
  for (auto& node : *graph.mutable_node()) {
    fn(graph, node);
    for_each_subgraph(node, [&](onnx::GraphProto& g) { for_each_node(g, fn); });
  }
}

// Fresh value and node names that collide with nothing in the graph (nor with each other): the graph's inputs,
// outputs, value_info and initializers, and every node's name, inputs and outputs, subgraphs included.
class NameScope {
 public:
  explicit NameScope(onnx::GraphProto& graph) {
    for (const auto& vi : graph.input()) used_.insert(vi.name());
    for (const auto& vi : graph.output()) used_.insert(vi.name());
    for (const auto& vi : graph.value_info()) used_.insert(vi.name());
    for (const auto& init : graph.initializer()) used_.insert(init.name());
    for_each_node(graph, [&](onnx::GraphProto&, onnx::NodeProto& node) {
      used_.insert(node.name());
      used_.insert(node.input().begin(), node.input().end());
      used_.insert(node.output().begin(), node.output().end());
    });
  }
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int i = 1; used_.count(name); ++i) name = detail::str_cat(base, "_", i);
    used_.insert(name);
    return name;
  }

 private:
  std::set<std::string> used_;
};

// ---- the opset upgrade ----

// Note [Opset upgrades the quantizer makes]
// QDQ needs QuantizeLinear-13 (per-axis scales) for int8, -19 for float8 and -21 for int4 blocks. A model whose
// default-domain import is older gets the newer import only when every default-domain op of its graph means the same
// under both: semantic_changes() lists, per op, the opset versions in which a model's existing node would start to
// behave differently (an attribute becoming an input, new broadcasting, a different axis meaning). Versions that only
// add types, or add attributes, inputs and attribute values whose defaults keep the old behaviour (Resize-18's
// antialias and axes, Resize-19's half_pixel_symmetric, ScatterND-16's reduction), are absent. An op missing from
// the table, or with a change inside (old, new], blocks the upgrade: re-exporting the model at the newer opset is the
// way out, and the error says so. A few such changes are mechanical and the upgrade rewrites the node instead
// (Reduce*-18 takes its axes as an input, Split-18 states num_outputs).
const std::map<std::string, std::vector<int>>& semantic_changes() {
  static const std::map<std::string, std::vector<int>> table = [] {
    std::map<std::string, std::vector<int>> t;
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Gemm"}) t[op] = {6, 7};
    for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Floor", "Ceil",
                           "Reciprocal", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Cast"}) {
      t[op] = {6};
    }
    for (const char* op : {"Pow", "Equal", "Less", "Greater", "And", "Or", "Xor"}) t[op] = {7};
    for (const char* op :
         {"MatMul", "Transpose", "Identity", "Flatten", "Gather", "Shape", "Constant", "Where", "Expand",
          "ConstantOfShape", "Range", "GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool", "Erf",
          "Softplus", "HardSwish", "LayerNormalization", "Einsum", "Not", "QuantizeLinear", "DequantizeLinear",
          "MatMulInteger", "Gelu", "GreaterOrEqual", "LessOrEqual", "IsNaN", "IsInf", "GatherElements", "GatherND",
          "ScatterND", "ScatterElements", "CumSum", "Sin", "Cos", "Mod", "NonZero", "Sign", "Round", "CastLike",
          "Size", "Trilu", "OneHot", "DepthToSpace", "SpaceToDepth", "Celu", "Mish", "If", "Loop",
          "LpNormalization"}) {
      t[op] = {};
    }
    t["Conv"] = {11};
    t["ConvTranspose"] = {11};
    t["Concat"] = {4};
    t["Reshape"] = {5};
    t["Softmax"] = {13};
    t["LogSoftmax"] = {13};
    t["Dropout"] = {7, 10, 12};
    t["InstanceNormalization"] = {6};
    t["GroupNormalization"] = {21};
    t["Scan"] = {8, 9};
    t["BatchNormalization"] = {6, 7, 9};
    t["Clip"] = {6, 11};
    t["Squeeze"] = {11, 13};
    t["Unsqueeze"] = {11, 13};
    t["ReduceSum"] = {11, 13};
    t["Pad"] = {2, 11};
    t["Slice"] = {10};
    t["Split"] = {2, 11, 13, 18};
    t["PRelu"] = {6, 7, 9};
    for (const char* op : {"Max", "Min", "Sum", "Mean"}) t[op] = {6, 8};
    t["Tile"] = {6};
    t["TopK"] = {10, 11};
    t["ArgMax"] = {11};
    t["ArgMin"] = {11};
    t["Resize"] = {11, 13};
    t["NonMaxSuppression"] = {10, 11};
    for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}) {
      t[op] = {11, 18};
    }
    return t;
  }();
  return table;
}

bool is_reduce_with_axes_input_at_18(const std::string& op) {
  static const std::set<std::string> ops = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                            "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  return ops.count(op) > 0;
}

// Reduce*-18: the `axes` attribute becomes the second input (an int64 initializer of the node's graph); without it
// the node reduces every axis in both versions.
void axes_to_input(onnx::GraphProto& graph, onnx::NodeProto& node, NameScope& names) {
  auto* attrs = node.mutable_attribute();
  for (int i = 0; i < attrs->size(); ++i) {
    if (attrs->Get(i).name() != "axes") continue;
    std::vector<std::int64_t> axes(attrs->Get(i).ints().begin(), attrs->Get(i).ints().end());
    attrs->DeleteSubrange(i, 1);
    const std::string name = names.fresh((node.name().empty() ? node.op_type() : node.name()) + "_axes");
    onnx::TensorProto* tensor = graph.add_initializer();
    tensor->add_dims(static_cast<std::int64_t>(axes.size()));
    tensor->set_data_type(kInt64);
    tensor->set_name(name);
    std::string raw(axes.size() * sizeof(std::int64_t), '\0');
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const auto v = static_cast<std::uint64_t>(axes[k]);
      for (int b = 0; b < 8; ++b) raw[k * 8 + b] = static_cast<char>((v >> (8 * b)) & 0xff);  // little-endian
    }
    tensor->set_raw_data(raw);
    node.add_input(name);
    return;
  }
}

// Split-18: without a `split` input, `num_outputs` must say the number of equal parts (Split-13 took it from the
// number of outputs).
void split_num_outputs(onnx::NodeProto& node) {
  if (node.input_size() < 2 || node.input(1).empty()) {
    onnx::AttributeProto* attr = node.add_attribute();
    attr->set_name("num_outputs");
    attr->set_i(node.output_size());
    attr->set_type(onnx::AttributeProto::INT);
  }
}

int upgrade_in_place(onnx::ModelProto& model, int needed, const std::string& why) {
  const int current = default_opset(model);
  if (current >= needed) return current;
  XPURT_CHECK(current != 0, "model: it imports no default ONNX domain (opset_import lacks '')");
  std::set<std::string> blocking;
  std::vector<std::pair<onnx::GraphProto*, onnx::NodeProto*>> adapt;
  for_each_node(*model.mutable_graph(), [&](onnx::GraphProto& graph, onnx::NodeProto& node) {
    if (!default_domain(node.domain())) return;
    const auto found = semantic_changes().find(node.op_type());
    if (found == semantic_changes().end()) {
      blocking.insert(node.op_type());
      return;
    }
    for (const int version : found->second) {
      if (version <= current || version > needed) continue;
      const bool adaptable =
          version == 18 && (is_reduce_with_axes_input_at_18(node.op_type()) || node.op_type() == "Split");
      if (adaptable) {
        adapt.emplace_back(&graph, &node);
      } else {
        blocking.insert(node.op_type());
      }
    }
  });
  if (!blocking.empty()) {
    throw InvalidArgumentError(detail::str_cat(
        "model: ", why, " needs ONNX opset ", needed, ", the model imports opset ", current, ", and the meaning of ",
        joined(std::vector<std::string>(blocking.begin(), blocking.end())),
        " may differ between those opsets (or is not known to the quantizer); re-export the model at opset ", needed,
        " or newer"));
  }
  NameScope names(*model.mutable_graph());
  for (auto& [graph, node] : adapt) {
    if (node->op_type() == "Split") {
      split_num_outputs(*node);
    } else {
      axes_to_input(*graph, *node, names);
    }
  }
  for (auto& imp : *model.mutable_opset_import()) {
    if (default_domain(imp.domain())) imp.set_version(needed);
  }
  // The IR version each default-domain opset needs (ONNX's versioning table).
  static const std::pair<int, int> ir_for_opset[] = {{21, 10}, {19, 9}, {15, 8}, {13, 7},
                                                     {11, 6},  {10, 5}, {9, 4},  {7, 3}};
  for (const auto& [opset, ir] : ir_for_opset) {
    if (needed >= opset) {
      model.set_ir_version(std::max<std::int64_t>(model.ir_version(), ir));
      break;
    }
  }
  return needed;
}

// ---- the QDQ rewrite ----

// The roles of a node's inputs: "activation", "weight" (per-channel capable) or "bias". A "weight" the decisions do
// not quantize as a constant is quantized as an activation.
std::vector<std::pair<int, const char*>> input_roles(const onnx::NodeProto& node) {
  const std::string& op = node.op_type();
  const int n = node.input_size();
  std::vector<std::pair<int, const char*>> roles;
  if (op == "Conv" || op == "Gemm" || op == "MatMul") {
    roles = {{0, "activation"}, {1, "weight"}};
    if (op != "MatMul" && n > 2 && !node.input(2).empty()) roles.emplace_back(2, "bias");
    return roles;
  }
  for (int i = 0; i < n; ++i) {
    if (!node.input(i).empty()) roles.emplace_back(i, "activation");
  }
  return roles;
}

std::string node_key(const onnx::NodeProto& node, int index) {
  return node.name().empty() ? detail::str_cat(node.op_type(), "_", index) : node.name();
}

int dtype_code(const std::string& dtype) {
  if (dtype == "int8") return kInt8;
  if (dtype == "uint8") return kUInt8;
  if (dtype == "float8e4m3fn") return kFloat8E4M3FN;
  if (dtype == "int4") return kInt4;
  return kInt32;
}

onnx::TensorProto make_tensor(const std::string& name, int code, const std::vector<std::int64_t>& dims,
                              std::string raw) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(code);
  for (const std::int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::move(raw));
  return t;
}

template <typename T>
std::string raw_of(const std::vector<T>& values) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::string raw(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());  // little-endian hosts only
  return raw;
}

// The float32 values of an initializer: raw_data, float_data or external data (read from `model_dir`).
std::vector<float> float_values(const onnx::TensorProto& tensor, const std::string& model_dir) {
  XPURT_CHECK(tensor.data_type() == kFloat, "quantization: initializer '", tensor.name(),
              "' is not float32 (element type ", tensor.data_type(), ")");
  std::size_t count = 1;
  for (const std::int64_t d : tensor.dims()) count *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
  std::vector<float> values(count);
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    XPURT_CHECK(!model_dir.empty(), "quantization: weight '", tensor.name(),
                "' has external data and no model folder was given to read it from");
    const auto span = onnx_frontend::open_external(tensor, model_dir, count * sizeof(float), tensor.name());
    onnx_frontend::read_external(span, values.data(), tensor.name());
  } else if (tensor.has_raw_data()) {
    XPURT_CHECK(tensor.raw_data().size() == count * sizeof(float), "quantization: initializer '", tensor.name(),
                "' has ", tensor.raw_data().size(), " bytes of raw data for ", count, " float32 values");
    std::memcpy(values.data(), tensor.raw_data().data(), tensor.raw_data().size());
  } else {
    XPURT_CHECK(static_cast<std::size_t>(tensor.float_data_size()) == count, "quantization: initializer '",
                tensor.name(), "' has ", tensor.float_data_size(), " float_data values for ", count);
    std::copy(tensor.float_data().begin(), tensor.float_data().end(), values.begin());
  }
  return values;
}

// The index into `scale` (row-major over entry.scale_shape) of element `flat` of a tensor of `dims`.
std::size_t scale_index(const QuantizedConstant& entry, const std::vector<std::int64_t>& dims, std::size_t flat) {
  if (!entry.has_axis || entry.scale.size() == 1) return 0;
  const auto rank = static_cast<std::int64_t>(dims.size());
  if (entry.block_size == 0) {  // per axis: the element's index on `axis`
    std::size_t inner = 1;
    for (std::int64_t d = entry.axis + 1; d < rank; ++d) inner *= static_cast<std::size_t>(dims[d]);
    return (flat / inner) % static_cast<std::size_t>(dims[entry.axis]);
  }
  // blocked: the element's coordinates with the one on `axis` divided by block_size, in scale_shape
  std::size_t index = 0, rest = flat;
  std::vector<std::size_t> coords(dims.size());
  for (std::int64_t d = rank - 1; d >= 0; --d) {
    coords[d] = rest % static_cast<std::size_t>(dims[d]);
    rest /= static_cast<std::size_t>(dims[d]);
  }
  for (std::int64_t d = 0; d < rank; ++d) {
    const std::size_t c = d == entry.axis ? coords[d] / static_cast<std::size_t>(entry.block_size) : coords[d];
    index = index * static_cast<std::size_t>(entry.scale_shape[d]) + c;
  }
  return index;
}

void check_scale_layout(const QuantizedConstant& entry, const std::vector<std::int64_t>& dims,
                        const std::string& name) {
  const auto rank = static_cast<std::int64_t>(dims.size());
  if (!entry.has_axis || entry.scale.size() == 1) return;
  XPURT_CHECK(entry.axis < rank, "decisions: '", name, "' is quantized along axis ", entry.axis, " but has rank ",
              rank);
  if (entry.block_size == 0) {
    XPURT_CHECK(static_cast<std::int64_t>(entry.scale.size()) == dims[entry.axis], "decisions: '", name, "' has ",
                entry.scale.size(), " scales for ", dims[entry.axis], " indices of axis ", entry.axis);
    return;
  }
  bool ok = static_cast<std::int64_t>(entry.scale_shape.size()) == rank;
  for (std::int64_t d = 0; ok && d < rank; ++d) {
    const std::int64_t want = d == entry.axis ? (dims[d] + entry.block_size - 1) / entry.block_size : dims[d];
    ok = entry.scale_shape[d] == want;
  }
  XPURT_CHECK(ok, "decisions: the block scales of '", name, "' do not fit its shape");
}

// The stored form of a float weight under `entry`, as QuantizeLinear computes it: float32 division, round half to
// even, saturation (int8 [-128, 127], int4 [-8, 7], float8e4m3fn to 448), int4 packed two a byte.
std::string quantized_raw(const std::vector<float>& w, const std::vector<std::int64_t>& dims,
                          const QuantizedConstant& entry, int code) {
  const std::size_t n = w.size();
  if (code == kInt32) {
    std::vector<std::int32_t> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double q = std::nearbyint(static_cast<double>(w[i] / entry.scale[scale_index(entry, dims, i)]));
      out[i] = static_cast<std::int32_t>(std::clamp(q, -2147483648.0, 2147483647.0));
    }
    return raw_of(out);
  }
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float q = w[i] / entry.scale[scale_index(entry, dims, i)];
    if (code == kFloat8E4M3FN) {
      out[i] = std::isnan(q) ? 0x7F : detail::float8_from_double(q, DType::kFloat8E4M3FN, true);
    } else {
      const float lo = code == kInt4 ? -8.0f : -128.0f, hi = code == kInt4 ? 7.0f : 127.0f;
      const float r = std::nearbyint(q);
      out[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::isnan(r) ? 0.0f : std::clamp(r, lo, hi)));
    }
  }
  if (code != kInt4) return std::string(out.begin(), out.end());
  std::string packed(detail::int4_packed_bytes(n), '\0');
  detail::pack_int4(out.data(), n, reinterpret_cast<std::uint8_t*>(packed.data()));
  return packed;
}

// The rewrite of one graph (Note [Decisions, then the model]): Q/DQ nodes to emit before each quantized node, new
// initializers, and the float values already rewired to their dequantized replacements.
class QdqWriter {
 public:
  QdqWriter(onnx::GraphProto& graph, const QuantizationDecisions& decisions, const std::string& model_dir)
      : graph_(graph), decisions_(decisions), model_dir_(model_dir), names_(graph) {
    for (int i = 0; i < graph.initializer_size(); ++i) inits_[graph.initializer(i).name()] = i;
  }

  void quantize_node(int index) {
    onnx::NodeProto& node = *graph_.mutable_node(index);
    for (const auto& [slot, role] : input_roles(node)) {
      const std::string name = node.input(slot);
      const bool constant = inits_.count(name) > 0;
      if (std::string(role) == "bias") {
        const auto found = decisions_.biases.find(name);
        if (found != decisions_.biases.end() && constant) node.set_input(slot, constant_input(name, index, found->second));
      } else if (const auto found = decisions_.weights.find(name); found != decisions_.weights.end() && constant) {
        node.set_input(slot, constant_input(name, index, found->second));
      } else if (decisions_.precision != "int4-weights") {
        node.set_input(slot, activation_input(name, index));
      }
    }
  }

  // The graph's nodes with the Q/DQ nodes in front of their readers, the new initializers, the unused ones dropped.
  void finish() {
    std::vector<onnx::NodeProto> nodes;
    for (int i = 0; i < graph_.node_size(); ++i) {
      for (auto& n : before_[i]) nodes.push_back(std::move(n));
      nodes.push_back(std::move(*graph_.mutable_node(i)));
    }
    graph_.clear_node();
    for (auto& n : nodes) *graph_.add_node() = std::move(n);
    for (auto& t : new_inits_) *graph_.add_initializer() = std::move(t);
    drop_unused_initializers();
  }

 private:
  std::string activation_input(const std::string& name, int index) {
    if (const auto it = rewired_.find(name); it != rewired_.end()) return it->second;
    const auto found = decisions_.activations.find(name);
    XPURT_CHECK(found != decisions_.activations.end(), "decisions: no scale for activation '", name, "'");
    const QuantizedActivation& entry = found->second;
    const int code = dtype_code(entry.dtype);
    const std::string scale = names_.fresh(name + "_scale");
    const std::string zero = names_.fresh(name + "_zero_point");
    new_inits_.push_back(make_tensor(scale, kFloat, {}, raw_of(std::vector<float>{entry.scale})));
    const auto zp = static_cast<std::uint8_t>(code == kFloat8E4M3FN ? 0 : entry.zero_point);
    new_inits_.push_back(make_tensor(zero, code, {}, std::string(1, static_cast<char>(zp))));
    const std::string quantized = names_.fresh(name + "_quantized");
    const std::string dequantized = names_.fresh(name + "_dequantized");
    emit(index, "QuantizeLinear", {name, scale, zero}, quantized, names_.fresh(name + "_QuantizeLinear"), {});
    emit(index, "DequantizeLinear", {quantized, scale, zero}, dequantized, names_.fresh(name + "_DequantizeLinear"),
         {});
    rewired_[name] = dequantized;
    return dequantized;
  }

  std::string constant_input(const std::string& name, int index, const QuantizedConstant& entry) {
    if (const auto it = rewired_.find(name); it != rewired_.end()) return it->second;
    const onnx::TensorProto& tensor = graph_.initializer(inits_.at(name));
    const std::vector<std::int64_t> dims(tensor.dims().begin(), tensor.dims().end());
    check_scale_layout(entry, dims, name);
    const int code = dtype_code(entry.dtype);
    std::string values = quantized_raw(float_values(tensor, model_dir_), dims, entry, code);
    const std::string q = names_.fresh(name + "_quantized");
    const std::string scale = names_.fresh(name + "_scale");
    const std::string zero = names_.fresh(name + "_zero_point");
    std::size_t count = 1;
    for (const std::int64_t d : entry.scale_shape) count *= static_cast<std::size_t>(d);
    new_inits_.push_back(make_tensor(q, code, dims, std::move(values)));
    new_inits_.push_back(make_tensor(scale, kFloat, entry.scale_shape, raw_of(entry.scale)));
    const std::size_t zero_bytes = code == kInt32 ? count * 4 : code == kInt4 ? detail::int4_packed_bytes(count) : count;
    new_inits_.push_back(make_tensor(zero, code, entry.scale_shape, std::string(zero_bytes, '\0')));
    std::vector<std::pair<std::string, std::int64_t>> attrs;  // sorted by name, as onnx.helper.make_node writes them
    if (entry.has_axis) attrs.emplace_back("axis", entry.axis);
    if (entry.block_size) attrs.emplace_back("block_size", entry.block_size);
    const std::string dequantized = names_.fresh(name + "_dequantized");
    emit(index, "DequantizeLinear", {q, scale, zero}, dequantized, names_.fresh(name + "_DequantizeLinear"), attrs);
    rewired_[name] = dequantized;
    return dequantized;
  }

  void emit(int index, const char* op, const std::vector<std::string>& inputs, const std::string& output,
            const std::string& name, const std::vector<std::pair<std::string, std::int64_t>>& attrs) {
    onnx::NodeProto node;
    node.set_op_type(op);
    for (const auto& input : inputs) node.add_input(input);
    node.add_output(output);
    node.set_name(name);
    for (const auto& [key, value] : attrs) {
      onnx::AttributeProto* attr = node.add_attribute();
      attr->set_name(key);
      attr->set_i(value);
      attr->set_type(onnx::AttributeProto::INT);
    }
    before_[index].push_back(std::move(node));
  }

  // Initializers no node (subgraphs included) reads and no graph output names are dropped, with their graph inputs.
  void drop_unused_initializers() {
    std::set<std::string> used;
    for (auto& node : *graph_.mutable_node()) {
      for (const auto& input : node.input()) {
        if (!input.empty()) used.insert(input);
      }
      for_each_subgraph(node, [&](onnx::GraphProto& g) {
        for_each_node(g, [&](onnx::GraphProto&, onnx::NodeProto& inner) {
          used.insert(inner.input().begin(), inner.input().end());
        });
      });
    }
    for (const auto& out : graph_.output()) used.insert(out.name());
    std::set<std::string> dropped;
    for (const auto& init : graph_.initializer()) {
      if (!used.count(init.name())) dropped.insert(init.name());
    }
    if (dropped.empty()) return;
    auto* inits = graph_.mutable_initializer();
    inits->erase(std::remove_if(inits->begin(), inits->end(),
                                [&](const onnx::TensorProto& t) { return dropped.count(t.name()) > 0; }),
                 inits->end());
    auto* inputs = graph_.mutable_input();
    inputs->erase(std::remove_if(inputs->begin(), inputs->end(),
                                 [&](const onnx::ValueInfoProto& v) { return dropped.count(v.name()) > 0; }),
                  inputs->end());
  }

  onnx::GraphProto& graph_;
  const QuantizationDecisions& decisions_;
  const std::string& model_dir_;
  NameScope names_;
  std::map<std::string, int> inits_;
  std::map<int, std::vector<onnx::NodeProto>> before_;
  std::vector<onnx::TensorProto> new_inits_;
  std::map<std::string, std::string> rewired_;
};

const std::set<std::string>& quantized_op_types() {
  static const std::set<std::string> ops = {
      "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
      "MatMulInteger",  "ConvInteger",      "MatMulNBits",           "QLinearAdd",  "QLinearMul",
      "QGemm",          "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearSigmoid", "QLinearLeakyRelu",
      "QLinearConcat",  "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "GatherBlockQuantized"};
  return ops;
}

}  // namespace

std::string upgrade_opset(const std::string& model_bytes, int needed, const std::string& why, int* version) {
  onnx::ModelProto model = parse_model(model_bytes);
  const int before = default_opset(model);
  const int after = upgrade_in_place(model, needed, why);
  if (version) *version = after;
  return after == before ? model_bytes : serialize(model);
}

std::string apply_quantization(const std::string& model_bytes, const QuantizationDecisions& decisions,
                               const ApplyQuantizationOptions& options) {
  onnx::ModelProto model = parse_model(model_bytes);
  onnx::GraphProto& graph = *model.mutable_graph();
  std::map<std::string, int> node_keys;
  for (int i = 0; i < graph.node_size(); ++i) node_keys.emplace(node_key(graph.node(i), i), i);
  std::vector<std::string> missing;
  for (const auto& key : decisions.nodes) {
    if (!node_keys.count(key)) missing.push_back(key);
  }
  if (!missing.empty()) {
    missing.resize(std::min<std::size_t>(missing.size(), 10));
    throw InvalidArgumentError(detail::str_cat("decisions: node(s) ", joined(missing),
                                               " are not in the model"));
  }
  const std::set<std::string> skip(options.skip_nodes.begin(), options.skip_nodes.end());
  std::set<int> selected;
  for (const auto& key : decisions.nodes) {
    if (!skip.count(key)) selected.insert(node_keys.at(key));
  }
  upgrade_in_place(model, quantization_opset(decisions.precision), decisions.precision + " QDQ");
  QdqWriter writer(graph, decisions, options.model_dir);
  for (const int index : selected) writer.quantize_node(index);
  writer.finish();
  return serialize(model);
}

namespace {

// Note [Decisions name the model they were made for]
// The quantizer records the SHA-256 of the float model's serialization (Python: SerializeToString(deterministic=True)
// of the model with its external data loaded; ONNX's protos have no map fields, so C++'s serialization of the same
// message is the same bytes). Scales made for one model applied to another (retrained weights, another export) give
// a model that runs and answers wrongly, so a session refuses decisions whose hash differs, as xrt.quantize does
// (its check_model=False is the way to apply them anyway). The hash needs OpenSSL's libcrypto (libssl-dev); a build
// without it, or a model whose tensors live in external files (their bytes are not in `model`), applies the
// decisions unchecked.
bool model_hash_checkable(const onnx::ModelProto& model) {
  for (const auto& t : model.graph().initializer()) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL) return false;
  }
  return XPURT_HAVE_OPENSSL != 0;
}

#if XPURT_HAVE_OPENSSL
std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw XpuRuntimeError("decisions: OpenSSL's SHA-256 of the model failed");
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int k = 0; k < length; ++k) {
    out += kHex[digest[k] >> 4];
    out += kHex[digest[k] & 15];
  }
  return out;
}
#endif

// Refuses decisions made for another model (Note [Decisions name the model they were made for]); true when the
// hash was compared.
bool check_decisions_model(const std::string& model_bytes, const QuantizationDecisions& decisions) {
  if (decisions.model_sha256.empty()) return false;
  const onnx::ModelProto model = parse_model(model_bytes);
  if (!model_hash_checkable(model)) return false;
#if XPURT_HAVE_OPENSSL
  const std::string actual = sha256_hex(serialize(model));
  if (actual != decisions.model_sha256) {
    throw InvalidArgumentError(detail::str_cat(
        "decisions: they were made for another model (sha256 ", decisions.model_sha256.substr(0, 12),
        "..., this one is ", actual.substr(0, 12), "...); make decisions for this model (xrt.quantize), or apply "
        "them to it with xrt.quantize(model, decisions=..., check_model=False) and run the result"));
  }
  return true;
#else
  return false;
#endif
}

}  // namespace

namespace onnx_frontend {

std::string quantization_note(const ExecutionPolicy& policy) {
  if (policy.quantization.empty()) return {};
  return QuantizationDecisions::from_json(policy.quantization, "ExecutionPolicy 'quantization'").summary();
}

const std::string& model_for_policy(const std::string& model, const SessionOptions& options, std::string& storage) {
  const ExecutionPolicy& policy = options.exec_policy;
  const Precision precision = policy.precision;
  const bool quantized_precision =
      precision == Precision::kInt8 || precision == Precision::kFP8 || precision == Precision::kInt4Weights;
  if (policy.quantization.empty()) {
    if (!quantized_precision) return model;
    const onnx::ModelProto proto = parse_model(model);
    for (const auto& node : proto.graph().node()) {
      if (quantized_op_types().count(node.op_type())) return model;  // already quantized: runs as it is
    }
    throw InvalidArgumentError(detail::str_cat(
        "ExecutionPolicy precision=", precision_name(precision),
        ": the model is a float model and the policy carries no quantization decisions to make it ",
        precision_name(precision), "; calibration runs in the Python SDK: xrt.quantize(model, calibration=..., "
        "precision=...) or ExecutionPolicy(precision=..., calibration=...) make them, and a policy saved from such a "
        "session carries them (docs/quantization.md)"));
  }
  const QuantizationDecisions decisions =
      QuantizationDecisions::from_json(policy.quantization, "ExecutionPolicy 'quantization'");
  XPURT_CHECK(decisions.precision == precision_name(precision), "ExecutionPolicy: the quantization decisions are for ",
              decisions.precision, " but the policy's precision is ", precision_name(precision),
              "; set precision=\"", decisions.precision, "\"");
  check_decisions_model(model, decisions);
  ApplyQuantizationOptions apply_options;
  apply_options.model_dir = options.model_dir;
  storage = apply_quantization(model, decisions, apply_options);
  return storage;
}

}  // namespace onnx_frontend

}  // namespace xpuruntime
