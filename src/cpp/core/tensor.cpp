#include "xpuruntime/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "cuda_utils.h"
#include "device_kernels.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"

namespace xpuruntime {

namespace {

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::int64_t checked_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, "Expected non-negative dimensions, but got shape ", shape_str(shape));
    XPURT_CHECK(d == 0 || n <= (std::int64_t{1} << 56) / std::max<std::int64_t>(d, 1),
                "The shape ", shape_str(shape), " has too many elements");
    n *= d;
  }
  return n;
}

// Element offsets (relative to the first element) of the lowest and highest element of a view.
void span_of(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides, std::int64_t* lo,
             std::int64_t* hi) {
  *lo = 0;
  *hi = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) {
      *lo = *hi = 0;
      return;
    }
    const std::int64_t extent = (shape[i] - 1) * strides[i];
    if (extent < 0) *lo += extent; else *hi += extent;
  }
}

// True when the view covers exactly numel elements without gaps or overlaps (a permuted contiguous layout).
bool is_dense(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides) {
  std::vector<std::size_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return strides[a] < strides[b]; });
  std::int64_t expected = 1;
  for (std::size_t i : order) {
    if (shape[i] == 1) continue;
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool same_layout(const Tensor& a, const Tensor& b) {
  for (int i = 0; i < a.dim(); ++i) {
    if (a.shape()[i] != 1 && a.strides()[i] != b.strides()[i]) return false;
  }
  return true;
}

// Copies every element of a strided view to another strided view, both in host memory.
void copy_strided_host(char* dst, const std::vector<std::int64_t>& dst_strides, const char* src,
                       const std::vector<std::int64_t>& src_strides, const std::vector<std::int64_t>& shape,
                       std::size_t element_size) {
  const std::size_t ndim = shape.size();
  for (std::int64_t d : shape) {
    if (d == 0) return;
  }
  if (ndim == 0) {
    std::memcpy(dst, src, element_size);
    return;
  }
  const auto es = static_cast<std::int64_t>(element_size);
  std::vector<std::int64_t> index(ndim, 0);
  const std::int64_t inner = shape[ndim - 1];
  const std::int64_t ds = dst_strides[ndim - 1] * es;
  const std::int64_t ss = src_strides[ndim - 1] * es;
  while (true) {
    std::int64_t d_off = 0;
    std::int64_t s_off = 0;
    for (std::size_t i = 0; i + 1 < ndim; ++i) {
      d_off += index[i] * dst_strides[i] * es;
      s_off += index[i] * src_strides[i] * es;
    }
    if (ds == es && ss == es) {
      std::memcpy(dst + d_off, src + s_off, static_cast<std::size_t>(inner * es));
    } else {
      for (std::int64_t j = 0; j < inner; ++j) std::memcpy(dst + d_off + j * ds, src + s_off + j * ss, element_size);
    }
    std::size_t i = ndim - 1;
    while (i > 0) {
      --i;
      if (++index[i] < shape[i]) break;
      index[i] = 0;
      if (i == 0) return;
    }
    if (ndim == 1) return;
  }
}

// Note [Disjoint views of one storage]
// A copy between two views of one storage must not read what it writes; copy_from stages the source when they may
// share an element, and copy_tensors batches only pairs that cannot. Views whose element spans do not meet are
// disjoint. Views of one shape and strides whose spans meet (two positions of one KV cache buffer: the same
// [batch, heads, 1, head_dim] view at two offsets) share an element exactly when the offsets' difference d is
// sum_k i_k * stride_k with |i_k| < shape_k; offset_reachable decides it dimension by dimension from the largest
// stride, where at most two i_k can leave a remainder the smaller dimensions reach when each stride exceeds what the
// dimensions below it span (a layout that does not overlap itself). Any other pair of views whose spans meet counts
// as overlapping: staged, never wrong.

// Whether d = sum_k i_k * strides[k] for some |i_k| < shape[k], over `dims` sorted by descending stride (all > 0,
// shapes > 1) from position k on; `below[k]` is what the dimensions after k span. nullopt: undecided (interleaved).
std::optional<bool> offset_reachable(std::int64_t d, const std::vector<std::pair<std::int64_t, std::int64_t>>& dims,
                                     const std::vector<std::int64_t>& below, std::size_t k) {
  if (k == dims.size()) return d == 0;
  const auto [stride, size] = dims[k];
  if (stride <= below[k]) return std::nullopt;
  // i with |d - i * stride| <= below[k]: floor((d + below) / stride) and at most one below it.
  const std::int64_t hi_num = d + below[k];
  std::int64_t hi = hi_num / stride - (hi_num % stride != 0 && hi_num < 0 ? 1 : 0);
  for (std::int64_t i = hi; i >= hi - 1; --i) {
    if (i < -(size - 1) || i > size - 1) continue;
    const std::int64_t rest = d - i * stride;
    if (rest < -below[k] || rest > below[k]) continue;
    const std::optional<bool> r = offset_reachable(rest, dims, below, k + 1);
    if (!r.has_value() || *r) return r;
  }
  return false;
}

StreamView copy_stream(const Tensor& dst, const Tensor& src, const StreamView* stream) {
  const Device cuda = dst.device().is_cuda() ? dst.device() : src.device();
  if (stream != nullptr) {
    XPURT_CHECK(stream->device == cuda, "The copy involves ", cuda.str(), " but the stream is on ",
                stream->device.str());
    return *stream;
  }
  return StreamManager::instance().current_stream(cuda);
}

// Raw byte copy between host/device memory on `stream` (or synchronously on the CPU).
void copy_bytes(void* dst, const void* src, std::size_t bytes, const StreamView& stream, bool host_only) {
  if (bytes == 0) return;
  if (host_only) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(stream.device.index);
  XPURT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream.handle)));
