// Quantization decisions in the ExecutionPolicy (include/xpuruntime/quantization.h): validated, serialized in policy
// files, part of the fingerprint; a C++ session applies them (apply_quantization) and explain() says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/quantization.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

// Y = Relu(MatMul(X[batch, 4], W[4, 3]) + B), opset 17 (onnx_models.h).
std::string float_mlp() {
  return std::string(reinterpret_cast<const char*>(test_models::kLinearReluModel), test_models::kLinearReluModelSize);
}

// int8 decisions for the MLP's MatMul, as the Python planner writes them: X per tensor (scale 0.05), W per output
// channel (axis 1: amax / 127 of each column of W).
// `model_sha256` empty: decisions that name no model are applied unchecked (a test of the check is below).
std::string mlp_decisions(const std::string& extra = "", const std::string& model_sha256 = "") {
  return R"({"format": "xpuruntime.quantization/1", "precision": "int8", "method": "minmax", "percentile": null,
    "num_bins": null, "activation_type": "int8", "per_channel": true, "block_size": null, "quantize_bias": false,
    "op_types": ["Conv", "Gemm", "MatMul"], "opset": 17, "model_sha256": ")" + model_sha256 + R"(", "nodes": ["matmul"],
    "excluded": {"add": "exclude list"},
    "activations": {"X": {"dtype": "int8", "scale": 0.05, "zero_point": 0, "min": -1.0, "max": 2.0, "amax": 2.0,
                          "threshold": 2.0)" + extra + R"(}},
    "weights": {"W": {"dtype": "int8", "axis": 1, "scale": [0.015748031437397003, 0.023622047156095505,
                                                              0.007874015718698502]}},
    "biases": {}})";
}

ExecutionPolicy int8_policy() {
  ExecutionPolicy policy;
  policy.precision = Precision::kInt8;
  policy.quantization = QuantizationDecisions::canonical_json(mlp_decisions());
  return policy;
}

bool has_yaml() {
  try {
    (void)ExecutionPolicy().to_yaml();
    return true;
  } catch (const UnsupportedOperationError&) {
    return false;
  }
}

TEST(QuantizationPolicy, PrecisionNamesRoundTrip) {
  for (const char* name : {"int8", "fp8", "int4-weights"}) {
    EXPECT_EQ(precision_name(precision_from_name(name)), std::string(name));
  }
  EXPECT_EQ(kernel_precision(Precision::kFP8), Precision::kFP32);
  EXPECT_EQ(kernel_precision(Precision::kInt8), Precision::kInt8);
}

TEST(QuantizationPolicy, DecisionsRoundTripThroughPolicyFiles) {
  const ExecutionPolicy policy = int8_policy();
  const ExecutionPolicy again = ExecutionPolicy::from_json(policy.to_json());
  EXPECT_EQ(again, policy);
  EXPECT_EQ(again.quantization, policy.quantization);
  EXPECT_EQ(again.to_json(), policy.to_json());
  EXPECT_NE(policy.to_json().find("\"quantization\""), std::string::npos);
  if (has_yaml()) {
    const ExecutionPolicy from_yaml = ExecutionPolicy::from_yaml(policy.to_yaml());
    EXPECT_EQ(from_yaml, policy);
    EXPECT_EQ(from_yaml.fingerprint(), policy.fingerprint());
  }
  // A policy without decisions keeps the bytes it had before the key existed.
  EXPECT_EQ(ExecutionPolicy().to_json().find("quantization"), std::string::npos);
  const QuantizationDecisions d = QuantizationDecisions::from_json(policy.quantization);
  EXPECT_EQ(d.precision, "int8");
  ASSERT_EQ(d.weights.count("W"), 1u);
  EXPECT_EQ(d.weights.at("W").scale.size(), 3u);
  EXPECT_EQ(d.weights.at("W").scale[1], 0.023622047156095505f);
  EXPECT_EQ(d.summary(), "quantization: 1 node quantized (int8), 1 excluded");
}

TEST(QuantizationPolicy, FingerprintCoversTheDecisions) {
  ExecutionPolicy plain;
  plain.precision = Precision::kInt8;
  const ExecutionPolicy policy = int8_policy();
  ExecutionPolicy other = policy;
  std::string text = mlp_decisions();
  text.replace(text.find("0.05"), 4, "0.06");
  other.quantization = QuantizationDecisions::canonical_json(text);
  EXPECT_NE(plain.fingerprint(), policy.fingerprint());
  EXPECT_NE(other.fingerprint(), policy.fingerprint());
  EXPECT_NE(other, policy);
}

TEST(QuantizationPolicy, UnknownKeysAndBadValuesAreRefused) {
  const std::string top = R"({"precision": "int8", "quantization": )";
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(top + mlp_decisions(R"(, "bogus": 1)") + "}"),
                          InvalidArgumentError, "unknown key 'bogus'");
  std::string text = mlp_decisions();
  text.insert(text.find("\"nodes\""), R"("scales": {}, )");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(top + text + "}"), InvalidArgumentError, "unknown key 'scales'");
  text = mlp_decisions();
  text.replace(text.find("0.05"), 4, "-1.0");
  XPURT_EXPECT_THROW_WITH(QuantizationDecisions::from_json(text), InvalidArgumentError, "positive finite");
  text = mlp_decisions();
  text.replace(text.find("xpuruntime.quantization/1"), 25, "xpuruntime.quantization/9");
  XPURT_EXPECT_THROW_WITH(QuantizationDecisions::from_json(text), InvalidArgumentError, "format");
}

