// The simulated CUDA runtime (see sim.h): every cudart function ptrain calls, with the real
// header's signatures. Behaviour follows the CUDA Runtime API reference (cuda_runtime_api.h and
// docs.nvidia.com/cuda/cuda-runtime-api) and the CUDA C++ Programming Guide; each rule below
// names its section.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim.h"

namespace ptrain::sim {
namespace {

constexpr size_t kDefaultCapacity = size_t(4) << 30;
constexpr size_t kPoisonLimit = size_t(64) << 20;  // larger freed blocks are unmapped instead
constexpr size_t kSharedPerBlock = 48 * 1024;       // without cudaFuncSetAttribute (Programming Guide, "Shared Memory")
constexpr int kMaxThreadsPerBlock = 1024;
int compute_capability[2] = {9, 0};  // Hopper, as the backend requires (set_compute_capability)

struct Op {
  std::string what;
  std::function<void()> run;          // empty for a wait
  struct Stream* wait_on = nullptr;   // a cudaStreamWaitEvent: runs once wait_on executed wait_until ops
  uint64_t wait_until = 0;
};

struct Graph {
  std::vector<Op> ops;
};

struct Stream {
  bool blocking = true;  // synchronises with the legacy default stream (cudaStreamNonBlocking: false)
  std::deque<Op> queue;
  uint64_t enqueued = 0, executed = 0;
  // Capture (Programming Guide, "CUDA Graphs", "Stream Capture").
  bool capturing = false, capture_invalid = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::unique_ptr<Graph> capture;
};

struct Event {
  Stream* stream = nullptr;  // where it was last recorded (nullptr: never)
  uint64_t position = 0;     // the ops of that stream before it
  bool captured = false;     // last recorded inside a capture
};

struct Allocation {
  size_t bytes = 0;
  bool pinned = false;  // cudaMallocHost
};

struct State {
  std::recursive_mutex mutex;
  size_t capacity = kDefaultCapacity, in_use = 0;
  std::map<uintptr_t, Allocation> device, pinned;  // start -> allocation
  std::set<Stream*> streams;
  Stream legacy;  // stream 0: runs eagerly
  std::mt19937_64 order;
  cudaError_t last_error = cudaSuccess, sticky = cudaSuccess;
  uint64_t executed = 0;
  std::map<std::string, uint64_t> ran;  // operations executed, by name: the report's counts
  int captures_prohibiting_unsafe_calls = 0;  // global or thread-local captures in progress

