// CUPTI kernel records (kernel_timeline.h). cupti.h is included for its types only: every entry point is
// resolved with dlsym from the library opened at run time, so nothing links against libcupti.
#include "backend/cuda/kernel_timeline.h"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

struct KernelTimeline::Collector {
  std::vector<KernelRecord> records;
  std::unordered_map<const char*, std::string> names;  // CUPTI shares one name pointer per kernel
  size_t dropped = 0;
  std::string error;  // the first record-parsing error
};

namespace {

// The CUPTI entry points this file uses.
struct CuptiApi {
  void* lib = nullptr;
  std::string path;
  uint32_t version = 0;
  decltype(&cuptiGetVersion) get_version = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped = nullptr;
};

// The process-wide state CUPTI forces (kernel_timeline.h), all of it. Two locks: `load_mu` for loading and
// registering; `sink_mu` for the active collector, taken by the buffer callback — never held while calling
// CUPTI, whose flush may deliver buffers on this thread or wait for its worker thread to deliver them.
struct CuptiProcess {
  std::mutex load_mu;
  std::optional<CuptiApi> api;  // loaded once, never unloaded (CUPTI stays attached to the driver)
  bool callbacks_registered = false;
  std::mutex sink_mu;
  KernelTimeline::Collector* active = nullptr;
};

// Never destroyed: CUPTI may deliver a last buffer from its own thread or an exit handler after static
// destructors ran.
CuptiProcess& cupti_process() {
  static CuptiProcess* p = new CuptiProcess;
  return *p;
}

std::string cupti_error(const CuptiApi& api, CUptiResult r, const char* call) {
  const char* text = nullptr;
  if (api.result_string == nullptr || api.result_string(r, &text) != CUPTI_SUCCESS || text == nullptr)
    text = "unknown CUPTI error";
  return std::string("CUPTI ") + call + " failed: " + text + " (" + std::to_string(static_cast<int>(r)) + ")";
}

Result<CuptiApi> open_cupti() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CEDAR_CUPTI"); env != nullptr && *env != '\0') candidates.emplace_back(env);
  for (const char* c : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", "/usr/local/cuda-13.0/lib/libcupti.so.13",
                        "/usr/local/cuda-13.0/lib64/libcupti.so.13"})
    candidates.emplace_back(c);
  CuptiApi api;
  std::string tried;
  for (const std::string& c : candidates) {
    api.lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.lib != nullptr) {
      api.path = c;
      break;
    }
    const char* why = dlerror();
    tried += "\n  " + c + ": " + (why != nullptr ? why : "not found");
  }
  if (api.lib == nullptr)
    return make_error(
        "CUPTI is not available (set CEDAR_CUPTI to a libcupti.so.13, e.g. the CUDA toolkit's "
        "lib64/ or a PyTorch wheel's nvidia/cuda_cupti/lib/); tried:" +
        tried);
  std::string missing;
  auto get = [&](auto& fn, const char* sym) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.lib, sym));
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + sym;
  };
  get(api.get_version, "cuptiGetVersion");
  get(api.result_string, "cuptiGetResultString");
  get(api.timestamp, "cuptiGetTimestamp");
  get(api.register_callbacks, "cuptiActivityRegisterCallbacks");
  get(api.enable, "cuptiActivityEnable");
  get(api.disable, "cuptiActivityDisable");
  get(api.flush_all, "cuptiActivityFlushAll");
  get(api.next_record, "cuptiActivityGetNextRecord");
  get(api.dropped, "cuptiActivityGetNumDroppedRecords");
  // The library stays open even on error: unloading a library that may have attached to the driver is unsafe.
  if (!missing.empty()) return make_error("CUPTI " + api.path + " lacks " + missing);
  if (CUptiResult r = api.get_version(&api.version); r != CUPTI_SUCCESS)
    return make_error(api.path + ": " + cupti_error(api, r, "cuptiGetVersion"));
  // The kernel record layout (CUpti_ActivityKernel10) is the headers'; an older library writes an older one.
  if (api.version < CUPTI_API_VERSION)
    return make_error("CUPTI " + api.path + " has API version " + std::to_string(api.version) +
                      ", older than the headers cedar was built with (" + std::to_string(CUPTI_API_VERSION) +
                      "): its kernel records have another layout; set CEDAR_CUPTI to CUDA 13's libcupti.so.13");
  return api;
}

Result<const CuptiApi*> load_cupti() {
  CuptiProcess& p = cupti_process();
  std::lock_guard<std::mutex> lock(p.load_mu);
  if (!p.api) {
    CEDAR_ASSIGN_OR_RETURN(CuptiApi api, open_cupti());
    p.api = std::move(api);
  }
  return &*p.api;
}

