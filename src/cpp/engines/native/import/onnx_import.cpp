// ONNX import/export through the protobuf classes of ONNX (Debian's libonnx-dev, or generated ones; see
// cmake/XpurtOnnxProto.cmake). See onnx_import.h for the contract. The model is parsed and checked, and external data
// read, by the ONNX frontend both engines share (frontends/onnx/onnx_check.h).
#include "xpuruntime/onnx_import.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "core/shape_str.h"
#include "frontends/onnx/onnx_check.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/low_bit.h"

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

namespace xpuruntime {
namespace {

// ---- element types ----

DType dtype_from_onnx(int elem_type, const std::string& where) {
  DType dtype;
  std::string name;
  if (dtype_from_onnx_type(elem_type, &dtype, &name)) return dtype;
  throw UnsupportedOperationError(detail::str_cat(where, ": element type ", name, " (ONNX type ", elem_type,
                                                  ") is not supported by xpuruntime tensors"));
}

int dtype_to_onnx(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return onnx::TensorProto::FLOAT;
    case DType::kUInt8: return onnx::TensorProto::UINT8;
    case DType::kInt8: return onnx::TensorProto::INT8;
    case DType::kInt16: return onnx::TensorProto::INT16;
    case DType::kInt32: return onnx::TensorProto::INT32;
    case DType::kInt64: return onnx::TensorProto::INT64;
    case DType::kBool: return onnx::TensorProto::BOOL;
    case DType::kFloat16: return onnx::TensorProto::FLOAT16;
    case DType::kFloat64: return onnx::TensorProto::DOUBLE;
    case DType::kBFloat16: return onnx::TensorProto::BFLOAT16;
    case DType::kUInt16: return onnx::TensorProto::UINT16;
    case DType::kUInt32: return onnx::TensorProto::UINT32;
    case DType::kUInt64: return onnx::TensorProto::UINT64;
    // Codes by number: Debian's ONNX protobuf (1.12) predates these types.
    case DType::kFloat8E4M3FN: return 17;
    case DType::kFloat8E4M3FNUZ: return 18;
    case DType::kFloat8E5M2: return 19;
    case DType::kFloat8E5M2FNUZ: return 20;
    case DType::kUInt4: return 21;
    case DType::kInt4: return 22;
  }
  return onnx::TensorProto::UNDEFINED;
}

// ---- tensors ----

template <typename Src, typename Dst>
void copy_field(const google::protobuf::RepeatedField<Src>& field, Dst* out, std::int64_t n, const std::string& where) {
  XPURT_CHECK(field.size() == n, where, ": holds ", field.size(), " values but its shape needs ", n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<Dst>(field.Get(static_cast<int>(i)));
}

// The values an initializer's data fields hold (for a tensor without raw or external data), to compare with the
// count its shape declares before anything is allocated.
std::int64_t field_count(const onnx::TensorProto& proto, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return proto.float_data_size();
    case DType::kFloat64: return proto.double_data_size();
    case DType::kInt64: return proto.int64_data_size();
    case DType::kUInt32:
    case DType::kUInt64: return proto.uint64_data_size();
    default: return proto.int32_data_size();
  }
}

// Note [Adopted initializer bytes]
// A model's weights arrive twice in memory: protobuf's parse copies each raw_data field into a string, and the
// tensor was a second copy of it (for ViT-B/16 in float16, 173 MB copied and page-faulted once more: a third of its
// import, Note [Build phases]). So the top-level initializers of a model parsed here take the string itself when
// it is large and suitably aligned: the tensor views the buffer and owns it through a shared string; the ModelProto
// is dropped after the import. Smaller ones, subgraphs' and the other storage forms are copied as before.
constexpr std::size_t kAdoptBytes = 64 * 1024;

// `adopt`: the proto's own raw_data, which the tensor may take over (empty after), or null.
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& model_dir, std::string* adopt = nullptr) {
  const std::string where = detail::str_cat("tensor '", proto.name(), "'");
  XPURT_CHECK(proto.has_data_type(), where, ": no data type");
  const DType dtype = dtype_from_onnx(proto.data_type(), where);
  std::vector<std::int64_t> shape(proto.dims().begin(), proto.dims().end());
  std::int64_t n = 1;
  const auto element = static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, where, ": negative dimension ", d);
    XPURT_CHECK(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / element / d, where,
                ": its shape's byte size overflows int64 (", detail::shape_str(shape, ","), ")");
    n *= d;
  }
  // Note [Sizes checked before allocation]: the data the file holds must match the shape before the tensor is
  // allocated, so a tensor that declares 10^12 elements with 10 bytes of data is an error, not an allocation.
  // int4/uint4 are stored two per byte (and two per int32_data entry), and unpacked here (Note [Float8 and 4-bit
  // dtypes], xpuruntime/low_bit.h).
  const bool packed = is_int4_dtype(dtype);
  const auto count = static_cast<std::size_t>(n);
  const std::size_t nbytes = packed ? detail::int4_packed_bytes(count) : static_cast<std::size_t>(n * element);
  const auto stored_values = packed ? static_cast<std::int64_t>(nbytes) : n;
  const bool external = proto.data_location() == onnx::TensorProto::EXTERNAL;
  if (!external && proto.has_raw_data()) {
    XPURT_CHECK(proto.raw_data().size() == nbytes, where, ": raw_data has ", proto.raw_data().size(),
                " bytes but its shape and type need ", nbytes, " (truncated or malformed model?)");
  } else if (!external) {
    XPURT_CHECK(field_count(proto, dtype) == stored_values, where, ": holds ", field_count(proto, dtype),
                " values but its shape needs ", stored_values);
  }
  if (packed) {
    std::vector<std::uint8_t> bytes(nbytes);
    if (external) {
      onnx_frontend::read_external(onnx_frontend::open_external(proto, model_dir, nbytes, where), bytes.data(), where);
    } else if (proto.has_raw_data()) {
      if (nbytes) std::memcpy(bytes.data(), proto.raw_data().data(), nbytes);
    } else {
      copy_field(proto.int32_data(), bytes.data(), stored_values, where);
    }
    Tensor t = Tensor::empty(shape, dtype, Device::cpu());
    detail::unpack_int4(bytes.data(), count, dtype, static_cast<std::uint8_t*>(t.data_ptr()));
    return t;
  }
  if (adopt != nullptr && !external && proto.has_raw_data() && nbytes >= kAdoptBytes &&
      reinterpret_cast<std::uintptr_t>(adopt->data()) % 16 == 0) {
    // Note [Adopted initializer bytes]
    auto bytes = std::make_shared<std::string>(std::move(*adopt));
    void* data = bytes->data();
    return Tensor::from_blob(data, shape, {}, dtype, Device::cpu(), std::shared_ptr<void>(bytes, data), nbytes);
  }
  std::optional<onnx_frontend::ExternalSpan> span;  // checked before the tensor is allocated
  if (external) span = onnx_frontend::open_external(proto, model_dir, nbytes, where);
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  void* dst = t.data_ptr();
  if (external) {
    onnx_frontend::read_external(*span, dst, where);
    return t;
  }
  if (proto.has_raw_data()) {
    if (nbytes) std::memcpy(dst, proto.raw_data().data(), nbytes);
    return t;
  }
  switch (dtype) {
    case DType::kFloat32: copy_field(proto.float_data(), static_cast<float*>(dst), n, where); break;
    case DType::kFloat64: copy_field(proto.double_data(), static_cast<double*>(dst), n, where); break;
    case DType::kInt64: copy_field(proto.int64_data(), static_cast<std::int64_t*>(dst), n, where); break;
    case DType::kInt32: copy_field(proto.int32_data(), static_cast<std::int32_t*>(dst), n, where); break;
    case DType::kInt16: copy_field(proto.int32_data(), static_cast<std::int16_t*>(dst), n, where); break;
    case DType::kInt8: copy_field(proto.int32_data(), static_cast<std::int8_t*>(dst), n, where); break;
    case DType::kUInt8: copy_field(proto.int32_data(), static_cast<std::uint8_t*>(dst), n, where); break;
    case DType::kBool: copy_field(proto.int32_data(), static_cast<bool*>(dst), n, where); break;
    case DType::kUInt16: copy_field(proto.int32_data(), static_cast<std::uint16_t*>(dst), n, where); break;
    // uint32 and uint64 values live in uint64_data.
    case DType::kUInt32: copy_field(proto.uint64_data(), static_cast<std::uint32_t*>(dst), n, where); break;
    case DType::kUInt64: copy_field(proto.uint64_data(), static_cast<std::uint64_t*>(dst), n, where); break;
    // 16-bit floats are stored as their bit patterns in int32_data.
    case DType::kFloat16:
    case DType::kBFloat16: copy_field(proto.int32_data(), static_cast<std::uint16_t*>(dst), n, where); break;
    // Float8 bit patterns, one per int32_data entry.
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: copy_field(proto.int32_data(), static_cast<std::uint8_t*>(dst), n, where); break;
    case DType::kInt4:
    case DType::kUInt4: XPURT_INTERNAL_ASSERT(false, "int4 is unpacked above");
  }
  return t;
}