  State() {
    if (const char* m = std::getenv("PTRAIN_SIM_MEMORY")) capacity = std::strtoull(m, nullptr, 10);
    const char* s = std::getenv("PTRAIN_SIM_SEED");
    order.seed(s ? std::strtoull(s, nullptr, 10) : 1);
    if (std::getenv("PTRAIN_SIM_REPORT")) std::atexit(write_report);
  }
  static void write_report();
};

State& state() {
  static State* s = new State;  // never destroyed: static destructors of the code under test call in
  return *s;
}

using Lock = std::lock_guard<std::recursive_mutex>;

// PTRAIN_SIM_REPORT=DIR: at exit each process writes DIR/ops-PID.json, {name: times executed}
// for every operation the device ran (kernels by name, copies by the memories they joined,
// library calls, graph launches, cudaMalloc calls), so a test of a whole run can ask which paths
// executed.
void State::write_report() {
  State& st = state();
  Lock lock(st.mutex);
  const std::string path = std::string(std::getenv("PTRAIN_SIM_REPORT")) + "/ops-" + std::to_string(getpid()) + ".json";
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  const char* separator = "{";
  for (const auto& [name, times] : st.ran) {
    std::fprintf(f, "%s\"", separator);
    for (unsigned char c : name) {
      if (c < 0x20)
        std::fprintf(f, "\\u%04x", c);
      else
        std::fprintf(f, c == '"' || c == '\\' ? "\\%c" : "%c", c);
    }
    std::fprintf(f, "\": %llu", static_cast<unsigned long long>(times));
    separator = ", ";
  }
  std::fprintf(f, "%s}\n", *separator == '{' ? "{" : "");
  std::fclose(f);
}

}  // namespace

void add_to_report(const std::string& name, uint64_t amount) {
  State& st = state();
  Lock lock(st.mutex);
  st.ran[name] += amount;
}

namespace {

cudaError_t fail(cudaError_t e) {
  state().last_error = e;
  return e;
}

Stream* stream_of(cudaStream_t s) {
  State& st = state();
  if (s == nullptr || s == cudaStreamLegacy) return &st.legacy;
  Stream* p = reinterpret_cast<Stream*>(s);
  return st.streams.count(p) ? p : nullptr;
}

// Runs one op at the front of s (its wait satisfied first). A kernel's simt::Error or any
// exception becomes the sticky cudaErrorLaunchFailure, as a device fault does.
void run_until(Stream* s, uint64_t position);
void run_front(Stream* s) {
  Op op = std::move(s->queue.front());
  s->queue.pop_front();
  if (op.wait_on) run_until(op.wait_on, op.wait_until);
  if (op.run && state().sticky == cudaSuccess) {
    try {
      op.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "simulated device: %s failed: %s\n", op.what.c_str(), e.what());
      state().sticky = cudaErrorLaunchFailure;
    }
  }
  ++s->executed;
  ++state().executed;
  if (op.run && state().sticky == cudaSuccess) ++state().ran[op.what];
}

void run_until(Stream* s, uint64_t position) {
  // First the other streams' work that s's ops up to `position` wait for, ahead of s's own
  // earlier ops: a legal order (those waits are all it depends on; a wait of theirs on s runs s
  // that far first), and the adversarial one, since an op of s that a reader on another stream
  // forgot to wait for then runs after that reader. E.g. a gather queued on NCCL's stream, then
  // an event wait for compute work that reads the gathered buffer without waiting for it.
  std::vector<std::pair<Stream*, uint64_t>> waits;
  for (size_t i = 0; i < s->queue.size() && s->executed + i < position; ++i)
    if (const Op& op = s->queue[i]; op.wait_on) waits.emplace_back(op.wait_on, op.wait_until);
  for (const auto& [other, until] : waits) run_until(other, until);
  while (s->executed < position && !s->queue.empty()) run_front(s);
}

void drain(Stream* s) { run_until(s, s->enqueued); }

// Legacy default stream semantics (Runtime API, "Stream synchronization behavior"): work on it
// waits for all blocking streams' earlier work.
void drain_blocking_streams() {
  for (Stream* s : state().streams)
    if (s->blocking) drain(s);
}

void drain_everything() {
  State& st = state();
  std::vector<Stream*> pending;
  for (;;) {
    pending.clear();
    for (Stream* s : st.streams)
      if (!s->queue.empty()) pending.push_back(s);
    if (pending.empty()) break;
    std::sort(pending.begin(), pending.end());  // a seeded choice among a fixed order
    run_front(pending[st.order() % pending.size()]);
  }
}

// Called by every API function that a capture in progress forbids in this thread
// (cudaStreamCaptureModeGlobal/ThreadLocal: "potentially unsafe API calls"). Invalidates the
// captures and returns cudaErrorStreamCaptureUnsupported.
cudaError_t refuse_in_capture() {
  State& st = state();
  for (Stream* s : st.streams)
    if (s->capturing && s->capture_mode != cudaStreamCaptureModeRelaxed) s->capture_invalid = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}
bool unsafe_calls_prohibited() { return state().captures_prohibiting_unsafe_calls > 0; }

const Allocation* find(const std::map<uintptr_t, Allocation>& m, const void* p, size_t bytes, uintptr_t* start) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  if (a + bytes > it->first + it->second.bytes) return nullptr;
  if (start) *start = it->first;
  return &it->second;
}

enum class Space { device, pinned, pageable };
Space space_of(const void* p, size_t bytes) {
  State& st = state();
  if (find(st.device, p, bytes, nullptr)) return Space::device;
  if (find(st.pinned, p, bytes, nullptr)) return Space::pinned;
  return Space::pageable;
}

