// What a generation step feeds and reads (step_io.h).
#include "generation/step_io.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

#include "core/cuda_utils.h"
#include "core/device_kernels.h"
#include "core/half.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime::generation::step_io {

namespace {

// Elements [at, at + count) of the int64 or int32 host tensor `t` from `values`.
void store_ints(const std::int64_t* values, std::int64_t count, Tensor& t, std::int64_t at) {
  if (t.dtype() == DType::kInt64) {
    std::copy(values, values + count, static_cast<std::int64_t*>(t.data_ptr()) + at);
  } else {
    std::transform(values, values + count, static_cast<std::int32_t*>(t.data_ptr()) + at,
                   [](std::int64_t v) { return static_cast<std::int32_t>(v); });
  }
}

// positions_of's rule at one position: the mask's sum up to it, less one, where the mask is set; 1 where it is not.
std::int64_t position_from(std::int64_t seen, std::int64_t m) { return m != 0 ? seen - 1 : 1; }

}  // namespace

Tensor host_matrix(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t from, DType dtype) {
  const auto batch = static_cast<std::int64_t>(rows.size());
  const std::int64_t width = static_cast<std::int64_t>(rows.front().size()) - from;
  Tensor t = Tensor::empty({batch, width}, dtype);
  for (std::int64_t r = 0; r < batch; ++r) {
    store_ints(rows[static_cast<std::size_t>(r)].data() + from, width, t, r * width);
  }
  return t;
}

Tensor host_tensor(const std::vector<std::int64_t>& values, const std::vector<std::int64_t>& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  XPURT_INTERNAL_ASSERT(static_cast<std::int64_t>(values.size()) == t.numel(), "host_tensor: ", values.size(),
                        " values for ", t.numel(), " elements");
  store_ints(values.data(), t.numel(), t, 0);
  return t;
}

std::vector<std::vector<std::int64_t>> positions_of(const std::vector<std::vector<std::int64_t>>& mask) {
  std::vector<std::vector<std::int64_t>> out(mask.size());
  for (std::size_t r = 0; r < mask.size(); ++r) {
    std::int64_t seen = 0;
    for (std::int64_t m : mask[r]) {
      seen += m;
      out[r].push_back(position_from(seen, m));
    }
  }
  return out;
}

std::int64_t last_position_of(const std::vector<std::int64_t>& mask) {
  return position_from(std::accumulate(mask.begin(), mask.end(), std::int64_t{0}), mask.back());
}

// Note [Logits read back]
// A decoder's logits output is [batch, seq, vocab]; a step needs one position of each row (the last, or for a
// right-padded prefill the row's last prompt position). The prefill's output is large (Llama-3's vocabulary of 128,256
// at 512 positions: 131 MB a row in float16), so the output stays on the session's device and only the rows'
// positions are read: position_rows makes them one [batch, vocab] there (a view when seq is 1, else one strided copy
// or a copy per row), and either the greedy tokens are picked there (device_argmax: one argmax kernel, the batch's
// token ids copied back) or that [batch, vocab] is copied to the host for the Sampler. Before, the whole output was
// copied to fresh host memory at every step: on an H200 the 1B Llama's prefill of 8 x 512 tokens took 837 ms of wall
// time for 21 ms of device work, and a batch-8 decode step 8.75 ms for 2.9 ms.

