// The SIMT emulator's scheduler: blocks run one at a time, each thread a Boost.Context fiber.
// See simt.h for what it emulates and diagnoses.
#include "simt.h"

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <numeric>
#include <sstream>
#include <vector>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace simt {
namespace {

namespace ctx = boost::context;

// Instrumented frames are larger under AddressSanitizer.
#ifdef __SANITIZE_ADDRESS__
constexpr size_t kFiberStack = 256 * 1024;
#else
constexpr size_t kFiberStack = 64 * 1024;
#endif
// What a GPU accepts without opting in with cudaFuncSetAttribute (which ptrain's kernels avoid).
constexpr size_t kMaxDynamicShared = 48 * 1024;

enum class Status { runnable, at_barrier, at_collective, finished };

struct Thread {
  ctx::fiber fiber;
  Status status = Status::runnable;
  uint3 idx{};
  // Where it waits (barrier or collective), for diagnostics.
  const char* what = "";
  const char* file = "";
  int line = 0;
  // Its part in a warp collective.
  detail::Collective collective{};
  detail::ShuffleKind shuffle{};
  unsigned mask = 0;
  int lane_arg = 0;
  int width = 32;
  uint64_t payload = 0;
  uint64_t result = 0;
};

struct Pending {  // a warp collective waiting for lanes
  detail::Collective kind;
  unsigned mask;
  unsigned arrived;
};

struct Block {
  std::vector<Thread> threads;
  std::vector<std::vector<Pending>> warps;
  ctx::fiber scheduler;  // the way back to the scheduler, held by whichever fiber runs
  int current = -1;
  std::string error;     // set by a fiber that found a fault; the scheduler throws it
  std::exception_ptr exception;
  std::unique_ptr<unsigned char[]> shared;
  std::string where;     // "kernel k, block (x,y,z)"
};

thread_local Options g_options;
thread_local Block* g_block = nullptr;
std::atomic<uint64_t> g_launches{0};

// Launches come from one OS thread at a time (the tests are single-threaded). Neither object
// below is ever destroyed, so LeakSanitizer sees abandoned fibers' memory as reachable.
ctx::pooled_fixedsize_stack& stacks() {
  static auto* pool = new ctx::pooled_fixedsize_stack(kFiberStack);
  return *pool;
}
// Fibers of a block that failed are parked here, never resumed or destroyed: destroying a
// suspended fiber unwinds its frames on the fiber's stack, which AddressSanitizer mistakes for
// stack corruption.
std::vector<ctx::fiber>& abandoned_fibers() {
  static auto* fibers = new std::vector<ctx::fiber>;
  return *fibers;
}

std::string dims(uint3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string dims(dim3 d) { return dims(uint3{d.x, d.y, d.z}); }
std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
std::string site(const Thread& t) { return std::string(t.what) + " at " + t.file + ":" + std::to_string(t.line); }

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The order in which `n` items (threads of a block, or blocks of a grid) are visited.
std::vector<int> visit_order(int n, uint64_t stream) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (g_options.order == Order::descending) std::reverse(order.begin(), order.end());
  if (g_options.order == Order::random) {
    uint64_t state = mix64(g_options.seed ^ mix64(stream));
    for (int i = n - 1; i > 0; --i) {
      state = mix64(state);
      std::swap(order[i], order[static_cast<int>(state % static_cast<uint64_t>(i + 1))]);
    }
  }
  return order;
}

// Called on a fiber: gives control back to the scheduler until it resumes this thread.
void yield_to_scheduler() {
  Block& b = *g_block;
  b.scheduler = std::move(b.scheduler).resume();
}

// Called on a fiber: records a fault and yields for good (the scheduler throws and parks the
// fiber). Not [[noreturn]]: AddressSanitizer mishandles noreturn calls on fiber stacks, so
// callers `return fault(...)`.
uint64_t fault(const std::string& message) {
  Block& b = *g_block;
  const Thread& t = b.threads[b.current];
  b.error = b.where + ", thread " + dims(t.idx) + ": " + message;
  yield_to_scheduler();
  return 0;
}

void set_builtins(const Block& b, int i) { threadIdx = b.threads[i].idx; }

void run_thread(Block& b, int i) {
  b.current = i;
  set_builtins(b, i);
  Thread& t = b.threads[i];
  t.fiber = std::move(t.fiber).resume();
  if (!t.fiber) t.status = Status::finished;
}

// The ballot of the lanes of `mask` of the warp starting at thread `base` (votes only).
unsigned ballot_of(const Block& b, int base, unsigned mask) {
  unsigned votes = 0;
  for (int j = 0; j < 32; ++j)
    if ((mask >> j) & 1u) votes |= (b.threads[base + j].payload != 0 ? 1u : 0u) << j;
  return votes;
}

// Result of a completed collective for lane `l` of the warp starting at thread `base`; `votes`
// is the ballot, computed once per collective.
uint64_t collective_result(Block& b, int base, unsigned mask, int l, unsigned votes) {
  const Thread& t = b.threads[base + l];
  switch (t.collective) {
    case detail::Collective::syncwarp: return 0;
    case detail::Collective::ballot: return votes;
    case detail::Collective::any: return votes != 0;
    case detail::Collective::all: return votes == mask;
    case detail::Collective::shuffle: break;
  }
  const int w = t.width, segment = l & ~(w - 1);
  int src = l;
  switch (t.shuffle) {
    case detail::ShuffleKind::idx: src = segment + (t.lane_arg & (w - 1)); break;
    case detail::ShuffleKind::up: src = (l - segment) >= t.lane_arg ? l - t.lane_arg : l; break;
    case detail::ShuffleKind::down: src = (l - segment) + t.lane_arg < w ? l + t.lane_arg : l; break;
    case detail::ShuffleKind::xor_: src = (l ^ t.lane_arg) < segment + w ? l ^ t.lane_arg : l; break;
  }
  if (src < 0 || src >= 32 || !((mask >> src) & 1u)) {
    b.current = base + l;
    return fault(std::string(t.what) + " at " + t.file + ":" + std::to_string(t.line) + ": lane " + std::to_string(l) +
          " reads lane " + std::to_string(src) + ", which is not in the mask " + hex(mask) + " (undefined on a GPU)");
  }
  return b.threads[base + src].payload;
}

// Every live thread is blocked: release a barrier that all reached, or report why none can move.
void resolve_stuck(Block& b) {
  std::vector<int> live, exited;
  for (int i = 0; i < static_cast<int>(b.threads.size()); ++i)
    (b.threads[i].status == Status::finished ? exited : live).push_back(i);
  if (live.empty()) return;
  const bool all_at_barrier = std::all_of(live.begin(), live.end(), [&](int i) {
    return b.threads[i].status == Status::at_barrier;
  });
  const Thread& first = b.threads[live[0]];
  if (all_at_barrier) {
    if (!exited.empty())
      throw Error(b.where + ": __syncthreads at " + first.file + ":" + std::to_string(first.line) + " is not reached by " +
                  std::to_string(exited.size()) + " of " + std::to_string(b.threads.size()) +
                  " threads, which exited (e.g. thread " + dims(b.threads[exited[0]].idx) +
                  "); every thread of a block must reach each barrier");
    for (int i : live) {
      const Thread& t = b.threads[i];
      if (t.line != first.line || std::strcmp(t.file, first.file) != 0)
        throw Error(b.where + ": divergent __syncthreads: thread " + dims(first.idx) + " waits at " + first.file + ":" +
                    std::to_string(first.line) + ", thread " + dims(t.idx) + " at " + t.file + ":" +
                    std::to_string(t.line));
    }
    for (int i : live) b.threads[i].status = Status::runnable;
    return;
  }
  std::ostringstream why;
  why << b.where << ": deadlock, no thread can continue:";
  int shown = 0;
  for (int i : live) {
    const Thread& t = b.threads[i];
    if (shown == 4) break;
    if (t.status == Status::at_collective) {
      const int base = i / 32 * 32;
      why << "\n  thread " << dims(t.idx) << " waits in " << site(t) << " with mask " << hex(t.mask) << "; missing lanes:";
      for (int l = 0; l < 32; ++l) {
        if (!((t.mask >> l) & 1u)) continue;
        const Thread& o = b.threads[base + l];
        if (o.status == Status::finished)
          why << " " << l << " (exited)";
        else if (o.status == Status::at_barrier)
          why << " " << l << " (at __syncthreads " << o.file << ":" << o.line << ")";
        else if (o.status == Status::at_collective && o.mask != t.mask)
          why << " " << l << " (in " << site(o) << " with mask " << hex(o.mask) << ")";
      }
      ++shown;
    } else if (t.status == Status::at_barrier && shown == 0) {
      why << "\n  thread " << dims(t.idx) << " waits at __syncthreads " << t.file << ":" << t.line;
      ++shown;
    }
  }
  throw Error(why.str());
}

void run_block(Block& b, const std::function<void()>& body, uint64_t block_linear) {
  const int n = static_cast<int>(b.threads.size());
  for (int i = 0; i < n; ++i) {
    b.threads[i].fiber = ctx::fiber(std::allocator_arg, stacks(), [&b, i, &body](ctx::fiber&& scheduler) {
      b.scheduler = std::move(scheduler);
      try {
        body();
      } catch (...) {
        b.exception = std::current_exception();
      }
      return std::move(b.scheduler);
    });
  }
  for (uint64_t round = 0;; ++round) {
    bool ran = false, live = false;
    for (int i : visit_order(n, block_linear * 0x10001ull + round)) {
      if (b.threads[i].status == Status::finished) continue;
      live = true;
      if (b.threads[i].status != Status::runnable) continue;
      run_thread(b, i);
      ran = true;
      if (!b.error.empty()) throw Error(b.error);
      if (b.exception) std::rethrow_exception(b.exception);
    }
    if (!live) return;
    if (!ran) resolve_stuck(b);
  }
}

void check_launch(dim3 grid, dim3 block, size_t shared, const char* kernel) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string problem;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) problem = "an empty grid " + dims(grid);
  else if (grid.y > 65535 || grid.z > 65535) problem = "grid " + dims(grid) + ": y and z are at most 65535";
  else if (threads == 0 || threads > 1024) problem = "block " + dims(block) + " has " + std::to_string(threads) + " threads (1 to 1024)";
  else if (block.x > 1024 || block.y > 1024 || block.z > 64) problem = "block " + dims(block) + " exceeds (1024,1024,64)";
  else if (shared > kMaxDynamicShared)
    problem = std::to_string(shared) + " bytes of dynamic shared memory (at most " + std::to_string(kMaxDynamicShared) +
              " without cudaFuncSetAttribute)";
  if (!problem.empty()) throw Error(std::string("launch of ") + kernel + ": " + problem);
}

}  // namespace