void tensor_to_proto(const Tensor& tensor, const std::string& name, onnx::TensorProto* proto) {
  const Tensor t = tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(Device::cpu()).contiguous();
  proto->set_name(name);
  proto->set_data_type(dtype_to_onnx(t.dtype()));
  for (std::int64_t d : t.shape()) proto->add_dims(d);
  if (is_int4_dtype(t.dtype())) {  // two per byte, the first in the low nibble (Note [Float8 and 4-bit dtypes])
    std::string packed(detail::int4_packed_bytes(static_cast<std::size_t>(t.numel())), '\0');
    detail::pack_int4(static_cast<const std::uint8_t*>(t.data_ptr()), static_cast<std::size_t>(t.numel()),
                      reinterpret_cast<std::uint8_t*>(packed.data()));
    proto->set_raw_data(std::move(packed));
    return;
  }
  proto->set_raw_data(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

// ---- types ----

ValueType tensor_type_from_proto(const onnx::TypeProto::Tensor& tensor, const std::string& where) {
  ValueType vt;
  vt.dtype = dtype_from_onnx(tensor.elem_type(), where);
  if (tensor.has_shape()) {
    vt.has_shape = true;
    for (const auto& dim : tensor.shape().dim()) {
      if (dim.has_dim_value()) {
        vt.shape.emplace_back(dim.dim_value());
      } else if (dim.has_dim_param()) {
        vt.shape.emplace_back(dim.dim_param());
      } else {
        vt.shape.emplace_back();
      }
    }
  }
  return vt;
}

const char* type_case_name(const onnx::TypeProto& type) {
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: return "tensor";
    case onnx::TypeProto::kSequenceType: return "sequence";
    case onnx::TypeProto::kMapType: return "map";
    case onnx::TypeProto::kOptionalType: return "optional";
    case onnx::TypeProto::kSparseTensorType: return "sparse tensor";
    default: return "non-tensor";
  }
}

// Tensors, sequences of tensors and optionals of those (value.h); maps, sparse tensors and deeper nestings are
// UnsupportedOperationError.
ValueType type_from_proto(const onnx::TypeProto& type, const std::string& where) {
  XPURT_CHECK(type.value_case() != onnx::TypeProto::VALUE_NOT_SET, where, ": the value has no type");
  auto unsupported = [&](const std::string& what) {
    return UnsupportedOperationError(detail::str_cat(
        where, ": ", what, " values are not supported (xpuruntime runs tensors, sequences of tensors and optionals "
        "of those)"));
  };
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: return tensor_type_from_proto(type.tensor_type(), where);
    case onnx::TypeProto::kSequenceType: {
      XPURT_CHECK(type.sequence_type().has_elem_type(), where, ": a sequence type without an element type");
      const onnx::TypeProto& elem = type.sequence_type().elem_type();
      if (elem.value_case() != onnx::TypeProto::kTensorType) {
        throw unsupported(detail::str_cat("sequence-of-", type_case_name(elem)));
      }
      return ValueType::sequence_of(tensor_type_from_proto(elem.tensor_type(), where));
    }
    case onnx::TypeProto::kOptionalType: {
      XPURT_CHECK(type.optional_type().has_elem_type(), where, ": an optional type without an element type");
      const onnx::TypeProto& elem = type.optional_type().elem_type();
      if (elem.value_case() != onnx::TypeProto::kTensorType && elem.value_case() != onnx::TypeProto::kSequenceType) {
        throw unsupported(detail::str_cat("optional-of-", type_case_name(elem)));
      }
      return ValueType::optional_of(type_from_proto(elem, where));
    }
    default: throw unsupported(type_case_name(type));
  }
}