Tensor position_rows(const Tensor& logits, const std::vector<std::int64_t>& positions, const std::string& name) {
  XPURT_CHECK_TYPE(logits.dim() == 3 && logits.shape()[0] == static_cast<std::int64_t>(positions.size()),
                   "logits output '", name, "' should be [batch, seq, vocab] with batch ", positions.size(), ", got ",
                   logits.str());
  const std::int64_t batch = logits.shape()[0], seq = logits.shape()[1], vocab = logits.shape()[2];
  for (std::int64_t p : positions) {
    XPURT_CHECK_TYPE(p >= 0 && p < seq, "logits output '", name, "' has ", seq, " positions; position ", p,
                     " is out of range (", logits.str(), ")");
  }
  const Tensor all = logits.contiguous();
  const auto es = static_cast<std::int64_t>(all.element_size());
  const auto at = [&](std::int64_t row, std::int64_t position, std::int64_t rows, std::vector<std::int64_t> strides) {
    const std::int64_t offset = (row * seq + position) * vocab * es;
    return Tensor::from_blob(static_cast<char*>(all.data_ptr()) + offset, {rows, vocab}, std::move(strides),
                             all.dtype(), all.device(), all.storage(), all.nbytes() - static_cast<std::size_t>(offset));
  };
  const bool one_position =
      std::all_of(positions.begin(), positions.end(), [&](std::int64_t p) { return p == positions.front(); });
  if (batch == 0 || one_position) {
    return batch == 0 ? at(0, 0, 0, {vocab, 1}) : at(0, positions[0], batch, {seq * vocab, 1}).contiguous();
  }
  Tensor out = Tensor::empty({batch, vocab}, all.dtype(), all.device());
  std::vector<Tensor> into;
  std::vector<Tensor> from;
  for (std::int64_t r = 0; r < batch; ++r) {
    const std::int64_t offset = r * vocab * es;
    into.push_back(Tensor::from_blob(static_cast<char*>(out.data_ptr()) + offset, {1, vocab}, {}, out.dtype(),
                                     out.device(), out.storage(), out.nbytes() - static_cast<std::size_t>(offset)));
    from.push_back(at(r, positions[static_cast<std::size_t>(r)], 1, {}));
  }
  copy_tensors(into, from);  // the rows in one launch on CUDA (Note [Copies in one launch] in core/tensor.cpp)
  return out;
}

namespace {

// float16 bits -> float32 for every bit pattern (256 KiB, built on first use): a row of a large vocabulary converts
// by lookups instead of detail::half_to_float's branches per element.
const std::vector<float>& half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      t[bits] = detail::half_to_float(static_cast<std::uint16_t>(bits));
    }
    return t;
  }();
  return table;
}

}  // namespace

std::vector<float> host_row(const Tensor& rows, std::int64_t row, const std::string& name) {
  XPURT_CHECK_TYPE(rows.dim() == 2 && row >= 0 && row < rows.shape()[0] && rows.device().is_cpu(), "logits rows of '",
                   name, "' should be [batch, vocab] on the host with a row ", row, ", got ", rows.str());
  const Tensor host = rows.contiguous();
  const std::int64_t vocab = host.shape()[1];
  const std::int64_t at = row * vocab;
  std::vector<float> out(static_cast<std::size_t>(vocab));
  switch (host.dtype()) {
    case DType::kFloat32:
      std::memcpy(out.data(), static_cast<const float*>(host.data_ptr()) + at, out.size() * sizeof(float));
      break;
    case DType::kFloat16: {
      const auto* bits = static_cast<const std::uint16_t*>(host.data_ptr()) + at;
      const float* table = half_table().data();
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = table[bits[i]];
      break;
    }
    case DType::kBFloat16: {
      const auto* bits = static_cast<const std::uint16_t*>(host.data_ptr()) + at;
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = detail::bfloat16_to_float(bits[i]);
      break;
    }
    default:
      throw InvalidTypeError(detail::str_cat("logits output '", name, "' is ", dtype_name(host.dtype()),
                                             "; expected float32, float16 or bfloat16"));
  }
  return out;
}

namespace {

// Whether the greedy tokens of `rows` can be picked where they are: a CUDA tensor in a build with argmax_rows.
bool argmax_on_device(const Tensor& rows) {
  const DType t = rows.dtype();
  return rows.device().is_cuda() && device_kernels().argmax_rows != nullptr &&
         (t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16);
}

// The argmax of every row of `rows` ([batch, vocab] on a CUDA device) taken there; only the tokens come back.
std::vector<std::int64_t> device_argmax(const Tensor& rows) {
  XPURT_CHECK(argmax_on_device(rows) && rows.dim() == 2 && rows.is_contiguous(),
              "device_argmax: expected contiguous float [batch, vocab] logits on a CUDA device, got ", rows.str());
  const std::int64_t batch = rows.shape()[0];
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch));
  if (batch == 0) return out;
  constexpr std::size_t kWorkspaceBytes = 64 * 1024;  // candidates of split rows (Note [Split arg reductions])
  const StreamView stream = StreamManager::instance().current_stream(rows.device());
  Tensor tokens = Tensor::empty({batch}, DType::kInt64, rows.device(), &stream);
  Tensor workspace = Tensor::empty({static_cast<std::int64_t>(kWorkspaceBytes)}, DType::kUInt8, rows.device(), &stream);
  {
#if XPURT_WITH_CUDA  // a CPU build has no argmax_rows: argmax_on_device was false
    detail::CudaDeviceGuard guard(rows.device().index);
#endif
    device_kernels().argmax_rows(rows.data_ptr(), rows.dtype(), batch, rows.shape()[1],
                                 static_cast<std::int64_t*>(tokens.data_ptr()), workspace.data_ptr(), kWorkspaceBytes,
                                 stream.handle);
  }
  const Tensor host = tokens.to(Device::cpu(), &stream);
  std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(std::int64_t));
  return out;
}

}  // namespace

