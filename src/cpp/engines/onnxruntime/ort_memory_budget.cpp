// The budgeted CPU allocator of Note [memory_limit through ORT] (ort_memory_budget.h).
#include "engines/onnxruntime/ort_memory_budget.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include "xpuruntime/caching_allocator.h"

namespace xpuruntime::ort {

namespace {

// Each block starts with this header (the budget it was charged to and its size), 64 bytes so that the data after
// it keeps ORT's alignment.
struct BlockHeader {
  std::shared_ptr<MemoryBudget> budget;
  std::size_t bytes;
};
constexpr std::size_t kHeaderBytes = 64;
static_assert(sizeof(BlockHeader) <= kHeaderBytes);

thread_local std::string refusal;  // the budget's message for the last allocation it refused on this thread

struct BudgetedAllocator : OrtAllocator {
  BudgetedAllocator() : OrtAllocator{} {
    version = ORT_API_VERSION;
    OrtAllocator::Alloc = &BudgetedAllocator::alloc;
    OrtAllocator::Free = &BudgetedAllocator::free;
    OrtAllocator::Info = &BudgetedAllocator::info;
    OrtAllocator::Reserve = &BudgetedAllocator::alloc;
    XPURT_ORT_CHECK(memory_info = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
  }

  // ORT's allocators throw on failure (it does not check for null), so a refusal is std::bad_alloc.
  static void* ORT_API_CALL alloc(OrtAllocator*, size_t bytes) {
    std::shared_ptr<MemoryBudget> budget = MemoryBudgetScope::current();
    if (budget) {
      try {
        budget->charge(bytes, Device::cpu());
      } catch (const OutOfMemoryError& e) {
        refusal = e.what();
        throw std::bad_alloc();
      }
    }
    void* block = std::aligned_alloc(kHeaderBytes, kHeaderBytes + ((bytes + kHeaderBytes - 1) / kHeaderBytes) *
                                                                      kHeaderBytes);
    if (block == nullptr) {
      if (budget) budget->release(bytes);
      throw std::bad_alloc();
    }
    new (block) BlockHeader{std::move(budget), bytes};
    return static_cast<char*>(block) + kHeaderBytes;
  }

  static void ORT_API_CALL free(OrtAllocator*, void* data) {
    if (data == nullptr) return;
    void* block = static_cast<char*>(data) - kHeaderBytes;
    auto* header = static_cast<BlockHeader*>(block);
    if (header->budget) header->budget->release(header->bytes);
    header->~BlockHeader();
    std::free(block);
  }

  static const OrtMemoryInfo* ORT_API_CALL info(const OrtAllocator* self) {
    return static_cast<const BudgetedAllocator*>(self)->memory_info;
  }

  Ort::MemoryInfo memory_info{nullptr};
};

}  // namespace

void use_budgeted_cpu_allocator(Ort::SessionOptions& session_options) {
  static std::once_flag registered;
  std::call_once(registered, [] {
    auto* allocator = new BudgetedAllocator();  // registered for the life of the process
    XPURT_ORT_CHECK(Ort::ThrowOnError(ort_api().RegisterAllocator(env(), allocator)));
  });
  XPURT_ORT_CHECK(session_options.AddConfigEntry("session.use_env_allocators", "1"));
}

RunBudget::RunBudget(std::uint64_t limit) {
  if (limit == 0) return;
  budget_ = std::make_shared<MemoryBudget>(static_cast<std::size_t>(limit), std::function<std::string()>([=] {
    return detail::str_cat("ExecutionPolicy.memory_limit = ", format_bytes(static_cast<std::size_t>(limit)),
                           ", onnxruntime engine");
  }));
  scope_ = std::make_unique<MemoryBudgetScope>(budget_);
  refusal.clear();
}

void RunBudget::rethrow_if_refused(const std::exception& error) const {
  if (!budget_ || refusal.empty()) return;
  std::string message = refusal;
  refusal.clear();
  // ORT names the outermost node that failed first: "... while running Loop node. Name:'grow' ...".
  const std::string ort = error.what();
  std::string node;
  const std::size_t running = ort.find("while running ");
  const std::size_t name = ort.find(" node. Name:'", running);
  if (running != std::string::npos && name != std::string::npos) {
    const std::size_t begin = name + 13;
    const std::size_t end = ort.find('\'', begin);
    const std::string op = ort.substr(running + 14, name - running - 14);
    if (end != std::string::npos) node = detail::str_cat("node '", ort.substr(begin, end - begin), "' (", op, "): ");
  }
  throw OutOfMemoryError(detail::str_cat(node, message, " ONNX Runtime: ", ort));
}

}  // namespace xpuruntime::ort