#else
  (void)stream;
  XPURT_THROW_NO_CUDA_BUILD("A device copy");
#endif
}

}  // namespace

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i > 1; --i) {
    // A tensor with no elements may have other dims whose product overflows (found by fuzz_model: an initializer
    // of shape [.., 0, ..] with huge dims). Its strides address nothing: they saturate instead of overflowing. A
    // tensor with elements cannot overflow here (checked_numel bounds the product).
    std::int64_t stride = 0;
    if (__builtin_mul_overflow(strides[i - 1], std::max<std::int64_t>(shape[i - 1], 1), &stride)) {
      stride = std::numeric_limits<std::int64_t>::max();
    }
    strides[i - 2] = stride;
  }
  return strides;
}

Tensor Tensor::empty(const std::vector<std::int64_t>& shape, DType dtype, Device device, const StreamView* stream,
                     bool pinned) {
  const std::int64_t n = checked_numel(shape);
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>();
  storage->device = device;
  DataPtr data;
  if (pinned) {
    XPURT_CHECK(device.is_cpu(), "pinned=True is for host (cpu) tensors, but the device is ", device.str());
    const StreamView s = stream != nullptr ? *stream : StreamView();
    data = MemoryManager::instance().allocate_pinned(bytes, s);
    storage->pinned = true;
    storage->stream = s;
  } else if (device.is_cuda()) {
    DeviceManager::instance().check_device(device);
    const StreamView s = stream != nullptr ? *stream : StreamManager::instance().current_stream(device);
    data = MemoryManager::instance().allocate(device, bytes, s);
    storage->stream = s;
  } else {
    data = MemoryManager::instance().allocate(device, bytes, StreamView());
  }
  storage->data = data.get();
  storage->nbytes = bytes;
  storage->owner = std::make_shared<DataPtr>(std::move(data));
  storage->from_memory_manager = true;
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const std::vector<std::int64_t>& shape, DType dtype, Device device, const StreamView* stream) {
  Tensor t = empty(shape, dtype, device, stream);
  t.zero_(stream);
  return t;
}

