// Structure-aware mutation of ONNX models (structure_mutator.h).
#include "structure_mutator.h"

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace xpuruntime::fuzz {
namespace {

using Rng = std::mt19937_64;

// Op types swapped in beside the model's own: common ones, control flow, and a few the native engine fuses.
const char* const kCommonOps[] = {
    "Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Conv", "ConvTranspose", "Relu", "Sigmoid", "Tanh", "Softmax",
    "LogSoftmax", "Gelu", "Erf", "Sqrt", "Pow", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Cast", "CastLike",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "ScatterND", "Expand", "Tile", "Pad", "Resize", "Where", "Equal", "Less",
    "Greater", "Not", "And", "ReduceMean", "ReduceSum", "ReduceMax", "ArgMax", "TopK", "LayerNormalization",
    "BatchNormalization", "InstanceNormalization", "GroupNormalization", "MaxPool", "AveragePool",
    "GlobalAveragePool", "Shape", "Size", "ConstantOfShape", "Constant", "Range", "Identity", "Dropout",
    "Einsum", "CumSum", "NonZero", "Trilu", "Clip", "Min", "Max", "HardSigmoid", "HardSwish", "If", "Loop",
    "Scan", "SequenceConstruct", "SequenceAt", "SplitToSequence", "ConcatFromSequence", "Optional",
    "OptionalGetElement", "QuantizeLinear", "DequantizeLinear", "NotAnOp"};
// Attribute names added to nodes beside the model's own.
const char* const kAttributeNames[] = {"axis", "axes", "perm", "to", "keepdims", "epsilon", "alpha", "beta",
                                       "transA", "transB", "group", "kernel_shape", "strides", "pads", "dilations",
                                       "mode", "value", "body", "then_branch", "else_branch", "num_outputs", "k",
                                       "allowzero", "equation", "num_scan_inputs", "split", "blocksize"};
const char* const kDomains[] = {"", "ai.onnx", "com.microsoft", "com.xpuruntime", "ai.onnx.ml", "no.such.domain"};

std::uint64_t below(Rng& rng, std::uint64_t n) { return n == 0 ? 0 : rng() % n; }
bool one_in(Rng& rng, std::uint64_t n) { return below(rng, n) == 0; }

std::int64_t interesting_int(Rng& rng) {
  static const std::int64_t values[] = {0,
                                        1,
                                        -1,
                                        2,
                                        3,
                                        -2,
                                        7,
                                        64,
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::int64_t{1} << 31,
                                        std::int64_t{1} << 40,
                                        std::int64_t{1} << 62,
                                        std::numeric_limits<std::int64_t>::max(),
                                        std::numeric_limits<std::int64_t>::min()};
  if (one_in(rng, 4)) return static_cast<std::int64_t>(below(rng, 9)) - 4;
  return values[below(rng, std::size(values))];
}

float interesting_float(Rng& rng) {
  static const float values[] = {0.0f, 1.0f, -1.0f, 0.5f, 1e30f, -1e-30f, 65504.0f,
                                 std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()};
  return values[below(rng, std::size(values))];
}

std::int32_t random_dtype(Rng& rng) {
  // TensorProto::DataType: 0 (undefined) .. 23 (FLOAT4E2M1), and a value no version defines.
  return one_in(rng, 16) ? 99 : static_cast<std::int32_t>(below(rng, 24));
}

template <typename T>
void erase_at(google::protobuf::RepeatedPtrField<T>* field, int index) {
  field->DeleteSubrange(index, 1);
}

// Moves the last element of `field` to `index`.
template <typename Field>
void move_last_to(Field* field, int index) {
  for (int i = field->size() - 1; i > index; --i) field->SwapElements(i, i - 1);
}

struct Context {
  Rng rng;
  onnx::ModelProto* model = nullptr;
  std::vector<onnx::GraphProto*> graphs;  // the main graph first, then every subgraph, depth first
  std::vector<std::string> op_types;      // the model's own and kCommonOps
  std::vector<std::string> names;         // every value name the model mentions
  std::vector<std::string> attribute_names;
  std::vector<std::string>* edits = nullptr;

  void note(std::string edit) {
    if (edits != nullptr) edits->push_back(std::move(edit));
  }
  const std::string& any_name() { return names[below(rng, names.size())]; }
};

void collect(onnx::GraphProto* graph, Context* ctx, std::set<std::string>* ops, std::set<std::string>* names,
             std::set<std::string>* attrs, int depth) {
  ctx->graphs.push_back(graph);
  for (const auto& v : graph->input()) names->insert(v.name());
  for (const auto& t : graph->initializer()) names->insert(t.name());
  for (auto& node : *graph->mutable_node()) {
    ops->insert(node.op_type());
    for (const auto& o : node.output()) names->insert(o);
    for (auto& attr : *node.mutable_attribute()) {
      attrs->insert(attr.name());
      if (depth > 16) continue;  // deeper bodies are mutated through their parents' attributes
      if (attr.has_g()) collect(attr.mutable_g(), ctx, ops, names, attrs, depth + 1);
      for (auto& g : *attr.mutable_graphs()) collect(&g, ctx, ops, names, attrs, depth + 1);
    }
  }
}

// A small body for a graph attribute: nothing, or one Identity of a value from outside (If/Loop/Scan bodies).
void fill_small_graph(onnx::GraphProto* g, Context* ctx) {
  g->set_name("fuzz_body");
  if (one_in(ctx->rng, 3)) return;
  onnx::NodeProto* node = g->add_node();
  node->set_op_type(one_in(ctx->rng, 2) ? "Identity" : ctx->op_types[below(ctx->rng, ctx->op_types.size())]);
  node->add_input(one_in(ctx->rng, 2) && !ctx->names.empty() ? ctx->any_name() : "fuzz_in");
  node->add_output("fuzz_out");
  if (one_in(ctx->rng, 2)) {
    onnx::ValueInfoProto* in = g->add_input();
    in->set_name("fuzz_in");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(one_in(ctx->rng, 2) ? 1 : random_dtype(ctx->rng));
  }
  onnx::ValueInfoProto* out = g->add_output();
  out->set_name("fuzz_out");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(1);
}

void fill_small_tensor(onnx::TensorProto* t, Context* ctx) {
  t->set_data_type(one_in(ctx->rng, 2) ? onnx::TensorProto::INT64 : random_dtype(ctx->rng));
  const int rank = static_cast<int>(below(ctx->rng, 3));
  std::int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const std::int64_t d = one_in(ctx->rng, 8) ? interesting_int(ctx->rng) : static_cast<std::int64_t>(below(ctx->rng, 4));
    t->add_dims(d);
    numel *= (d > 0 && d < 16) ? d : 1;
  }
  if (one_in(ctx->rng, 4)) numel = static_cast<std::int64_t>(below(ctx->rng, 4));  // a count that may not match
  if (t->data_type() == onnx::TensorProto::INT64 && one_in(ctx->rng, 2)) {
    for (std::int64_t i = 0; i < numel; ++i) t->add_int64_data(interesting_int(ctx->rng));
  } else {
    std::string raw(static_cast<std::size_t>(numel) * (1 + below(ctx->rng, 8)), '\0');
    for (char& c : raw) c = static_cast<char>(ctx->rng());
    t->set_raw_data(raw);
  }
}

void clear_attribute_value(onnx::AttributeProto* a) {
  a->clear_i();
  a->clear_f();
  a->clear_s();
  a->clear_t();
  a->clear_g();
  a->clear_sparse_tensor();
  a->clear_tp();
  a->clear_ints();
  a->clear_floats();
  a->clear_strings();
  a->clear_tensors();
  a->clear_graphs();
  a->clear_sparse_tensors();
  a->clear_type_protos();
}

// Gives `a` a value of a random type (int, float, string, tensor, graph, or a list of one of them).
void set_random_attribute_value(onnx::AttributeProto* a, Context* ctx) {
  clear_attribute_value(a);
  Rng& rng = ctx->rng;
  switch (below(rng, 9)) {
    case 0: a->set_type(onnx::AttributeProto::INT); a->set_i(interesting_int(rng)); break;
    case 1: a->set_type(onnx::AttributeProto::FLOAT); a->set_f(interesting_float(rng)); break;
    case 2:
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(one_in(rng, 3) ? std::string() : one_in(rng, 2) ? std::string("\xff\xfe bytes") : "NOTSET");
      break;
    case 3: {
      a->set_type(onnx::AttributeProto::INTS);
      const std::uint64_t n = below(rng, 6);
      for (std::uint64_t i = 0; i < n; ++i) a->add_ints(interesting_int(rng));
      break;
    }
    case 4: {
      a->set_type(onnx::AttributeProto::FLOATS);
      const std::uint64_t n = below(rng, 4);
      for (std::uint64_t i = 0; i < n; ++i) a->add_floats(interesting_float(rng));
      break;
    }
    case 5: a->set_type(onnx::AttributeProto::TENSOR); fill_small_tensor(a->mutable_t(), ctx); break;
    case 6: a->set_type(onnx::AttributeProto::GRAPH); fill_small_graph(a->mutable_g(), ctx); break;
    case 7: a->set_type(onnx::AttributeProto::STRINGS); a->add_strings(""); break;
    default: a->set_type(onnx::AttributeProto::GRAPHS); fill_small_graph(a->add_graphs(), ctx); break;
  }
  // Now and then the declared type says something else than the value set (a field the reader may trust).
  if (one_in(rng, 10)) a->set_type(static_cast<onnx::AttributeProto::AttributeType>(below(rng, 15)));
}

// Changes an attribute's value keeping its type (0, -1, huge, negative, empty lists, other lengths).
void change_attribute_value(onnx::AttributeProto* a, Context* ctx) {
  Rng& rng = ctx->rng;
  switch (a->type()) {
    case onnx::AttributeProto::INT: a->set_i(interesting_int(rng)); break;
    case onnx::AttributeProto::FLOAT: a->set_f(interesting_float(rng)); break;
    case onnx::AttributeProto::STRING: a->set_s(one_in(rng, 2) ? std::string() : std::string("\xc3\x28")); break;
    case onnx::AttributeProto::INTS:
      if (a->ints_size() > 0 && !one_in(rng, 3)) {
        a->set_ints(static_cast<int>(below(rng, a->ints_size())), interesting_int(rng));
      } else if (a->ints_size() > 0 && one_in(rng, 2)) {
        a->mutable_ints()->RemoveLast();
      } else {
        a->add_ints(interesting_int(rng));
      }
      break;
    case onnx::AttributeProto::FLOATS:
      if (a->floats_size() > 0 && one_in(rng, 2)) a->mutable_floats()->RemoveLast();
      else a->add_floats(interesting_float(rng));
      break;
    case onnx::AttributeProto::TENSOR: {
      onnx::TensorProto* t = a->mutable_t();
      if (one_in(rng, 2) && t->raw_data().size() > 0) t->mutable_raw_data()->resize(below(rng, t->raw_data().size()));
      else if (t->dims_size() > 0) t->set_dims(static_cast<int>(below(rng, t->dims_size())), interesting_int(rng));
      else t->add_dims(interesting_int(rng));
      break;
    }
    case onnx::AttributeProto::GRAPH: a->clear_g(); fill_small_graph(a->mutable_g(), ctx); break;
    default: set_random_attribute_value(a, ctx); break;
  }
}

onnx::NodeProto* pick_node(onnx::GraphProto* g, Context* ctx) {
  if (g->node_size() == 0) return nullptr;
  return g->mutable_node(static_cast<int>(below(ctx->rng, g->node_size())));
}

std::string node_label(const onnx::NodeProto& n) { return n.op_type() + "(" + n.name() + ")"; }

bool edit_node_input(onnx::GraphProto* g, Context* ctx) {
  onnx::NodeProto* n = pick_node(g, ctx);
  if (n == nullptr) return false;
  auto* inputs = n->mutable_input();
  const int i = inputs->empty() ? 0 : static_cast<int>(below(ctx->rng, inputs->size()));
  const std::uint64_t kind = inputs->empty() ? 4 : below(ctx->rng, 5);
  const std::string where = node_label(*n) + " input " + std::to_string(i);
  switch (kind) {
    case 0: erase_at(inputs, i); ctx->note("drop " + where); break;
    case 1: {
      *n->add_input() = inputs->Get(i);
      move_last_to(inputs, static_cast<int>(below(ctx->rng, inputs->size())));
      ctx->note("duplicate " + where);
      break;
    }
    case 2: inputs->Mutable(i)->clear(); ctx->note("empty " + where); break;
    case 3: *inputs->Mutable(i) = ctx->any_name(); ctx->note("rewire " + where + " to " + inputs->Get(i)); break;
    default: *n->add_input() = ctx->any_name(); ctx->note("add input " + inputs->Get(inputs->size() - 1) + " to " + node_label(*n)); break;
  }
  return true;
}

bool edit_node_output(onnx::GraphProto* g, Context* ctx) {
  onnx::NodeProto* n = pick_node(g, ctx);
  if (n == nullptr || n->output_size() == 0) return false;
  auto* outputs = n->mutable_output();
  const int i = static_cast<int>(below(ctx->rng, outputs->size()));
  const std::string where = node_label(*n) + " output " + std::to_string(i);
  switch (below(ctx->rng, 5)) {
    case 0: erase_at(outputs, i); ctx->note("drop " + where); break;
    case 1: *n->add_output() = outputs->Get(i); ctx->note("duplicate " + where); break;
    case 2: outputs->Mutable(i)->clear(); ctx->note("empty " + where); break;
    case 3: *outputs->Mutable(i) = ctx->any_name(); ctx->note("rename " + where + " to existing " + outputs->Get(i)); break;
    default: *n->add_output() = "fuzz_extra_out"; ctx->note("add output to " + node_label(*n)); break;
  }
  return true;
}

bool edit_op_type(onnx::GraphProto* g, Context* ctx) {
  onnx::NodeProto* n = pick_node(g, ctx);
  if (n == nullptr) return false;
  const std::string before = node_label(*n);
  if (one_in(ctx->rng, 8)) {
    n->set_domain(kDomains[below(ctx->rng, std::size(kDomains))]);
    ctx->note("domain of " + before + " to '" + n->domain() + "'");
    return true;
  }
  n->set_op_type(ctx->op_types[below(ctx->rng, ctx->op_types.size())]);
  ctx->note("op type " + before + " to " + n->op_type());
  return true;
}

bool edit_attribute(onnx::GraphProto* g, Context* ctx) {
  onnx::NodeProto* n = pick_node(g, ctx);
  if (n == nullptr) return false;
  auto* attrs = n->mutable_attribute();
  const std::uint64_t kind = attrs->empty() ? 0 : below(ctx->rng, 4);
  if (kind == 0) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(one_in(ctx->rng, 2) ? ctx->attribute_names[below(ctx->rng, ctx->attribute_names.size())]
                                    : kAttributeNames[below(ctx->rng, std::size(kAttributeNames))]);
    set_random_attribute_value(a, ctx);
    ctx->note("add attribute " + a->name() + " (type " + std::to_string(a->type()) + ") to " + node_label(*n));
    return true;
  }
  const int i = static_cast<int>(below(ctx->rng, attrs->size()));
  onnx::AttributeProto* a = attrs->Mutable(i);
  const std::string where = "attribute " + a->name() + " of " + node_label(*n);
  if (kind == 1) {
    ctx->note("drop " + where);
    erase_at(attrs, i);
  } else if (kind == 2) {
    set_random_attribute_value(a, ctx);
    ctx->note("retype " + where + " to " + std::to_string(a->type()));
  } else {
    change_attribute_value(a, ctx);
    ctx->note("change " + where);
  }
  return true;
}

