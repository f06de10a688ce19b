// The onnxruntime engine: tiny embedded ONNX models (tests/cpp/onnx_models.h and below) run through
// EngineRegistry::global().find("onnxruntime"). Skips when the build has no ONNX Runtime; the CUDA cases also skip
// without a GPU or without the CUDA execution provider plugin (XPURT_ORT_CUDA_PROVIDER, scripts/stage_ort_cuda.sh).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

const Engine* ort_engine() { return EngineRegistry::global().find("onnxruntime"); }

// A build without ONNX Runtime still names the engine (a DeclaredEngine that says what to install): skip there too.
#define SKIP_WITHOUT_ORT()                                                                                   \
  do {                                                                                                       \
    if (ort_engine() == nullptr || !ort_engine()->available(SessionOptions{})) {                             \
      GTEST_SKIP() << "this build has no ONNX Runtime (onnxruntime engine)";                                 \
    }                                                                                                        \
  } while (0)

std::string linear_relu_model() {
  return {reinterpret_cast<const char*>(test_models::kLinearReluModel), test_models::kLinearReluModelSize};
}
std::string add_shape_model() {
  return {reinterpret_cast<const char*>(test_models::kAddShapeModel), test_models::kAddShapeModelSize};
}

// Two more models (ir_version 8, opset 17, generated like onnx_models.h):
//   kNonZeroModel: Y int64[1, count] = NonZero(X float32[4]); node "nonzero". Y's shape depends on X's values.
//   kStaticReluNegModel: Y = Relu(X), Z = Neg(X), all float32[2, 3] (static shapes); nodes "relu", "neg".
// NonZeroModel (106 bytes)
constexpr unsigned char kNonZeroModel[] = {
    0x08, 0x08, 0x12, 0x10, 0x78, 0x70, 0x75, 0x72, 0x75, 0x6e, 0x74, 0x69, 0x6d, 0x65, 0x2d, 0x74,
    0x65, 0x73, 0x74, 0x73, 0x3a, 0x4e, 0x0a, 0x18, 0x0a, 0x01, 0x58, 0x12, 0x01, 0x59, 0x1a, 0x07,
    0x6e, 0x6f, 0x6e, 0x7a, 0x65, 0x72, 0x6f, 0x22, 0x07, 0x4e, 0x6f, 0x6e, 0x5a, 0x65, 0x72, 0x6f,
    0x12, 0x07, 0x6e, 0x6f, 0x6e, 0x7a, 0x65, 0x72, 0x6f, 0x5a, 0x0f, 0x0a, 0x01, 0x58, 0x12, 0x0a,
    0x0a, 0x08, 0x08, 0x01, 0x12, 0x04, 0x0a, 0x02, 0x08, 0x04, 0x62, 0x18, 0x0a, 0x01, 0x59, 0x12,
    0x13, 0x0a, 0x11, 0x08, 0x07, 0x12, 0x0d, 0x0a, 0x02, 0x08, 0x01, 0x0a, 0x07, 0x12, 0x05, 0x63,
    0x6f, 0x75, 0x6e, 0x74, 0x42, 0x04, 0x0a, 0x00, 0x10, 0x11,
};
// StaticReluNegModel (142 bytes)
constexpr unsigned char kStaticReluNegModel[] = {
    0x08, 0x08, 0x12, 0x10, 0x78, 0x70, 0x75, 0x72, 0x75, 0x6e, 0x74, 0x69, 0x6d, 0x65, 0x2d, 0x74,
    0x65, 0x73, 0x74, 0x73, 0x3a, 0x72, 0x0a, 0x12, 0x0a, 0x01, 0x58, 0x12, 0x01, 0x59, 0x1a, 0x04,
    0x72, 0x65, 0x6c, 0x75, 0x22, 0x04, 0x52, 0x65, 0x6c, 0x75, 0x0a, 0x10, 0x0a, 0x01, 0x58, 0x12,
    0x01, 0x5a, 0x1a, 0x03, 0x6e, 0x65, 0x67, 0x22, 0x03, 0x4e, 0x65, 0x67, 0x12, 0x0b, 0x73, 0x74,
    0x61, 0x74, 0x69, 0x63, 0x5f, 0x72, 0x65, 0x6c, 0x75, 0x5a, 0x13, 0x0a, 0x01, 0x58, 0x12, 0x0e,
    0x0a, 0x0c, 0x08, 0x01, 0x12, 0x08, 0x0a, 0x02, 0x08, 0x02, 0x0a, 0x02, 0x08, 0x03, 0x62, 0x13,
    0x0a, 0x01, 0x59, 0x12, 0x0e, 0x0a, 0x0c, 0x08, 0x01, 0x12, 0x08, 0x0a, 0x02, 0x08, 0x02, 0x0a,
    0x02, 0x08, 0x03, 0x62, 0x13, 0x0a, 0x01, 0x5a, 0x12, 0x0e, 0x0a, 0x0c, 0x08, 0x01, 0x12, 0x08,
    0x0a, 0x02, 0x08, 0x02, 0x0a, 0x02, 0x08, 0x03, 0x42, 0x04, 0x0a, 0x00, 0x10, 0x11,
};