Tensor Tensor::from_blob(void* data, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                         DType dtype, Device device, std::shared_ptr<void> owner, std::size_t storage_bytes) {
  const std::int64_t n = checked_numel(shape);
  XPURT_CHECK(strides.empty() || strides.size() == shape.size(), "from_blob: got ", strides.size(),
              " strides for a shape of ", shape.size(), " dimensions");
  XPURT_CHECK(data != nullptr || n == 0, "from_blob: null data for a tensor of ", n, " elements");
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  t.dtype_ = dtype;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  span_of(t.shape_, t.strides_, &lo, &hi);
  auto storage = std::make_shared<Storage>();
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  // The storage starts at the lowest element the view touches; the view's offset points at element 0.
  storage->data = static_cast<char*>(data) + lo * es;
  storage->nbytes = storage_bytes != 0 ? storage_bytes : static_cast<std::size_t>((hi - lo + (n > 0 ? 1 : 0)) * es);
  storage->device = device;
  storage->owner = std::move(owner);
  if (device.is_cuda()) storage->stream = StreamView(device, nullptr);
  t.offset_ = -lo;
  t.storage_ = std::move(storage);
  return t;
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape_) n *= d;
  return n;
}

void* Tensor::data_ptr() const {
  if (!storage_ || storage_->data == nullptr) return nullptr;
  return static_cast<char*>(storage_->data) + offset_ * static_cast<std::int64_t>(element_size());
}

bool Tensor::is_contiguous() const {
  // An empty tensor is contiguous whatever its other dims (which may be huge: [0, 2^40, 2^40] from a fuzzed model);
  // otherwise a run of strides whose product overflows cannot be one block of memory.
  if (std::find(shape_.begin(), shape_.end(), std::int64_t{0}) != shape_.end()) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i > 0; --i) {
    const std::int64_t d = shape_[i - 1];
    if (d == 1) continue;
    if (strides_[i - 1] != expected || __builtin_mul_overflow(expected, d, &expected)) return false;
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return detail::str_cat("Tensor(shape=", shape_str(shape_), ", dtype=", dtype_name(dtype_), ", device=",
                         device().str(), is_pinned() ? ", pinned" : "", ")");
}

Tensor Tensor::to(Device device, const StreamView* stream, bool non_blocking) const {
  XPURT_CHECK(defined(), "to(): the tensor is undefined");
  if (device == this->device()) return *this;
  DeviceManager::instance().check_device(device);
  if (is_contiguous() || device.is_cuda() == false || is_dense(shape_, strides_)) {
    // Same strides when dense (a single span copy), else contiguous.
    Tensor out = empty(shape_, dtype_, device, device.is_cuda() ? stream : nullptr);
    if (!is_contiguous() && is_dense(shape_, strides_)) {
      out.strides_ = strides_;
      std::int64_t lo = 0;
      std::int64_t hi = 0;
      span_of(shape_, strides_, &lo, &hi);
      out.offset_ = -lo;
    }
    out.copy_from(*this, stream, non_blocking);
    return out;
  }
  return contiguous().to(device, stream, non_blocking);
}

Tensor Tensor::view(DType dtype) const {
  XPURT_CHECK(defined(), "view(): the tensor is undefined");
  XPURT_CHECK_TYPE(dtype_size(dtype) == element_size(), "view(): cannot reinterpret ", dtype_name(dtype_), " (",
                   element_size(), "-byte elements) as ", dtype_name(dtype), " (", dtype_size(dtype),
                   "-byte elements); view() only changes between dtypes of one element size, e.g. uint16 <-> "
                   "bfloat16; use a cast to convert values");
  Tensor out = *this;
  out.dtype_ = dtype;
  return out;
}

