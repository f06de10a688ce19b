// The onnxruntime engine on CPU: tiny embedded ONNX models (tests/cpp/onnx_models.h) run through
// EngineRegistry::global().find("onnxruntime"). Skips when the build has no ONNX Runtime.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

const Engine* ort_engine() { return EngineRegistry::global().find("onnxruntime"); }

#define SKIP_WITHOUT_ORT()                                                                       \
  do {                                                                                           \
    if (ort_engine() == nullptr) GTEST_SKIP() << "this build has no ONNX Runtime (onnxruntime engine)"; \
  } while (0)

std::string linear_relu_model() {
  return {reinterpret_cast<const char*>(test_models::kLinearReluModel), test_models::kLinearReluModelSize};
}
std::string add_shape_model() {
  return {reinterpret_cast<const char*>(test_models::kAddShapeModel), test_models::kAddShapeModelSize};
}

constexpr float kW[4][3] = {{1, -2, 0.5f}, {0, 1, -1}, {2, 0, 1}, {-1, 3, 0.25f}};
constexpr float kB[3] = {0.5f, -1, 0};

Tensor cpu_tensor(const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));
  return t;
}

// Y = relu(X W + B), computed by hand for a row-major [rows, 4] X.
std::vector<float> expected_linear_relu(const std::vector<float>& x, int rows) {
  std::vector<float> y(static_cast<size_t>(rows) * 3);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < 3; ++c) {
      float acc = kB[c];
      for (int k = 0; k < 4; ++k) acc += x[static_cast<size_t>(r) * 4 + k] * kW[k][c];
      y[static_cast<size_t>(r) * 3 + c] = acc > 0 ? acc : 0;
    }
  }
  return y;
}

void expect_values(const Tensor& t, const std::vector<float>& expected) {
  ASSERT_EQ(t.dtype(), DType::kFloat32);
  ASSERT_EQ(static_cast<size_t>(t.numel()), expected.size());
  const float* data = static_cast<const float*>(t.data_ptr());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(data[i], expected[i]) << "element " << i;
}

TEST(OnnxRuntimeEngine, RunsLinearReluLikeAHandComputation) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, -2, 1};
  std::vector<Tensor> out = session->run({{"X", cpu_tensor({2, 4}, x)}}, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_TRUE(out[0].device().is_cpu());
  expect_values(out[0], expected_linear_relu(x, 2));

  // Another batch size through the symbolic dimension.
  const std::vector<float> x3 = {0, 0, 0, 0, 1, 1, 1, 1, -3, 2, 0.25f, 4};
  out = session->run({{"X", cpu_tensor({3, 4}, x3)}}, {"Y"});
  expect_values(out.at(0), expected_linear_relu(x3, 3));
}

TEST(OnnxRuntimeEngine, NonContiguousInputIsMadeContiguous) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  // Storage holds X^T ([4, 2] row-major); the view [2, 4] with strides {1, 2} is X.
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, -2, 1};
  std::vector<float> xt(8);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) xt[static_cast<size_t>(c) * 2 + r] = x[static_cast<size_t>(r) * 4 + c];
  Tensor storage = cpu_tensor({4, 2}, xt);
  Tensor view = Tensor::from_blob(storage.data_ptr(), {2, 4}, {1, 2}, DType::kFloat32, Device::cpu(),
                                  std::make_shared<Tensor>(storage), 8 * sizeof(float));
  ASSERT_FALSE(view.is_contiguous());
  expect_values(session->run({{"X", view}}, {}).at(0), expected_linear_relu(x, 2));
}

TEST(OnnxRuntimeEngine, ReportsInputsAndOutputsWithSymbolicDims) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  ASSERT_EQ(session->inputs().size(), 1u);
  EXPECT_EQ(session->inputs()[0].name, "X");
  EXPECT_EQ(session->inputs()[0].dtype, DType::kFloat32);
  EXPECT_EQ(session->inputs()[0].shape, (std::vector<std::string>{"batch", "4"}));
  ASSERT_EQ(session->outputs().size(), 1u);
  EXPECT_EQ(session->outputs()[0].name, "Y");
  EXPECT_EQ(session->outputs()[0].shape, (std::vector<std::string>{"batch", "3"}));

  auto add = ort_engine()->create(add_shape_model(), SessionOptions{});
  ASSERT_EQ(add->inputs().size(), 2u);
  EXPECT_EQ(add->inputs()[0].shape, (std::vector<std::string>{"n"}));
  EXPECT_EQ(add->inputs()[1].name, "B");
  EXPECT_EQ(add->inputs()[1].shape, (std::vector<std::string>{"?"}));
  ASSERT_EQ(add->outputs().size(), 2u);
  EXPECT_EQ(add->outputs()[1].name, "C");
  EXPECT_EQ(add->outputs()[1].dtype, DType::kInt64);
}

