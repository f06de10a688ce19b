// ONNX Runtime used directly, the baseline of benchmarks/session_bench.py: one model, one batch size, ORT's C++
// API with the same execution provider and options as xpuruntime's onnxruntime engine (the CUDA plugin EP from
// XPURT_ORT_CUDA_PROVIDER, graph optimizations on, intra-op threads 0, use_tf32=0), inputs and outputs bound on the
// device with IoBinding (no copies in the timing), with or without CUDA graphs (enable_cuda_graph=1).
//
//   ort_direct_bench --model m.onnx [--batch 1] [--device cuda|cpu] [--graphs 0|1] [--iterations 100]
//                    [--warmup 10] [--profile-first 0|1] [--static-shapes 0|1] [--dim NAME=VALUE ...]
//
// Symbolic dimensions of the inputs take the batch size, or the value --dim gives their name (`--dim sequence=128`).
// With --static-shapes 1 the session is told those values (AddFreeDimensionOverrideByName, as a user who serves one
// shape would), so that ORT's optimizer can fold the shape computations of exports with dynamic axes instead of
// placing them on its CPU EP: ORT 1.29's CUDA plugin EP crashed (SIGSEGV) on every such export with nodes left on the
// CPU (BERT, GPT-2, BEiT, CLIP's text model, 2026-11-25 to 2026-12-06), and a graph with CPU nodes cannot be
// captured into a CUDA graph. Not the default: on ORT's CPU EP it made the tiny BEiT 11x slower (2026-12-06), so
// benchmarks/model_suite_bench.py uses it only where the export as it is crashes. The JSON says which:
// "static_shapes" and "free_dims" (the overrides).
// Float inputs are filled with small values, integer
// inputs with i % 1000 (valid token ids for the zoo's BERT). Prints one JSON line:
//   {"model": ..., "batch": 1, "device": "cuda", "cuda_graphs": true, "iterations": 100, "median_ms": ...,
//    "p90_ms": ..., "mean_ms": ..., "min_ms": ..., "create_ms": ..., "first_run_ms": ...}
// create_ms is the Session constructor (graph optimization, EP partitioning); first_run_ms the first Run (output shapes
// learned, without a graph).
// Each iteration is timed on the host around Session::Run, which returns once ORT has synchronized its stream.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench_common.h"

namespace {

struct Args : bench::CommonArgs {
  std::unordered_map<std::string, int64_t> dims;  // --dim NAME=VALUE: symbolic input dims by name
  bool profile_first = false;  // session profiling on until the first run ends (what the onnxruntime engine did before
                               // it profiled single runs through RunOptions; kept to compare)
  bool static_shapes = false;  // the inputs' symbolic dimensions fixed in the session options (see the top)
};

Args parse(int argc, char** argv) {
  Args args;
  bench::parse_args(argc, argv, args, [&](const std::string& flag, const std::string& value) {
    if (flag == "--dim") {
      const size_t eq = value.find('=');
      if (eq == std::string::npos) throw std::invalid_argument("--dim takes NAME=VALUE, got " + value);
      args.dims[value.substr(0, eq)] = std::stoll(value.substr(eq + 1));
      return true;
    }
    if (flag == "--static-shapes") {
      args.static_shapes = bench::flag_true(value);
      return true;
    }
    if (flag != "--profile-first") return false;
    args.profile_first = bench::flag_true(value);
    return true;
  });
  if (args.device != "cuda" && args.device != "cpu") throw std::invalid_argument("--device is cuda or cpu");
  if (args.graphs && args.device != "cuda") throw std::invalid_argument("--graphs 1 needs --device cuda");
  return args;
}

size_t element_size(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    default: throw std::invalid_argument("unsupported input element type " + std::to_string(type));
  }
}

// Host bytes for an input: small floats (fp32 or fp16 0.0/0.5/-0.5 patterns) or ids i % 1000.
std::vector<unsigned char> fill(ONNXTensorElementDataType type, size_t count) {
  std::vector<unsigned char> bytes(count * element_size(type));
  for (size_t i = 0; i < count; ++i) {
    const int pattern = static_cast<int>(i % 7) - 3;  // -3..3
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      const float v = 0.25f * static_cast<float>(pattern);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
      const Ort::Float16_t v(0.25f * static_cast<float>(pattern));
      std::memcpy(bytes.data() + i * 2, &v, 2);
    } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      const int64_t v = static_cast<int64_t>(i % 1000);
      std::memcpy(bytes.data() + i * 8, &v, 8);
    } else {
      const int32_t v = static_cast<int32_t>(i % 1000);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
  }
  return bytes;
}