Tensor Tensor::contiguous() const {
  XPURT_CHECK(defined(), "contiguous(): the tensor is undefined");
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device(), device().is_cuda() ? &storage_->stream : nullptr);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src, const StreamView* stream, bool non_blocking) {
  XPURT_CHECK(defined() && src.defined(), "copy_from: both tensors must be defined");
  XPURT_CHECK_TYPE(src.dtype_ == dtype_, "copy_from: expected a source of dtype ", dtype_name(dtype_), ", but got ",
                   dtype_name(src.dtype_), " (convert dtypes explicitly)");
  XPURT_CHECK(src.shape_ == shape_, "copy_from: expected a source of shape ", shape_str(shape_), ", but got ",
              shape_str(src.shape_));
  if (numel() == 0) return;
  const bool host_only = device().is_cpu() && src.device().is_cpu();
  const std::size_t es = element_size();
  // One span copy when both views are dense with the same layout (on the host too: not one per inner row).
  if (is_dense(shape_, strides_) && same_layout(*this, src)) {
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    span_of(shape_, strides_, &lo, &hi);
    const auto off = lo * static_cast<std::int64_t>(es);
    const StreamView s = host_only ? StreamView() : copy_stream(*this, src, stream);
    copy_bytes(static_cast<char*>(data_ptr()) + off, static_cast<const char*>(src.data_ptr()) + off,
               static_cast<std::size_t>(numel()) * es, s, host_only);
    if (!host_only && !non_blocking) s.synchronize();
    return;
  }
  if (host_only) {
    copy_strided_host(static_cast<char*>(data_ptr()), strides_, static_cast<const char*>(src.data_ptr()),
                      src.strides_, shape_, es);
    return;
  }
  const StreamView s = copy_stream(*this, src, stream);
  auto finish = [&] {
    if (!non_blocking) s.synchronize();
  };
  if (device().is_cpu()) {
    // Bring the source's whole span to the host, then rearrange there.
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    span_of(src.shape_, src.strides_, &lo, &hi);
    const auto span_bytes = static_cast<std::size_t>(hi - lo + 1) * es;
    Tensor staging = empty({static_cast<std::int64_t>(span_bytes)}, DType::kUInt8, Device::cpu());
    copy_bytes(staging.data_ptr(), static_cast<const char*>(src.data_ptr()) + lo * static_cast<std::int64_t>(es),
               span_bytes, s, false);
    s.synchronize();
    copy_strided_host(static_cast<char*>(data_ptr()), strides_,
                      static_cast<const char*>(staging.data_ptr()) - lo * static_cast<std::int64_t>(es), src.strides_,
                      shape_, es);
    return;
  }
  if (src.device().is_cpu() && is_dense(shape_, strides_)) {
    // Lay the source out like the destination on the host, then one span copy.
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    span_of(shape_, strides_, &lo, &hi);
    Tensor staging = empty({hi - lo + 1}, dtype_, Device::cpu());
    staging.shape_ = shape_;
    staging.strides_ = strides_;
    staging.offset_ = -lo;
    staging.copy_from(src);
    copy_bytes(static_cast<char*>(data_ptr()) + lo * static_cast<std::int64_t>(es),
               static_cast<const char*>(staging.data_ptr()) + lo * static_cast<std::int64_t>(es),
               static_cast<std::size_t>(numel()) * es, s, false);
    s.synchronize();  // the staging buffer dies here
    return;
  }
  // Different layouts on a CUDA destination: the cuda_raw gather kernel rearranges the elements on this device
  // (through the device kernels table: Note [Device kernels table] in core/device_kernels.h).
  const auto strided_copy = device_kernels().strided_copy;
  if (strided_copy == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "copy_from: a strided copy into ", device().str(), " from ", src.device().str(), " with a different layout (",
        shape_str(strides_), " vs ", shape_str(src.strides_),
        " strides) needs the cuda_raw backend's device kernel, which this build lacks (it needs CUDA); copy through "
        "the host or make both tensors contiguous"));
  }
  // A source elsewhere (the host, another GPU) first comes here contiguously; a source sharing this tensor's
  // storage is first copied out, since the kernel's reads and writes must not overlap.
  Tensor source = src;
  if (src.device() != device()) {
    source = src.contiguous().to(device(), &s, false);
  } else if (may_overlap(*this, src)) {
    source = empty(shape_, dtype_, device(), &s);
    source.copy_from(src, &s, true);
  }
  {
#if XPURT_WITH_CUDA  // a CPU build has no strided_copy: it threw above
    detail::CudaDeviceGuard guard(device().index);
#endif
    strided_copy(source.data_ptr(), data_ptr(), dtype_, shape_, source.strides_, strides_, s.handle);
  }
  finish();
}