void* map_bytes(size_t bytes) {
  void* p = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Poisoned, and kept mapped so a stale read gives NaN rather than a crash; large blocks are
// made inaccessible instead (their pages are given back).
void unmap_poisoned(void* p, size_t bytes) {
  if (bytes <= kPoisonLimit) {
    std::memset(p, 0xFF, bytes);
  } else {
    madvise(p, bytes, MADV_DONTNEED);
    mprotect(p, bytes, PROT_NONE);
  }
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
  State& st = state();
  Lock lock(st.mutex);
  if (st.sticky != cudaSuccess) return st.sticky;
  Stream* s = stream_of(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (s->capturing) {
    if (!s->capture_invalid) s->capture->ops.push_back(Op{what, std::move(work)});
    return s->capture_invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
  }
  if (s == &st.legacy) {
    // Legacy-stream work waits for every blocking stream, and a capturing one cannot be waited
    // for: the capture is invalidated and the call fails (Runtime API, cudaErrorStreamCaptureImplicit:
    // "a disallowed implicit dependency on a current capture sequence from cudaStreamLegacy").
    bool implicit = false;
    for (Stream* b : st.streams)
      if (b->blocking && b->capturing) implicit = b->capture_invalid = true;
    if (implicit) return fail(cudaErrorStreamCaptureImplicit);
    drain_blocking_streams();
    s->queue.push_back(Op{what, std::move(work)});
    ++s->enqueued;
    drain(s);
    return st.sticky;
  }
  s->queue.push_back(Op{what, std::move(work)});
  ++s->enqueued;
  return cudaSuccess;
}

void set_last_error(cudaError_t error) { fail(error); }

bool is_device_range(const void* p, size_t bytes) {
  State& st = state();
  Lock lock(st.mutex);
  return find(st.device, p, bytes, nullptr) != nullptr;
}

bool launch_config_ok(dim3 grid, dim3 block, size_t shared_bytes) {
  // Programming Guide, "Compute Capabilities", table "Technical Specifications" (9.0).
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  return grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 2147483647u && grid.y <= 65535 && grid.z <= 65535 &&
         threads >= 1 && threads <= kMaxThreadsPerBlock && block.z <= 64 && shared_bytes <= kSharedPerBlock;
}

Stats stats() {
  State& st = state();
  Lock lock(st.mutex);
  Stats out;
  out.bytes_in_use = st.in_use;
  out.capacity = st.capacity;
  out.executed = st.executed;
  for (Stream* s : st.streams) out.pending += s->queue.size();
  return out;
}

void set_compute_capability(int major, int minor) {
  compute_capability[0] = major;
  compute_capability[1] = minor;
}

cudaError_t drain_all() {
  State& st = state();
  Lock lock(st.mutex);
  drain_everything();
  return st.sticky;
}

}  // namespace ptrain::sim

using namespace ptrain::sim;

// ---------------------------------------------------------------------------- errors, versions
extern "C" {

cudaError_t cudaGetLastError(void) {
  State& st = state();
  Lock lock(st.mutex);
  const cudaError_t e = st.sticky != cudaSuccess ? st.sticky : st.last_error;
  st.last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (simulated device)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (a kernel failed on the simulated device)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return cudaGetErrorName(error);
  }
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;  // the simulated driver matches the runtime
  return cudaSuccess;
}

// ---------------------------------------------------------------------------- the device
// PTRAIN_SIM_DEVICES devices (default 1), for the multi-rank tests: each rank is a process with
// its own simulated memory and takes one of them, so they never share memory or streams.
static int device_count() {
  const char* n = std::getenv("PTRAIN_SIM_DEVICES");
  return n ? std::max(1, std::atoi(n)) : 1;
}
static int current_device = 0;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "ptrain simulated device");
  prop->major = compute_capability[0];
  prop->minor = compute_capability[1];
  prop->multiProcessorCount = 4;  // few: the emulator runs blocks one after another
  prop->totalGlobalMem = state().capacity;
  prop->sharedMemPerBlock = kSharedPerBlock;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
  prop->warpSize = 32;
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = compute_capability[0]; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = compute_capability[1]; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 4; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);  // an attribute the simulation does not know
  }
}

