// InferenceSession from C++: engine choice and its reason, the declared engines' errors, files and bytes.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/inference_session.h"

using namespace xpuruntime;

namespace {

std::string model_bytes() {
  return std::string(reinterpret_cast<const char*>(test_models::kLinearReluModel),
                     test_models::kLinearReluModelSize);
}

bool has_onnxruntime() {
  return EngineRegistry::global().find("onnxruntime")->available(SessionOptions{}).ok();
}

}  // namespace

TEST(InferenceSession, EveryKnownEngineIsDeclaredAndUnknownOnesAreRejected) {
  for (const auto& name : {"native", "onnxruntime", "tensorrt"}) {
    EXPECT_NE(EngineRegistry::global().find(name), nullptr) << name;
  }
  SessionOptions options;
  options.engine = "trt";
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(model_bytes(), options), InvalidArgumentError,
                          "unknown engine 'trt'; valid engines: auto, native, onnxruntime, tensorrt");
  options.engine = "tensorrt";
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(model_bytes(), options), UnsupportedOperationError,
                          "the tensorrt engine (NVIDIA TensorRT 10) is not implemented");
  options.engine = "native";
  EXPECT_EQ(InferenceSession::from_bytes(model_bytes(), options).engine(), "native");
  const std::string truncated = model_bytes().substr(0, model_bytes().size() / 2);
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(truncated, options), InvalidArgumentError, "invalid model");
  XPURT_EXPECT_THROW_WITH(InferenceSession("/nonexistent/model.onnx"), InvalidArgumentError,
                          "cannot open the model file '/nonexistent/model.onnx'");
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(""), InvalidArgumentError, "the model is empty");
}

// Note [A device that does not exist] (core/engine.cpp): refused at creation, before any engine is asked.
TEST(InferenceSession, ADeviceThatDoesNotExistFailsAtCreationWithCudaError) {
  const int count = DeviceManager::instance().get_device_count();
  for (const char* engine : {"auto", "native", "onnxruntime", "tensorrt"}) {
    SessionOptions options;
    options.engine = engine;
    options.device = Device::cuda(count);  // cuda:0 without a GPU, one past the last GPU with some
    XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(model_bytes(), options), CudaError,
                            count == 0 ? "no CUDA device is available (the only device here is cpu)"
                                       : " CUDA device");
  }
  // The same when an engine is asked directly, without InferenceSession.
  SessionOptions options;
  options.device = Device::cuda(count);
  for (const char* engine : {"native", "onnxruntime"}) {
    const Engine* found = EngineRegistry::global().find(engine);
    if (engine == std::string("onnxruntime") && !has_onnxruntime()) continue;  // a DeclaredEngine: says what to install
    XPURT_EXPECT_THROW_WITH(found->create(model_bytes(), options), CudaError, " CUDA device");
  }
}

TEST(InferenceSession, EngineAvailabilitySaysWhatIsMissingAndNamesOnlyWhatExists) {
  const auto engines = engine_availability();
  ASSERT_EQ(engines.size(), known_engines().size() - 1);  // all but "auto"
  for (const EngineAvailability& e : engines) {
    EXPECT_EQ(e.available, e.reason.empty()) << e.name;
    if (e.name == "native") {
      EXPECT_TRUE(e.available) << e.reason;
    }
    if (e.name == "tensorrt" || e.name == "openvino" || e.name == "qnn") {
      EXPECT_FALSE(e.available);
      EXPECT_NE(e.reason.find("is not implemented in this version of xpuruntime"), std::string::npos) << e.reason;
      EXPECT_EQ(e.reason.find("pip install"), std::string::npos) << e.reason;
    }
  }
  const int count = DeviceManager::instance().get_device_count();
  for (const EngineAvailability& e : engine_availability(Device::cuda(count))) {
    EXPECT_FALSE(e.available) << e.name;
    EXPECT_NE(e.reason.find("CUDA device"), std::string::npos) << e.reason;
  }
}