std::vector<Options> test_orders() {
  return {{Order::ascending, 0}, {Order::descending, 0}, {Order::random, 1}, {Order::random, 2}};
}

std::string Options::name() const {
  switch (order) {
    case Order::ascending: return "ascending";
    case Order::descending: return "descending";
    case Order::random: return "random(seed " + std::to_string(seed) + ")";
  }
  return "?";
}

void set_options(const Options& options) { g_options = options; }
Options options() { return g_options; }
uint64_t launch_count() { return g_launches.load(); }

void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const char* kernel, const std::function<void()>& body) {
  check_launch(grid, block, dynamic_shared_bytes, kernel);
  ++g_launches;
  if (g_block) throw Error(std::string("launch of ") + kernel + " from inside a kernel (dynamic parallelism is not emulated)");
  const int n = static_cast<int>(block.x * block.y * block.z);
  const int blocks = static_cast<int>(uint64_t{grid.x} * grid.y * grid.z);
  gridDim = grid;
  blockDim = block;
  for (int linear : visit_order(blocks, 0x5eed)) {
    Block b;
    b.threads.resize(n);
    for (int i = 0; i < n; ++i)
      b.threads[i].idx = uint3{static_cast<unsigned>(i) % block.x, static_cast<unsigned>(i) / block.x % block.y,
                               static_cast<unsigned>(i) / (block.x * block.y)};
    b.warps.resize((n + 31) / 32);
    blockIdx = uint3{static_cast<unsigned>(linear) % grid.x, static_cast<unsigned>(linear) / grid.x % grid.y,
                     static_cast<unsigned>(linear) / (grid.x * grid.y)};
    b.where = std::string("kernel ") + kernel + ", block " + dims(blockIdx);
    if (dynamic_shared_bytes > 0) {
      b.shared.reset(new unsigned char[dynamic_shared_bytes]);
      std::memset(b.shared.get(), 0xFF, dynamic_shared_bytes);
    }
    g_block = &b;
    try {
      run_block(b, body, static_cast<uint64_t>(linear));
    } catch (...) {
      for (Thread& t : b.threads)
        if (t.fiber) abandoned_fibers().push_back(std::move(t.fiber));
      g_block = nullptr;
      throw;
    }
    g_block = nullptr;
  }
}

