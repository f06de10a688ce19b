// concat_fusion: a Concat of fused values becomes one fused node whose pieces write the concatenation (Note [Pieces of
// a concatenation] in core/fused_elementwise.h).
//
// Note [Concats of fused values]
// A Concat copies what its inputs' kernels just wrote: GPT-NeoX (and the other partial-rotary decoders: Phi-2,
// StableLM, ChatGLM) rotates a quarter of each head and joins it to the other three quarters, so that each of q and k
// took a rotary kernel, a copy of the pass-through part out of the projection and the Concat's copy, three launches
// and three passes over the head, where torch.compile writes one kernel. A Concat of float values of static shapes
// becomes one FusedElementwise with pieces when at least one input is gained: a FusedElementwise that only the Concat
// reads (its program becomes the piece's, its inputs and their views the node's), or a value view ops copied out of a
// tensor along a contiguous innermost axis (the piece reads the tensor through the composed view: Swin's patch
// merging, four strided Slices and their Concat). The other inputs are copy pieces ("f32 x<k>", exact in every float
// dtype). Producers that reduce over rows or quantize their output stay as they are, read as copies. A KernelPolicy
// rule for concat keeps the Concats, and CPU plans keep them too.
//
// Note [Concats read by a fused node]
// A Concat whose one reader is an elementwise fused node F is written by one kernel and read back by the next:
// DenseNet concatenates every earlier feature map of a block in each layer and reads the result only through that
// layer's pre-activation norm and ReLU (a per-channel affine map in CUDA plans), 58 Concats of up to 25 inputs in
// DenseNet-121. F becomes a node of pieces instead, piece p being F's program over the Concat's input p; F's other
// inputs are read as they were where they do not vary along the Concat's axis, and through a view of their slab where
// they do (a per-channel scale read from the piece's first channel). The concatenation is never written. F must
// compute one value of the Concat's shape without a row reduction, pieces of its own, a quantized output or a
// rotate_half across the Concat's last axis, and read the Concat as stored. A Concat that has inputs to absorb itself
// (Note [Concats of fused values]) keeps that form instead.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/fused_elementwise.h"
#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

using Shape = std::vector<std::int64_t>;

// The fused node producing `value` when only the Concat `concat` reads it and its program can be a piece (no row
// reduction, no pieces of its own, a float output); nullopt otherwise.
std::optional<std::size_t> absorbable(const Graph& g, const Uses& uses, const std::string& value, std::size_t concat) {
  auto p = uses.producer(value);
  if (!p || !uses.only_reader(value, concat)) return std::nullopt;
  const Node& f = g.nodes[*p];
  if (f.domain != kXpurtDomain || f.op_type != "FusedElementwise" || f.outputs.size() != 1 ||
      f.attrs.get_int("row_axes", 0) != 0 || f.attrs.has("pieces")) {
    return std::nullopt;
  }
  if (f.attrs.has("output_dtype") && !is_fusable_float(dtype_from_name(f.attrs.get_string("output_dtype", "")))) {
    return std::nullopt;
  }
  for (const std::string& x : f.inputs) {
    if (!static_shape(g, x)) return std::nullopt;
  }
  return p;
}

// The piece of a Concat input: the node's inputs it adds (with their views) and its program over the node's inputs.
struct PieceOf {
  std::vector<std::string> inputs;
  fused::InputViews views;
  std::string program;
  bool gained = false;  // a kernel or a copy fewer
  std::string note;
};

PieceOf piece_of(const Graph& g, const Uses& uses, const std::string& value, std::size_t concat, std::size_t base) {
  PieceOf piece;
  if (auto p = absorbable(g, uses, value, concat)) {
    const Node& f = g.nodes[*p];
    fused::Program program = fused::parse(f.attrs.get_string("program", ""), f.inputs.size());
    fused::for_each_input(program, [&](fused::Operand& o) { o.index += static_cast<int>(base); });
    std::vector<Shape> stored;
    for (const std::string& x : f.inputs) stored.push_back(*static_shape(g, x));
    piece.views = fused::input_views(f.attrs, stored);
    piece.views.resize(f.inputs.size());
    piece.inputs = f.inputs;
    piece.program = program.text();
    piece.gained = true;
    piece.note = describe(f);
    return piece;
  }
  const std::string x = "x" + std::to_string(base);
  piece.program = "f32 " + x;
  // Only views whose innermost axis is contiguous: a transposed read (an NHWC tensor read as NCHW) strides every lane
  // of a warp across memory, where a Transpose kernel moves tiles.
  if (auto chain = view_chain(g, uses, value);
      chain && chain->copies > 0 && (chain->view.shape.back() == 1 || chain->view.strides.back() == 1)) {
    piece.inputs = {chain->source};
    piece.views = {chain->view};
    piece.gained = true;
    piece.note = chain->source + " through";
    for (std::size_t op : chain->nodes) piece.note += " " + describe(g.nodes[op]);
    return piece;
  }
  piece.inputs = {value};
  piece.views = {std::nullopt};
  return piece;
}