constexpr size_t kBufferBytes = size_t{8} << 20;  // ~30 k kernel records per buffer

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // Records must be 8-byte aligned (ACTIVITY_RECORD_ALIGNMENT); nullptr makes CUPTI drop records.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void add_kernel(KernelTimeline::Collector& c, const CUpti_ActivityKernel10& k) {
  KernelRecord r;
  auto [it, fresh] = c.names.try_emplace(k.name);
  if (fresh) it->second = demangle_kernel_name(k.name);
  r.name = it->second;
  r.start_ns = k.start;
  r.end_ns = k.end;
  r.stream_id = k.streamId;
  r.channel_id = k.channelID;
  r.correlation_id = k.correlationId;
  r.graph_id = k.graphId;
  r.graph_node_id = k.graphNodeId;
  r.grid[0] = k.gridX, r.grid[1] = k.gridY, r.grid[2] = k.gridZ;
  r.block[0] = k.blockX, r.block[1] = k.blockY, r.block[2] = k.blockZ;
  r.registers = k.registersPerThread;
  r.shared_bytes = k.staticSharedMemory + k.dynamicSharedMemory;
  c.records.push_back(std::move(r));
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid) {
  CuptiProcess& p = cupti_process();
  {
    std::lock_guard<std::mutex> lock(p.sink_mu);
    // Buffers of no recording (a timeline destroyed before its flush finished) are discarded.
    if (p.active != nullptr && p.api) {
      KernelTimeline::Collector& c = *p.active;
      CUpti_Activity* record = nullptr;
      for (;;) {
        const CUptiResult r = p.api->next_record(buffer, valid, &record);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
        if (r != CUPTI_SUCCESS) {
          if (c.error.empty()) c.error = cupti_error(*p.api, r, "cuptiActivityGetNextRecord");
          break;
        }
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
          add_kernel(c, *reinterpret_cast<const CUpti_ActivityKernel10*>(record));
      }
      size_t dropped = 0;
      if (p.api->dropped(context, stream_id, &dropped) == CUPTI_SUCCESS) c.dropped += dropped;
    }
  }
  std::free(buffer);
}

}  // namespace

Result<uint32_t> cupti_version() {
  CEDAR_ASSIGN_OR_RETURN(const CuptiApi* api, load_cupti());
  return api->version;
}

Result<KernelTimeline> KernelTimeline::start() {
  CEDAR_ASSIGN_OR_RETURN(const CuptiApi* api, load_cupti());
  CuptiProcess& p = cupti_process();
  // The collector joins `t` only once it is the active one: a refused start must not hold one, or its
  // destructor would stop the recording that is active (the s8 run 7 failure of the two-stream test).
  auto collector = std::make_unique<Collector>();
  {
    std::lock_guard<std::mutex> lock(p.sink_mu);
    if (p.active != nullptr) return make_error("KernelTimeline::start: another kernel timeline is recording");
    p.active = collector.get();
  }
  KernelTimeline t;
  t.collector_ = std::move(collector);
  auto detach = [&](std::string message) -> Error {
    std::lock_guard<std::mutex> lock(p.sink_mu);
    p.active = nullptr;
    t.collector_.reset();
    return make_error(std::move(message));
  };
  {
    std::lock_guard<std::mutex> lock(p.load_mu);
    if (!p.callbacks_registered) {
      if (CUptiResult r = api->register_callbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS)
        return detach(cupti_error(*api, r, "cuptiActivityRegisterCallbacks"));
      p.callbacks_registered = true;
    }
  }
  if (CUptiResult r = api->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); r != CUPTI_SUCCESS)
    return detach(cupti_error(*api, r, "cuptiActivityEnable(CONCURRENT_KERNEL)"));
  return t;
}

KernelTimeline::KernelTimeline(KernelTimeline&&) noexcept = default;
KernelTimeline& KernelTimeline::operator=(KernelTimeline&& other) noexcept {
  if (this != &other) {
    if (collector_) (void)stop_and_collect();
    collector_ = std::move(other.collector_);
  }
  return *this;
}

KernelTimeline::~KernelTimeline() {
  if (collector_) (void)stop_and_collect();
}

Result<uint64_t> KernelTimeline::synchronize_and_stamp() const {
  CEDAR_ASSIGN_OR_RETURN(const CuptiApi* api, load_cupti());
  CEDAR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  uint64_t t = 0;
  if (CUptiResult r = api->timestamp(&t); r != CUPTI_SUCCESS)
    return make_error(cupti_error(*api, r, "cuptiGetTimestamp"));
  return t;
}

Result<std::vector<KernelRecord>> KernelTimeline::stop_and_collect() {
  if (!collector_) return make_error("KernelTimeline::stop_and_collect: not recording (already stopped or moved)");
  CEDAR_ASSIGN_OR_RETURN(const CuptiApi* api, load_cupti());
  CuptiProcess& p = cupti_process();
  // Every kernel must have ended before the flush for its record to be complete; errors are reported after
  // the recording is detached, so a failing device never leaves CUPTI writing into a dead collector.
  const Status sync = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize()");
  std::string error;
  if (CUptiResult r = api->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); r != CUPTI_SUCCESS)
    error = cupti_error(*api, r, "cuptiActivityDisable(CONCURRENT_KERNEL)");
  if (CUptiResult r = api->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); r != CUPTI_SUCCESS && error.empty())
    error = cupti_error(*api, r, "cuptiActivityFlushAll");
  std::unique_ptr<Collector> c;
  {
    std::lock_guard<std::mutex> lock(p.sink_mu);
    p.active = nullptr;
    c = std::move(collector_);
  }
  if (!sync.ok()) return sync.error().with_context("kernel timeline");
  if (!error.empty()) return make_error(error);
  if (!c->error.empty()) return make_error(c->error);
  if (c->dropped > 0)
    return make_error("CUPTI dropped " + std::to_string(c->dropped) + " kernel records (" +
                      std::to_string(c->records.size()) + " kept): the timeline has holes; record fewer steps");
  std::stable_sort(c->records.begin(), c->records.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return std::move(c->records);
}

}  // namespace cedar::cuda
