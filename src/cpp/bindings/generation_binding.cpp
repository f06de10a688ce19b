// xpuruntime._core's text generation classes: GenerationConfig, Generator, Generation (xpuruntime.generation wraps
// them; docs/generation.md).
#include <pybind11/stl.h>

#include <map>
#include <optional>

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

generation::PaddingSide padding_side(const std::string& name) {
  if (name == "auto") return generation::PaddingSide::kAuto;
  if (name == "left") return generation::PaddingSide::kLeft;
  if (name == "right") return generation::PaddingSide::kRight;
  throw InvalidArgumentError("GenerationConfig.padding must be 'auto', 'left' or 'right', got '" + name + "'");
}

std::string padding_side_name(generation::PaddingSide side) {
  return side == generation::PaddingSide::kAuto ? "auto" : side == generation::PaddingSide::kLeft ? "left" : "right";
}

generation::CacheLayout cache_layout(const std::string& name) {
  if (name == "auto") return generation::CacheLayout::kAuto;
  if (name == "dynamic") return generation::CacheLayout::kDynamic;
  if (name == "static") return generation::CacheLayout::kStatic;
  throw InvalidArgumentError("GenerationConfig.cache_layout must be 'auto', 'dynamic' or 'static', got '" + name + "'");
}

std::string cache_layout_name(generation::CacheLayout layout) {
  return layout == generation::CacheLayout::kAuto      ? "auto"
         : layout == generation::CacheLayout::kDynamic ? "dynamic"
                                                       : "static";
}

