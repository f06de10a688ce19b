// What the cublasLt backend's two quantized GEMMs share (cublaslt_qlinear.cpp: int8 qlinear; cublaslt_qlinear_fp8.cpp:
// qlinear_fp8): their descriptors' shape (A = the weight [N, K] op T, B = x [M, K], C = D = the accumulator [M, N]),
// the heuristic's checked candidates, the plan record, re-creating a plan from its record, and the per-thread
// descriptor cache. Internal to the backend; needs a CUDA build.
#pragma once

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cublaslt/cublaslt_common.h"
#include "core/cublas_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::cublaslt::quantized_gemm {

// The GEMM's descriptors, made by each kernel for its element types. C has D's layout unless `c` is set (a float8
// output takes a 16-bit C).
struct Descriptors {
  MatmulDesc operation;
  MatrixLayout a;
  MatrixLayout b;
  MatrixLayout d;
  std::optional<MatrixLayout> c = std::nullopt;

  cublasLtMatrixLayout_t c_layout() const { return c ? c->get() : d.get(); }
};

struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};

constexpr int kHeuristicCandidates = 8;

// The heuristic's candidates, in its order, within `limit` bytes of workspace that cublasLtMatmulAlgoCheck passes,
// for operands aligned to `alignment` bytes. `reductions`: the split-K reduction schemes allowed (set as the
// preference and checked on each candidate); none given: the heuristic's default. `invalid_is_unsupported`: the
// heuristic's CUBLAS_STATUS_INVALID_VALUE means no candidate (cuBLASLt answers so for some epilogue and scale-mode
// combinations it does not implement, e.g. outer-vector scales with a float8 output on sm_90) rather than an error.
inline std::vector<Candidate> heuristic_candidates(cublasLtHandle_t handle, const Descriptors& descriptors,
                                                   std::size_t limit, std::uint32_t alignment,
                                                   std::optional<std::uint32_t> reductions,
                                                   bool invalid_is_unsupported = false) {
  std::vector<Candidate> valid;
  Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(limit));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment);
  if (reductions) preference.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, *reductions);
  std::array<cublasLtMatmulHeuristicResult_t, kHeuristicCandidates> results{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(), descriptors.c_layout(),
      descriptors.d.get(), preference.get(), kHeuristicCandidates, results.data(), &returned);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return valid;
  if (status == CUBLAS_STATUS_INVALID_VALUE && invalid_is_unsupported) return valid;
  XPURT_CUBLASLT_CHECK(status);
  for (int j = 0; j < returned; ++j) {
    const cublasLtMatmulHeuristicResult_t& result = results[static_cast<std::size_t>(j)];
    if (result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > limit) continue;
    if (reductions && !reduction_allowed(config_of(result.algo), *reductions)) continue;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(),
                                descriptors.c_layout(), descriptors.d.get(), &result.algo,
                                &check) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    Candidate candidate{result.algo, std::max(result.workspaceSize, check.workspaceSize)};
    if (candidate.workspace <= limit) valid.push_back(candidate);
  }
  return valid;
}

// A plan's record: `format`, the algorithm's 8 words (hex) and its readable configuration, `compute_type`, the
// workspace and the versions it was chosen under, and the kernel's own `fields` (an object, or null for none).
inline std::string plan_record(const char* format, const cublasLtMatmulAlgo_t& algo, const AlgoConfig& config,
                               const char* compute_type, std::size_t workspace, int compute_capability,
                               nlohmann::json fields = nullptr) {
  nlohmann::json record = fields.is_object() ? std::move(fields) : nlohmann::json::object();
  nlohmann::json words = nlohmann::json::array();
  for (const std::uint64_t word : algo.data) {
    char text[24];
    std::snprintf(text, sizeof(text), "0x%016" PRIx64, word);
    words.push_back(text);
  }
  record["format"] = format;
  record["algo"] = words;
  record["algo_id"] = config.id;
  record["tile"] = enum_name(kTileNames, config.tile);
  record["stages"] = enum_name(kStagesNames, config.stages);
  record["splitk"] = config.splitk;
  record["reduction_scheme"] = reduction_scheme_name(config.reduction_scheme);
  record["compute_type"] = compute_type;
  record["workspace_bytes"] = workspace;
  record["cublaslt_version"] = cublasLtGetVersion();
  record["compute_capability"] = compute_capability;
  return record.dump();
}

// The algorithm of a plan_record `text` of `format`, checked against this GEMM here (cublasLtMatmulAlgoCheck), and its
// workspace. `bad_record` throws the kernel's error for each reason; `unsplit`: an algorithm that splits K is refused
// (a deterministic policy's plan); a workspace above `limit` is refused.
inline Candidate candidate_from_record(cublasLtHandle_t handle, const Descriptors& descriptors, std::size_t limit,
                                       const std::string& text, const char* format, bool unsplit,
                                       void (*bad_record)(const std::string& why)) {
  Candidate candidate;
  try {
    const nlohmann::json record = nlohmann::json::parse(text);
    if (!record.is_object() || record.value("format", std::string()) != format) {
      bad_record(detail::str_cat("it is not a record of format ", format, ": ", text));
    }
    const auto& words = record.at("algo");
    if (!words.is_array() || words.size() != 8) bad_record("'algo' must hold 8 words");
    for (std::size_t j = 0; j < 8; ++j) candidate.algo.data[j] = std::stoull(words[j].get<std::string>(), nullptr, 16);
    candidate.workspace = record.at("workspace_bytes").get<std::size_t>();
  } catch (const nlohmann::json::exception& e) {
    bad_record(detail::str_cat("it is not JSON with the fields of a record (", e.what(), ")"));
  } catch (const std::logic_error& e) {  // std::stoull: not a hex number
    bad_record(detail::str_cat("an 'algo' word is not a hex number (", e.what(), ")"));
  }
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(),
                              descriptors.c_layout(), descriptors.d.get(), &candidate.algo, &check);
  if (status != CUBLAS_STATUS_SUCCESS) {
    bad_record(detail::str_cat("cublasLtMatmulAlgoCheck rejects its algorithm for this GEMM here: ",
                               cublas::status_name(status)));
  }
  candidate.workspace = std::max(candidate.workspace, check.workspaceSize);
  if (unsplit && !reduction_allowed(config_of(candidate.algo), CUBLASLT_REDUCTION_SCHEME_NONE)) {
    bad_record("its algorithm splits K, and this plan is built for a deterministic policy");
  }
  if (candidate.workspace > limit) {
    bad_record(detail::str_cat("its algorithm needs ", candidate.workspace,
                               " bytes of workspace, above the policy's limit of ", limit, " bytes"));
  }
  return candidate;
}

// This thread's descriptors of plan `id`, made by `make` once per thread (Note [cuBLASLt descriptors per thread] in
// cublaslt_gemm.cpp); at most `capacity` plans' are kept.
template <typename Make>
const Descriptors& thread_descriptors(std::uint64_t id, std::size_t capacity, const Make& make) {
  thread_local std::unordered_map<std::uint64_t, std::unique_ptr<Descriptors>> cache;
  const auto found = cache.find(id);
  if (found != cache.end()) return *found->second;
  if (cache.size() >= capacity) cache.clear();
  return *cache.emplace(id, std::make_unique<Descriptors>(make())).first->second;
}

}  // namespace xpuruntime::cublaslt::quantized_gemm
