// Sampling rows where the logits are (generation/row_sampler.h; Note [Sampling rows where the logits are] in
// core/row_sampling.h).
#include "generation/row_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/cuda_utils.h"
#include "core/device_kernels.h"
#include "generation/step_io.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime::generation {

namespace rs = row_sampling;

namespace {

struct Candidate {
  std::uint64_t key;     // step 3's composite key
  std::uint64_t weight;  // step 4's fixed-point weight
};

// Step 5's top_p: the key of the candidate, in key order from the highest, at which the running weight first reaches
// `mass` (at least 1, at most the candidates' sum). A weighted selection: each round splits the range still open at
// its middle key (nth_element) and keeps the half that holds the answer, so a nucleus of most of a near-uniform
// vocabulary costs a few passes rather than a sort.
std::uint64_t nucleus_threshold(std::vector<Candidate>* candidates, std::uint64_t mass) {
  const auto before = [](const Candidate& a, const Candidate& b) { return a.key > b.key; };
  auto first = candidates->begin(), last = candidates->end();
  while (last - first > 32) {
    const auto middle = first + (last - first) / 2;
    std::nth_element(first, middle, last, before);
    std::uint64_t upper = 0;  // the weight of [first, middle], the keys from the range's highest to middle's
    for (auto c = first; c <= middle; ++c) upper += c->weight;
    if (upper >= mass) {
      last = middle + 1;
    } else {
      mass -= upper;
      first = middle + 1;
    }
  }
  std::sort(first, last, before);
  std::uint64_t running = 0;
  for (auto c = first; c != last; ++c) {
    running += c->weight;
    if (running >= mass) return c->key;
  }
  XPURT_INTERNAL_ASSERT(false, "sample_rows: the nucleus mass exceeds the candidates' weights");
  return 0;
}

}  // namespace

std::int64_t sample_row_host(const float* x, std::int64_t vocab, const rs::RowParams& p,
                             const std::vector<std::int64_t>& seen) {
  XPURT_CHECK(vocab > 0 && vocab < (std::int64_t{1} << 23), "sample_rows: vocabularies of 1 to 2^23 - 1 tokens, got ",
              vocab);
  const float scale = p.greedy ? 1.0f : p.temperature;
  std::vector<float> y(static_cast<std::size_t>(vocab));
  for (std::int64_t i = 0; i < vocab; ++i) y[static_cast<std::size_t>(i)] = x[i] / scale;
  if (p.penalty != 1.0f) {  // recomputed from the logits: a repeated id is penalised once
    for (std::int64_t id : seen) {
      if (id >= 0 && id < vocab) y[static_cast<std::size_t>(id)] = rs::penalized(x[id], p.penalty) / scale;
    }
  }
  float top = -INFINITY;
  for (std::int64_t i = 0; i < vocab; ++i) {
    const float v = y[static_cast<std::size_t>(i)];
    if (std::isnan(v)) return i;  // 2. the first NaN
    top = std::max(top, v);
  }
  // 3. candidates by key, highest first, ordered only as far as top_k and top_p read them (selections, not sorts).
  std::vector<Candidate> kept(static_cast<std::size_t>(vocab));
  std::vector<std::uint64_t> weights(static_cast<std::size_t>(vocab));  // by id, for the draw
  for (std::int64_t i = 0; i < vocab; ++i) {
    const float v = y[static_cast<std::size_t>(i)];
    const auto at = static_cast<std::size_t>(i);
    weights[at] = v == top ? (std::uint64_t{1} << rs::kWeightBits) : rs::fixed_weight(std::exp(v - top));
    kept[at] = {rs::candidate_key(v, i), weights[at]};
  }
  const auto before = [](const Candidate& a, const Candidate& b) { return a.key > b.key; };
  if (p.greedy) {
    return static_cast<std::int64_t>(std::min_element(kept.begin(), kept.end(), before) - kept.begin());
  }
  std::uint64_t threshold = 0;  // the smallest kept key
  if (p.top_k > 0 && p.top_k < vocab) {
    std::nth_element(kept.begin(), kept.begin() + (p.top_k - 1), kept.end(), before);
    threshold = kept[static_cast<std::size_t>(p.top_k - 1)].key;
    kept.resize(static_cast<std::size_t>(p.top_k));
  }
  if (p.top_p < 1.0f) {
    std::uint64_t sum = 0;
    for (const Candidate& c : kept) sum += c.weight;
    threshold = nucleus_threshold(&kept, rs::nucleus_mass(p.top_p, sum));
  }
  // 6. the draw, in id order.
  std::uint64_t total = 0;
  for (const Candidate& c : kept) total += c.key >= threshold ? c.weight : 0;
  const std::uint64_t u = rs::scale_draw(rs::draw_word(p), total);
  std::uint64_t running = 0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (rs::candidate_key(y[static_cast<std::size_t>(i)], i) < threshold) continue;
    running += weights[static_cast<std::size_t>(i)];
    if (u < running) return i;
  }
  XPURT_INTERNAL_ASSERT(false, "sample_rows: the draw ", u, " fell outside the kept weights' sum");
  return 0;
}

