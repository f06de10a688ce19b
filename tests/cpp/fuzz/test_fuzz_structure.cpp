// The structure-aware mutator (tests/fuzz/structure_mutator.h) and the model fuzzers' findings: every
// tests/fuzz/corpus/model/regression-*.onnx runs through the fuzzers' harness (tests/fuzz/model_harness.h) on both
// engines and must end as a typed error or a run, never a crash (docs/reliability.md, Fuzzing).
#include <gtest/gtest.h>
#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "fuzz/model_harness.h"
#include "fuzz/structure_mutator.h"
#include "xpuruntime/engine.h"

namespace fs = std::filesystem;
using namespace xpuruntime;

namespace {

const fs::path kCorpus = fs::path(XPURT_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / "model";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool has_onnxruntime() {
  return EngineRegistry::global().find("onnxruntime")->available(SessionOptions{}).ok();
}

std::vector<std::string> engines() {
  std::vector<std::string> e = {"native"};
  if (has_onnxruntime()) e.push_back("onnxruntime");
  return e;
}

}  // namespace

TEST(StructureMutator, TheSameSeedGivesTheSameMutantAndEveryMutantParses) {
  const std::string model = read_file(kCorpus / "test_if.onnx");
  ASSERT_FALSE(model.empty());
  std::set<std::string> distinct;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    std::string a, b;
    std::vector<std::string> edits;
    ASSERT_TRUE(fuzz::mutate_model_structure(model, seed, &a, &edits));
    ASSERT_TRUE(fuzz::mutate_model_structure(model, seed, &b));
    EXPECT_EQ(a, b) << "seed " << seed;
    EXPECT_GE(edits.size(), 1u);
    EXPECT_LE(edits.size(), 3u);
    onnx::ModelProto parsed;
    EXPECT_TRUE(parsed.ParseFromString(a)) << "seed " << seed;
    distinct.insert(a);
  }
  EXPECT_GT(distinct.size(), 150u);  // edits that change nothing (a swap of a node with itself) are rare
}

TEST(StructureMutator, EditsReachSubgraphs) {
  // test_if's nodes live in its branches half of the time an edit picks a graph.
  const std::string model = read_file(kCorpus / "test_if.onnx");
  onnx::ModelProto original;
  ASSERT_TRUE(original.ParseFromString(model));
  int changed_branch = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    std::string mutant;
    ASSERT_TRUE(fuzz::mutate_model_structure(model, seed, &mutant));
    onnx::ModelProto m;
    ASSERT_TRUE(m.ParseFromString(mutant));
    if (m.graph().node_size() == original.graph().node_size() && m.graph().node(0).attribute_size() > 0 &&
        original.graph().node(0).attribute_size() > 0 &&
        m.graph().node(0).attribute(0).SerializeAsString() != original.graph().node(0).attribute(0).SerializeAsString()) {
      ++changed_branch;
    }
  }
  EXPECT_GT(changed_branch, 0);
}

TEST(StructureMutator, BytesThatAreNoModelAreRefused) {
  std::string out = "untouched";
  EXPECT_FALSE(fuzz::mutate_model_structure(std::string("\xff\xff\xff\xff", 4), 1, &out));
  EXPECT_EQ(out, "untouched");
}

TEST(FuzzRegressions, EveryRegressionInputIsATypedErrorOrARunOnBothEngines) {
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("regression-", 0) != 0) continue;
    ++seen;
    const std::string bytes = read_file(entry.path());
    for (const std::string& engine : engines()) {
      // A crash ends the test binary; another exception than XpuRuntimeError fails here.
      EXPECT_NO_THROW(fuzz::run_model_bytes(bytes, engine, /*run_control_flow=*/true)) << name << " on " << engine;
    }
  }
  EXPECT_GE(seen, 14);
}

TEST(FuzzRegressions, AReshapeTargetOfInt64MaxIsReadExactly) {
  // Reshape(shape, shape) of an int64 constant holding INT64_MAX: the identity check read the target through double
  // (2^63, out of int64's range: undefined behaviour under UBSan); core/scalar.h's to_int64s reads it exactly.
  const auto r = fuzz::run_model_bytes(read_file(kCorpus / "regression-reshape-to-its-own-int64-max-shape.onnx"),
                                       "native", true);
  EXPECT_TRUE(r.outcome == fuzz::ModelOutcome::kRan || r.outcome == fuzz::ModelOutcome::kTypedError) << r.message;
}