template <size_t N>
std::string model_bytes(const unsigned char (&bytes)[N]) {
  return {reinterpret_cast<const char*>(bytes), N};
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
  // Shapes ORT itself rejects (A[3] + B[2] do not broadcast) come back as typed errors with ORT's message, without
  // its C++ (the failed condition, function signature, source path) or ours (Note [ORT's messages]).
  try {
    add->run({{"A", cpu_tensor({3}, {1, 2, 3})}, {"B", cpu_tensor({2}, {1, 2})}}, {});
    ADD_FAILURE() << "A[3] + B[2] ran";
  } catch (const XpuRuntimeError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("ONNX Runtime ORT_", 0), 0u) << message;
    EXPECT_NE(message.find("while running Add node"), std::string::npos) << message;
    for (const char* leak : {"onnxruntime_src", ".cc:", ".h:", ".cpp:", "was false", "session_->", "onnxruntime::"}) {
      EXPECT_EQ(message.find(leak), std::string::npos) << leak << " in " << message;
    }
  }
}

TEST(OnnxRuntimeEngine, MalformedModelIsAnInvalidArgument) {
  SKIP_WITHOUT_ORT();
  const std::string model = linear_relu_model();
  // The engine's schema check reads the model before ONNX Runtime does (validate_onnx).
  XPURT_EXPECT_THROW_WITH(ort_engine()->create(model.substr(0, model.size() / 2), SessionOptions{}),
                          InvalidArgumentError, "invalid model: the bytes are not a valid ONNX ModelProto");
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
  if (DeviceManager::instance().get_device_count() == 0) {
    // No GPU: creation is refused for the device first (Note [A device that does not exist] in core/engine.cpp).
    XPURT_EXPECT_THROW_WITH(ort_engine()->create(linear_relu_model(), cuda), CudaError, "no CUDA device is available");
  } else {
    XPURT_EXPECT_THROW_WITH(ort_engine()->create(linear_relu_model(), cuda), UnsupportedOperationError,
                            "XPURT_ORT_CUDA_PROVIDER");
  }

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

// ---- outputs bound to xpuruntime's allocator (Note [Bound runs] in ort_engine.cpp) ----

std::int64_t live_allocations(Device device) { return MemoryManager::instance().get_stats(device).allocation.current; }

std::vector<float> to_host_floats(const Tensor& t) {
  Tensor host = t.to(Device::cpu()).contiguous();
  const float* data = static_cast<const float*>(host.data_ptr());
  return std::vector<float>(data, data + host.numel());
}

std::vector<std::int64_t> to_host_int64(const Tensor& t) {
  Tensor host = t.to(Device::cpu()).contiguous();
  const std::int64_t* data = static_cast<const std::int64_t*>(host.data_ptr());
  return std::vector<std::int64_t>(data, data + host.numel());
}

TEST(OnnxRuntimeEngine, StaticOutputShapesAreAllocatedByXpuruntime) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(model_bytes(kStaticReluNegModel), SessionOptions{});
  const std::vector<float> x = {1, -2, 3, -4, 0, 5};
  Tensor input = cpu_tensor({2, 3}, x);
  const std::int64_t before = live_allocations(Device::cpu());
  std::vector<Tensor> out = session->run({{"X", input}}, {});
  // Both outputs have static shapes: they are tensors of the MemoryManager, not ORT buffers.
  EXPECT_EQ(live_allocations(Device::cpu()) - before, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].storage()->from_memory_manager);
  EXPECT_EQ(out[0].shape(), (std::vector<std::int64_t>{2, 3}));
  expect_values(out[0], {1, 0, 3, 0, 0, 5});
  expect_values(out[1], {-1, 2, -3, 4, -0.0f, -5});
  // A subset, a repeated name and the order asked for.
  out = session->run({{"X", input}}, {"Z", "Y", "Z"});
  ASSERT_EQ(out.size(), 3u);
  expect_values(out[0], {-1, 2, -3, 4, -0.0f, -5});
  expect_values(out[1], {1, 0, 3, 0, 0, 5});
  expect_values(out[2], {-1, 2, -3, 4, -0.0f, -5});
}

