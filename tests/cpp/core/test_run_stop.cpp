// Stopping runs (Note [Stopping a run] in run_options.h): the token checked between a plan's steps, its timeout and
// terminate, nesting, InferenceSession's RunOptions, and a plan that runs normally after it was stopped.
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph_exec.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/run_options.h"

using namespace xpuruntime;

namespace {

// v0 -> Relu -> v1 -> ... -> v<n> over [rows, 256] float32, each step a kernel of its own.
std::shared_ptr<const CapturePlan> relu_chain(int n, std::int64_t rows) {
  Graph g;
  g.opsets[""] = 17;
  g.inputs = {"v0"};
  ValueType vt;
  vt.dtype = DType::kFloat32;
  vt.has_shape = true;
  vt.shape = {Dim(rows), Dim(256)};
  g.types["v0"] = vt;
  for (int i = 0; i < n; ++i) {
    Node node;
    node.op_type = "Relu";
    node.name = "r" + std::to_string(i);
    node.inputs = {"v" + std::to_string(i)};
    node.outputs = {"v" + std::to_string(i + 1)};
    g.nodes.push_back(node);
  }
  g.outputs = {"v" + std::to_string(n)};
  g.validate();
  PlanOptions options;
  options.dispatcher = std::make_shared<Dispatcher>(KernelPolicy{}, ExecutionPolicy{});
  options.disabled_passes = {"elementwise_fusion"};  // which would make the chain one kernel
  return CapturePlan::build(g, {{rows, 256}}, options);
}

Tensor filled(std::int64_t rows, float value) {
  Tensor t = Tensor::empty({rows, 256}, DType::kFloat32);
  for (std::int64_t i = 0; i < t.numel(); ++i) static_cast<float*>(t.data_ptr())[i] = value;
  return t;
}

}  // namespace

TEST(RunStop, TerminatedTokenStopsBeforeTheFirstStepOfAPlan) {
  GraphExec exec(relu_chain(4, 2));
  RunOptions options;
  options.set_terminate();
  {
    const RunStop stop(options, nullptr);
    const RunStopScope scope(&stop);
    XPURT_EXPECT_THROW_WITH(exec.run({filled(2, -1.0f)}), RunTerminatedError,
                            "run stopped before node 'r0' (Relu, step 1 of 4) because RunOptions terminate was set");
  }
  // The same executor runs normally afterwards.
  const auto out = exec.run({filled(2, -1.0f)});
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[0], 0.0f);
}

TEST(RunStop, TimeoutStopsBetweenNodes) {
  // 400 steps of 1 MiB each: far longer than the 2 ms timeout, which passes after the first step's check.
  GraphExec exec(relu_chain(400, 1024));
  const Tensor x = filled(1024, 2.0f);
  RunOptions options;
  options.timeout = std::chrono::milliseconds(2);
  options.tag = "chain";
  // On a loaded machine the 2 ms may pass before the first step's check; some attempt stops between nodes.
  bool between_nodes = false;
  for (int attempt = 0; attempt < 20 && !between_nodes; ++attempt) {
    try {
      const RunStop stop(options, nullptr);
      const RunStopScope scope(&stop);
      exec.run({x});
      ADD_FAILURE() << "the run was not stopped";
    } catch (const RunTerminatedError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(e.timed_out());
      EXPECT_NE(what.find("run 'chain' stopped "), std::string::npos) << what;
      EXPECT_NE(what.find("timeout of 2 ms passed"), std::string::npos) << what;
      between_nodes = what.find("step 1 of 400") == std::string::npos;  // not before the run: between its nodes
    }
  }
  EXPECT_TRUE(between_nodes) << "20 runs stopped before their first node, none between nodes";
  const auto out = exec.run({x});
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[5], 2.0f);
}

TEST(RunStop, EnclosingTokenStopsNestedRunsAndTerminateIsReadLive) {
  RunStop outer;
  RunOptions options;
  const RunStop inner(options, &outer);
  EXPECT_EQ(inner.reason(), RunStop::Reason::kNone);
  options.set_terminate();  // read through the reference, while the token lives
  EXPECT_EQ(inner.reason(), RunStop::Reason::kTerminate);
  options.unset_terminate();
  outer.interrupt();
  EXPECT_EQ(inner.reason(), RunStop::Reason::kInterrupt);
  XPURT_EXPECT_THROW_WITH(inner.check("here"), RunTerminatedError, "stopped here because it was interrupted");
  EXPECT_EQ(RunStop::current(), nullptr);
  {
    const RunStopScope scope(&inner);
    EXPECT_EQ(RunStop::current(), &inner);
    XPURT_EXPECT_THROW_WITH(check_run_stop("in a test"), RunTerminatedError, "in a test");
  }
  EXPECT_EQ(RunStop::current(), nullptr);
  check_run_stop("outside a run");  // nothing to stop
}

TEST(RunStop, SessionRunOptionsTerminateStopsBeforeTheRunAndUnsetRunsAgain) {
  SessionOptions session_options;
  session_options.engine = "native";
  const std::string model(reinterpret_cast<const char*>(test_models::kLinearReluModel),
                          test_models::kLinearReluModelSize);
  const InferenceSession session = InferenceSession::from_bytes(model, session_options);
  Tensor x = Tensor::empty({1, 4}, DType::kFloat32);
  for (int i = 0; i < 4; ++i) static_cast<float*>(x.data_ptr())[i] = 1.0f;
  RunOptions options;
  options.set_terminate();
  XPURT_EXPECT_THROW_WITH(session.run({{"X", x}}, {}, options), RunTerminatedError, "before it started");
  XPURT_EXPECT_THROW_WITH(session.run_values({{"X", Value(x)}}, {}, options), RunTerminatedError,
                          "before it started");
  options.unset_terminate();
  const auto out = session.run({{"X", x}}, {}, options);
  // Relu([1,1,1,1] @ W + B) with W's column sums 2, 2, 0.75 and B = [0.5, -1, 0].
  EXPECT_FLOAT_EQ(static_cast<const float*>(out[0].data_ptr())[0], 2.5f);
  EXPECT_FLOAT_EQ(static_cast<const float*>(out[0].data_ptr())[1], 1.0f);
  EXPECT_FLOAT_EQ(static_cast<const float*>(out[0].data_ptr())[2], 0.75f);
}