namespace {

// The CSR of the rows' seen lists, for the rows whose penalty reads them (Note [Sampling rows where the logits are]).
void seen_lists(const std::vector<rs::RowParams>& params, const std::vector<const std::vector<std::int64_t>*>& seen,
                std::vector<std::int64_t>* offsets, std::vector<std::int64_t>* ids) {
  offsets->assign(1, 0);
  for (std::size_t r = 0; r < params.size(); ++r) {
    if (params[r].penalty != 1.0f && seen[r] != nullptr) ids->insert(ids->end(), seen[r]->begin(), seen[r]->end());
    offsets->push_back(static_cast<std::int64_t>(ids->size()));
  }
}

// The kernel's arguments from the host, in one copy: the rows' parameters, then the seen lists' offsets and ids.
struct Uploaded {
  Tensor bytes;  // on the device
  const void* params = nullptr;
  const std::int64_t* offsets = nullptr;
  const std::int64_t* ids = nullptr;
};

Uploaded upload(const std::vector<rs::RowParams>& params, const std::vector<std::int64_t>& offsets,
                const std::vector<std::int64_t>& ids, Device device, const StreamView& stream) {
  static_assert(sizeof(rs::RowParams) % sizeof(std::int64_t) == 0, "the offsets follow the parameters aligned");
  const std::size_t params_bytes = params.size() * sizeof(rs::RowParams);
  const std::size_t offsets_bytes = offsets.size() * sizeof(std::int64_t);
  const std::size_t ids_bytes = ids.size() * sizeof(std::int64_t);
  Tensor host = Tensor::empty({static_cast<std::int64_t>(params_bytes + offsets_bytes + ids_bytes)}, DType::kUInt8);
  auto* at = static_cast<unsigned char*>(host.data_ptr());
  std::memcpy(at, params.data(), params_bytes);
  std::memcpy(at + params_bytes, offsets.data(), offsets_bytes);
  std::memcpy(at + params_bytes + offsets_bytes, ids.data(), ids_bytes);
  Uploaded out;
  out.bytes = host.to(device, &stream);
  const auto* base = static_cast<const unsigned char*>(out.bytes.data_ptr());
  out.params = base;
  out.offsets = reinterpret_cast<const std::int64_t*>(base + params_bytes);
  out.ids = reinterpret_cast<const std::int64_t*>(base + params_bytes + offsets_bytes);
  return out;
}

std::vector<std::int64_t> sample_on_device(const Tensor& rows, const std::vector<rs::RowParams>& params,
                                           const std::vector<const std::vector<std::int64_t>*>& seen) {
  const auto kernel = required_device_kernel(device_kernels().sample_rows, "sample_rows",
                                             "GenerationConfig(sampling='device') on a CUDA device");
  const std::int64_t batch = rows.shape()[0], vocab = rows.shape()[1];
  const Device device = rows.device();
  const StreamView stream = StreamManager::instance().current_stream(device);
  std::vector<std::int64_t> offsets, ids;
  seen_lists(params, seen, &offsets, &ids);
  if (ids.empty()) ids.push_back(-1);  // the kernel's argument stays a device pointer; no row's range reads it
  const Uploaded arguments = upload(params, offsets, ids, device, stream);
  Tensor workspace = Tensor::empty({batch, vocab}, DType::kFloat32, device, &stream);
  Tensor tokens = Tensor::empty({batch}, DType::kInt64, device, &stream);
  {
#if XPURT_WITH_CUDA
    detail::CudaDeviceGuard guard(device.index);
#endif
    kernel(rows.data_ptr(), rows.dtype(), batch, vocab, arguments.params, arguments.offsets, arguments.ids,
           static_cast<float*>(workspace.data_ptr()), static_cast<std::int64_t*>(tokens.data_ptr()), stream.handle);
  }
  const Tensor host = tokens.to(Device::cpu(), &stream);
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch));
  std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(std::int64_t));
  for (std::int64_t t : out) XPURT_INTERNAL_ASSERT(t >= 0 && t < vocab, "sample_rows drew no token (", t, ")");
  return out;
}

}  // namespace

std::vector<std::int64_t> sample_rows(const Tensor& rows, const std::vector<rs::RowParams>& params,
                                      const std::vector<const std::vector<std::int64_t>*>& seen) {
  XPURT_CHECK_TYPE(rows.dim() == 2, "sample_rows: logits rows should be [batch, vocab], got ", rows.str());
  XPURT_CHECK_TYPE(rows.dtype() == DType::kFloat32 || rows.dtype() == DType::kFloat16 ||
                       rows.dtype() == DType::kBFloat16,
                   "sample_rows: logits should be float32, float16 or bfloat16, got ", rows.str());
  const auto batch = static_cast<std::size_t>(rows.shape()[0]);
  XPURT_CHECK(params.size() == batch && seen.size() == batch, "sample_rows: ", batch, " rows but ", params.size(),
              " parameter sets and ", seen.size(), " seen lists");
  if (batch == 0) return {};
  if (rows.device().is_cuda()) return sample_on_device(rows.contiguous(), params, seen);
  const Tensor host = rows.device().is_cpu() ? rows : rows.to(Device::cpu());
  std::vector<std::int64_t> out(batch);
  static const std::vector<std::int64_t> nothing;
  for (std::size_t r = 0; r < batch; ++r) {
    const std::vector<float> x = step_io::host_row(host, static_cast<std::int64_t>(r), "logits");
    out[r] = sample_row_host(x.data(), static_cast<std::int64_t>(x.size()), params[r],
                             seen[r] != nullptr ? *seen[r] : nothing);
  }
  return out;
}

}  // namespace xpuruntime::generation