void bind_generation_config(py::module_& m) {
  py::class_<GenerationConfig>(m, "GenerationConfig", "How tokens are chosen and when generation stops.")
      .def(py::init([](std::int64_t max_new_tokens, std::int64_t max_length, bool do_sample, double temperature,
                       std::int64_t top_k, double top_p, double repetition_penalty, std::uint64_t seed,
                       const std::vector<std::int64_t>& stop_tokens, std::int64_t pad_token_id,
                       const std::string& cache, const std::string& padding, const std::string& layout,
                       const std::string& sampling) {
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
             c.padding = padding_side(padding);
             c.cache_layout = cache_layout(layout);
             c.sampling = generation::parse_sampling_site(sampling);
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_new_tokens") = 32, py::arg("max_length") = 0, py::arg("do_sample") = false,
           py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("repetition_penalty") = 1.0, py::arg("seed") = 0,
           py::arg("stop_tokens") = std::vector<std::int64_t>{}, py::arg("pad_token_id") = 0,
           py::arg("cache") = "auto", py::arg("padding") = "auto", py::arg("cache_layout") = "auto",
           py::arg("sampling") = "auto")
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
      .def_property(
          "padding", [](const GenerationConfig& c) { return padding_side_name(c.padding); },
          [](GenerationConfig& c, const std::string& name) { c.padding = padding_side(name); })
      .def_property(
          "cache_layout", [](const GenerationConfig& c) { return cache_layout_name(c.cache_layout); },
          [](GenerationConfig& c, const std::string& name) { c.cache_layout = cache_layout(name); })
      .def_property(
          "sampling", [](const GenerationConfig& c) { return generation::sampling_site_name(c.sampling); },
          [](GenerationConfig& c, const std::string& name) { c.sampling = generation::parse_sampling_site(name); })
      .def("__copy__", [](const GenerationConfig& c) { return c; })
      .def("validate", &GenerationConfig::validate)
      .def("__repr__", &GenerationConfig::str);
}

void bind_generator(py::module_& m) {
  m.attr("GENERATION_PREFILL_RANGE") = generation::kPrefillRange;  // Note [Generation ranges]
  m.attr("GENERATION_DECODE_RANGE") = generation::kDecodeRange;
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
      .def_readonly("decode_feeds_ms", &GenerationStats::decode_feeds_ms)
      .def_readonly("decode_run_ms", &GenerationStats::decode_run_ms)
      .def_readonly("decode_commit_ms", &GenerationStats::decode_commit_ms)
      .def_readonly("decode_pick_ms", &GenerationStats::decode_pick_ms)
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
                             [](const Generation& g) { return g.cache() ? g.cache()->bytes() : std::size_t{0}; })
      .def("explain", &Generation::explain);
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
      .def_property_readonly("padding", [](const Generator& g) { return padding_side_name(g.padding()); })
      .def_property_readonly("cache_layout", [](const Generator& g) { return cache_layout_name(g.cache_layout()); })
      .def_property_readonly("signature", [](const Generator& g) { return g.signature().str(); });
}

void bind_continuous_batcher(py::module_& m) {
  using generation::BatcherStats;
  using generation::BatchEvent;
  using generation::ContinuousBatcher;
  using generation::PagedCacheConfig;
  py::class_<PagedCacheConfig>(m, "PagedCacheConfig", "How a ContinuousBatcher holds its requests' caches.")
      .def(py::init([](std::int64_t max_batch, std::int64_t block_size, std::int64_t num_blocks, bool share_prefixes,
                       const std::string& reservation) {
             PagedCacheConfig c;
             c.max_batch = max_batch;
             c.block_size = block_size;
             c.num_blocks = num_blocks;
             c.share_prefixes = share_prefixes;
             c.reservation = generation::parse_block_reservation(reservation);
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_batch") = 8, py::arg("block_size") = 16, py::arg("num_blocks") = 0,
           py::arg("share_prefixes") = true, py::arg("reservation") = "on_demand")
      .def_readonly("max_batch", &PagedCacheConfig::max_batch)
      .def_readonly("block_size", &PagedCacheConfig::block_size)
      .def_readonly("num_blocks", &PagedCacheConfig::num_blocks)
      .def_readonly("share_prefixes", &PagedCacheConfig::share_prefixes)
      .def_property_readonly(
          "reservation", [](const PagedCacheConfig& c) { return generation::block_reservation_name(c.reservation); })
      .def("__repr__", &PagedCacheConfig::str);
  py::class_<BatchEvent>(m, "BatchEvent", "A token one step made for a request.")
      .def_readonly("request", &BatchEvent::request)
      .def_readonly("token", &BatchEvent::token)
      .def_readonly("finished", &BatchEvent::finished)
      .def("__repr__", [](const BatchEvent& e) {
        return "BatchEvent(request=" + std::to_string(e.request) + ", token=" + std::to_string(e.token) +
               ", finished=" + (e.finished ? "True" : "False") + ")";
      });
  py::class_<BatcherStats>(m, "BatcherStats", "What a ContinuousBatcher has done and holds.")
      .def_readonly("waiting", &BatcherStats::waiting)
      .def_readonly("running", &BatcherStats::running)
      .def_readonly("finished", &BatcherStats::finished)
      .def_readonly("steps", &BatcherStats::steps)
      .def_readonly("prefills", &BatcherStats::prefills)
      .def_readonly("prefill_runs", &BatcherStats::prefill_runs)
      .def_readonly("prefill_tokens", &BatcherStats::prefill_tokens)
      .def_readonly("shared_tokens", &BatcherStats::shared_tokens)
      .def_readonly("decode_steps", &BatcherStats::decode_steps)
      .def_readonly("decode_tokens", &BatcherStats::decode_tokens)
      .def_readonly("max_running", &BatcherStats::max_running)
      .def_readonly("regathers", &BatcherStats::regathers)
      .def_readonly("rows_joined", &BatcherStats::rows_joined)
      .def_readonly("preemptions", &BatcherStats::preemptions)
      .def_readonly("recomputed_tokens", &BatcherStats::recomputed_tokens)
      .def_readonly("prefill_ms", &BatcherStats::prefill_ms)
      .def_readonly("decode_ms", &BatcherStats::decode_ms)
      .def_readonly("decode_regather_ms", &BatcherStats::decode_regather_ms)
      .def_readonly("decode_feeds_ms", &BatcherStats::decode_feeds_ms)
      .def_readonly("decode_run_ms", &BatcherStats::decode_run_ms)
      .def_readonly("decode_commit_ms", &BatcherStats::decode_commit_ms)
      .def_readonly("decode_pick_ms", &BatcherStats::decode_pick_ms)
      .def_readonly("blocks_total", &BatcherStats::blocks_total)
      .def_readonly("blocks_used", &BatcherStats::blocks_used)
      .def_readonly("blocks_cached", &BatcherStats::blocks_cached)
      .def_readonly("block_size", &BatcherStats::block_size)
      .def_readonly("pool_bytes", &BatcherStats::pool_bytes)
      .def_property_readonly("decode_tokens_per_s", &BatcherStats::decode_tokens_per_s)
      .def("__str__", &BatcherStats::str)
      .def("__repr__", [](const BatcherStats& s) { return "BatcherStats(" + s.str() + ")"; });
  py::class_<ContinuousBatcher>(m, "ContinuousBatcher",
                                "Serves many requests with one decoder session over a paged cache.")
      .def(py::init<const InferenceSession&, GenerationConfig, PagedCacheConfig>(), py::arg("session"),
           py::arg("config"), py::arg("cache"), py::keep_alive<1, 2>())
      .def("submit", &ContinuousBatcher::submit, py::arg("prompt"), py::arg("config") = py::none())
      .def("step",
           [](ContinuousBatcher& b) {
             py::gil_scoped_release release;
             return b.step();
           })
      .def("run",
           [](ContinuousBatcher& b) {
             py::gil_scoped_release release;
             return b.run();
           })
      .def_property_readonly("idle", &ContinuousBatcher::idle)
      .def("finished", &ContinuousBatcher::finished, py::arg("request"))
      .def("tokens", &ContinuousBatcher::tokens, py::arg("request"))
      .def_property_readonly("stats", &ContinuousBatcher::stats)
      .def("explain", &ContinuousBatcher::explain)
      .def_property_readonly("cache_config", &ContinuousBatcher::cache_config)
      .def_property_readonly("signature", [](const ContinuousBatcher& b) { return b.signature().str(); });
}

}  // namespace

void bind_generation(py::module_& m) {
  bind_generation_config(m);
  bind_generator(m);
  bind_continuous_batcher(m);
}

}  // namespace xpuruntime::bindings