TEST(OnnxRuntimeEngine, OutputShapesAreRememberedPerInputSignature) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, -2, 1};
  Tensor input = cpu_tensor({2, 4}, x);
  const std::int64_t before = live_allocations(Device::cpu());
  // Y is [batch, 3]: unknown before the first run with batch 2, so ORT allocates it (wrapped, not counted).
  Tensor first = session->run({{"X", input}}, {}).at(0);
  EXPECT_FALSE(first.storage()->from_memory_manager);
  EXPECT_EQ(live_allocations(Device::cpu()) - before, 0);
  // Same input shapes again: the remembered shape lets xpuruntime allocate the output.
  Tensor second = session->run({{"X", input}}, {}).at(0);
  EXPECT_TRUE(second.storage()->from_memory_manager);
  EXPECT_EQ(live_allocations(Device::cpu()) - before, 1);
  expect_values(first, expected_linear_relu(x, 2));
  expect_values(second, expected_linear_relu(x, 2));
  // Another batch size is another signature: ORT allocates again, with the right shape.
  const std::vector<float> x1 = {4, 3, 2, 1};
  Tensor third = session->run({{"X", cpu_tensor({1, 4}, x1)}}, {}).at(0);
  EXPECT_FALSE(third.storage()->from_memory_manager);
  expect_values(third, expected_linear_relu(x1, 1));
}

TEST(OnnxRuntimeEngine, ValueDependentOutputShapesFallBackToOrtAllocation) {
  SKIP_WITHOUT_ORT();
  auto session = ort_engine()->create(model_bytes(kNonZeroModel), SessionOptions{});
  // The same input shape gives outputs of three shapes: a remembered shape must never give a wrong answer.
  const std::vector<std::pair<std::vector<float>, std::vector<std::int64_t>>> cases = {
      {{1, 0, 2, 0}, {0, 2}}, {{1, 1, 1, 0}, {0, 1, 2}}, {{0, 0, 0, 0}, {}},
      {{0, 0, 0, 7}, {3}},    {{1, 0, 2, 0}, {0, 2}}};
  for (const auto& [x, want] : cases) {
    Tensor y = session->run({{"X", cpu_tensor({4}, x)}}, {}).at(0);
    ASSERT_EQ(y.dtype(), DType::kInt64);
    EXPECT_EQ(y.shape(), (std::vector<std::int64_t>{1, static_cast<std::int64_t>(want.size())}));
    EXPECT_EQ(to_host_int64(y), want);
  }
}

