// CUPTI activity collection (see profiler_cupti.h). Compiled only in builds with the CUPTI headers.
//
// Note [CUPTI loaded at run time]
// libcupti is opened with dlopen when a profiler first asks for CUDA activity, never linked: like the CUDA driver,
// it may be missing where xpuruntime runs (a machine without the toolkit's extras, a wheel without
// nvidia-cuda-cupti), and its absence must cost the profiler its CUDA records, not the whole library its ability to
// load. The soname of the toolkit we were built with is tried first (so a libcupti already loaded by another
// library, such as torch's, is the one used), then the library CMake found at configure time.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <type_traits>

#include <cupti.h>

#include "core/profiler_cupti.h"
#include "xpuruntime/exceptions.h"

#if CUPTI_API_VERSION < 130000
#error "profiler_cupti.cpp reads the CUPTI 13 record layouts (CUpti_ActivityKernel10, Memcpy6, Memset4)"
#endif

namespace xpuruntime::profiler_detail {
namespace {

constexpr std::size_t kBufferBytes = 8u << 20;  // per CUPTI buffer
constexpr std::size_t kBufferAlign = 8;

struct CuptiApi {
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) dropped = nullptr;
  decltype(&::cuptiActivityPushExternalCorrelationId) push = nullptr;
  decltype(&::cuptiActivityPopExternalCorrelationId) pop = nullptr;
  decltype(&::cuptiGetTimestamp) timestamp = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
  decltype(&::cuptiSubscribe) subscribe = nullptr;
  decltype(&::cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&::cuptiEnableCallback) enable_callback = nullptr;
  decltype(&::cuptiGetGraphNodeId) graph_node_id = nullptr;
  CUpti_SubscriberHandle subscriber = nullptr;  // while graph tracking is on
  bool loaded = false;
  bool callbacks_registered = false;
  std::string error;  // why it could not be loaded
};

CuptiApi& api() {
  static CuptiApi* a = new CuptiApi();  // never destroyed: CUPTI may call back during process exit
  return *a;
}

// Note [CUPTI loaded at run time]
bool load(CuptiApi& a) {
  if (a.loaded) return true;
  if (!a.error.empty()) return false;
  const std::string soname = "libcupti.so." + std::to_string(CUPTI_API_VERSION / 10000);
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL);
#ifdef XPURT_CUPTI_LIBRARY
  if (handle == nullptr) handle = dlopen(XPURT_CUPTI_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
#endif
  if (handle == nullptr) {
    const char* err = dlerror();
    a.error = "cannot load " + soname + " (" + (err ? err : "not found") +
              "); add the CUDA toolkit's CUPTI folder (or the nvidia-cuda-cupti wheel's lib folder) to LD_LIBRARY_PATH";
    return false;
  }
  bool ok = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) {
      ok = false;
      a.error = std::string(soname) + " has no " + name;
    }
  };
  sym(a.enable, "cuptiActivityEnable");
  sym(a.disable, "cuptiActivityDisable");
  sym(a.register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(a.flush_all, "cuptiActivityFlushAll");
  sym(a.next_record, "cuptiActivityGetNextRecord");
  sym(a.dropped, "cuptiActivityGetNumDroppedRecords");
  sym(a.push, "cuptiActivityPushExternalCorrelationId");
  sym(a.pop, "cuptiActivityPopExternalCorrelationId");
  sym(a.timestamp, "cuptiGetTimestamp");
  sym(a.result_string, "cuptiGetResultString");
  sym(a.subscribe, "cuptiSubscribe");
  sym(a.unsubscribe, "cuptiUnsubscribe");
  sym(a.enable_callback, "cuptiEnableCallback");
  sym(a.graph_node_id, "cuptiGetGraphNodeId");
  a.loaded = ok;
  return ok;
}

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (api().result_string && api().result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

// What the buffer-completed callback (a CUPTI thread, or the thread calling flush) accumulates.
struct Collected {
  std::mutex mutex;
  CuptiResult result;
  std::int64_t clock_offset = 0;
  bool active = false;
};

Collected& collected() {
  static Collected* c = new Collected();
  return *c;
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* memcpy_kind(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

const char* sync_kind(CUpti_ActivitySynchronizationType type) {
  switch (type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "cudaStreamWaitEvent";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "cudaDeviceSynchronize";
    default: return "synchronize";
  }
}

// The fields kernel, memcpy and memset records share (their CUPTI structs name them alike).
template <typename Activity>
DeviceRecord device_record(const Activity* a, std::string category, std::string name) {
  DeviceRecord r;
  r.category = std::move(category);
  r.name = std::move(name);
  r.start = a->start;
  r.end = a->end;
  r.device = a->deviceId;
  r.stream = a->streamId;
  r.correlation = a->correlationId;
  r.graph_node = a->graphNodeId;
  return r;
}

void parse(const CUpti_Activity* record, CuptiResult& out) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      DeviceRecord r =
          device_record(k, "kernel", k->name ? profiler::demangle_kernel_name(k->name) : "(unnamed kernel)");
      r.args = {{"grid", std::to_string(k->gridX) + "x" + std::to_string(k->gridY) + "x" + std::to_string(k->gridZ)},
                {"block", std::to_string(k->blockX) + "x" + std::to_string(k->blockY) + "x" + std::to_string(k->blockZ)},
                {"registers_per_thread", std::int64_t{k->registersPerThread}},
                {"shared_memory", std::int64_t{k->staticSharedMemory} + k->dynamicSharedMemory},
                {"correlation", std::int64_t{k->correlationId}}};
      if (k->graphId != 0) r.args.emplace_back("graph_id", std::int64_t{k->graphId});
      if (k->name != nullptr && r.name != k->name) r.args.emplace_back("mangled_name", std::string(k->name));
      out.records.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      DeviceRecord r = device_record(m, "memcpy", std::string("memcpy ") + memcpy_kind(m->copyKind));
      r.args = {{"bytes", static_cast<std::int64_t>(m->bytes)}, {"kind", std::string(memcpy_kind(m->copyKind))},
                {"correlation", std::int64_t{m->correlationId}}};
      out.records.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      DeviceRecord r = device_record(m, "memset", "memset");
      r.args = {{"bytes", static_cast<std::int64_t>(m->bytes)}, {"value", std::int64_t{m->value}},
                {"correlation", std::int64_t{m->correlationId}}};
      out.records.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(record);
      DeviceRecord r;
      r.category = "sync";
      r.name = sync_kind(s->type);
      r.start = s->start;
      r.end = s->end;
      r.device = -1;
      r.stream = s->streamId;
      r.correlation = s->correlationId;
      r.args = {{"stream", std::int64_t{s->streamId}}, {"correlation", std::int64_t{s->correlationId}}};
      out.records.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      out.thread_of[a->correlationId] = a->threadId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) out.external[e->correlationId] = e->externalId;
      break;
    }
    default: break;
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t /*size*/, size_t valid) {
  CuptiApi& a = api();
  Collected& c = collected();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    CUpti_Activity* record = nullptr;
    while (valid > 0 && a.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (c.active) {
        try {
          parse(record, c.result);
        } catch (...) {
          c.result.dropped += 1;  // out of host memory: the record is lost, the run goes on
        }
      }
    }
    std::size_t dropped = 0;
    if (a.dropped(context, stream, &dropped) == CUPTI_SUCCESS) c.result.dropped += dropped;
  }
  std::free(buffer);
}