// Note [Concats read by a fused node]: F, the Concat `concat`'s only reader, becomes a node of pieces over the
// Concat's inputs; false (nothing changed) where it cannot.
bool absorb_into_reader(Graph& g, const Uses& uses, std::size_t concat, std::int64_t axis, const Shape& out,
                        std::string* note) {
  const Node& c = g.nodes[concat];
  const std::string& value = c.outputs[0];
  if (uses.is_graph_output(value) || uses.read_by_subgraph(value) || uses.readers(value).size() != 1) return false;
  const std::size_t f_index = uses.readers(value)[0];
  const Node& f = g.nodes[f_index];
  if (f.domain != kXpurtDomain || f.op_type != "FusedElementwise" || f.outputs.size() != 1 ||
      f.attrs.get_int("row_axes", 0) != 0 || f.attrs.has("pieces") || static_shape(g, f.outputs[0]) != out) {
    return false;
  }
  const auto f_dtype = value_dtype(g, f.outputs[0]);
  if (!f_dtype || !is_fusable_float(*f_dtype)) return false;
  std::vector<Shape> stored;
  for (const std::string& x : f.inputs) {
    const auto shape = static_shape(g, x);
    if (!shape) return false;
    stored.push_back(*shape);
  }
  fused::InputViews f_views = fused::input_views(f.attrs, stored);
  f_views.resize(f.inputs.size());
  // Per F input: -1 the Concat, 0 shared by every piece, 1 sliced along the axis (its axis in `sliced_axis`).
  std::vector<int> kind(f.inputs.size(), 0);
  std::vector<std::size_t> sliced_axis(f.inputs.size(), 0);
  const std::size_t rank = out.size();
  for (std::size_t j = 0; j < f.inputs.size(); ++j) {
    if (f.inputs[j] == value) {
      if (f_views[j]) return false;
      kind[j] = -1;
      continue;
    }
    const Shape& read = f_views[j] ? f_views[j]->shape : stored[j];
    if (read.size() > rank) return false;
    const std::int64_t a = axis - static_cast<std::int64_t>(rank - read.size());
    if (a < 0 || read[static_cast<std::size_t>(a)] == 1) continue;
    if (read[static_cast<std::size_t>(a)] != out[static_cast<std::size_t>(axis)]) return false;
    kind[j] = 1;
    sliced_axis[j] = static_cast<std::size_t>(a);
  }
  const fused::Program program = fused::parse(f.attrs.get_string("program", ""), f.inputs.size());
  // rotate_half turns over the output's last axis, which a piece along it cuts
  if (program.rotates() && axis + 1 == static_cast<std::int64_t>(rank)) return false;
  Node fused;
  fused::InputViews views;
  std::vector<int> shared_index(f.inputs.size(), -1);
  for (std::size_t j = 0; j < f.inputs.size(); ++j) {
    if (kind[j] != 0) continue;
    shared_index[j] = static_cast<int>(fused.inputs.size());
    fused.inputs.push_back(f.inputs[j]);
    views.push_back(f_views[j]);
  }
  std::vector<std::int64_t> pieces = {axis};
  std::string text;
  std::int64_t start = 0;
  for (const std::string& x : c.inputs) {
    const std::int64_t size = (*static_shape(g, x))[static_cast<std::size_t>(axis)];
    if (size == 0) continue;  // adds nothing
    const int x_index = static_cast<int>(fused.inputs.size());
    fused.inputs.push_back(x);
    views.push_back(std::nullopt);
    std::vector<int> index = shared_index;
    for (std::size_t j = 0; j < f.inputs.size(); ++j) {
      if (kind[j] == -1) index[j] = x_index;
      if (kind[j] != 1) continue;
      fused::InputView view = f_views[j] ? *f_views[j] : contiguous_view(stored[j]);
      view.offset += start * view.strides[sliced_axis[j]];
      view.shape[sliced_axis[j]] = size;
      index[j] = static_cast<int>(fused.inputs.size());
      fused.inputs.push_back(f.inputs[j]);
      views.push_back(view);
    }
    fused::Program piece = program;
    fused::for_each_input(piece, [&](fused::Operand& o) { o.index = index[static_cast<std::size_t>(o.index)]; });
    text += (text.empty() ? "" : " | ") + piece.text();
    pieces.push_back(size);
    start += size;
  }
  if (pieces.size() < 3) return false;
  fused.name = f.name + "_pieces";
  fused.domain = kXpurtDomain;
  fused.op_type = "FusedElementwise";
  fused.outputs = f.outputs;
  for (const auto& [key, attr] : f.attrs.values()) {
    if (key != "program" && key != "input_views") fused.attrs.set(key, attr);
  }
  fused.attrs.set("program", text);
  fused.attrs.set("pieces", pieces);
  fused::set_input_views(&fused.attrs, views);
  *note = detail::str_cat(describe(c), " read by ", describe(f), " -> FusedElementwise '", fused.name, "' (",
                          pieces.size() - 1, " pieces along axis ", axis, ")");
  g.nodes[f_index] = std::move(fused);
  return true;
}

}  // namespace