TEST(OnnxRuntimeEngine, OutputsOutliveTheSession) {
  SKIP_WITHOUT_ORT();
  const std::vector<float> x = {1, 2, 3, 4};
  Tensor ort_allocated;
  {
    auto session = ort_engine()->create(linear_relu_model(), SessionOptions{});
    ort_allocated = session->run({{"X", cpu_tensor({1, 4}, x)}}, {}).at(0);
  }
  expect_values(ort_allocated, expected_linear_relu(x, 1));
}

TEST(OnnxRuntimeEngine, CudaGraphsPolicyIsSilentOnCpu) {
  SKIP_WITHOUT_ORT();
  SessionOptions options;
  options.exec_policy.cuda_graphs = true;
  auto session = ort_engine()->create(linear_relu_model(), options);
  for (const std::string& note : session->explain().policy_notes) {
    EXPECT_EQ(note.find("cuda_graphs"), std::string::npos) << note;
  }
  bool io_binding = false;
  for (const std::string& o : session->explain().options) io_binding |= o.rfind("io_binding: ", 0) == 0;
  EXPECT_TRUE(io_binding);
}

// ---- CUDA: the plugin execution provider (runs on the GPU machine; skips here) ----

#define SKIP_WITHOUT_ORT_CUDA()                                                                          \
  do {                                                                                                   \
    SKIP_WITHOUT_ORT();                                                                                  \
    XPURT_SKIP_WITHOUT_GPU();                                                                            \
    SessionOptions cuda_options_;                                                                        \
    cuda_options_.device = Device::cuda(0);                                                              \
    Support support_ = ort_engine()->available(cuda_options_);                                           \
    if (!support_) GTEST_SKIP() << "no ONNX Runtime CUDA execution provider: " << support_.reason();     \
  } while (0)

SessionOptions cuda_session(bool graphs) {
  SessionOptions options;
  options.device = Device::cuda(0);
  options.exec_policy.cuda_graphs = graphs;
  return options;
}

bool has_note(const Explanation& e, const std::string& fragment) {
  for (const std::string& note : e.policy_notes) {
    if (note.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(OnnxRuntimeEngineCuda, DeviceFeedsAndOutputsStayOnTheDevice) {
  SKIP_WITHOUT_ORT_CUDA();
  auto session = ort_engine()->create(linear_relu_model(), cuda_session(false));
  EXPECT_TRUE(has_note(session->explain(), "cuda_graphs=false -> enable_cuda_graph=0"));
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, -2, 1};
  Tensor on_device = cpu_tensor({2, 4}, x).to(Device::cuda(0));
  const std::int64_t before = live_allocations(Device::cuda(0));
  Tensor first = session->run({{"X", on_device}}, {}).at(0);
  EXPECT_TRUE(first.device().is_cuda());
  EXPECT_FALSE(first.storage()->from_memory_manager);  // shape unknown before the first run: ORT's buffer
  EXPECT_EQ(to_host_floats(first), expected_linear_relu(x, 2));
  Tensor second = session->run({{"X", on_device}}, {}).at(0);
  EXPECT_TRUE(second.device().is_cuda());
  EXPECT_TRUE(second.storage()->from_memory_manager);  // remembered shape: xpuruntime's caching allocator
  EXPECT_EQ(live_allocations(Device::cuda(0)) - before, 1);
  EXPECT_EQ(to_host_floats(second), expected_linear_relu(x, 2));
  // A CPU feed is copied to the device by ORT; the result is the same.
  EXPECT_EQ(to_host_floats(session->run({{"X", cpu_tensor({2, 4}, x)}}, {}).at(0)), expected_linear_relu(x, 2));
  Explanation explanation = session->explain();
  ASSERT_FALSE(explanation.nodes.empty());
  bool on_cuda = false;
  for (const NodeExplanation& node : explanation.nodes) on_cuda |= node.kernel == "CUDAExecutionProvider";
  EXPECT_TRUE(on_cuda) << explanation.str();
}

TEST(OnnxRuntimeEngineCuda, NonContiguousDeviceFeed) {
  SKIP_WITHOUT_ORT_CUDA();
  auto session = ort_engine()->create(linear_relu_model(), cuda_session(false));
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, -2, 1};
  std::vector<float> xt(8);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) xt[static_cast<size_t>(c) * 2 + r] = x[static_cast<size_t>(r) * 4 + c];
  Tensor storage = cpu_tensor({4, 2}, xt).to(Device::cuda(0));
  Tensor view = Tensor::from_blob(storage.data_ptr(), {2, 4}, {1, 2}, DType::kFloat32, Device::cuda(0),
                                  std::make_shared<Tensor>(storage), 8 * sizeof(float));
  EXPECT_EQ(to_host_floats(session->run({{"X", view}}, {}).at(0)), expected_linear_relu(x, 2));
}