cudaError_t cudaDeviceSynchronize(void) {
  State& st = state();
  Lock lock(st.mutex);
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  drain_everything();
  return st.sticky;
}

// ---------------------------------------------------------------------------- memory
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  State& st = state();
  Lock lock(st.mutex);
  *ptr = nullptr;
  if (const int injected = injected_failure(__func__)) return fail(static_cast<cudaError_t>(injected));
  if (st.sticky != cudaSuccess) return st.sticky;
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  if (bytes > st.capacity - st.in_use) return fail(cudaErrorMemoryAllocation);
  void* p = map_bytes(bytes);
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xFF, std::min(bytes, kPoisonLimit));  // cudaMalloc does not clear memory
  st.device[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, false};
  st.in_use += bytes;
  ++st.ran["cudaMalloc"];  // so a run's report says how often it went to the device for memory
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  State& st = state();
  Lock lock(st.mutex);
  if (!ptr) return cudaSuccess;
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  auto it = st.device.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == st.device.end()) return fail(cudaErrorInvalidValue);
  drain_everything();  // cudaFree synchronises the device (Runtime API, cudaFree)
  unmap_poisoned(ptr, it->second.bytes);
  st.in_use -= it->second.bytes;
  st.device.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  State& st = state();
  Lock lock(st.mutex);
  *free_bytes = st.capacity - st.in_use;
  *total_bytes = st.capacity;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  State& st = state();
  Lock lock(st.mutex);
  *ptr = nullptr;
  if (const int injected = injected_failure(__func__)) return fail(static_cast<cudaError_t>(injected));
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  void* p = map_bytes(bytes);
  if (!p) return fail(cudaErrorMemoryAllocation);
  st.pinned[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, true};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  State& st = state();
  Lock lock(st.mutex);
  if (!ptr) return cudaSuccess;
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  auto it = st.pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == st.pinned.end()) return fail(cudaErrorInvalidValue);
  drain_everything();  // cudaFreeHost synchronises the device
  unmap_poisoned(ptr, it->second.bytes);
  st.pinned.erase(it);
  return cudaSuccess;
}

}  // extern "C"

namespace {

// A copy's name in diagnostics and the report: which memories it joined, since pinned and
// pageable host memory take different paths.
const char* copy_name(Space src, Space dst) {
  if (src == Space::device) return dst == Space::device ? "cudaMemcpyAsync device to device"
                                   : dst == Space::pinned ? "cudaMemcpyAsync device to pinned host"
                                                          : "cudaMemcpyAsync device to pageable host";
  return src == Space::pinned ? "cudaMemcpyAsync pinned host to device" : "cudaMemcpyAsync pageable host to device";
}

// Checks that a copy's direction matches where its pointers are (cudaMemcpyDefault infers it).
cudaError_t check_direction(const void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Space* dst_space,
                            Space* src_space) {
  *dst_space = space_of(dst, bytes);
  *src_space = space_of(src, bytes);
  const bool dst_dev = *dst_space == Space::device, src_dev = *src_space == Space::device;
  switch (kind) {
    case cudaMemcpyHostToDevice: return dst_dev && !src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return !dst_dev && src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return dst_dev && src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return dst_dev || src_dev ? cudaSuccess : cudaErrorInvalidValue;
    default: return cudaErrorInvalidMemcpyDirection;
  }
}

}  // namespace