void tensor_type_to_proto(const ValueType& vt, onnx::TypeProto* type) {
  auto* tensor = type->mutable_tensor_type();
  tensor->set_elem_type(dtype_to_onnx(vt.dtype));
  if (!vt.has_shape) return;
  auto* shape = tensor->mutable_shape();
  for (const Dim& d : vt.shape) {
    auto* dim = shape->add_dim();
    if (d.known()) {
      dim->set_dim_value(d.value);
    } else if (!d.symbol.empty()) {
      dim->set_dim_param(d.symbol);
    }
  }
}

void type_to_proto(const ValueType& vt, onnx::TypeProto* type) {
  switch (vt.kind) {
    case ValueKind::kTensor: tensor_type_to_proto(vt, type); break;
    case ValueKind::kSequence:
      tensor_type_to_proto(vt.element(), type->mutable_sequence_type()->mutable_elem_type());
      break;
    case ValueKind::kOptional:
      type_to_proto(vt.element(), type->mutable_optional_type()->mutable_elem_type());
      break;
  }
}

// ---- graphs ----

// `adopt`: the same graph, mutable, whose initializers' bytes the tensors may take (Note [Adopted initializer
// bytes]), or null.
Graph graph_from_proto(const onnx::GraphProto& proto, const std::map<std::string, std::int64_t>& opsets,
                       const std::string& model_dir, bool top_level, onnx::GraphProto* adopt = nullptr);

