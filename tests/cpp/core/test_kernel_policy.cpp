// KernelPolicy and ExecutionPolicy: rules, validation messages, canonical JSON/YAML round trips, fingerprints.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "test_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"

using namespace xpuruntime;

namespace {

KernelPolicy sample_policy() {
  KernelPolicy policy;
  policy.set("matmul", KernelRule::preferred({"cublasLt", "cublas"}));
  policy.set("attention", "pin:flash_v2");
  policy.set("softmax", "auto:BestPerformance");
  policy.set("conv", "cudnn");
  return policy;
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + name; }

}  // namespace

TEST(KernelPolicy, ShortFormsParseAndPrint) {
  EXPECT_EQ(KernelRule::parse("cublasLt", AutoSelectStrategy::kFirstSupported), KernelRule::preferred({"cublasLt"}));
  EXPECT_EQ(KernelRule::parse("pin:cudnn", AutoSelectStrategy::kFirstSupported), KernelRule::pinned("cudnn"));
  EXPECT_EQ(KernelRule::parse("cudnn!", AutoSelectStrategy::kFirstSupported), KernelRule::pinned("cudnn"));
  EXPECT_EQ(KernelRule::parse("auto", AutoSelectStrategy::kBestPerformance),
            KernelRule::automatic(AutoSelectStrategy::kBestPerformance));
  EXPECT_EQ(KernelRule::preferred({"a", "b"}).str(), "[a, b]");
  EXPECT_EQ(KernelRule::pinned("flash_v2").str(), "pin:flash_v2");
  EXPECT_EQ(KernelRule::automatic(AutoSelectStrategy::kBestPerformance).str(), "auto:BestPerformance");
  EXPECT_EQ(sample_policy().str(),
            "KernelPolicy(attention=pin:flash_v2, conv=cudnn, matmul=[cublasLt, cublas], softmax=auto:BestPerformance)");
}

TEST(KernelPolicy, ResolvesOpThenFamilyThenAuto) {
  KernelPolicy policy = sample_policy();
  policy.set("linear", "pin:cublas");
  EXPECT_EQ(policy.resolve("linear", "matmul"), KernelRule::pinned("cublas"));
  EXPECT_EQ(policy.resolve("matmul", "matmul"), KernelRule::preferred({"cublasLt", "cublas"}));
  EXPECT_EQ(policy.resolve("relu", "activation").mode, RuleMode::kAuto);
  policy.set_auto_strategy(AutoSelectStrategy::kBestPerformance);
  EXPECT_EQ(policy.resolve("relu", "activation"), KernelRule::automatic(AutoSelectStrategy::kBestPerformance));
}

TEST(KernelPolicy, RejectsUnknownOpsKernelsAndValuesListingValidOnes) {
  KernelPolicy policy;
  XPURT_EXPECT_THROW_WITH(policy.set("matmull", "cublasLt"), InvalidArgumentError, "valid ops and op families: ");
  XPURT_EXPECT_THROW_WITH(policy.set("matmull", "cublasLt"), InvalidArgumentError, "matmul");
  XPURT_EXPECT_THROW_WITH(policy.set("matmul", "cublasLT"), InvalidArgumentError, "valid kernels: ");
  XPURT_EXPECT_THROW_WITH(policy.set("matmul", "cublasLT"), InvalidArgumentError, "cublasLt");
  XPURT_EXPECT_THROW_WITH(policy.set("matmul", "auto:Fastest"), InvalidArgumentError,
                          "valid strategies: FirstSupported, BestPerformance");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json(R"({"rules": {"matmul": {"mode": "always", "kernels": ["cpu"]}}})"),
                          InvalidArgumentError, "valid modes: pinned, preferred, auto");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json(R"({"rulez": {}})"), InvalidArgumentError,
                          "unknown key 'rulez' in KernelPolicy; valid keys: auto_strategy, rules, schema");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json(R"({"rules": {"matmul": {"mode": "pinned", "kernels": ["cpu", "cublas"]}}})"),
                          InvalidArgumentError, "pinned takes exactly one kernel");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json(R"({"rules": {"matmul": {"mode": "pinned", "kernel": ["cpu"]}}})"),
                          InvalidArgumentError, "valid keys: kernels, mode, strategy");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json("{\"rules\": "), InvalidArgumentError, "not valid JSON");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json(R"({"schema": "xpuruntime.kernel_policy/9"})"), InvalidArgumentError,
                          "schema must be");
  // A kernel of the family that does not implement this op is caught when dispatching, not here: "unfused" is an
  // attention kernel, not a matmul one.
  XPURT_EXPECT_THROW_WITH(policy.set("matmul", "unfused"), InvalidArgumentError, "unknown kernel 'unfused'");
}

TEST(KernelPolicy, JsonAndYamlRoundTripByteIdentically) {
  XPURT_SKIP_WITHOUT_YAML();
  const KernelPolicy policy = sample_policy();
  const std::string json = policy.to_json();
  EXPECT_EQ(KernelPolicy::from_json(json).to_json(), json);
  EXPECT_EQ(KernelPolicy::from_json(json), policy);
  const std::string yaml = policy.to_yaml();
  EXPECT_EQ(KernelPolicy::from_yaml(yaml).to_yaml(), yaml);
  EXPECT_EQ(KernelPolicy::from_yaml(yaml).to_json(), json);
  EXPECT_EQ(KernelPolicy::from_yaml(yaml).fingerprint(), policy.fingerprint());
  EXPECT_EQ(policy.fingerprint().size(), 16u);
  EXPECT_NE(KernelPolicy().fingerprint(), policy.fingerprint());

  for (const char* name : {"policy.json", "policy.yaml", "policy.yml"}) {
    const std::string path = temp_path(name);
    policy.save(path);
    EXPECT_EQ(KernelPolicy::load(path), policy) << path;
    std::remove(path.c_str());
  }
  XPURT_EXPECT_THROW_WITH(policy.save(temp_path("policy.txt")), InvalidArgumentError, ".json, .yaml or .yml");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::load(temp_path("missing.json")), InvalidArgumentError, "cannot open");
}