// The value a symbolic input dimension takes: --dim's for its name, else the batch size.
int64_t dim_value(const Args& args, const char* symbol) {
  const auto named = symbol != nullptr ? args.dims.find(symbol) : args.dims.end();
  return named != args.dims.end() ? named->second : args.batch;
}

// The inputs' symbolic dimension names with their values, read from the model by a session without optimizations
// (the overrides must be in the options before the session that is timed is made).
std::vector<std::pair<std::string, int64_t>> free_dims(const Ort::Env& env, const Args& args) {
  Ort::SessionOptions plain;
  plain.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_DISABLE_ALL);
  plain.SetIntraOpNumThreads(1);
  const Ort::Session probe(env, args.model.c_str(), plain);
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < probe.GetInputCount(); ++i) {
    const Ort::TypeInfo type_info = probe.GetInputTypeInfo(i);
    const auto info = type_info.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    const std::vector<const char*> symbols = info.GetSymbolicDimensions();
    for (size_t k = 0; k < shape.size() && k < symbols.size(); ++k) {
      if (shape[k] >= 0 || symbols[k] == nullptr || *symbols[k] == '\0') continue;
      const std::string name = symbols[k];
      const bool seen = std::any_of(out.begin(), out.end(), [&](const auto& d) { return d.first == name; });
      if (!seen) out.emplace_back(name, dim_value(args, symbols[k]));
    }
  }
  return out;
}