TEST(OnnxRuntimeEngine, ReturnsTheRequestedOutputsInOrder) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(add_shape_model(), SessionOptions{});
  std::vector<Tensor> out =
      session->run({{"B", cpu_tensor({3}, {10, 20, 30})}, {"A", cpu_tensor({3}, {1, 2, 3})}}, {"C", "S"});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].dtype(), DType::kInt64);
  ASSERT_EQ(out[0].numel(), 1);
  EXPECT_EQ(static_cast<const std::int64_t*>(out[0].data_ptr())[0], 3);
  expect_values(out[1], {11, 22, 33});
}

TEST(OnnxRuntimeEngine, RejectsBadFeedsWithActionableErrors) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  Tensor wrong_dtype = Tensor::zeros({2, 4}, DType::kInt64);
  XPURT_EXPECT_THROW_WITH(session->run({{"X", wrong_dtype}}, {}), InvalidTypeError,
                          "input 'X' expects float32[batch, 4], got int64[2, 4]");
  XPURT_EXPECT_THROW_WITH(session->run({{"X", Tensor::zeros({2, 5}, DType::kFloat32)}}, {}), InvalidArgumentError,
                          "input 'X' expects float32[batch, 4], got float32[2, 5]");
  XPURT_EXPECT_THROW_WITH(session->run({{"X", Tensor::zeros({8}, DType::kFloat32)}}, {}), InvalidArgumentError,
                          "got float32[8]");
  XPURT_EXPECT_THROW_WITH(session->run({}, {}), InvalidArgumentError, "input 'X' (float32[batch, 4]) is not fed");
  XPURT_EXPECT_THROW_WITH(session->run({{"x", Tensor::zeros({2, 4}, DType::kFloat32)}}, {}), InvalidArgumentError,
                          "unknown input 'x'; the model's inputs are 'X'");
  XPURT_EXPECT_THROW_WITH(session->run({{"X", Tensor::zeros({2, 4}, DType::kFloat32)}}, {"Z"}),
                          InvalidArgumentError, "unknown output 'Z'; the model's outputs are 'Y'");

  auto add = ort_engine()->create(add_shape_model(), SessionOptions{});
  XPURT_EXPECT_THROW_WITH(add->run({{"A", cpu_tensor({3}, {1, 2, 3})}}, {}), InvalidArgumentError,
                          "input 'B' (float32[?]) is not fed");
  // Shapes ORT itself rejects (A[3] + B[2] do not broadcast) come back as typed errors with ORT's message.
  EXPECT_THROW(add->run({{"A", cpu_tensor({3}, {1, 2, 3})}, {"B", cpu_tensor({2}, {1, 2})}}, {}),
               XpuRuntimeError);
}

TEST(OnnxRuntimeEngine, MalformedModelIsAnInvalidArgument) {
  SKIP_WITHOUT_ORT();
  const std::string model = linear_relu_model();
  XPURT_EXPECT_THROW_WITH(ort_engine()->create(model.substr(0, model.size() / 2), SessionOptions{}),
                          InvalidArgumentError, "ONNX Runtime error ORT_INVALID_PROTOBUF");
  EXPECT_THROW(ort_engine()->create("not a model", SessionOptions{}), InvalidArgumentError);
}