TEST(FuzzRegressions, AnAxisOfA0dInputIsATypedError) {
  // Split (and ArgMax, CumSum, Compress, Scan, ...) indexed the empty shape of a 0-d input with axis 0.
  const auto r = fuzz::run_model_bytes(read_file(kCorpus / "regression-split-of-a-0d-input.onnx"), "native", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message.find("the input is 0-d: it has no axis"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, AScanBodyWithFewerOutputsThanStatesIsATypedError) {
  // The count of scan outputs wrapped around (a std::vector of 2^64 - 1 axes: std::length_error, untyped).
  const auto r =
      fuzz::run_model_bytes(read_file(kCorpus / "regression-scan-body-without-outputs.onnx"), "native", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_NE(r.message.find("the body has 0 outputs, expected at least 1"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, ALayerNormalizationWhoseBiasIsAnEmptyNameRunsOnOnnxRuntime) {
  // Valid ONNX that crashed ONNX Runtime 1.29's session creation (Note [Trailing empty inputs]).
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const std::string bytes = read_file(kCorpus / "regression-layernorm-without-bias-as-empty-name.onnx");
  for (const std::string& engine : engines()) {
    const auto r = fuzz::run_model_bytes(bytes, engine, true);
    EXPECT_EQ(r.outcome, fuzz::ModelOutcome::kRan) << engine << ": " << r.message;
  }
}

TEST(FuzzRegressions, AReductionOverAnAxisOfA0dInputIsATypedError) {
  // The registry's shape inference (op_schemas.cpp) indexed the empty shape of a 0-d input with axis 0.
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-reduce-over-an-axis-of-a-0d-input.onnx"), "native", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_NE(r.message.find("out of range for rank 0"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, ASplitToSequenceByAScalar0IsATypedErrorOnOnnxRuntime) {
  // ONNX Runtime 1.29 divided by the split while loading the model (SIGFPE; Note [Models ORT crashes on]).
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-split-to-sequence-by-a-scalar-0.onnx"), "onnxruntime", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message.find("a scalar 'split' must be positive"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, AReshapeToAShapeOfTwoBillionElementsIsATypedErrorOnOnnxRuntime) {
  // ONNX Runtime 1.29 built a shape of that rank loading the model: 7 GiB and 13 s before std::bad_alloc under the
  // campaign's 8 GiB limit, past its 20 s deadline on a busy machine (Note [Models ORT crashes on]).
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-ort-reshape-to-a-shape-of-2147483648-elements.onnx"), "onnxruntime", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message.find("its shape operand 'shape' has 2147483648 elements"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, AScanWithMoreScanInputsThanInputsIsATypedErrorOnOnnxRuntime) {
  // num_scan_inputs = 2^40: ONNX Runtime 1.29 allocated a vector of that many entries loading the model (8 TiB;
  // ASan's operator new aborts there; Note [Models ORT crashes on]).
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-ort-scan-with-2-pow-40-scan-inputs.onnx"), "onnxruntime", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message.find("num_scan_inputs is 1099511627776, but the node has 3 inputs"), std::string::npos)
      << r.message;
}

TEST(FuzzRegressions, AnIfConditionStoredAsByte205IsTrue) {
  // A bool initializer whose byte is 205 (not 0 or 1): inline_constant_ifs read it as a C++ bool, undefined behaviour
  // (UBSan). Any nonzero byte is true, as ONNX Runtime reads it.
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-if-condition-bool-byte-205.onnx"), "native", true);
  EXPECT_EQ(r.outcome, fuzz::ModelOutcome::kRan) << r.message;
}

TEST(FuzzHarness, ALoopWithoutEndStopsAtTheRunTimeoutOnBothEngines) {
  // Valid ONNX that never ends: the harness runs control flow under a RunOptions timeout, so the fuzzers count it as
  // a typed RunTimeoutError, not a hang.
  const std::string bytes = read_file(kCorpus / "loop-without-end.onnx");
  for (const std::string& engine : engines()) {
    const auto r = fuzz::run_model_bytes(bytes, engine, true, std::chrono::milliseconds(200));
    ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError) << engine;
    EXPECT_EQ(r.code, ErrorCode::kTerminated) << engine << ": " << r.message;
  }
}

TEST(FuzzRegressions, AnEmptyVariadicInputBeforeANamedOneIsATypedErrorOnOnnxRuntime) {
  // Min(X, "", X): ONNX Runtime 1.29 crashed running it (SIGSEGV; Note [Models ORT crashes on]).
  if (!has_onnxruntime()) GTEST_SKIP() << "this build has no ONNX Runtime engine";
  const auto r = fuzz::run_model_bytes(
      read_file(kCorpus / "regression-min-with-an-empty-input-between-named-ones.onnx"), "onnxruntime", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message.find("node 'min' (Min): input 1 has no name"), std::string::npos) << r.message;
}

TEST(FuzzRegressions, ASequenceWhereAKernelTakesATensorIsATypedError) {
  // value_info declares the SequenceConstruct's output a tensor, so Concat was planned as a kernel, which read an
  // undefined tensor (SIGSEGV in memcpy).
  const auto r = fuzz::run_model_bytes(read_file(kCorpus / "regression-concat-of-a-sequence.onnx"), "native", true);
  ASSERT_EQ(r.outcome, fuzz::ModelOutcome::kTypedError);
  EXPECT_EQ(r.code, ErrorCode::kInvalidType);
  EXPECT_NE(r.message.find("but Concat takes tensors"), std::string::npos) << r.message;
}