int run(const Args& args) {
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ort_direct_bench");
  Ort::SessionOptions options;
  std::vector<std::pair<std::string, int64_t>> overrides;
  if (args.static_shapes) overrides = free_dims(env, args);
  for (const auto& [name, value] : overrides) options.AddFreeDimensionOverrideByName(name.c_str(), value);
  options.SetIntraOpNumThreads(0);
  options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  Ort::MemoryInfo cpu_memory = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  const OrtMemoryInfo* device_memory = cpu_memory;
  if (args.device == "cuda") {
    const char* provider = std::getenv("XPURT_ORT_CUDA_PROVIDER");
    if (provider == nullptr || *provider == '\0') {
      throw std::runtime_error("set XPURT_ORT_CUDA_PROVIDER to libonnxruntime_providers_cuda.so "
                               "(scripts/stage_ort_cuda.sh, scripts/ort_cuda_unstage.sh)");
    }
    env.RegisterExecutionProviderLibrary("CUDA", provider);
    Ort::ConstEpDevice cuda{nullptr};
    bool found = false;
    for (const Ort::ConstEpDevice& device : env.GetEpDevices()) {
      if (std::string(device.EpName()) == "CUDAExecutionProvider") {
        cuda = device;
        found = true;
        break;
      }
    }
    if (!found) throw std::runtime_error("the CUDA execution provider sees no device");
    const std::unordered_map<std::string, std::string> cuda_options = {
        {"device_id", "0"}, {"use_tf32", "0"}, {"enable_cuda_graph", args.graphs ? "1" : "0"}};
    options.AppendExecutionProvider_V2(env, {cuda}, cuda_options);
    device_memory = cuda.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
  }
  if (args.profile_first) options.EnableProfiling("/tmp/ort_direct_bench_profile");
  const auto created = std::chrono::steady_clock::now();
  Ort::Session session(env, args.model.c_str(), options);
  const double create_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - created).count();
  Ort::Allocator device_allocator(session, device_memory);
  Ort::AllocatorWithDefaultOptions names;

  Ort::IoBinding binding(session);
  std::vector<std::string> input_names;
  std::vector<Ort::Value> inputs;                       // on the device
  std::vector<std::vector<unsigned char>> host_inputs;  // their contents (the inputs themselves on the CPU)
  host_inputs.reserve(session.GetInputCount());
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    input_names.push_back(session.GetInputNameAllocated(i, names).get());
    const Ort::TypeInfo type_info = session.GetInputTypeInfo(i);  // owns what `info` views
    auto info = type_info.GetTensorTypeAndShapeInfo();
    std::vector<int64_t> shape = info.GetShape();
    const std::vector<const char*> symbols = info.GetSymbolicDimensions();
    size_t count = 1;
    for (size_t k = 0; k < shape.size(); ++k) {
      int64_t& d = shape[k];
      if (d < 0) d = dim_value(args, k < symbols.size() ? symbols[k] : nullptr);
      count *= static_cast<size_t>(d);
    }
    host_inputs.push_back(fill(info.GetElementType(), count));
    std::vector<Ort::Value> source;
    source.push_back(Ort::Value::CreateTensor(cpu_memory, host_inputs.back().data(), host_inputs.back().size(),
                                              shape.data(), shape.size(), info.GetElementType()));
    if (args.device == "cuda") {
      std::vector<Ort::Value> target;
      target.push_back(Ort::Value::CreateTensor(device_allocator, shape.data(), shape.size(), info.GetElementType()));
      Ort::ThrowOnError(env.CopyTensors(source, target, nullptr));
      inputs.push_back(std::move(target[0]));
    } else {
      inputs.push_back(std::move(source[0]));
    }
    binding.BindInput(input_names.back().c_str(), inputs.back());
  }
  // Outputs: a first run without a graph learns their shapes; then device buffers of those shapes stay bound.
  std::vector<std::string> output_names;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    output_names.push_back(session.GetOutputNameAllocated(i, names).get());
  }
  Ort::RunOptions probe_options;
  if (args.graphs) probe_options.AddConfigEntry("gpu_graph_id", "-1");
  for (const std::string& name : output_names) binding.BindOutput(name.c_str(), device_memory);
  const auto first = std::chrono::steady_clock::now();
  session.Run(probe_options, binding);
  const double first_run_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first).count();
  if (args.profile_first) {
    Ort::AllocatorWithDefaultOptions allocator;
    std::remove(session.EndProfilingAllocated(allocator).get());
  }
  std::vector<Ort::Value> outputs;
  for (Ort::Value& value : binding.GetOutputValues()) {
    const Ort::TensorTypeAndShapeInfo info = value.GetTensorTypeAndShapeInfo();
    std::vector<int64_t> shape = info.GetShape();
    outputs.push_back(Ort::Value::CreateTensor(device_allocator, shape.data(), shape.size(), info.GetElementType()));
  }
  binding.ClearBoundOutputs();
  for (size_t i = 0; i < outputs.size(); ++i) binding.BindOutput(output_names[i].c_str(), outputs[i]);

  Ort::RunOptions run_options;  // graphs: the default annotation id, captured on the first of these runs
  for (int i = 0; i < args.warmup; ++i) session.Run(run_options, binding);
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(args.iterations));
  for (int i = 0; i < args.iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    session.Run(run_options, binding);
    const auto end = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  double sum = 0;
  for (double v : ms) sum += v;
  std::string dims_json;
  for (const auto& [name, value] : overrides) {
    dims_json += (dims_json.empty() ? "\"" : ", \"") + name + "\": " + std::to_string(value);
  }
  std::printf(
      "{\"model\": \"%s\", \"batch\": %lld, \"device\": \"%s\", \"cuda_graphs\": %s, \"iterations\": %d, "
      "\"median_ms\": %.5f, \"p90_ms\": %.5f, \"mean_ms\": %.5f, \"min_ms\": %.5f, \"create_ms\": %.3f, "
      "\"first_run_ms\": %.3f, \"static_shapes\": %s, \"free_dims\": {%s}, \"onnxruntime\": \"%s\"}\n",
      args.model.c_str(), static_cast<long long>(args.batch), args.device.c_str(), args.graphs ? "true" : "false",
      args.iterations, bench::percentile(ms, 0.5), bench::percentile(ms, 0.9), sum / static_cast<double>(ms.size()),
      *std::min_element(ms.begin(), ms.end()), create_ms, first_run_ms, args.static_shapes ? "true" : "false",
      dims_json.c_str(), Ort::GetVersionString().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const Ort::Exception& e) {
    std::fprintf(stderr, "ort_direct_bench: ONNX Runtime error %d: %s\n", static_cast<int>(e.GetOrtErrorCode()),
                 e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ort_direct_bench: %s\n", e.what());
  }
  return 1;
}