void attribute_from_proto(const onnx::AttributeProto& attr, Node& node,
                          const std::map<std::string, std::int64_t>& opsets, const std::string& model_dir) {
  const std::string where = detail::str_cat("attribute '", attr.name(), "' of node '", node.name, "' (",
                                            node.op_type, ")");
  XPURT_CHECK(!attr.name().empty(), "node '", node.name, "' (", node.op_type, ") has an attribute without a name");
  switch (attr.type()) {
    case onnx::AttributeProto::FLOAT: node.attrs.set(attr.name(), static_cast<double>(attr.f())); break;
    case onnx::AttributeProto::INT: node.attrs.set(attr.name(), static_cast<std::int64_t>(attr.i())); break;
    case onnx::AttributeProto::STRING: node.attrs.set(attr.name(), attr.s()); break;
    case onnx::AttributeProto::FLOATS:
      node.attrs.set(attr.name(), std::vector<double>(attr.floats().begin(), attr.floats().end()));
      break;
    case onnx::AttributeProto::INTS:
      node.attrs.set(attr.name(), std::vector<std::int64_t>(attr.ints().begin(), attr.ints().end()));
      break;
    case onnx::AttributeProto::STRINGS:
      node.string_list_attrs[attr.name()] = std::vector<std::string>(attr.strings().begin(), attr.strings().end());
      break;
    case onnx::AttributeProto::TENSOR: node.tensor_attrs[attr.name()] = tensor_from_proto(attr.t(), model_dir); break;
    case onnx::AttributeProto::GRAPH:
      node.graph_attrs[attr.name()] =
          std::make_shared<Graph>(graph_from_proto(attr.g(), opsets, model_dir, /*top_level=*/false));
      break;
    case onnx::AttributeProto::TYPE_PROTO: node.type_attrs[attr.name()] = type_from_proto(attr.tp(), where); break;
    case onnx::AttributeProto::UNDEFINED: {
      // Old models (IR < 2) leave the type out; infer it from the field that is set.
      if (attr.has_f()) node.attrs.set(attr.name(), static_cast<double>(attr.f()));
      else if (attr.has_i()) node.attrs.set(attr.name(), static_cast<std::int64_t>(attr.i()));
      else if (attr.has_s()) node.attrs.set(attr.name(), attr.s());
      else if (attr.has_t()) node.tensor_attrs[attr.name()] = tensor_from_proto(attr.t(), model_dir);
      else if (attr.floats_size()) node.attrs.set(attr.name(), std::vector<double>(attr.floats().begin(), attr.floats().end()));
      else if (attr.ints_size()) node.attrs.set(attr.name(), std::vector<std::int64_t>(attr.ints().begin(), attr.ints().end()));
      else throw InvalidArgumentError(where + ": has no type and no value");
      break;
    }
    default:
      throw UnsupportedOperationError(detail::str_cat(where, ": attribute type ",
                                                      onnx::AttributeProto::AttributeType_Name(attr.type()),
                                                      " is not supported"));
  }
}

