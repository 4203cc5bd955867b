// The SIMT emulator's own tests: it runs correct kernels correctly under every thread order,
// and it catches what it claims to catch (missing barriers, divergent barriers, bad masks,
// deadlock, bad launches, out-of-bounds accesses under AddressSanitizer).
#include <cmath>
#include <numeric>

#include "kernel_test.h"

namespace ptrain::test {
namespace {

using Catch::Matchers::Contains;
using kernels::kWarpSize;

// ---------------------------------------------------------------- kernels under test

// out[i] = in[i] + in[i - 1] (block-local neighbour through shared memory).
template <bool kBarrier>
__global__ void neighbour_sum_kernel(float* out, const float* in) {
  PTRAIN_DYNAMIC_SHARED(float, cache);
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  cache[t] = in[i];
  if (kBarrier) __syncthreads();
  out[i] = cache[t] + (t > 0 ? cache[t - 1] : 0.0f);
}

template <bool kBarrier>
std::vector<float> neighbour_sum(const std::vector<float>& in, int block) {
  std::vector<float> out = poisoned<float>(in.size());
  auto kernel = neighbour_sum_kernel<kBarrier>;
  PTRAIN_LAUNCH(kernel, static_cast<int>(in.size()) / block, block, block * sizeof(float), nullptr, out.data(), in.data());
  return out;
}

__global__ void block_sum_kernel(float* out, const float* in, int n) {
  PTRAIN_DYNAMIC_SHARED(float, scratch);
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[i];
  v = kernels::block_sum(v, scratch);
  if (threadIdx.x == 0) *out = v;
}

__global__ void barrier_skipped_by_some_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void half_mask_shuffle_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);  // called by all 32 lanes
}

__global__ void full_mask_in_short_block_kernel(float* out) {
  out[threadIdx.x] = kernels::warp_sum(1.0f);  // a 16-thread block: lanes 16-31 do not exist
}

__global__ void shuffle_from_outside_mask_kernel(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<float>(threadIdx.x), 20);
}

__global__ void exited_lane_deadlock_kernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = kernels::warp_sum(1.0f);
}

__global__ void warp_ops_kernel(int* out, int width) {
  const int lane = threadIdx.x;
  int* o = out + lane * 7;
  o[0] = __shfl_sync(0xffffffffu, lane * 10, 3, width);
  o[1] = __shfl_up_sync(0xffffffffu, lane * 10, 2, width);
  o[2] = __shfl_down_sync(0xffffffffu, lane * 10, 2, width);
  o[3] = __shfl_xor_sync(0xffffffffu, lane * 10, 5, width);
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  o[5] = __any_sync(0xffffffffu, lane == 31);
  o[6] = __all_sync(0xffffffffu, lane < 31);
}

// Lanes of the lower half publish through shared memory; __syncwarp on their mask orders it.
__global__ void syncwarp_publish_kernel(float* out) {
  PTRAIN_DYNAMIC_SHARED(float, cache);
  const int lane = threadIdx.x;
  if (lane < 16) {
    cache[lane] = static_cast<float>(lane);
    __syncwarp(0x0000ffffu);
    out[lane] = cache[15 - lane];
  } else {
    out[lane] = -1.0f;
  }
}

// Reverses each block's slice through a static __shared__ array.
__global__ void reverse_static_shared_kernel(float* out, const float* in) {
  __shared__ float tile[64];
  const int t = threadIdx.x, base = blockIdx.x * 64;
  tile[t] = in[base + t];
  __syncthreads();
  out[base + t] = tile[63 - t];
}

__global__ void count_blocks_kernel(int* counter) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) atomicAdd(counter, 1);
}

__global__ void read_shared_unwritten_kernel(float* out) {
  PTRAIN_DYNAMIC_SHARED(float, cache);
  out[threadIdx.x] = cache[threadIdx.x];
}

__global__ void unguarded_copy_kernel(float* out, const float* in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // no `if (i < n)`: overruns
  out[i] = in[i];
}

__global__ void empty_kernel() {}

std::vector<float> iota_floats(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

// ---------------------------------------------------------------- tests

TEST_CASE("simt: a correct kernel gives the same result under every thread order", "[simt]") {
  const std::vector<float> in = iota_floats(256);
  std::vector<float> expected(in.size());
  for (size_t i = 0; i < in.size(); ++i) expected[i] = in[i] + (i % 64 ? in[i - 1] : 0.0f);
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    INFO(order.name());
    CHECK(neighbour_sum<true>(in, 64) == expected);
    std::vector<float> big = iota_floats(1000), sum = poisoned<float>(1);
    PTRAIN_LAUNCH(block_sum_kernel, 1, 256, 32 * sizeof(float), nullptr, sum.data(), big.data(), 1000);
    CHECK(sum[0] == 500500.0f);
  }
}

TEST_CASE("simt: a missing barrier fails under some thread order", "[simt]") {
  const std::vector<float> in = iota_floats(128);
  const std::vector<float> expected = [&] {
    simt::ScopedOptions use({simt::Order::ascending, 0});
    return neighbour_sum<true>(in, 64);
  }();
  int wrong_orders = 0;
  bool ascending_hides_it = false;
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    const std::vector<float> got = neighbour_sum<false>(in, 64);
    const bool wrong = relative_error(got, expected) != 0;  // NaN (unwritten shared memory) counts as wrong
    wrong_orders += wrong;
    if (order.order == simt::Order::ascending) ascending_hides_it = !wrong;
  }
  // Thread t reads what thread t-1 wrote: run in ascending order, the bug stays hidden; that is
  // why every kernel test also runs descending and random orders.
  CHECK(ascending_hides_it);
  CHECK(wrong_orders >= 2);
}