namespace detail {

void* dynamic_shared_memory() {
  if (!g_block) throw Error("dynamic shared memory used outside a kernel");
  return g_block->shared.get();
}

void syncthreads(const char* file, int line) {
  Block& b = *g_block;
  Thread& t = b.threads[b.current];
  t.status = Status::at_barrier;
  t.what = "__syncthreads";
  t.file = file;
  t.line = line;
  yield_to_scheduler();
}

uint64_t warp_collective(Collective kind, unsigned mask, uint64_t payload, ShuffleKind shuffle, int lane_arg, int width,
                         const char* what, const char* file, int line) {
  if (!g_block) throw Error(std::string(what) + " called outside a kernel");
  Block& b = *g_block;
  const int me = b.current, lane = me % 32, base = me - lane;
  const int warp_threads = std::min(32, static_cast<int>(b.threads.size()) - base);
  const unsigned existing = warp_threads == 32 ? 0xffffffffu : (1u << warp_threads) - 1;
  // Built only for a diagnosis: this runs once per lane per collective.
  auto here = [&] { return std::string(what) + " at " + file + ":" + std::to_string(line); };
  if (!((mask >> lane) & 1u)) return fault(here() + ": the mask " + hex(mask) + " leaves out the calling lane " + std::to_string(lane));
  if (mask & ~existing)
    return fault(here() + ": the mask " + hex(mask) + " names lanes that do not exist (this warp has " +
          std::to_string(warp_threads) + " threads)");
  if (kind == Collective::shuffle && (width < 1 || width > 32 || (width & (width - 1)) != 0))
    return fault(here() + ": width " + std::to_string(width) + " is not a power of two up to 32");

  Thread& t = b.threads[me];
  t.collective = kind;
  t.shuffle = shuffle;
  t.mask = mask;
  t.lane_arg = lane_arg;
  t.width = width;
  t.payload = payload;
  t.what = what;
  t.file = file;
  t.line = line;

  auto& pending = b.warps[base / 32];
  auto it = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) { return (p.mask & mask) != 0; });
  if (it == pending.end()) {
    pending.push_back(Pending{kind, mask, 0});
    it = pending.end() - 1;
  } else if (it->mask != mask || it->kind != kind) {
    const int other = base + __builtin_ctz(it->arrived);
    return fault(here() + " with mask " + hex(mask) + " meets lane " + std::to_string(other % 32) + " waiting in " +
          site(b.threads[other]) + " with mask " + hex(it->mask) + ": lanes of one warp disagree");
  }
  it->arrived |= 1u << lane;
  if (it->arrived != mask) {
    t.status = Status::at_collective;
    yield_to_scheduler();
    return t.result;
  }
  // The last lane to arrive completes the collective for all.
  pending.erase(it);
  std::array<uint64_t, 32> results{};
  const bool vote = kind == Collective::ballot || kind == Collective::any || kind == Collective::all;
  const unsigned votes = vote ? ballot_of(b, base, mask) : 0u;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) results[l] = collective_result(b, base, mask, l, votes);
  b.current = me;
  for (int l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    b.threads[base + l].result = results[l];
    if (base + l != me) b.threads[base + l].status = Status::runnable;
  }
  return results[lane];
}

}  // namespace detail
}  // namespace simt