// Note [Graph node attribution]: runs on the thread that creates or instantiates the graph.
void CUPTIAPI graph_callback(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void* cbdata) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbdata == nullptr) return;
  const auto* resource = static_cast<const CUpti_ResourceData*>(cbdata);
  const auto* graph = static_cast<const CUpti_GraphData*>(resource->resourceDescriptor);
  if (graph == nullptr || graph->node == nullptr) return;
  CuptiApi& a = api();
  std::uint64_t label = 0;
  if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) {
    label = current_capture_label();
  } else if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED && graph->originalNode != nullptr) {
    std::uint64_t original = 0;
    if (a.graph_node_id(graph->originalNode, &original) == CUPTI_SUCCESS) label = graph_node_label(original);
  }
  if (label == 0) return;
  std::uint64_t id = 0;
  if (a.graph_node_id(graph->node, &id) == CUPTI_SUCCESS) note_graph_node(id, label);
}

const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,   CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

}  // namespace

bool cupti_start(std::string* why) {
  CuptiApi& a = api();
  if (!load(a)) {
    *why = a.error;
    return false;
  }
  if (!a.callbacks_registered) {
    const CUptiResult r = a.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
      *why = "cuptiActivityRegisterCallbacks failed: " + result_text(r);
      return false;
    }
    a.callbacks_registered = true;
  }
  {
    std::lock_guard<std::mutex> lock(collected().mutex);
    collected().result = CuptiResult();
    collected().active = true;
  }
  for (std::size_t i = 0; i < std::size(kKinds); ++i) {
    const CUptiResult r = a.enable(kKinds[i]);
    if (r != CUPTI_SUCCESS) {
      for (std::size_t j = 0; j < i; ++j) (void)a.disable(kKinds[j]);
      std::lock_guard<std::mutex> lock(collected().mutex);
      collected().active = false;
      *why = "cuptiActivityEnable(" + std::to_string(static_cast<int>(kKinds[i])) + ") failed: " + result_text(r) +
             (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? " (another profiler owns CUPTI)" : "");
      return false;
    }
  }
  std::uint64_t ts = 0;
  const std::int64_t before = steady_ns();
  (void)a.timestamp(&ts);
  const std::int64_t after = steady_ns();
  collected().clock_offset = static_cast<std::int64_t>(ts) - (before + after) / 2;
  return true;
}