bool may_overlap(const Tensor& a, const Tensor& b) {
  // By address, not by storage: from_blob views of one buffer have storages of their own.
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  const auto es = static_cast<std::int64_t>(a.element_size());
  std::int64_t alo = 0, ahi = 0, blo = 0, bhi = 0;
  span_of(a.shape(), a.strides(), &alo, &ahi);
  span_of(b.shape(), b.strides(), &blo, &bhi);
  const auto ao = reinterpret_cast<std::intptr_t>(a.data_ptr()), bo = reinterpret_cast<std::intptr_t>(b.data_ptr());
  if (ao + (ahi + 1) * es <= bo + blo * static_cast<std::int64_t>(b.element_size()) ||
      bo + (bhi + 1) * static_cast<std::int64_t>(b.element_size()) <= ao + alo * es) {
    return false;
  }
  if (a.element_size() != b.element_size() || a.shape() != b.shape() || a.strides() != b.strides() ||
      (bo - ao) % es != 0) {
    return true;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;
  for (int k = 0; k < a.dim(); ++k) {
    if (a.shape()[k] > 1 && a.strides()[k] == 0) return true;  // a broadcast view: not worth deciding
    if (a.shape()[k] > 1) dims.emplace_back(std::abs(a.strides()[k]), a.shape()[k]);
  }
  std::sort(dims.begin(), dims.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<std::int64_t> below(dims.size(), 0);
  for (std::size_t k = dims.size(); k-- > 1;) below[k - 1] = below[k] + (dims[k].second - 1) * dims[k].first;
  return offset_reachable((bo - ao) / es, dims, below, 0).value_or(true);
}

// Note [Copies in one launch]
// A decode step of a static KV cache moves one position of every layer's key and value (Note [Static cache layout]
// in generation/kv_cache.cpp): 32 to 64 small strided copies a step, each a launch (two when the source shares the
// destination's buffer and copy_from stages it). copy_tensors makes them one launch (cuda_raw::strided_copy_pairs)
// when the pairs allow it: every destination on one CUDA device and every source there too, one dtype, one shape, the
// destinations of one layout and the sources of one, and no destination sharing an element with any source or other
// destination (Note [Disjoint views of one storage]), so that the order of the copies cannot matter. Anything else
// is copied pair by pair with copy_from, in order, which is the meaning of the call either way.
bool copy_tensors(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs, const StreamView* stream,
                  bool non_blocking) {
  XPURT_CHECK(dsts.size() == srcs.size(), "copy_tensors: ", dsts.size(), " destinations for ", srcs.size(),
              " sources");
  for (std::size_t i = 0; i < dsts.size(); ++i) {
    XPURT_CHECK(dsts[i].defined() && srcs[i].defined(), "copy_tensors: pair ", i, " has an undefined tensor");
    XPURT_CHECK_TYPE(dsts[i].dtype() == srcs[i].dtype(), "copy_tensors: pair ", i, " copies ",
                     dtype_name(srcs[i].dtype()), " into ", dtype_name(dsts[i].dtype()),
                     " (convert dtypes explicitly)");
    XPURT_CHECK(dsts[i].shape() == srcs[i].shape(), "copy_tensors: pair ", i, " copies a source of shape ",
                shape_str(srcs[i].shape()), " into a destination of shape ", shape_str(dsts[i].shape()));
  }
  const auto batched = device_kernels().strided_copy_pairs;
  bool one_launch = batched != nullptr && dsts.size() > 1;
  for (std::size_t i = 0; one_launch && i < dsts.size(); ++i) {
    const Tensor& d = dsts[i];
    const Tensor& r = srcs[i];
    one_launch = d.device().is_cuda() && r.device() == dsts[0].device() && d.device() == dsts[0].device() &&
                 d.dtype() == dsts[0].dtype() && d.shape() == dsts[0].shape() && d.strides() == dsts[0].strides() &&
                 r.strides() == srcs[0].strides();
    for (std::size_t j = 0; one_launch && j < dsts.size(); ++j) {
      one_launch = !may_overlap(d, srcs[j]) && (j == i || !may_overlap(d, dsts[j]));
    }
  }
  if (!one_launch) {
    // Queued pair by pair; then, unless non_blocking, each stream involved is waited for once.
    std::vector<StreamView> used;
    for (std::size_t i = 0; i < dsts.size(); ++i) {
      Tensor into = dsts[i];
      into.copy_from(srcs[i], stream, /*non_blocking=*/true);
      if (into.device().is_cpu() && srcs[i].device().is_cpu()) continue;
      const StreamView s = copy_stream(into, srcs[i], stream);
      if (std::none_of(used.begin(), used.end(), [&](const StreamView& u) { return u.device == s.device; })) {
        used.push_back(s);
      }
    }
    if (!non_blocking) {
      for (const StreamView& s : used) s.synchronize();
    }
    return false;
  }
  if (dsts[0].numel() == 0) return true;
  const StreamView s = copy_stream(dsts[0], srcs[0], stream);
  std::vector<const void*> from;
  std::vector<void*> into;
  for (std::size_t i = 0; i < dsts.size(); ++i) {
    from.push_back(srcs[i].data_ptr());
    into.push_back(dsts[i].data_ptr());
  }
  {
#if XPURT_WITH_CUDA  // a CPU build has no strided_copy_pairs: one_launch is false there
    detail::CudaDeviceGuard guard(dsts[0].device().index);
#endif
    batched(from, into, dsts[0].dtype(), dsts[0].shape(), srcs[0].strides(), dsts[0].strides(), s.handle);
  }
  if (!non_blocking) s.synchronize();
  return true;
}

void Tensor::zero_(const StreamView* stream) {
  XPURT_CHECK(defined(), "zero_(): the tensor is undefined");
  if (numel() == 0) return;
  if (device().is_cpu()) {
    if (is_contiguous()) {
      std::memset(data_ptr(), 0, nbytes());
    } else {
      Tensor zeros = Tensor::zeros({1}, dtype_, Device::cpu());
      Tensor broadcast = zeros;
      broadcast.shape_ = shape_;
      broadcast.strides_.assign(shape_.size(), 0);
      copy_from(broadcast);
    }
    return;
  }
  XPURT_CHECK(is_dense(shape_, strides_), "zero_(): a CUDA tensor with gaps between its elements (strides ",
              shape_str(strides_), ") needs a device kernel; zero a dense tensor instead");
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  span_of(shape_, strides_, &lo, &hi);
#if XPURT_WITH_CUDA
  const StreamView s = stream != nullptr ? *stream : storage_->stream;
  detail::CudaDeviceGuard guard(device().index);
  XPURT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(data_ptr()) + lo * static_cast<std::int64_t>(element_size()), 0,
                                   nbytes(), static_cast<cudaStream_t>(s.handle)));
#else
  (void)stream;
  XPURT_THROW_NO_CUDA_BUILD("zero_ on a CUDA tensor");
#endif
}

void Tensor::record_stream(const StreamView& stream) const {
  XPURT_CHECK(defined(), "record_stream(): the tensor is undefined");
  XPURT_CHECK(device().is_cpu() || stream.device == device(), "record_stream: the tensor is on ", device().str(),
              " but the stream is on ", stream.device.str());
  // Only memory from the MemoryManager carries a DataPtr owner; imported memory is the producer's to track.
  if (storage_->from_memory_manager) static_cast<const DataPtr*>(storage_->owner.get())->record_stream(stream);
}

}  // namespace xpuruntime
