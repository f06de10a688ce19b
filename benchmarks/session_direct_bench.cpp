// xpuruntime's InferenceSession called from C++: the counterpart of ort_direct_bench.cpp (ONNX Runtime's C++
// API), so that benchmarks/session_bench.py can compare the two engines without a Python call in either timing.
//
//   session_direct_bench --model m.onnx [--engine native] [--batch 1] [--device cuda|cpu] [--graphs 0|1]
//                        [--iterations 100] [--warmup 10] [--io-binding 0|1]
//
// Symbolic dimensions of the inputs take the batch size. Float inputs are filled with small values, integer
// inputs with i % 1000 (valid token ids for the zoo's BERT); inputs live on the session's device. Prints one JSON
// line in ort_direct_bench's format. Each iteration is timed on the host around InferenceSession::run followed
// by a synchronization of the current stream, the one xpuruntime orders a run's outputs on (they are complete when
// the timing stops). --io-binding 1 binds the inputs and outputs once (IoBinding, outputs preallocated on the device
// with the shapes of a first run) and times run_with_binding instead: the same I/O as ort_direct_bench's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

#include "bench_common.h"

namespace {

using xpuruntime::Device;
using xpuruntime::DType;
using xpuruntime::Tensor;

struct Args : bench::CommonArgs {
  Args() { graphs = true; }  // the native engine's default
  std::string engine = "native";
  bool io_binding = false;
};

Args parse(int argc, char** argv) {
  Args args;
  bench::parse_args(argc, argv, args, [&](const std::string& flag, const std::string& value) {
    if (flag == "--engine") {
      args.engine = value;
      return true;
    }
    if (flag == "--io-binding") {
      args.io_binding = bench::flag_true(value);
      return true;
    }
    return false;
  });
  return args;
}

// A host tensor of `shape` filled like ort_direct_bench's inputs.
Tensor fill(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  // 0.25 * (-3 .. 3), and the same values as IEEE half bit patterns.
  constexpr uint16_t kHalf[7] = {0xBA00, 0xB800, 0xB400, 0x0000, 0x3400, 0x3800, 0x3A00};
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.25f * static_cast<float>(static_cast<int>(i % 7) - 3);
    switch (dtype) {
      case DType::kFloat32: static_cast<float*>(t.data_ptr())[i] = v; break;
      case DType::kFloat16: static_cast<uint16_t*>(t.data_ptr())[i] = kHalf[i % 7]; break;
      case DType::kInt64: static_cast<int64_t*>(t.data_ptr())[i] = i % 1000; break;
      case DType::kInt32: static_cast<int32_t*>(t.data_ptr())[i] = static_cast<int32_t>(i % 1000); break;
      default: throw std::invalid_argument("unsupported input element type " +
                                           std::string(xpuruntime::dtype_name(dtype)));
    }
  }
  return t;
}

int run(const Args& args) {
  xpuruntime::SessionOptions options;
  options.device = Device::parse(args.device);
  options.engine = args.engine;
  options.exec_policy.cuda_graphs = args.graphs;
  const xpuruntime::InferenceSession session(args.model, options);
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (const xpuruntime::ValueInfo& info : session.get_inputs()) {
    std::vector<int64_t> shape;
    for (const std::string& d : info.shape) {
      const bool number = !d.empty() && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
      shape.push_back(number ? std::stoll(d) : args.batch);
    }
    feeds.emplace_back(info.name, fill(info.dtype, shape).to(options.device));
  }
  xpuruntime::DeviceManager::instance().synchronize(options.device);
  const xpuruntime::StreamView stream = xpuruntime::StreamManager::instance().current_stream(options.device);
  xpuruntime::IoBinding binding = session.io_binding();
  if (args.io_binding) {
    const std::vector<Tensor> probe = session.run(feeds);
    for (const auto& [name, tensor] : feeds) binding.bind_input(name, tensor);
    for (size_t i = 0; i < probe.size(); ++i) {
      binding.bind_output(session.get_outputs()[i].name, Tensor::empty(probe[i].shape(), probe[i].dtype(),
                                                                        options.device));
    }
  }
  auto run_once = [&] {
    if (args.io_binding) {
      session.run_with_binding(binding);
    } else {
      const std::vector<Tensor> outputs = session.run(feeds);
    }
    stream.synchronize();
  };
  for (int i = 0; i < args.warmup; ++i) run_once();
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(args.iterations));
  for (int i = 0; i < args.iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run_once();
    const auto end = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  double sum = 0;
  for (double v : ms) sum += v;
  std::printf(
      "{\"model\": \"%s\", \"engine\": \"%s\", \"batch\": %lld, \"device\": \"%s\", \"cuda_graphs\": %s, "
      "\"io_binding\": %s, \"iterations\": %d, \"median_ms\": %.5f, \"p90_ms\": %.5f, \"mean_ms\": %.5f, \"min_ms\": %.5f}\n",
      args.model.c_str(), session.engine().c_str(), static_cast<long long>(args.batch), args.device.c_str(),
      args.graphs ? "true" : "false", args.io_binding ? "true" : "false", args.iterations, bench::percentile(ms, 0.5), bench::percentile(ms, 0.9),
      sum / static_cast<double>(ms.size()), *std::min_element(ms.begin(), ms.end()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "session_direct_bench: %s\n", e.what());
  }
  return 1;
}
