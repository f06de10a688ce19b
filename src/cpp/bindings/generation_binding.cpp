// xpuruntime._core's text generation classes: GenerationConfig, Generator, Generation (xpuruntime.generation wraps
// them; docs/generation.md).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::bindings {

namespace {

using generation::CacheMode;
using generation::GenerationConfig;

CacheMode cache_mode(const std::string& name) {
  if (name == "auto") return CacheMode::kAuto;
  if (name == "required") return CacheMode::kRequired;
  if (name == "none") return CacheMode::kNone;
  throw InvalidArgumentError("GenerationConfig.cache must be 'auto', 'required' or 'none', got '" + name + "'");
}

std::string cache_mode_name(CacheMode mode) {
  return mode == CacheMode::kAuto ? "auto" : mode == CacheMode::kRequired ? "required" : "none";
}

void bind_generation_config(py::module_& m) {
  py::class_<GenerationConfig>(m, "GenerationConfig", "How tokens are chosen and when generation stops.")
      .def(py::init([](std::int64_t max_new_tokens, std::int64_t max_length, bool do_sample, double temperature,
                       std::int64_t top_k, double top_p, double repetition_penalty, std::uint64_t seed,
                       const std::vector<std::int64_t>& stop_tokens, std::int64_t pad_token_id,
                       const std::string& cache) {
             GenerationConfig c;
             c.max_new_tokens = max_new_tokens;
             c.max_length = max_length;
             c.do_sample = do_sample;
             c.temperature = temperature;
             c.top_k = top_k;
             c.top_p = top_p;
             c.repetition_penalty = repetition_penalty;
             c.seed = seed;
             c.stop_tokens = stop_tokens;
             c.pad_token_id = pad_token_id;
             c.cache = cache_mode(cache);
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_new_tokens") = 32, py::arg("max_length") = 0, py::arg("do_sample") = false,
           py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("repetition_penalty") = 1.0, py::arg("seed") = 0,
           py::arg("stop_tokens") = std::vector<std::int64_t>{}, py::arg("pad_token_id") = 0,
           py::arg("cache") = "auto")
      .def_readwrite("max_new_tokens", &GenerationConfig::max_new_tokens)
      .def_readwrite("max_length", &GenerationConfig::max_length)
      .def_readwrite("do_sample", &GenerationConfig::do_sample)
      .def_readwrite("temperature", &GenerationConfig::temperature)
      .def_readwrite("top_k", &GenerationConfig::top_k)
      .def_readwrite("top_p", &GenerationConfig::top_p)
      .def_readwrite("repetition_penalty", &GenerationConfig::repetition_penalty)
      .def_readwrite("seed", &GenerationConfig::seed)
      .def_readwrite("stop_tokens", &GenerationConfig::stop_tokens)
      .def_readwrite("pad_token_id", &GenerationConfig::pad_token_id)
      .def_property(
          "cache", [](const GenerationConfig& c) { return cache_mode_name(c.cache); },
          [](GenerationConfig& c, const std::string& name) { c.cache = cache_mode(name); })
      .def("validate", &GenerationConfig::validate)
      .def("__repr__", &GenerationConfig::str);
}

void bind_generator(py::module_& m) {
  using generation::Generation;
  using generation::GenerationStats;
  using generation::Generator;
  py::class_<GenerationStats>(m, "GenerationStats",
                              "Where a generation's time went: prefill and decode apart, the cache's size and "
                              "occupancy (docs/generation.md).")
      .def_readonly("prefill_tokens", &GenerationStats::prefill_tokens)
      .def_readonly("prefill_ms", &GenerationStats::prefill_ms)
      .def_readonly("decode_steps", &GenerationStats::decode_steps)
      .def_readonly("decode_tokens", &GenerationStats::decode_tokens)
      .def_readonly("decode_ms", &GenerationStats::decode_ms)
      .def_readonly("cache_length", &GenerationStats::cache_length)
      .def_readonly("cache_capacity", &GenerationStats::cache_capacity)
      .def_readonly("cache_bytes", &GenerationStats::cache_bytes)
      .def_property_readonly("prefill_tokens_per_s", &GenerationStats::prefill_tokens_per_s)
      .def_property_readonly("decode_tokens_per_s", &GenerationStats::decode_tokens_per_s)
      .def_property_readonly("ms_per_decode_step", &GenerationStats::ms_per_decode_step)
      .def_property_readonly("cache_occupancy", &GenerationStats::cache_occupancy)
      .def("__str__", &GenerationStats::str)
      .def("__repr__", [](const GenerationStats& s) { return "GenerationStats(" + s.str() + ")"; });
  py::class_<Generation>(m, "Generation", "One batch being generated: step() until done.")
      .def_property_readonly("stats", &Generation::stats)
      .def("step",
           [](Generation& g) {
             py::gil_scoped_release release;
             return g.step();
           })
      .def_property_readonly("done", &Generation::done)
      .def_property_readonly("tokens", &Generation::tokens)
      .def_property_readonly("steps", &Generation::steps)
      .def_property_readonly("uses_cache", &Generation::uses_cache)
      .def_property_readonly("cache_length",
                             [](const Generation& g) { return g.cache() ? g.cache()->length() : 0; })
      .def_property_readonly("cache_capacity",
                             [](const Generation& g) { return g.cache() ? g.cache()->capacity() : 0; })
      .def_property_readonly("cache_bytes",
                             [](const Generation& g) { return g.cache() ? g.cache()->bytes() : std::size_t{0}; });
  py::class_<Generator>(m, "Generator", "Generates tokens with a decoder session (docs/generation.md).")
      .def(py::init<const InferenceSession&, GenerationConfig>(), py::arg("session"), py::arg("config"),
           py::keep_alive<1, 2>())
      .def("start",
           [](const Generator& g, const std::vector<std::vector<std::int64_t>>& prompts) {
             return std::make_unique<Generation>(g.start(prompts));
           },
           py::arg("prompts"), py::keep_alive<0, 1>())
      .def("generate",
           [](const Generator& g, const std::vector<std::vector<std::int64_t>>& prompts) {
             py::gil_scoped_release release;
             return g.generate(prompts);
           },
           py::arg("prompts"))
      .def_property_readonly("config", &Generator::config)
      .def_property_readonly("uses_cache", &Generator::uses_cache)
      .def_property_readonly("signature", [](const Generator& g) { return g.signature().str(); });
}

}  // namespace

void bind_generation(py::module_& m) {
  bind_generation_config(m);
  bind_generator(m);
}

}  // namespace xpuruntime::bindings