PassResult concat_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"concat_fusion", 0, {}};
  // CUDA plans only: on the CPU a Concat's copies are memcpys, cheaper than the cpu kernel's float round trip through
  // a piece's program, and no launch is saved (GPT-NeoX's tiny export: 127 against 122 us a run, ShuffleNetV2's 114
  // against 102).
  if (!ctx.fuse_elementwise || !ctx.device.is_cuda()) return result;
  if (ctx.keep_unfused && ctx.keep_unfused("concat")) return result;  // the user's rule keeps the Concats
  Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (!is_onnx(n, "Concat") || n.outputs.size() != 1 || n.inputs.size() < 2) continue;
    const auto out = static_shape(g, n.outputs[0]);
    const auto dtype = value_dtype(g, n.outputs[0]);
    if (!out || out->empty() || !dtype || !is_fusable_float(*dtype) || uses.read_by_subgraph(n.outputs[0])) continue;
    const auto rank = static_cast<std::int64_t>(out->size());
    std::int64_t axis = n.attrs.get_int("axis", 0);
    axis = axis < 0 ? axis + rank : axis;
    if (axis < 0 || axis >= rank) continue;
    // A cache append (a graph input's past joined to new positions as a graph output's present) stays a Concat: a
    // run whose present is bound over its past writes only the new positions (Note [Cache appended in place] in
    // plan/capture_plan.cpp), where a node of pieces would copy the whole past.
    if (uses.is_graph_output(n.outputs[0]) &&
        std::find(g.inputs.begin(), g.inputs.end(), n.inputs[0]) != g.inputs.end()) {
      continue;
    }
    bool ranked = true;
    for (const std::string& x : n.inputs) {
      const auto shape = static_shape(g, x);
      ranked = ranked && !x.empty() && shape && static_cast<std::int64_t>(shape->size()) == rank;
    }
    if (!ranked) continue;
    Node fused;
    fused::InputViews views;
    std::vector<std::int64_t> pieces = {axis};
    std::string program, note;
    bool gained = false;
    for (const std::string& x : n.inputs) {
      const auto shape = static_shape(g, x);
      if ((*shape)[static_cast<std::size_t>(axis)] == 0) continue;  // adds nothing
      PieceOf piece = piece_of(g, uses, x, i, fused.inputs.size());
      fused.inputs.insert(fused.inputs.end(), piece.inputs.begin(), piece.inputs.end());
      views.insert(views.end(), piece.views.begin(), piece.views.end());
      program += (program.empty() ? "" : " | ") + piece.program;
      pieces.push_back((*shape)[static_cast<std::size_t>(axis)]);
      gained = gained || piece.gained;
      if (piece.gained) note += (note.empty() ? "" : ", ") + piece.note;
    }
    if (!gained) {  // nothing to absorb: the Concat's reader may take its inputs instead
      if (std::string absorbed; absorb_into_reader(g, uses, i, axis, *out, &absorbed)) {
        result.notes.push_back(absorbed);
        ++result.rewrites;
        uses = Uses(g);  // the reader reads the Concat's inputs now
      }
      continue;
    }
    if (pieces.size() < 3) continue;
    fused.name = n.name + "_pieces";
    fused.domain = kXpurtDomain;
    fused.op_type = "FusedElementwise";
    fused.outputs = n.outputs;
    fused.attrs.set("program", program);
    fused.attrs.set("pieces", pieces);
    fused.attrs.set("output_dtype", std::string(dtype_name(*dtype)));
    fused::set_input_views(&fused.attrs, views);
    result.notes.push_back(detail::str_cat(describe(n), " of ", note, " -> FusedElementwise '", fused.name, "' (",
                                           pieces.size() - 1, " pieces along axis ", axis, ")"));
    n = std::move(fused);
    ++result.rewrites;
  }
  if (result.rewrites > 0) {  // the producers only the Concats read, and view ops nothing reads now
    PassResult dead = dead_node_elimination(g, ctx);
    result.notes.insert(result.notes.end(), dead.notes.begin(), dead.notes.end());
  }
  return result;
}

}  // namespace xpuruntime::passes