void edit_shape(onnx::TypeProto* type, Context* ctx, const std::string& where) {
  Rng& rng = ctx->rng;
  if (!type->has_tensor_type() || one_in(rng, 16)) {
    if (one_in(rng, 2)) {
      type->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(1);
      ctx->note(where + " becomes a sequence");
    } else {
      type->mutable_tensor_type()->set_elem_type(1);
      ctx->note(where + " becomes a float tensor");
    }
    return;
  }
  onnx::TypeProto::Tensor* t = type->mutable_tensor_type();
  switch (below(rng, 6)) {
    case 0: t->set_elem_type(random_dtype(rng)); ctx->note("dtype of " + where + " to " + std::to_string(t->elem_type())); return;
    case 1: t->clear_shape(); ctx->note("no shape for " + where); return;
    case 2: t->mutable_shape()->clear_dim(); ctx->note("rank 0 for " + where); return;
    case 3: {
      onnx::TensorShapeProto::Dimension* d = t->mutable_shape()->add_dim();
      if (one_in(rng, 2)) d->set_dim_value(interesting_int(rng));
      else d->set_dim_param("fuzz_dim");
      move_last_to(t->mutable_shape()->mutable_dim(), static_cast<int>(below(rng, t->shape().dim_size())));
      ctx->note("one more dim for " + where);
      return;
    }
    case 4:
      if (t->shape().dim_size() > 0) {
        erase_at(t->mutable_shape()->mutable_dim(), static_cast<int>(below(rng, t->shape().dim_size())));
        ctx->note("one dim less for " + where);
        return;
      }
      [[fallthrough]];
    default: {
      if (t->shape().dim_size() == 0) t->mutable_shape()->add_dim();
      onnx::TensorShapeProto::Dimension* d =
          t->mutable_shape()->mutable_dim(static_cast<int>(below(rng, t->shape().dim_size())));
      const std::uint64_t k = below(rng, 4);
      if (k == 0) d->set_dim_param(one_in(rng, 2) ? "" : "fuzz_dim");
      else if (k == 1) d->Clear();
      else d->set_dim_value(interesting_int(rng));
      ctx->note("a dim of " + where + " to " + (d->has_dim_value() ? std::to_string(d->dim_value()) : d->dim_param()));
      return;
    }
  }
}