Graph graph_from_proto(const onnx::GraphProto& proto, const std::map<std::string, std::int64_t>& opsets,
                       const std::string& model_dir, bool top_level, onnx::GraphProto* adopt) {
  Graph g;
  g.name = proto.name();
  g.opsets = opsets;
  XPURT_CHECK(proto.sparse_initializer_size() == 0, "graph '", proto.name(),
              "': sparse initializers are not supported");
  for (int i = 0; i < proto.initializer_size(); ++i) {
    const onnx::TensorProto& init = proto.initializer(i);
    XPURT_CHECK(!init.name().empty(), "graph '", proto.name(), "' has an initializer without a name");
    std::string* bytes = adopt != nullptr && init.has_raw_data() ? adopt->mutable_initializer(i)->mutable_raw_data()
                                                                  : nullptr;
    Tensor t = tensor_from_proto(init, model_dir, bytes);
    ValueType vt;
    vt.dtype = t.dtype();
    vt.has_shape = true;
    for (std::int64_t d : t.shape()) vt.shape.emplace_back(d);
    g.types[init.name()] = vt;
    g.initializers[init.name()] = std::move(t);
  }
  for (const auto& in : proto.input()) {
    XPURT_CHECK(!in.name().empty(), "graph '", proto.name(), "' has an input without a name");
    const bool is_init = g.initializers.count(in.name()) != 0;
    if (in.has_type()) {
      ValueType vt = type_from_proto(in.type(), detail::str_cat("graph input '", in.name(), "'"));
      if (!is_init) g.types[in.name()] = vt;
    }
    // IR < 4 lists initializers among the inputs too; they are constants here (ONNX Runtime treats them as
    // overridable defaults; xpuruntime keeps them constant so they can be folded).
    if (!is_init || !top_level) g.inputs.push_back(in.name());
  }
  for (const auto& out : proto.output()) {
    XPURT_CHECK(!out.name().empty(), "graph '", proto.name(), "' has an output without a name");
    g.outputs.push_back(out.name());
    if (out.has_type() && g.types.count(out.name()) == 0) {
      g.types[out.name()] = type_from_proto(out.type(), detail::str_cat("graph output '", out.name(), "'"));
    }
  }
  for (const auto& vi : proto.value_info()) {
    if (!vi.has_type() || g.types.count(vi.name())) continue;
    try {
      g.types[vi.name()] = type_from_proto(vi.type(), detail::str_cat("value '", vi.name(), "'"));
    } catch (const UnsupportedOperationError&) {
      // A map or another value kind xpuruntime does not run: the node that makes it reports the problem.
    }
  }
  g.nodes.reserve(static_cast<std::size_t>(proto.node_size()));
  for (const auto& np : proto.node()) {
    Node node;
    node.name = np.name();
    node.op_type = np.op_type();
    node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    XPURT_CHECK(!node.op_type.empty(), "graph '", proto.name(), "': node '", np.name(), "' has no op_type");
    node.inputs.assign(np.input().begin(), np.input().end());
    node.outputs.assign(np.output().begin(), np.output().end());
    for (const auto& attr : np.attribute()) attribute_from_proto(attr, node, opsets, model_dir);
    g.nodes.push_back(std::move(node));
  }
  if (top_level) g.validate();
  return g;
}

void graph_to_proto(const Graph& g, onnx::GraphProto* proto);

void node_to_proto(const Node& node, onnx::NodeProto* np) {
  np->set_name(node.name);
  np->set_op_type(node.op_type);
  if (!node.domain.empty()) np->set_domain(node.domain);
  for (const auto& in : node.inputs) np->add_input(in);
  for (const auto& out : node.outputs) np->add_output(out);
  for (const auto& [name, value] : node.attrs.values()) {
    auto* a = np->add_attribute();
    a->set_name(name);
    if (const auto* i = std::get_if<std::int64_t>(&value)) {
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(*i);
    } else if (const auto* f = std::get_if<double>(&value)) {
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(static_cast<float>(*f));
    } else if (const auto* s = std::get_if<std::string>(&value)) {
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(*s);
    } else if (const auto* is = std::get_if<std::vector<std::int64_t>>(&value)) {
      a->set_type(onnx::AttributeProto::INTS);
      for (auto v : *is) a->add_ints(v);
    } else if (const auto* fs = std::get_if<std::vector<double>>(&value)) {
      a->set_type(onnx::AttributeProto::FLOATS);
      for (auto v : *fs) a->add_floats(static_cast<float>(v));
    }
  }
  for (const auto& [name, t] : node.tensor_attrs) {
    auto* a = np->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::TENSOR);
    tensor_to_proto(t, "", a->mutable_t());
  }
  for (const auto& [name, list] : node.string_list_attrs) {
    auto* a = np->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRINGS);
    for (const auto& s : list) a->add_strings(s);
  }
  for (const auto& [name, sub] : node.graph_attrs) {
    auto* a = np->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    graph_to_proto(*sub, a->mutable_g());
  }
  for (const auto& [name, vt] : node.type_attrs) {
    auto* a = np->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::TYPE_PROTO);
    type_to_proto(vt, a->mutable_tp());
  }
}

