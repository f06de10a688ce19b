// Recognising a decoder's inputs and outputs (include/xpuruntime/generation.h).
#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::generation {

// Note [Decoder signatures]
// Exporters name a decoder's cache in a few ways, all `<past>.<layer>.<key|value>` -> `<present>.<layer>.<key|value>`:
//   transformers + torch.onnx.export, optimum's "with-past" exports:  past_key_values.0.key -> present.0.key
//   older exports and hand-written graphs:                            past.0.key / past_0_key -> present_0_key
// (the separators may be '.' or '_'). Each past input must have its present output with the same layer and kind,
// and both must be rank-4 [batch, heads, seq, head_dim] with static heads and head_dim: the generator allocates the
// cache before the first run, so it must know them from the signature. ONNX Runtime's GroupQueryAttention form as
// onnxruntime-genai's builder writes it has these same names (its seqlens_k and total_sequence_length are computed
// from attention_mask inside the graph) and runs with rows right-padded (Note [Padding sides] in generator.cpp), the
// present a new buffer of past + new positions; its shared past/present buffer of fixed length (seqlens_k as model
// inputs) and GPT-2's old fused form (one `past_{i}` [2, batch, heads, seq, head_dim] per layer) are not recognised
// yet: they are UnsupportedOperationErrors that say so. The other inputs: `input_ids` (required), `attention_mask`, `position_ids` and optimum's merged decoders'
// `use_cache_branch` (optional); the logits are the output named `logits`, else the only output that is not a
// present. An input the generator does not know how to feed is an error naming it (a silent zero feed could give
// wrong tokens).

namespace {

const std::regex kPastName(R"(^past(?:_key_values)?[._](\d+)[._](key|value)$)");
const std::regex kPresentName(R"(^present(?:_key_values)?[._](\d+)[._](key|value)$)");

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) out += (k ? ", '" : "'") + names[k] + "'";
  return names.empty() ? "none" : out;
}

bool is_integer(DType t) { return t == DType::kInt64 || t == DType::kInt32; }

bool is_static(const std::string& dim) {
  return !dim.empty() && std::all_of(dim.begin(), dim.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string shape_text(const ValueInfo& v) { return v.str(); }

// The slot of cache input `past` and its present output.
CacheSlot cache_slot(const ValueInfo& past, int layer, bool is_key, const ValueInfo* present) {
  const std::string kind = is_key ? "key" : "value";
  if (present == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "cache input '", past.name, "' has no present output for layer ", layer, " ", kind,
        " (expected an output named like 'present.", layer, ".", kind, "')"));
  }
  for (const ValueInfo* v : {&past, present}) {
    if (v->shape.size() != 4 || !is_static(v->shape[1]) || !is_static(v->shape[3])) {
      throw UnsupportedOperationError(detail::str_cat(
          "cache value ", shape_text(*v), " is not [batch, heads, seq, head_dim] with static heads and head_dim; ",
          "the generator allocates the cache before the first run and needs both"));
    }
  }
  XPURT_CHECK_TYPE(past.dtype == present->dtype && past.shape[1] == present->shape[1] &&
                       past.shape[3] == present->shape[3],
                   "cache input ", shape_text(past), " and its present output ", shape_text(*present), " disagree");
  CacheSlot slot;
  slot.layer = layer;
  slot.is_key = is_key;
  slot.past_input = past.name;
  slot.present_output = present->name;
  slot.heads = std::stoll(past.shape[1]);
  slot.head_dim = std::stoll(past.shape[3]);
  slot.dtype = past.dtype;
  return slot;
}

std::vector<CacheSlot> cache_slots(const std::vector<ValueInfo>& inputs, const std::vector<ValueInfo>& outputs) {
  std::map<std::pair<int, std::string>, const ValueInfo*> presents;
  for (const ValueInfo& out : outputs) {
    std::smatch m;
    if (std::regex_match(out.name, m, kPresentName)) presents[{std::stoi(m[1]), m[2]}] = &out;
  }
  std::vector<CacheSlot> slots;
  for (const ValueInfo& in : inputs) {
    std::smatch m;
    if (!std::regex_match(in.name, m, kPastName)) continue;
    const int layer = std::stoi(m[1]);
    auto it = presents.find({layer, m[2]});
    slots.push_back(cache_slot(in, layer, m[2] == "key", it == presents.end() ? nullptr : it->second));
    presents.erase({layer, m[2]});
  }
  if (!presents.empty()) {
    throw UnsupportedOperationError(detail::str_cat("present output '", presents.begin()->second->name,
                                                    "' has no past input (expected one named like 'past_key_values.",
                                                    presents.begin()->first.first, ".",
                                                    presents.begin()->first.second, "')"));
  }
  std::sort(slots.begin(), slots.end(), [](const CacheSlot& a, const CacheSlot& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.is_key > b.is_key;
  });
  return slots;
}