extern "C" {

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  if (st.sticky != cudaSuccess) return st.sticky;
  if (bytes == 0) return cudaSuccess;
  Space dst_space, src_space;
  if (const cudaError_t e = check_direction(dst, src, bytes, kind, &dst_space, &src_space)) return fail(e);
  Stream* s = stream_of(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  // Runtime API, "API synchronization behavior": a copy from pageable host memory is staged
  // (the data is taken now); a copy to pageable host memory returns once it completed, which a
  // capture cannot record.
  if (dst_space == Space::pageable && s->capturing) {
    s->capture_invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::function<void()> work;
  if (src_space == Space::pageable && !s->capturing) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    work = [dst, staged]() { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    work = [dst, src, bytes]() { std::memmove(dst, src, bytes); };
  }
  if (const cudaError_t e = enqueue(stream, copy_name(src_space, dst_space), std::move(work))) return fail(e);
  if (dst_space == Space::pageable) drain(s);
  return st.sticky;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  State& st = state();
  Lock lock(st.mutex);
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);  // the legacy stream: eager
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  if (bytes == 0) return cudaSuccess;
  if (space_of(dst, bytes) != Space::device) return fail(cudaErrorInvalidValue);
  const cudaError_t e = enqueue(stream, "cudaMemsetAsync", [dst, value, bytes]() { std::memset(dst, value, bytes); });
  return e == cudaSuccess ? cudaSuccess : fail(e);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  State& st = state();
  Lock lock(st.mutex);
  if (unsafe_calls_prohibited()) return refuse_in_capture();
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}

// ---------------------------------------------------------------------------- streams, events
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = new Stream;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  st.streams.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = stream_of(stream);
  if (!s || s == &st.legacy) return fail(cudaErrorInvalidResourceHandle);
  *flags = s->blocking ? cudaStreamDefault : cudaStreamNonBlocking;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = stream_of(stream);
  if (!s || s == &st.legacy) return fail(cudaErrorInvalidResourceHandle);
  drain(s);  // "the work already queued completes" (Runtime API, cudaStreamDestroy)
  st.streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = stream_of(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (s->capturing) {
    s->capture_invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s == &st.legacy) drain_blocking_streams();
  drain(s);
  return st.sticky;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  Event* e = reinterpret_cast<Event*>(event);
  Stream* s = stream_of(stream);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  e->stream = s;
  e->position = s->enqueued;
  e->captured = s->capturing;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  State& st = state();
  Lock lock(st.mutex);
  Event* e = reinterpret_cast<Event*>(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (e->captured) return fail(cudaErrorCapturedEvent);
  if (e->stream) run_until(e->stream, e->position);
  return st.sticky;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  State& st = state();
  Lock lock(st.mutex);
  Event* e = reinterpret_cast<Event*>(event);
  Stream* s = stream_of(stream);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  if (!e->stream) return cudaSuccess;  // a never-recorded event is complete
  if (s->capturing || e->captured) {
    // Cross-stream capture (fork and join) is not simulated: ptrain captures one stream.
    if (e->stream != s) {
      s->capture_invalid = s->capturing;
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;  // an event of the capturing stream itself orders nothing new
  }
  if (s == &st.legacy) {
    run_until(e->stream, e->position);
    return st.sticky;
  }
  Op wait;
  wait.what = "cudaStreamWaitEvent";
  wait.wait_on = e->stream;
  wait.wait_until = e->position;
  s->queue.push_back(std::move(wait));
  ++s->enqueued;
  return cudaSuccess;
}

// ---------------------------------------------------------------------------- capture, graphs
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = stream_of(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (s == &st.legacy) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot be captured
  if (s->capturing) return fail(cudaErrorIllegalState);
  s->capturing = true;
  s->capture_invalid = false;
  s->capture_mode = mode;
  s->capture = std::make_unique<Graph>();
  if (mode != cudaStreamCaptureModeRelaxed) ++st.captures_prohibiting_unsafe_calls;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = stream_of(stream);
  *graph = nullptr;
  if (!s || !s->capturing) return fail(cudaErrorIllegalState);
  s->capturing = false;
  if (s->capture_mode != cudaStreamCaptureModeRelaxed) --st.captures_prohibiting_unsafe_calls;
  std::unique_ptr<Graph> g = std::move(s->capture);
  if (s->capture_invalid) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(g.release());
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (const int injected = injected_failure(__func__)) return fail(static_cast<cudaError_t>(injected));
  if (!graph) return fail(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(new Graph(*reinterpret_cast<Graph*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  if (!exec) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = enqueue(stream, "cudaGraphLaunch", [] {})) return fail(e);  // counted in the report
  for (const Op& op : reinterpret_cast<Graph*>(exec)->ops)
    if (const cudaError_t e = enqueue(stream, op.what.c_str(), op.run)) return fail(e);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<Graph*>(exec);
  return cudaSuccess;
}

}  // extern "C"
