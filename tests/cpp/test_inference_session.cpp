// InferenceSession from C++: engine choice and its reason, the declared engines' errors, files and bytes.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "onnx_models.h"
#include "test_utils.h"
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
                          "needs NVIDIA TensorRT");
  options.engine = "native";
  EXPECT_EQ(InferenceSession::from_bytes(model_bytes(), options).engine(), "native");
  const std::string truncated = model_bytes().substr(0, model_bytes().size() / 2);
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(truncated, options), InvalidArgumentError, "invalid model");
  XPURT_EXPECT_THROW_WITH(InferenceSession("/nonexistent/model.onnx"), InvalidArgumentError,
                          "cannot open the model file '/nonexistent/model.onnx'");
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(""), InvalidArgumentError, "the model is empty");
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