TEST(KernelPolicy, AcceptsHandWrittenShortForms) {
  const KernelPolicy policy = KernelPolicy::from_json(
      R"({"matmul": ["cublasLt", "cublas"], "attention": {"pinned": "flash_v2"}, "conv": "cudnn",
          "rules": {"softmax": {"auto": "BestPerformance"}}})");
  EXPECT_EQ(policy, sample_policy());
  XPURT_SKIP_WITHOUT_YAML();
  const KernelPolicy from_yaml = KernelPolicy::from_yaml(
      "matmul: [cublasLt, cublas]\nattention: pin:flash_v2\nconv: cudnn\nsoftmax: auto:BestPerformance\n");
  EXPECT_EQ(from_yaml, sample_policy());
}

TEST(ExecutionPolicy, RoundTripsAndValidates) {
  ExecutionPolicy policy;
  policy.precision = Precision::kBF16;
  policy.deterministic = true;
  policy.cuda_graphs = false;
  policy.workspace_limit = 256ull << 20;
  policy.intra_op_threads = 4;
  const std::string json = policy.to_json();
  EXPECT_EQ(ExecutionPolicy::from_json(json), policy);
  EXPECT_EQ(ExecutionPolicy::from_json(json).to_json(), json);
  XPURT_SKIP_WITHOUT_YAML();
  EXPECT_EQ(ExecutionPolicy::from_yaml(policy.to_yaml()).to_yaml(), policy.to_yaml());
  EXPECT_EQ(ExecutionPolicy::from_yaml(policy.to_yaml()), policy);
  EXPECT_NE(ExecutionPolicy().fingerprint(), policy.fingerprint());
}

TEST(ExecutionPolicy, Validates) {
  EXPECT_EQ(ExecutionPolicy::from_json(R"({"workspace_limit": "256MiB", "memory_limit": "1.5GB"})").workspace_limit,
            256ull << 20);
  EXPECT_EQ(ExecutionPolicy::from_json(R"({"memory_limit": "1.5GB"})").memory_limit, 1500000000ull);
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"precision": "fp4"})"), InvalidArgumentError,
                          "valid precisions: fp32, tf32, fp16, bf16, int8");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"precison": "fp16"})"), InvalidArgumentError,
                          "unknown key 'precison' in ExecutionPolicy; valid keys: ");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"deterministic": "yes"})"), InvalidArgumentError,
                          "must be true or false");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"workspace_limit": "lots"})"), InvalidArgumentError,
                          "MiB");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"intra_op_threads": -1})"), InvalidArgumentError,
                          "intra_op_threads");
  XPURT_SKIP_WITHOUT_YAML();
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_yaml("precision: [fp16"), InvalidArgumentError, "not valid YAML");
}

TEST(ExecutionPolicy, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("1KiB"), 1024u);
  EXPECT_EQ(parse_byte_size("2 GiB"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1.5KB"), 1500u);
  XPURT_EXPECT_THROW_WITH(parse_byte_size("12XB"), InvalidArgumentError, "invalid byte size '12XB'");
  XPURT_EXPECT_THROW_WITH(parse_byte_size(""), InvalidArgumentError, "invalid byte size");
}

// Found by fuzz_policy (tests/fuzz/corpus/policy/regression-utf8-key): YAML whose key is not UTF-8 made the error
// message's JSON dump throw nlohmann's type_error, an untyped exception, instead of an InvalidArgumentError.
TEST(PolicyFiles, YamlThatIsNotUtf8IsATypedError) {
  XPURT_SKIP_WITHOUT_YAML();
  const std::string text = "prec w?s\xff\xff\xff\x0c" "egy :\"e\nintra_op_threa__t\n";
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_yaml(text), InvalidArgumentError, "is not valid UTF-8 text");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_yaml("matmul: \xff\xfe\n"), InvalidArgumentError,
                          "is not valid UTF-8 text");
  // JSON's own parser refuses such bytes with a typed error too.
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json("{\"\xff\": 1}"), InvalidArgumentError, "");
}

// Found by fuzz_policy and fuzz_autotune (tests/fuzz/corpus/*/regression-number-overflow*): a number past a double
// ('12e311') made nlohmann's parser throw out_of_range, which escaped as an untyped exception.
TEST(PolicyFiles, NumbersPastADoubleAreATypedError) {
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json("{\"memory_limit\": 12e311}"), InvalidArgumentError,
                          "is not valid JSON");
  XPURT_EXPECT_THROW_WITH(KernelPolicy::from_json("{\"rules\": {\"matmul\": 2e648}}"), InvalidArgumentError,
                          "is not valid JSON");
  const std::string path = ::testing::TempDir() + "xpurt_autotune_overflow.json";
  {
    std::ofstream file(path);
    file << "{\"schema\": \"xpuruntime.autotune_cache/1\", \"entries\": {\"k\": {\"kernel\": \"cpu\", "
            "\"times_us\": {\"cpu\": 2e648}}}}";
  }
  XPURT_EXPECT_THROW_WITH(AutotuneCache(path, false), InvalidArgumentError, "is not valid JSON");
  std::remove(path.c_str());
}