bool edit_value_info(onnx::GraphProto* g, Context* ctx) {
  Rng& rng = ctx->rng;
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list = nullptr;
  const char* which = "";
  switch (below(rng, 4)) {
    case 0: case 1: list = g->mutable_input(); which = "graph input"; break;
    case 2: list = g->mutable_output(); which = "graph output"; break;
    default: list = g->mutable_value_info(); which = "value_info"; break;
  }
  if (list->empty()) return false;
  const int i = static_cast<int>(below(rng, list->size()));
  onnx::ValueInfoProto* v = list->Mutable(i);
  const std::string where = std::string(which) + " " + v->name();
  switch (below(rng, 8)) {
    case 0: ctx->note("drop " + where); erase_at(list, i); return true;
    case 1: *list->Add() = *v; ctx->note("duplicate " + where); return true;
    case 2: v->set_name(ctx->any_name()); ctx->note("rename " + where + " to existing " + v->name()); return true;
    default: edit_shape(v->mutable_type(), ctx, where); return true;
  }
}

bool edit_initializer(onnx::GraphProto* g, Context* ctx) {
  Rng& rng = ctx->rng;
  if (g->initializer_size() == 0) {
    // A Constant-free graph: give one node input an initializer.
    onnx::NodeProto* n = pick_node(g, ctx);
    if (n == nullptr || n->input_size() == 0) return false;
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(n->input(static_cast<int>(below(rng, n->input_size()))));
    fill_small_tensor(t, ctx);
    ctx->note("initializer for " + t->name());
    return true;
  }
  const int i = static_cast<int>(below(rng, g->initializer_size()));
  onnx::TensorProto* t = g->mutable_initializer(i);
  const std::string where = "initializer " + t->name();
  switch (below(rng, 9)) {
    case 0: ctx->note("drop " + where); erase_at(g->mutable_initializer(), i); return true;
    case 1: t->set_data_type(random_dtype(rng)); ctx->note("dtype of " + where + " to " + std::to_string(t->data_type())); return true;
    case 2:
      if (t->dims_size() > 0) {
        t->set_dims(static_cast<int>(below(rng, t->dims_size())), interesting_int(rng));
        ctx->note("a dim of " + where);
        return true;
      }
      [[fallthrough]];
    case 3: t->add_dims(one_in(rng, 2) ? 1 : interesting_int(rng)); ctx->note("one more dim for " + where); return true;
    case 4:
      t->clear_dims();
      ctx->note("rank 0 for " + where);
      return true;
    case 5: {
      // Truncated data: the raw bytes or the typed fields lose a tail.
      if (!t->raw_data().empty()) t->mutable_raw_data()->resize(below(rng, t->raw_data().size()));
      if (t->float_data_size() > 0) t->mutable_float_data()->Truncate(static_cast<int>(below(rng, t->float_data_size())));
      if (t->int64_data_size() > 0) t->mutable_int64_data()->Truncate(static_cast<int>(below(rng, t->int64_data_size())));
      if (t->int32_data_size() > 0) t->mutable_int32_data()->Truncate(static_cast<int>(below(rng, t->int32_data_size())));
      ctx->note("truncate data of " + where);
      return true;
    }
    case 6:
      t->clear_raw_data();
      t->clear_float_data();
      t->clear_int32_data();
      t->clear_int64_data();
      t->clear_double_data();
      t->clear_uint64_data();
      t->clear_string_data();
      ctx->note("empty data of " + where);
      return true;
    case 7: t->set_name(ctx->any_name()); ctx->note("rename " + where + " to existing " + t->name()); return true;
    default: {
      fill_small_tensor(t, ctx);  // keeps the name, replaces dims, dtype and data
      ctx->note("replace " + where);
      return true;
    }
  }
}

