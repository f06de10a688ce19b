// Tensor: a device-aware strided view of memory (dtype, shape, strides in elements, device).
//
// Ownership: a Tensor shares its storage (reference counted); copying a Tensor copies the view, not the data.
// Storage comes from MemoryManager (empty/zeros/to/contiguous) or from another library through DLPack
// (dlpack.h), kept alive until the last view is gone. Thread-safety: like std::shared_ptr; concurrent writes
// to the same data are the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime {

// Memory shared by tensors. `owner` keeps the memory alive (a DataPtr, a DLPack tensor, ...).
struct Storage {
  void* data = nullptr;
  std::size_t nbytes = 0;
  Device device;
  bool pinned = false;          // page-locked host memory
  StreamView stream;            // the stream the memory was allocated on (for stream-ordered frees)
  bool from_memory_manager = false;  // `owner` is a DataPtr of the MemoryManager (record_stream applies)
  std::shared_ptr<void> owner;  // released when the last tensor using the storage goes
};

class XPURT_API Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() is false

  // Uninitialised memory from the MemoryManager on `device`, ordered on `stream` (default: the device's
  // current stream). `pinned`: page-locked host memory (CPU only, needs CUDA).
  static Tensor empty(const std::vector<std::int64_t>& shape, DType dtype, Device device = Device::cpu(),
                      const StreamView* stream = nullptr, bool pinned = false);
  static Tensor zeros(const std::vector<std::int64_t>& shape, DType dtype, Device device = Device::cpu(),
                      const StreamView* stream = nullptr);
  // A view of memory owned elsewhere; `owner` keeps it alive. Empty `strides` means contiguous.
  static Tensor from_blob(void* data, const std::vector<std::int64_t>& shape,
                          const std::vector<std::int64_t>& strides, DType dtype, Device device,
                          std::shared_ptr<void> owner, std::size_t storage_bytes = 0);

  bool defined() const { return storage_ != nullptr; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }  // in elements
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const;
  std::size_t element_size() const { return dtype_size(dtype_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  std::int64_t storage_offset() const { return offset_; }  // in elements
  void* data_ptr() const;  // first element
  bool is_contiguous() const;
  bool is_pinned() const { return storage_ && storage_->pinned; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "Tensor(shape=[2, 3], dtype=float32, device=cpu)"

  // A copy on `device` (a new contiguous tensor when this one is contiguous; otherwise the same strides).
  // CUDA copies run on `stream` (default: the current stream of the CUDA device involved); unless
  // `non_blocking`, the call returns when the copy is done.
  Tensor to(Device device, const StreamView* stream = nullptr, bool non_blocking = false) const;
  // Copies `src` (same shape and dtype, any device) into this tensor.
  void copy_from(const Tensor& src, const StreamView* stream = nullptr, bool non_blocking = false);
  // This tensor if contiguous, else a contiguous copy on the same device.
  Tensor contiguous() const;
  // The same memory (shape, strides, storage shared) read as `dtype`, which must have this tensor's element size
  // (InvalidTypeError otherwise): the bits are reinterpreted, not converted, like torch's Tensor.view(dtype).
  // E.g. uint16 bit patterns <-> bfloat16 for code that has no bfloat16 type (numpy).
  Tensor view(DType dtype) const;
  // Fills with zero bytes (0 for every dtype).
  void zero_(const StreamView* stream = nullptr);
  // Marks the memory as used on `stream` (see CachingAllocator::record_stream).
  void record_stream(const StreamView& stream) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::kFloat32;
};

// Contiguous strides (in elements) for `shape`.
XPURT_API std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);

// Whether two views may share an element: false only when they cannot (other storages, element spans that do not
// meet, or one shape and strides at offsets no index difference reaches: Note [Disjoint views of one storage] in
// core/tensor.cpp); true when they do or it is not decided. Both of one element size.
XPURT_API bool may_overlap(const Tensor& a, const Tensor& b);

// dsts[i].copy_from(srcs[i]) for every i, in order (each pair one shape and dtype, any devices; `stream` and
// `non_blocking` as copy_from's, for the whole call). Pairs of one CUDA device, dtype, shape and pair of layouts, no
// destination sharing an element with a source or another destination, are one kernel launch instead of one or two
// each (Note [Copies in one launch] in core/tensor.cpp): a decode step's new KV cache positions, for example. True
// when they went as that one launch.
XPURT_API bool copy_tensors(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs,
                            const StreamView* stream = nullptr, bool non_blocking = false);

}  // namespace xpuruntime