std::string logits_output(const std::vector<ValueInfo>& outputs) {
  std::vector<std::string> candidates;
  for (const ValueInfo& out : outputs) {
    if (out.name == "logits") return out.name;
    if (!std::regex_match(out.name, kPresentName)) candidates.push_back(out.name);
  }
  if (candidates.size() != 1) {
    throw UnsupportedOperationError(detail::str_cat(
        "cannot tell which output holds the logits: no output is named 'logits' and the outputs other than the "
        "cache are ", join(candidates)));
  }
  if (candidates.front().find("hidden_state") != std::string::npos) {
    throw UnsupportedOperationError(detail::str_cat(
        "the model's output '", candidates.front(), "' holds hidden states, not logits: a base model without its ",
        "language-model head (export the *ForCausalLM model, whose output is 'logits')"));
  }
  return candidates.front();
}

void check_inputs_known(const std::vector<ValueInfo>& inputs, const DecoderSignature& s) {
  for (const ValueInfo& in : inputs) {
    const bool known = in.name == s.input_ids || in.name == s.attention_mask || in.name == s.position_ids ||
                       in.name == s.use_cache_branch || std::regex_match(in.name, kPastName);
    if (known) continue;
    std::string hint;
    if (in.name.rfind("past", 0) == 0) {
      hint = " (a cache input not named '<past>.<layer>.<key|value>': GPT-2's fused 'past_<i>' form and "
             "GroupQueryAttention's shared fixed-length buffers are not supported yet)";
    }
    throw UnsupportedOperationError(detail::str_cat("decoder input ", in.str(),
                                                    " is not one the generator knows how to feed", hint));
  }
}

}  // namespace

DecoderSignature DecoderSignature::recognise(const std::vector<ValueInfo>& inputs,
                                             const std::vector<ValueInfo>& outputs) {
  DecoderSignature s;
  for (const ValueInfo& in : inputs) {
    const bool named = in.name == "input_ids" || in.name == "attention_mask" || in.name == "position_ids" ||
                       in.name == "use_cache_branch";
    if (!named) continue;
    if (in.name == "use_cache_branch") {
      XPURT_CHECK_TYPE(in.dtype == DType::kBool, "decoder input ", in.str(), " should be bool");
      s.use_cache_branch = in.name;
      continue;
    }
    XPURT_CHECK_TYPE(is_integer(in.dtype) && in.shape.size() == 2, "decoder input ", in.str(),
                     " should be int64 or int32 [batch, seq]");
    if (in.name == "input_ids") {
      s.input_ids = in.name;
      s.ids_dtype = in.dtype;
    } else if (in.name == "attention_mask") {
      s.attention_mask = in.name;
      s.mask_dtype = in.dtype;
    } else {
      s.position_ids = in.name;
      s.positions_dtype = in.dtype;
    }
  }
  if (s.input_ids.empty()) {
    std::vector<std::string> names;
    for (const ValueInfo& in : inputs) names.push_back(in.name);
    throw UnsupportedOperationError(detail::str_cat(
        "not a decoder the generator recognises: no input named 'input_ids' (the inputs are ",
        join(names), ")"));
  }
  s.logits = logits_output(outputs);
  s.cache = cache_slots(inputs, outputs);
  check_inputs_known(inputs, s);
  return s;
}

std::string DecoderSignature::str() const {
  std::string out = "input_ids=" + input_ids;
  if (!attention_mask.empty()) out += ", attention_mask=" + attention_mask;
  if (!position_ids.empty()) out += ", position_ids=" + position_ids;
  if (!use_cache_branch.empty()) out += ", use_cache_branch=" + use_cache_branch;
  out += ", logits=" + logits;
  if (cache.empty()) return out + ", no cache";
  return detail::str_cat(out, ", cache: ", cache.size() / 2, " layers x (key, value) of [batch, ",
                         cache.front().heads, ", seq, ", cache.front().head_dim, "] ", dtype_name(cache.front().dtype));
}

}  // namespace xpuruntime::generation