TEST(OnnxRuntimeEngine, ExplainListsNodesAndTheirExecutionProviderAfterARun) {
  SKIP_WITHOUT_ORT();
  SessionOptions options;
  options.exec_policy.intra_op_threads = 2;
  options.exec_policy.deterministic = true;
  auto session = ort_engine()->create(linear_relu_model(), options);
  Explanation before = session->explain();
  EXPECT_EQ(before.engine, "onnxruntime");
  EXPECT_TRUE(before.nodes.empty());
  bool says_not_run = false;
  for (const std::string& o : before.options) says_not_run |= o.find("not run yet") != std::string::npos;
  EXPECT_TRUE(says_not_run);

  session->run({{"X", cpu_tensor({1, 4}, {1, 2, 3, 4})}}, {});
  Explanation after = session->explain();
  EXPECT_EQ(after.device, "cpu");
  ASSERT_FALSE(after.nodes.empty()) << after.str();
  for (const NodeExplanation& node : after.nodes) {
    EXPECT_EQ(node.kernel, "CPUExecutionProvider") << node.node;
    EXPECT_FALSE(node.op_type.empty()) << node.node;
    EXPECT_EQ(node.backend, "onnxruntime");
  }
  bool threads = false, deterministic = false;
  for (const std::string& o : after.options) {
    threads |= o == "intra_op_num_threads=2";
    deterministic |= o == "use_deterministic_compute=1";
  }
  EXPECT_TRUE(threads);
  EXPECT_TRUE(deterministic);
  // A second run keeps the report (profiling ended after the first one).
  session->run({{"X", cpu_tensor({1, 4}, {1, 2, 3, 4})}}, {});
  EXPECT_EQ(session->explain().nodes.size(), after.nodes.size());
}

TEST(OnnxRuntimeEngine, KernelPolicyEntriesOrtCannotHonour) {
  SKIP_WITHOUT_ORT();
  SessionOptions preferred;
  preferred.kernel_policy.set("matmul", "cpu");
  auto session = ort_engine()->create(linear_relu_model(), preferred);
  std::vector<std::string> notes = session->explain().policy_notes;
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "matmul=cpu: not honoured by onnxruntime (ORT picks its own GEMM)");

  SessionOptions pinned;
  pinned.kernel_policy.set("matmul", "pin:cpu");
  XPURT_EXPECT_THROW_WITH(ort_engine()->create(linear_relu_model(), pinned), UnsupportedOperationError,
                          "cannot honour the pinned kernel rule(s) matmul=pin:cpu");
}

TEST(OnnxRuntimeEngine, ConcurrentRunsGiveTheSameResults) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const float v = static_cast<float>(t * 100 + i);
        const std::vector<float> x = {v, -v, 0.5f * v, 1};
        std::vector<Tensor> out = session->run({{"X", cpu_tensor({1, 4}, x)}}, {});
        const std::vector<float> want = expected_linear_relu(x, 1);
        const float* got = static_cast<const float*>(out.at(0).data_ptr());
        for (int c = 0; c < 3; ++c) failures[static_cast<size_t>(t)] += got[c] != want[static_cast<size_t>(c)];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(OnnxRuntimeEngine, CudaWithoutTheProviderSaysWhy) {
  SKIP_WITHOUT_ORT();
  const char* configured = std::getenv("XPURT_ORT_CUDA_PROVIDER");
  if (configured != nullptr) GTEST_SKIP() << "XPURT_ORT_CUDA_PROVIDER is set: the CUDA provider is configured";
  SessionOptions cuda;
  cuda.device = Device::cuda(0);
  Support support = ort_engine()->available(cuda);
  if (support) GTEST_SKIP() << "libonnxruntime_providers_cuda.so sits next to libonnxruntime.so";
  EXPECT_NE(support.reason().find("com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9"), std::string::npos)
      << support.reason();
  EXPECT_NE(support.reason().find("XPURT_ORT_CUDA_PROVIDER"), std::string::npos) << support.reason();
  XPURT_EXPECT_THROW_WITH(ort_engine()->create(linear_relu_model(), cuda), UnsupportedOperationError,
                          "XPURT_ORT_CUDA_PROVIDER");

  ::setenv("XPURT_ORT_CUDA_PROVIDER", "/nonexistent/libonnxruntime_providers_cuda.so", 1);
  Support missing_file = ort_engine()->available(cuda);
  ::unsetenv("XPURT_ORT_CUDA_PROVIDER");
  EXPECT_FALSE(missing_file);
  EXPECT_NE(missing_file.reason().find("does not exist"), std::string::npos) << missing_file.reason();
}

TEST(OnnxRuntimeEngine, CpuIsAvailable) {
  SKIP_WITHOUT_ORT();
  EXPECT_TRUE(ort_engine()->available(SessionOptions{}));
}

}  // namespace
}  // namespace xpuruntime
