// elementwise_fusion -> com.xpuruntime:FusedElementwise (see passes.h, Note [Fused elementwise programs] in
// core/fused_elementwise.h).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/fused_elementwise.h"
#include "core/runtime/passes.h"
#include "core/runtime/passes/pass_utils.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

constexpr std::size_t kMaxInputs = 16;
constexpr std::size_t kMaxInstructions = 64;

// The program op and the registry op (what a KernelPolicy names) of a node the pass can take, or false.
bool member_code(const Node& n, fused::Code* code, std::string* registry_op) {
  struct Entry {
    const char* op_type;
    fused::Code code;
    const char* registry_op;
    std::size_t inputs;
  };
  static const Entry kOnnx[] = {
      {"Add", fused::Code::kAdd, "add", 2},       {"Sub", fused::Code::kSub, "sub", 2},
      {"Mul", fused::Code::kMul, "mul", 2},       {"Div", fused::Code::kDiv, "div", 2},
      {"Pow", fused::Code::kPow, "pow", 2},       {"Max", fused::Code::kMax, "maximum", 2},
      {"Min", fused::Code::kMin, "minimum", 2},   {"Neg", fused::Code::kNeg, "neg", 1},
      {"Abs", fused::Code::kAbs, "abs", 1},       {"Relu", fused::Code::kRelu, "relu", 1},
      {"Sigmoid", fused::Code::kSigmoid, "sigmoid", 1}, {"Tanh", fused::Code::kTanh, "tanh", 1},
      {"Exp", fused::Code::kExp, "exp", 1},       {"Log", fused::Code::kLog, "log", 1},
      {"Sqrt", fused::Code::kSqrt, "sqrt", 1},    {"Reciprocal", fused::Code::kReciprocal, "reciprocal", 1},
      {"Erf", fused::Code::kErf, "erf", 1},
  };
  if (n.domain.empty() || n.domain == "ai.onnx") {
    for (const Entry& e : kOnnx) {
      if (n.op_type == e.op_type && n.inputs.size() == e.inputs && n.outputs.size() == 1) {
        *code = e.code;
        *registry_op = e.registry_op;
        return true;
      }
    }
    return false;
  }
  if (n.domain == kXpurtDomain && n.op_type == "Gelu" && n.inputs.size() == 1 && n.outputs.size() == 1) {
    const std::string approximate = n.attrs.get_string("approximate", "none");
    if (approximate != "none" && approximate != "tanh") return false;
    *code = approximate == "tanh" ? fused::Code::kGeluTanh : fused::Code::kGelu;
    *registry_op = "gelu";
    return true;
  }
  return false;
}

struct Candidate {
  fused::Code code;
  std::vector<std::int64_t> shape;  // the output's
  DType dtype;
};

// Whether node `i` can be a member: an op the programs have, the policy does not keep it on its own kernel, every
// input and the output of one float dtype with static shapes, inputs no bigger than the output.
std::optional<Candidate> candidate(const Graph& g, const PassContext& ctx, std::size_t i) {
  const Node& n = g.nodes[i];
  Candidate c;
  std::string registry_op;
  if (!member_code(n, &c.code, &registry_op)) return std::nullopt;
  if (ctx.keep_unfused && ctx.keep_unfused(registry_op)) return std::nullopt;
  auto out = value_type(g, n.outputs[0]);
  if (!out || !out->fully_known() || !is_fusable_float(out->dtype)) return std::nullopt;
  c.shape = out->sizes();
  c.dtype = out->dtype;
  std::int64_t numel = 1;
  for (std::int64_t d : c.shape) {
    if (d <= 0 || __builtin_mul_overflow(numel, d, &numel)) return std::nullopt;  // empty, or past int64
  }
  for (const std::string& x : n.inputs) {
    auto t = value_type(g, x);
    if (x.empty() || !t || !t->fully_known() || t->dtype != c.dtype || t->shape.size() > c.shape.size()) {
      return std::nullopt;
    }
  }
  return c;
}

}  // namespace

PassResult elementwise_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"elementwise_fusion", 0, {}};
  if (!ctx.fuse_elementwise) return result;
  Rewriter rw(g);
  const Uses uses(g);
  std::vector<std::optional<Candidate>> cand(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) cand[i] = candidate(g, ctx, i);
  // Roots from the last node back: a root's group grows backwards through producers whose output only the group
  // reads and that have the root's shape and dtype. A value read outside the group ends it there (the reader
  // outside becomes a root of its own), so the group has one output and every value it reads from outside is
  // produced before the root (where the fused node goes).
  for (std::size_t r = g.nodes.size(); r-- > 0;) {
    if (!cand[r] || rw.taken(r)) continue;
    const Candidate& root = *cand[r];
    std::set<std::size_t> members = {r};
    std::vector<std::size_t> frontier = {r};
    while (!frontier.empty() && members.size() < kMaxInstructions) {
      const std::size_t m = frontier.back();
      frontier.pop_back();
      for (const std::string& x : g.nodes[m].inputs) {
        auto p = uses.producer(x);
        if (!p || members.count(*p) || rw.taken(*p) || !cand[*p]) continue;
        if (cand[*p]->shape != root.shape || cand[*p]->dtype != root.dtype) continue;
        if (uses.is_graph_output(x) || uses.read_by_subgraph(x)) continue;
        bool inside = true;
        for (std::size_t reader : uses.readers(x)) inside = inside && members.count(reader);
        if (!inside) continue;
        members.insert(*p);
        frontier.push_back(*p);
      }
    }
    if (members.size() < 2) continue;
    // The program: members in graph order (topological), inputs numbered as first read.
    std::vector<std::size_t> ordered(members.begin(), members.end());
    std::map<std::string, fused::Operand> operand_of;
    std::vector<std::string> inputs;
    fused::Program program;
    for (std::size_t m : ordered) {
      fused::Instruction in;
      in.code = cand[m]->code;
      const Node& n = g.nodes[m];
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        auto it = operand_of.find(n.inputs[k]);
        if (it == operand_of.end()) {
          it = operand_of.emplace(n.inputs[k], fused::Operand{true, static_cast<int>(inputs.size())}).first;
          inputs.push_back(n.inputs[k]);
        }
        (k == 0 ? in.a : in.b) = it->second;
      }
      operand_of[n.outputs[0]] = fused::Operand{false, static_cast<int>(program.code.size())};
      program.code.push_back(in);
    }
    program.num_inputs = inputs.size();
    if (inputs.size() > kMaxInputs) continue;
    const Node& last = g.nodes[r];
    Node fused_node;
    fused_node.name = last.name + "_fused";
    fused_node.domain = kXpurtDomain;
    fused_node.op_type = "FusedElementwise";
    fused_node.inputs = inputs;
    fused_node.outputs = {last.outputs[0]};
    fused_node.attrs.set("program", program.text());
    std::string note = "fused ";
    for (std::size_t k = 0; k < ordered.size(); ++k) note += (k ? " + " : "") + describe(g.nodes[ordered[k]]);
    note += " -> FusedElementwise '" + fused_node.name + "' (" + program.text() + ")";
    std::vector<Node> replacement;
    replacement.push_back(std::move(fused_node));
    rw.replace(ordered, std::move(replacement), std::move(note));
  }
  rw.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