namespace {

// Note [Rows picked in parallel]
// The host Sampler takes milliseconds a row when the rows' logits are flat over a large vocabulary (a random-weight
// model's: top_p 0.9 keeps most of 128,256 tokens, and the walk sorts them; Note [Sampling without sorting the
// vocabulary]), and a batch's rows were picked one after the other. Rows are independent (each has its own Sampler
// stream and seen list), so sampled rows of a vocabulary of kParallelVocab or more are picked by up to one thread per
// core (std::thread::hardware_concurrency, at most kPickThreads), each claiming the next row; which thread picks a row
// does not change its token. Greedy rows (an argmax: microseconds) and small vocabularies stay on the caller.
constexpr std::int64_t kParallelVocab = 4096;
constexpr unsigned kPickThreads = 16;

void pick_rows_in_parallel(std::size_t count, unsigned threads,
                           const std::function<void(std::size_t)>& pick_row) {
  std::atomic<std::size_t> next{0};
  std::mutex failed;
  std::size_t failed_row = count;
  std::exception_ptr error;
  const auto worker = [&] {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      try {
        pick_row(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failed);
        if (i < failed_row) {
          failed_row = i;
          error = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads: the caller and those started pick every row
    }
  }
  worker();
  for (std::thread& helper : helpers) helper.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

PickedTokens pick_tokens(const Tensor& rows, std::size_t count, bool argmax_only, const PickRow& sample) {
  PickedTokens out;
  if (argmax_only && argmax_on_device(rows)) {
    const std::vector<std::int64_t> ids = device_argmax(rows);
    out.tokens.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(count, ids.size())));
    out.on_device = true;
    return out;
  }
  const Tensor host = rows.device().is_cpu() ? rows : rows.to(Device::cpu());
  out.tokens.resize(count);
  const unsigned cores = std::max(1u, std::min(std::thread::hardware_concurrency(), kPickThreads));
  const bool parallel =
      !argmax_only && count > 1 && cores > 1 && host.dim() >= 1 && host.shape().back() >= kParallelVocab;
  if (!parallel) {
    for (std::size_t i = 0; i < count; ++i) out.tokens[i] = sample(i, host);
    return out;
  }
  pick_rows_in_parallel(count, std::min<unsigned>(cores, static_cast<unsigned>(count)),
                        [&](std::size_t i) { out.tokens[i] = sample(i, host); });
  return out;
}

Tensor bound_output(const IoBinding& binding, const std::string& name) {
  const std::vector<std::string> names = binding.output_names();
  const auto it = std::find(names.begin(), names.end(), name);
  XPURT_INTERNAL_ASSERT(it != names.end(), "output '", name, "' was not bound");
  return binding.outputs()[static_cast<std::size_t>(it - names.begin())];
}

row_sampling::RowParams row_params(const GenerationConfig& config, std::uint64_t stream, std::uint64_t counter) {
  row_sampling::RowParams p;
  p.temperature = static_cast<float>(config.temperature);
  p.top_p = static_cast<float>(config.top_p);
  p.penalty = static_cast<float>(config.repetition_penalty);
  p.greedy = config.do_sample ? 0 : 1;
  p.top_k = config.top_k;
  p.seed = config.seed;
  p.stream = stream;
  p.counter = counter;
  return p;
}

Tensor cache_branch(bool value) {
  Tensor branch = Tensor::empty({1}, DType::kBool);
  *static_cast<bool*>(branch.data_ptr()) = value;
  return branch;
}

}  // namespace xpuruntime::generation::step_io
