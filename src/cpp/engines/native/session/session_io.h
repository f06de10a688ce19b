// A native session's inputs and outputs by name: feeds put in the model's input order and checked, the input-shape
// signature that keys the plans, the requested outputs' indices, the probe plan's shapes. Internal header.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/engine.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime::runtime {

using Shapes = std::vector<std::vector<std::int64_t>>;

// The signature of a set of input shapes, the key of a session's plans and executor pools: "[1,3,224,224][1]".
std::string shape_key(const Shapes& shapes);

// The ValueInfo of value `name` of `g` (name, kind, dtype and dimensions as declared).
ValueInfo value_info(const Graph& g, const std::string& name);

// `feeds` by name in the model's input order (an absent input: an undefined tensor). InvalidArgumentError naming
// an unknown input.
std::vector<Tensor> order_feeds(const Graph& g, const std::vector<std::pair<std::string, Tensor>>& feeds);

// The shapes of ordered tensor feeds; InvalidArgumentError for a missing input, InvalidTypeError for a dtype other
// than the declared one. `inputs`: the session's ValueInfos (what the messages say is expected).
Shapes feed_shapes(const Graph& g, const std::vector<ValueInfo>& inputs, const std::vector<Tensor>& ordered);

// run_values' feeds by name in the model's input order, each conformed (conform_feed); then their plan shapes
// (empty for a sequence or optional). InvalidArgumentError for an unknown or missing input.
std::pair<std::vector<Value>, Shapes> order_value_feeds(const Graph& g, const std::vector<ValueInfo>& inputs,
                                                        const std::vector<std::pair<std::string, Value>>& feeds);

// A feed for input `name` of declared type `vt` as the plan takes it: a tensor of the declared dtype; a sequence
// of the declared element type; for an optional, an optional (a tensor or sequence is wrapped in one, as ONNX
// Runtime does). Tensors on other devices are copied to the CPU. InvalidTypeError naming the input otherwise.
Value conform_feed(const std::string& name, const ValueType* vt, const Value& value);

// The indices of `names` among the model's outputs (empty: none, meaning all). InvalidArgumentError naming an
// unknown output.
std::vector<int> output_indices(const Graph& g, const std::vector<std::string>& names);

// The probe plan's input shapes (Note [Support check at session creation] in native_engine.cpp): every symbolic
// or unknown dimension 1; empty for a sequence or optional input. InvalidArgumentError for an input without a
// declared shape.
Shapes probe_shapes(const Graph& g);

}  // namespace xpuruntime::runtime