bool edit_nodes(onnx::GraphProto* g, Context* ctx) {
  Rng& rng = ctx->rng;
  if (g->node_size() == 0) return false;
  auto* nodes = g->mutable_node();
  const int i = static_cast<int>(below(rng, nodes->size()));
  switch (below(rng, 4)) {
    case 0: ctx->note("drop node " + node_label(nodes->Get(i))); erase_at(nodes, i); return true;
    case 1:
      *g->add_node() = nodes->Get(i);
      move_last_to(nodes, static_cast<int>(below(rng, nodes->size())));
      ctx->note("duplicate node " + node_label(nodes->Get(i)));
      return true;
    case 2: {
      const int j = static_cast<int>(below(rng, nodes->size()));
      nodes->SwapElements(i, j);
      ctx->note("swap nodes " + std::to_string(i) + " and " + std::to_string(j));
      return true;
    }
    default:
      std::reverse(nodes->begin(), nodes->end());
      ctx->note("reverse node order");
      return true;
  }
}

bool edit_versions(Context* ctx) {
  Rng& rng = ctx->rng;
  onnx::ModelProto* m = ctx->model;
  static const std::int64_t kVersions[] = {1, 999, 0, -1, 6, 7, 9, 11, 13, 14, 17, 18, 21, 22, 23, 24};
  switch (below(rng, 4)) {
    case 0: {
      static const std::int64_t kIr[] = {0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 999, -1};
      m->set_ir_version(kIr[below(rng, std::size(kIr))]);
      ctx->note("ir_version " + std::to_string(m->ir_version()));
      return true;
    }
    case 1: {
      onnx::OperatorSetIdProto* o = m->add_opset_import();
      o->set_domain(kDomains[below(rng, std::size(kDomains))]);
      o->set_version(kVersions[below(rng, std::size(kVersions))]);
      ctx->note("opset import '" + o->domain() + "' " + std::to_string(o->version()));
      return true;
    }
    case 2:
      if (m->opset_import_size() > 0) {
        const int i = static_cast<int>(below(rng, m->opset_import_size()));
        ctx->note("drop opset import '" + m->opset_import(i).domain() + "'");
        erase_at(m->mutable_opset_import(), i);
        return true;
      }
      [[fallthrough]];
    default: {
      if (m->opset_import_size() == 0) m->add_opset_import();
      onnx::OperatorSetIdProto* o = m->mutable_opset_import(static_cast<int>(below(rng, m->opset_import_size())));
      o->set_version(kVersions[below(rng, std::size(kVersions))]);
      ctx->note("opset '" + o->domain() + "' version " + std::to_string(o->version()));
      return true;
    }
  }
}