TEST(OnnxRuntimeEngineCuda, CudaGraphsReplayOverStagingBuffers) {
  SKIP_WITHOUT_ORT_CUDA();
  auto session = ort_engine()->create(linear_relu_model(), cuda_session(true));
  Explanation explanation = session->explain();
  ASSERT_TRUE(has_note(explanation, "cuda_graphs=true -> enable_cuda_graph=1")) << explanation.str();
  bool option = false;
  for (const std::string& o : explanation.options) option |= o == "cuda.enable_cuda_graph=1";
  EXPECT_TRUE(option);
  // Run 1 learns the shapes, run 2 captures, the rest replay: each must see its own feed (copied into the staging
  // buffers) and return its own output (copied out of them).
  std::vector<Tensor> kept;
  std::vector<std::vector<float>> inputs;
  for (int i = 0; i < 6; ++i) {
    const float v = static_cast<float>(i);
    inputs.push_back({v, -v, 0.5f * v, 1, 2 * v, 1, -1, v});
    Tensor feed = cpu_tensor({2, 4}, inputs.back());
    kept.push_back(session->run({{"X", i % 2 == 0 ? feed.to(Device::cuda(0)) : feed}}, {}).at(0));
    EXPECT_TRUE(kept.back().device().is_cuda());
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(to_host_floats(kept[i]), expected_linear_relu(inputs[i], 2)) << "run " << i;
  }
  // Another signature gets its own graph and buffers.
  const std::vector<float> x3 = {0, 0, 0, 0, 1, 1, 1, 1, -3, 2, 0.25f, 4};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(to_host_floats(session->run({{"X", cpu_tensor({3, 4}, x3)}}, {}).at(0)), expected_linear_relu(x3, 3));
  }
  EXPECT_FALSE(has_note(session->explain(), "capture failed")) << session->explain().str();
}

TEST(OnnxRuntimeEngineCuda, CudaGraphRunsAreThreadSafe) {
  SKIP_WITHOUT_ORT_CUDA();
  auto session = ort_engine()->create(linear_relu_model(), cuda_session(true));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const float v = static_cast<float>(t * 100 + i);
        const std::vector<float> x = {v, -v, 0.5f * v, 1};
        const std::vector<float> got = to_host_floats(session->run({{"X", cpu_tensor({1, 4}, x)}}, {}).at(0));
        failures[static_cast<size_t>(t)] += got != expected_linear_relu(x, 1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(OnnxRuntimeEngineCuda, ValueDependentShapesWithCudaGraphs) {
  SKIP_WITHOUT_ORT_CUDA();
  auto session = ort_engine()->create(model_bytes(kNonZeroModel), cuda_session(true));
  const std::vector<std::pair<std::vector<float>, std::vector<std::int64_t>>> cases = {
      {{1, 0, 2, 0}, {0, 2}}, {{1, 1, 1, 0}, {0, 1, 2}}, {{0, 0, 0, 0}, {}},
      {{1, 0, 2, 0}, {0, 2}}, {{0, 5, 0, 7}, {1, 3}}};
  for (const auto& [x, want] : cases) {
    Tensor y = session->run({{"X", cpu_tensor({4}, x).to(Device::cuda(0))}}, {}).at(0);
    EXPECT_EQ(to_host_int64(y), want);
  }
}

}  // namespace
}  // namespace xpuruntime