CuptiResult cupti_stop() {
  CuptiApi& a = api();
  (void)a.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind kind : kKinds) (void)a.disable(kind);
  (void)a.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(collected().mutex);
  collected().active = false;
  CuptiResult out = std::move(collected().result);
  collected().result = CuptiResult();
  return out;
}

std::int64_t cupti_clock_offset_ns() { return collected().clock_offset; }

bool cupti_graph_tracking_start(std::string* why) {
  CuptiApi& a = api();
  if (!load(a)) {
    *why = a.error;
    return false;
  }
  if (a.subscriber != nullptr) return true;
  CUptiResult r = a.subscribe(&a.subscriber, graph_callback, nullptr);
  if (r != CUPTI_SUCCESS) {
    a.subscriber = nullptr;
    *why = "cuptiSubscribe failed: " + result_text(r) +
           (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? " (another tool subscribed to CUPTI callbacks)" : "");
    return false;
  }
  for (CUpti_CallbackId cbid : {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED}) {
    r = a.enable_callback(1, a.subscriber, CUPTI_CB_DOMAIN_RESOURCE, cbid);
    if (r != CUPTI_SUCCESS) {
      (void)a.unsubscribe(a.subscriber);
      a.subscriber = nullptr;
      *why = "cuptiEnableCallback(graph nodes) failed: " + result_text(r);
      return false;
    }
  }
  return true;
}

void cupti_graph_tracking_stop() {
  CuptiApi& a = api();
  if (a.subscriber == nullptr) return;
  (void)a.unsubscribe(a.subscriber);
  a.subscriber = nullptr;
}

void cupti_push(std::uint64_t event_id) {
  CuptiApi& a = api();
  if (a.loaded) (void)a.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, event_id);
}

void cupti_pop() {
  CuptiApi& a = api();
  std::uint64_t last = 0;
  if (a.loaded) (void)a.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

}  // namespace xpuruntime::profiler_detail