bool apply_one_edit(Context* ctx) {
  Rng& rng = ctx->rng;
  // The main graph half of the time, else any graph (subgraphs of If/Loop/Scan included).
  onnx::GraphProto* g = one_in(rng, 2) ? ctx->graphs[0] : ctx->graphs[below(rng, ctx->graphs.size())];
  switch (below(rng, 20)) {
    case 0: case 1: case 2: return edit_node_input(g, ctx);
    case 3: case 4: return edit_node_output(g, ctx);
    case 5: case 6: return edit_op_type(g, ctx);
    case 7: case 8: case 9: return edit_attribute(g, ctx);
    case 10: case 11: case 12: return edit_value_info(g, ctx);
    case 13: case 14: case 15: return edit_initializer(g, ctx);
    case 16: case 17: return edit_nodes(g, ctx);
    default: return edit_versions(ctx);
  }
}

}  // namespace

bool mutate_model_structure(const std::string& model, std::uint64_t seed, std::string* out,
                            std::vector<std::string>* edits) {
  onnx::ModelProto proto;
  if (!proto.ParseFromString(model)) return false;
  Context ctx;
  ctx.rng.seed(seed);
  ctx.model = &proto;
  ctx.edits = edits;
  std::set<std::string> ops(std::begin(kCommonOps), std::end(kCommonOps));
  std::set<std::string> names;
  std::set<std::string> attrs(std::begin(kAttributeNames), std::end(kAttributeNames));
  collect(proto.mutable_graph(), &ctx, &ops, &names, &attrs, 0);
  names.insert("");
  names.insert("fuzz_undefined_name");
  ctx.op_types.assign(ops.begin(), ops.end());
  ctx.names.assign(names.begin(), names.end());
  ctx.attribute_names.assign(attrs.begin(), attrs.end());
  const int count = 1 + static_cast<int>(below(ctx.rng, 3));
  for (int done = 0, tries = 0; done < count && tries < 16; ++tries) {
    if (apply_one_edit(&ctx)) ++done;
    // Edits may add or remove subgraphs: later edits pick among the graphs the model has now.
    ctx.graphs.clear();
    std::set<std::string> unused_ops, unused_names, unused_attrs;
    collect(proto.mutable_graph(), &ctx, &unused_ops, &unused_names, &unused_attrs, 0);
  }
  *out = proto.SerializeAsString();
  return true;
}

}  // namespace xpuruntime::fuzz