TEST(InferenceSession, AutoPicksOnnxRuntimeOnTheCpuAndSaysWhy) {
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const std::string path = ::testing::TempDir() + "xpurt_linear_relu.onnx";
  {
    std::ofstream file(path, std::ios::binary);
    file << model_bytes();
  }
  InferenceSession session(path);
  EXPECT_EQ(session.engine(), "onnxruntime");
  ASSERT_EQ(session.get_inputs().size(), 1u);
  EXPECT_EQ(session.get_inputs()[0].str(), "X: float32[batch, 4]");
  Tensor x = Tensor::zeros({2, 4}, DType::kFloat32);
  const auto outputs = session.run({{"X", x}});
  ASSERT_EQ(outputs.size(), 1u);
  // Relu(0 @ W + B) = Relu(B) = [0.5, 0, 0] per row.
  const float* y = static_cast<const float*>(outputs[0].data_ptr());
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_FLOAT_EQ(y[1], 0.0f);
  const Explanation explanation = session.explain();
  EXPECT_EQ(explanation.engine, "onnxruntime");
  EXPECT_EQ(explanation.engine_reason, "auto: onnxruntime is the engine for CPU devices");
  EXPECT_EQ(explanation.device, "cpu");
  EXPECT_FALSE(explanation.nodes.empty());
  EXPECT_NE(explanation.str().find("CPUExecutionProvider"), std::string::npos) << explanation.str();
  std::remove(path.c_str());
}

TEST(InferenceSession, IoBindingWritesBoundOutputsInPlaceOnEveryEngine) {
  for (const char* engine : {"native", "onnxruntime"}) {
    if (std::string(engine) == "onnxruntime" && !has_onnxruntime()) continue;
    SessionOptions options;
    options.engine = engine;
    const InferenceSession session = InferenceSession::from_bytes(model_bytes(), options);
    Tensor x = Tensor::empty({3, 4}, DType::kFloat32);
    float* xs = static_cast<float*>(x.data_ptr());
    for (int i = 0; i < 12; ++i) xs[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
    const std::vector<Tensor> expected = session.run({{"X", x}});
    IoBinding binding = session.io_binding();
    binding.bind_input("X", x);
    Tensor y = Tensor::empty({3, 3}, DType::kFloat32);
    binding.bind_output("Y", y);
    session.run_with_binding(binding);
    ASSERT_EQ(binding.outputs().size(), 1u);
    EXPECT_EQ(binding.outputs()[0].data_ptr(), y.data_ptr()) << engine;
    for (int i = 0; i < 9; ++i) {
      EXPECT_FLOAT_EQ(static_cast<const float*>(y.data_ptr())[i], static_cast<const float*>(expected[0].data_ptr())[i])
          << engine << " element " << i;
    }
    // New input values in the same bound memory, then an output bound to a device.
    for (int i = 0; i < 12; ++i) xs[i] = 1.0f;
    binding.bind_output("Y", Device::cpu());
    session.run_with_binding(binding);
    const std::vector<Tensor> again = session.run({{"X", x}});
    EXPECT_NE(binding.outputs()[0].data_ptr(), y.data_ptr());
    for (int i = 0; i < 9; ++i) {
      EXPECT_FLOAT_EQ(static_cast<const float*>(binding.outputs()[0].data_ptr())[i],
                      static_cast<const float*>(again[0].data_ptr())[i]);
    }
    // Bad bindings: typed errors naming the problem.
    XPURT_EXPECT_THROW_WITH(binding.bind_input("Z", x), InvalidArgumentError, "unknown input 'Z'; the model's inputs are");
    XPURT_EXPECT_THROW_WITH(binding.bind_input("X", Tensor::empty({3, 4}, DType::kFloat64)), InvalidTypeError,
                            "input 'X' is float32, the bound tensor is float64");
    XPURT_EXPECT_THROW_WITH(binding.bind_output("Y", Tensor::empty({3, 3}, DType::kInt32)), InvalidTypeError,
                            "the bound tensor is int32");
    binding.bind_output("Y", Tensor::empty({2, 3}, DType::kFloat32));
    XPURT_EXPECT_THROW_WITH(session.run_with_binding(binding), XpuRuntimeError, "shape");
    binding.clear_outputs();
    XPURT_EXPECT_THROW_WITH(session.run_with_binding(binding), InvalidArgumentError, "no output is bound");
  }
}