TEST_CASE("simt: a barrier not reached by every thread is reported", "[simt]") {
  std::vector<float> out(64);
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(barrier_skipped_by_some_kernel, 1, 64, 0, nullptr, out.data()),
                    Contains("is not reached by 48 of 64 threads"));
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr, out.data()),
                    Contains("divergent __syncthreads"));
}

TEST_CASE("simt: bad warp masks are reported", "[simt]") {
  std::vector<float> out(32);
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(half_mask_shuffle_kernel, 1, 32, 0, nullptr, out.data()),
                    Contains("leaves out the calling lane"));
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(full_mask_in_short_block_kernel, 1, 16, 0, nullptr, out.data()),
                    Contains("names lanes that do not exist"));
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(shuffle_from_outside_mask_kernel, 1, 32, 0, nullptr, out.data()),
                    Contains("which is not in the mask"));
}

TEST_CASE("simt: deadlock is reported instead of hanging", "[simt]") {
  std::vector<float> out(32);
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(exited_lane_deadlock_kernel, 1, 32, 0, nullptr, out.data()),
                    Contains("deadlock") && Contains("5 (exited)"));
}

TEST_CASE("simt: shuffles and votes follow CUDA's semantics", "[simt]") {
  for (int width : {32, 8}) {
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("width " << width << ", " << order.name());
      std::vector<int> out(32 * 7, -1);
      PTRAIN_LAUNCH(warp_ops_kernel, 1, 32, 0, nullptr, out.data(), width);
      unsigned ballot = 0;
      for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
      for (int l = 0; l < 32; ++l) {
        INFO("lane " << l);
        const int seg = l / width * width, in_seg = l - seg;
        CHECK(out[l * 7 + 0] == (seg + 3 % width) * 10);
        CHECK(out[l * 7 + 1] == (in_seg >= 2 ? l - 2 : l) * 10);
        CHECK(out[l * 7 + 2] == (in_seg + 2 < width ? l + 2 : l) * 10);
        CHECK(out[l * 7 + 3] == ((l ^ 5) < seg + width ? l ^ 5 : l) * 10);
        CHECK(static_cast<unsigned>(out[l * 7 + 4]) == ballot);
        CHECK(out[l * 7 + 5] == 1);
        CHECK(out[l * 7 + 6] == 0);
      }
    }
  }
}

TEST_CASE("simt: __syncwarp completes when every lane of its mask arrives", "[simt]") {
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    INFO(order.name());
    std::vector<float> out = poisoned<float>(32);
    PTRAIN_LAUNCH(syncwarp_publish_kernel, 1, 32, 16 * sizeof(float), nullptr, out.data());
    for (int l = 0; l < 32; ++l) CHECK(out[l] == (l < 16 ? static_cast<float>(15 - l) : -1.0f));
  }
}

TEST_CASE("simt: grids, atomics and poisoned shared memory", "[simt]") {
  int counter = 0;
  const uint64_t before = simt::launch_count();
  PTRAIN_LAUNCH(count_blocks_kernel, dim3(3, 4, 5), dim3(8, 2, 2), 0, nullptr, &counter);
  CHECK(counter == 60);
  CHECK(simt::launch_count() == before + 1);
  std::vector<float> out(32, 0.0f);
  PTRAIN_LAUNCH(read_shared_unwritten_kernel, 1, 32, 32 * sizeof(float), nullptr, out.data());
  for (float x : out) CHECK(std::isnan(x));
}

TEST_CASE("simt: static __shared__ memory is one array per block", "[simt]") {
  const std::vector<float> in = iota_floats(256);
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    INFO(order.name());
    std::vector<float> out = poisoned<float>(256);
    PTRAIN_LAUNCH(reverse_static_shared_kernel, 4, 64, 0, nullptr, out.data(), in.data());
    for (int i = 0; i < 256; ++i) CHECK(out[i] == in[i / 64 * 64 + 63 - i % 64]);
  }
}

TEST_CASE("simt: launches a GPU would refuse are refused", "[simt]") {
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(empty_kernel, 1, 2048, 0, nullptr), Contains("2048 threads"));
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(empty_kernel, 0, 32, 0, nullptr), Contains("empty grid"));
  CHECK_THROWS_WITH(PTRAIN_LAUNCH(empty_kernel, 1, 32, 64 * 1024, nullptr), Contains("dynamic shared memory"));
}

// Run only by the AddressSanitizer build's ctest, which expects ASan's report (see CMake).
TEST_CASE("simt: an out-of-bounds access in a kernel", "[.asan-oob]") {
  std::vector<float> in(100, 1.0f), out(100);
  PTRAIN_LAUNCH(unguarded_copy_kernel, 4, 32, 0, nullptr, out.data(), in.data());  // 128 threads, 100 elements
}

}  // namespace
}  // namespace ptrain::test