void graph_to_proto(const Graph& g, onnx::GraphProto* proto) {
  proto->set_name(g.name.empty() ? "graph" : g.name);
  for (const auto& [name, t] : g.initializers) tensor_to_proto(t, name, proto->add_initializer());
  auto add_value_info = [&](const std::string& name, onnx::ValueInfoProto* vi) {
    vi->set_name(name);
    if (const ValueType* vt = g.type(name)) type_to_proto(*vt, vi->mutable_type());
  };
  for (const auto& in : g.inputs) add_value_info(in, proto->add_input());
  for (const auto& out : g.outputs) add_value_info(out, proto->add_output());
  std::set<std::string> listed(g.inputs.begin(), g.inputs.end());
  listed.insert(g.outputs.begin(), g.outputs.end());
  for (const Node& n : g.nodes) {
    node_to_proto(n, proto->add_node());
    for (const auto& out : n.outputs) {
      if (!out.empty() && !listed.count(out) && g.type(out)) add_value_info(out, proto->add_value_info());
    }
  }
}

}  // namespace

Graph import_onnx(const std::string& model_bytes, const OnnxImportOptions& options) {
  onnx::ModelProto model;
  onnx_frontend::parse_checked(model_bytes, options.allow_newer_opsets, &model);
  std::map<std::string, std::int64_t> opsets;
  for (const auto& op : model.opset_import()) {
    opsets[op.domain() == "ai.onnx" ? "" : op.domain()] = op.version();
  }
  // Model-local functions are not inlined yet: refuse only when a node uses one.
  std::set<std::pair<std::string, std::string>> functions;
  for (const auto& f : model.functions()) functions.insert({f.domain(), f.name()});
  for (const auto& n : model.graph().node()) {
    if (functions.count({n.domain(), n.op_type()})) {
      throw UnsupportedOperationError(detail::str_cat("node '", n.name(), "' calls the model-local function ",
                                                      n.op_type(), ", which xpuruntime does not inline yet"));
    }
  }
  Graph g = graph_from_proto(model.graph(), opsets, options.model_dir, /*top_level=*/true, model.mutable_graph());
  g.ir_version = model.ir_version();
  g.producer = model.producer_name() + (model.producer_version().empty() ? "" : " " + model.producer_version());
  return g;
}

Graph import_onnx_file(const std::string& path) {
  const std::string bytes = read_model_file(path);
  OnnxImportOptions options;
  options.model_dir = std::filesystem::path(path).parent_path().string();
  if (options.model_dir.empty()) options.model_dir = ".";
  return import_onnx(bytes, options);
}

std::string export_onnx(const Graph& graph) {
  onnx::ModelProto model;
  model.set_ir_version(graph.ir_version);
  model.set_producer_name("xpuruntime");
  for (const auto& [domain, version] : graph.opsets) {
    auto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  bool has_xpurt = false;
  for (const Node& n : graph.nodes) has_xpurt |= n.domain == kXpurtDomain;
  if (has_xpurt && graph.opsets.count(kXpurtDomain) == 0) {
    auto* op = model.add_opset_import();
    op->set_domain(kXpurtDomain);
    op->set_version(1);
  }
  graph_to_proto(graph, model.mutable_graph());
  std::string out;
  XPURT_CHECK(model.SerializeToString(&out), "export_onnx: the graph does not serialize (over 2 GB?)");
  return out;
}

Tensor tensor_from_onnx(const std::string& tensor_proto_bytes, const std::string& model_dir) {
  onnx::TensorProto proto;
  XPURT_CHECK(proto.ParseFromArray(tensor_proto_bytes.data(), static_cast<int>(tensor_proto_bytes.size())),
              "not a valid ONNX TensorProto (", tensor_proto_bytes.size(), " bytes)");
  return tensor_from_proto(proto, model_dir);
}


std::string tensor_to_onnx(const Tensor& tensor, const std::string& name) {
  onnx::TensorProto proto;
  tensor_to_proto(tensor, name, &proto);
  std::string out;
  proto.SerializeToString(&out);
  return out;
}

}  // namespace xpuruntime