std::vector<float> run_mlp(InferenceSession& session, const std::vector<float>& x) {
  Tensor input = Tensor::zeros({2, 4}, DType::kFloat32);
  std::copy(x.begin(), x.end(), static_cast<float*>(input.data_ptr()));
  const std::vector<Tensor> out = session.run({{"X", input}});
  const auto* y = static_cast<const float*>(out.at(0).data_ptr());
  return std::vector<float>(y, y + out.at(0).numel());
}

TEST(QuantizationPolicy, SessionAppliesTheDecisions) {
  const std::vector<float> x = {0.3f, -1.2f, 0.77f, 2.5f, -0.01f, 0.5f, 1.0f, -0.4f};
  SessionOptions options;
  options.engine = "native";
  options.exec_policy = int8_policy();
  InferenceSession session = InferenceSession::from_bytes(float_mlp(), options);
  const std::vector<float> got = run_mlp(session, x);

  // The reference: X and W through quantize-dequantize, then MatMul + B and Relu in float.
  const float w[4][3] = {{1, -2, 0.5f}, {0, 1, -1}, {2, 0, 1}, {-1, 3, 0.25f}};
  const float b[3] = {0.5f, -1, 0};
  const QuantizationDecisions d = QuantizationDecisions::from_json(options.exec_policy.quantization);
  const std::vector<float>& ws = d.weights.at("W").scale;
  ASSERT_EQ(got.size(), 6u);
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      float acc = 0;
      for (int k = 0; k < 4; ++k) {
        const float xq = std::clamp(std::nearbyint(x[r * 4 + k] / 0.05f), -128.0f, 127.0f) * 0.05f;
        const float wq = std::clamp(std::nearbyint(w[k][c] / ws[c]), -128.0f, 127.0f) * ws[c];
        acc += xq * wq;
      }
      EXPECT_NEAR(got[r * 3 + c], std::max(acc + b[c], 0.0f), 1e-5) << r << "," << c;
    }
  }
  // X = 2.5 saturates nowhere (127 * 0.05 = 6.35), but -0.01 rounds to 0: the output is not the float model's.
  const std::string explained = session.explain().str();
  EXPECT_NE(explained.find("quantization: 1 node quantized (int8), 1 excluded"), std::string::npos) << explained;
  EXPECT_NE(explained.find("QuantizeLinear"), std::string::npos) << explained;

  // The same outputs as a session on the QDQ model apply_quantization writes, which is the same bytes every time.
  const std::string qdq = apply_quantization(float_mlp(), d);
  EXPECT_EQ(qdq, apply_quantization(float_mlp(), d));
  SessionOptions plain;
  plain.engine = "native";
  plain.exec_policy.precision = Precision::kInt8;  // an already quantized model needs no decisions
  InferenceSession replay = InferenceSession::from_bytes(qdq, plain);
  EXPECT_EQ(run_mlp(replay, x), got);
}

// Note [Decisions name the model they were made for] (frontends/onnx/onnx_quantize.cpp): decisions whose model hash
// is another model's are refused at session creation, on both engines' path.
TEST(QuantizationPolicy, DecisionsForAnotherModelAreRefused) {
#if __has_include(<openssl/evp.h>)
  SessionOptions options;
  options.engine = "native";
  options.exec_policy.precision = Precision::kInt8;
  options.exec_policy.quantization = QuantizationDecisions::canonical_json(
      mlp_decisions("", "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"));
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(float_mlp(), options), InvalidArgumentError,
                          "they were made for another model (sha256 5feceb66ffc8..., this one is ");
#else
  GTEST_SKIP() << "built without OpenSSL's libcrypto: decisions are applied unchecked";
#endif
}

TEST(QuantizationPolicy, FloatModelWithoutDecisionsIsRefused) {
  SessionOptions options;
  options.engine = "native";
  options.exec_policy.precision = Precision::kInt8;
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(float_mlp(), options), InvalidArgumentError,
                          "no quantization decisions");
  options.exec_policy = int8_policy();
  options.exec_policy.precision = Precision::kFP8;
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(float_mlp(), options), InvalidArgumentError,
                          "the quantization decisions are for int8");
}

TEST(QuantizationPolicy, OpsetUpgradeAndUnknownNodes) {
  int version = 0;
  EXPECT_EQ(upgrade_opset(float_mlp(), 13, "test", &version), float_mlp());
  EXPECT_EQ(version, 17);
  (void)upgrade_opset(float_mlp(), 21, "test", &version);
  EXPECT_EQ(version, 21);
  std::string text = mlp_decisions();
  text.replace(text.find(R"(["matmul"])"), 10, R"(["gemm9"])");
  XPURT_EXPECT_THROW_WITH(apply_quantization(float_mlp(), QuantizationDecisions::from_json(text)),
                          InvalidArgumentError, "node(s) gemm9 are not in the model");
}

}  // namespace
}  // namespace xpuruntime
