// Memory: buffers, statistics, limits, caching allocators.
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"

namespace xpuruntime::bindings {

namespace {

py::dict stats_to_dict(const MemoryStats& s) {
  py::dict d;
  auto put = [&](const char* name, const Stat& st) {
    const std::string n(name);
    d[py::str(n + ".current")] = st.current;
    d[py::str(n + ".peak")] = st.peak;
    d[py::str(n + ".allocated")] = st.allocated;
    d[py::str(n + ".freed")] = st.freed;
  };
  put("allocation", s.allocation);
  put("segment", s.segment);
  put("active", s.active);
  put("inactive_split", s.inactive_split);
  put("allocated_bytes", s.allocated_bytes);
  put("requested_bytes", s.requested_bytes);
  put("reserved_bytes", s.reserved_bytes);
  put("active_bytes", s.active_bytes);
  put("inactive_split_bytes", s.inactive_split_bytes);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["memory_limit"] = s.memory_limit;
  return d;
}

py::list snapshot_to_list(const std::vector<SegmentInfo>& segments) {
  py::list out;
  for (const SegmentInfo& seg : segments) {
    py::dict d;
    d["address"] = seg.address;
    d["total_size"] = seg.size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["pool"] = seg.pool;
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated" : (b.pending_events ? "active_pending_free" : "inactive");
      blocks.append(bd);
    }
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
}

std::size_t checked_size(long long nbytes, const char* what) {
  XPURT_CHECK(nbytes >= 0, what, ": expected a non-negative number of bytes, but got ", nbytes);
  return static_cast<std::size_t>(nbytes);
}

// A Python-owned allocation.
struct Buffer {
  DataPtr data;
};

// A standalone allocator for experiments and tests (e.g. over simulated memory). Holds the backing's typed
// pointer when it is simulated, for complete_stream().
struct PyAllocator {
  std::shared_ptr<CachingAllocator> allocator;
  SimulatedMemoryBacking* simulated = nullptr;
};

CachingAllocator& allocator_of(PyAllocator& a) { return *a.allocator; }

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<Buffer>(m, "Buffer",
                     "Memory from the xpuruntime allocator; freed when the Buffer is freed or garbage collected.")
      .def_property_readonly("ptr", [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data.get()); })
      .def_property_readonly("nbytes", [](const Buffer& b) { return b.data.size(); })
      .def_property_readonly("device", [](const Buffer& b) { return b.data.device(); })
      .def_property_readonly("pinned", [](const Buffer& b) { return b.data.pinned(); })
      .def("free", [](Buffer& b) { b.data.reset(); }, py::call_guard<py::gil_scoped_release>(),
           "Frees now (the Buffer becomes empty); freeing twice does nothing.")
      .def("record_stream",
           [](const Buffer& b, const py::object& stream) { b.data.record_stream(to_stream(stream, b.data.device())); },
           py::arg("stream"), "Marks the memory as used on `stream` too (its free waits for that stream).")
      .def("__enter__", [](Buffer& b) -> Buffer& { return b; }, py::return_value_policy::reference)
      .def("__exit__", [](Buffer& b, const py::args&) { b.data.reset(); })
      .def("__int__", [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data.get()); })
      .def("__repr__", [](const Buffer& b) {
        char buffer[128];
        std::snprintf(buffer, sizeof(buffer), "<Buffer %zu bytes on %s%s at 0x%zx>", b.data.size(),
                      b.data.device().str().c_str(), b.data.pinned() ? " (pinned)" : "",
                      reinterpret_cast<std::size_t>(b.data.get()));
        return std::string(buffer);
      });

  m.def("allocate",
        [](long long nbytes, const py::object& device, const py::object& stream, bool pinned) {
          const std::size_t n = checked_size(nbytes, "allocate");
          if (pinned) {
            const Device d = device.is_none() ? Device::cpu() : to_device(device);
            XPURT_CHECK(d.is_cpu(), "pinned=True allocates host memory; pass device=\"cpu\", not ", d.str());
            const StreamView s = stream.is_none() ? StreamView() : to_stream(stream, Device::cpu());
            py::gil_scoped_release release;
            return Buffer{MemoryManager::instance().allocate_pinned(n, s)};
          }
          const Device d = to_device(device);
          const StreamView s = to_stream(stream, d);
          py::gil_scoped_release release;
          return Buffer{MemoryManager::instance().allocate(d, n, s)};
        },
        py::arg("nbytes"), py::arg("device") = py::none(), py::arg("stream") = py::none(), py::arg("pinned") = false,
        "Allocates `nbytes` on `device` (default: current), stream-ordered on `stream` (default: current).");

  m.def("memory_stats",
        [](const py::object& device) {
          const Device d = to_device(device);
          py::gil_scoped_release release;
          MemoryStats s = MemoryManager::instance().get_stats(d);
          py::gil_scoped_acquire acquire;
          return stats_to_dict(s);
        },
        py::arg("device") = py::none(), "Allocator statistics of `device` as a flat dict (torch-style keys).");
  m.def("pinned_memory_stats", [] { return stats_to_dict(MemoryManager::instance().get_pinned_stats()); });
  m.def("memory_snapshot",
        [](const py::object& device) {
          const Device d = to_device(device);
          XPURT_CHECK(d.is_cuda(), "memory_snapshot is for CUDA devices; got ", d.str());
          return snapshot_to_list(MemoryManager::instance().device_allocator(d).snapshot());
        },
        py::arg("device") = py::none(), "The segments and blocks of a CUDA device's caching allocator.");
  m.def("empty_cache",
        [](const py::object& device) {
          if (device.is_none()) {
            py::gil_scoped_release release;
            MemoryManager::instance().empty_cache();
            return;
          }
          const Device d = to_device(device);
          py::gil_scoped_release release;
          MemoryManager::instance().empty_cache(d);
        },
        py::arg("device") = py::none(), "Returns cached unused memory to the system (every device by default).");
  m.def("reset_peak_memory_stats", [](const py::object& device) { MemoryManager::instance().reset_peak_stats(to_device(device)); },
        py::arg("device") = py::none());
  m.def("set_memory_limit",
        [](long long nbytes, const py::object& device) {
          MemoryManager::instance().set_memory_limit(to_device(device), checked_size(nbytes, "set_memory_limit"));
        },
        py::arg("nbytes"), py::arg("device") = py::none(), "Caps reserved bytes on `device` (0 removes the cap).");
  m.def("get_memory_limit", [](const py::object& device) { return MemoryManager::instance().get_memory_limit(to_device(device)); },
        py::arg("device") = py::none());

  py::class_<PyAllocator>(m, "CachingAllocator",
                          "A caching allocator of its own. CachingAllocator.simulated(capacity) runs the caching "
                          "logic over host memory with events completed by hand (complete_stream), so it can be "
                          "studied without a GPU; device_allocator(device) returns a CUDA device's allocator.")
      .def_static("simulated",
                  [](long long capacity) {
                    auto backing = std::make_unique<SimulatedMemoryBacking>(checked_size(capacity, "simulated"));
                    PyAllocator a;
                    a.simulated = backing.get();
                    a.allocator = std::make_shared<CachingAllocator>(std::move(backing));
                    return a;
                  },
                  py::arg("capacity"))
      .def_static("device_allocator",
                  [](const py::object& device) {
                    PyAllocator a;
                    // Not owned: the MemoryManager's allocators live as long as the process.
                    a.allocator = std::shared_ptr<CachingAllocator>(
                        &MemoryManager::instance().device_allocator(to_device(device)), [](CachingAllocator*) {});
                    return a;
                  },
                  py::arg("device") = py::none())
      .def("allocate",
           [](PyAllocator& a, long long nbytes, std::uintptr_t stream) {
             const std::size_t n = checked_size(nbytes, "allocate");
             py::gil_scoped_release release;
             return reinterpret_cast<std::uintptr_t>(allocator_of(a).allocate(n, stream));
           },
           py::arg("nbytes"), py::arg("stream") = 0, "Returns the address of the new block.")
      .def("free",
           [](PyAllocator& a, std::uintptr_t ptr) {
             py::gil_scoped_release release;
             allocator_of(a).free(reinterpret_cast<void*>(ptr));
           },
           py::arg("ptr"))
      .def("record_stream",
           [](PyAllocator& a, std::uintptr_t ptr, std::uintptr_t stream) {
             allocator_of(a).record_stream(reinterpret_cast<void*>(ptr), stream);
           },
           py::arg("ptr"), py::arg("stream"))
      .def("allocation_size",
           [](PyAllocator& a, std::uintptr_t ptr) { return allocator_of(a).allocation_size(reinterpret_cast<void*>(ptr)); })
      .def("owns", [](PyAllocator& a, std::uintptr_t ptr) { return allocator_of(a).owns(reinterpret_cast<void*>(ptr)); })
      .def("empty_cache", [](PyAllocator& a) { allocator_of(a).empty_cache(); }, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](PyAllocator& a) { return stats_to_dict(allocator_of(a).stats()); })
      .def("reset_peak_stats", [](PyAllocator& a) { allocator_of(a).reset_peak_stats(); })
      .def("snapshot", [](PyAllocator& a) { return snapshot_to_list(allocator_of(a).snapshot()); })
      .def("set_memory_limit",
           [](PyAllocator& a, long long n) { allocator_of(a).set_memory_limit(checked_size(n, "set_memory_limit")); })
      .def("create_pool", [](PyAllocator& a) { return allocator_of(a).create_pool(); })
      .def("begin_allocate_to_pool",
           [](PyAllocator& a, MempoolId pool, std::uintptr_t stream) { allocator_of(a).begin_allocate_to_pool(pool, stream); })
      .def("end_allocate_to_pool", [](PyAllocator& a, MempoolId pool) { allocator_of(a).end_allocate_to_pool(pool); })
      .def("release_pool", [](PyAllocator& a, MempoolId pool) { allocator_of(a).release_pool(pool); })
      .def("complete_stream",
           [](PyAllocator& a, std::uintptr_t stream) {
             XPURT_CHECK(a.simulated != nullptr, "complete_stream is only for simulated allocators");
             a.simulated->complete_stream(stream);
           },
           py::arg("stream"), "Simulated allocators: marks the work queued on `stream` as done.")
      .def_property_readonly("backing_reserved", [](PyAllocator& a) {
        XPURT_CHECK(a.simulated != nullptr, "backing_reserved is only for simulated allocators");
        return a.simulated->reserved();
      })
      .def("__repr__", [](PyAllocator& a) { return "<CachingAllocator over " + allocator_of(a).backing().name() + ">"; });
}

}  // namespace xpuruntime::bindings
