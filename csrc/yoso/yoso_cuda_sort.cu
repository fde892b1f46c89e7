// Each pair's codes sorted stably by a counting sort, one block a pair (yoso_cuda_kernels.h): the codes
// counted in shared memory (2^tau counters; from tau = 14, past 48 KB, the block opts into more), the counts
// scanned into each code's first position (the pair's run starts, written on the way), then every token
// placed in token order. One launch instead of torch's sort, its int64-to-int32 copy, the starts' fill and
// launch_run_starts; the same output, bit for bit, as a stable sort.
#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"

namespace yoso {
namespace {

constexpr int kSortThreads = 128;
constexpr int kSortWarps = kSortThreads / kWarp;

// The sum of `value` over this lane and the lanes below it in the warp (a shuffle scan).
YOSO_DEVICE int inclusive_warp_sum(int value) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const int below = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += below;
  }
  return value;
}

// Block x: a pair. cursor[code] counts the pair's tokens of each code, then becomes the code's next free
// sorted position. Tokens are placed in rounds of kSortThreads, in token order: a warp ranks its lanes of
// one code among themselves (__match_any_sync), and the warps of a round take turns on the cursors, so a
// code's tokens land in token order (stable) in any schedule.
YOSO_GLOBAL void counting_sort_kernel(const int32_t* codes, int n, int tau, int32_t* sorted, int32_t* order,
                                      int32_t* starts) {
  YOSO_DYNAMIC_SHARED(int, cursor);  // [2^tau] per code, then [kSortWarps] the scan's warp totals
  const int code_count = 1 << tau;
  int* totals = cursor + code_count;
  const int64_t pair = blockIdx.x;
  codes += pair * n, sorted += pair * n, order += pair * n;
  for (int code = threadIdx.x; code < code_count; code += kSortThreads) cursor[code] = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < n; t += kSortThreads) shared_increment(cursor + checked_code(codes, t, tau));
  __syncthreads();
  // Warp w scans codes [first, last), a contiguous share of them, a lane a code (coalesced, no bank conflict):
  // its total first, then, after the totals of the warps before it, each code's first position.
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int share = (code_count + kSortWarps * kWarp - 1) / (kSortWarps * kWarp) * kWarp;
  const int first = warp * share < code_count ? warp * share : code_count;
  const int last = first + share < code_count ? first + share : code_count;
  int total = 0;
  for (int code = first + lane; code < last; code += kWarp) total += cursor[code];
  total = __shfl_sync(0xffffffffu, inclusive_warp_sum(total), kWarp - 1);
  if (lane == 0) totals[warp] = total;
  __syncthreads();
  int at = 0;
  for (int w = 0; w < warp; ++w) at += totals[w];
  for (int base = first; base < last; base += kWarp) {
    const int code = base + lane;
    const int count = code < last ? cursor[code] : 0;
    const int inclusive = inclusive_warp_sum(count);
    if (code < last) {
      cursor[code] = at + inclusive - count;
      if (starts != nullptr) store(starts + (pair << tau) + code, int32_t(count > 0 ? at + inclusive - count : -1));
    }
    at += __shfl_sync(0xffffffffu, inclusive, kWarp - 1);
  }
  __syncthreads();
  int32_t next = threadIdx.x < n ? load(codes + threadIdx.x) : -1;  // checked when counted
  for (int round = 0; round < n; round += kSortThreads) {
    const int t = round + threadIdx.x;
    const bool listed = t < n;
    const int32_t code = next;
    next = t + kSortThreads < n ? load(codes + t + kSortThreads) : -1;  // in flight through this round's turns
    const unsigned peers = __match_any_sync(0xffffffffu, code);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const bool last_of_code = (peers >> lane) == 1u;
    const int turns = (n - round + kWarp - 1) / kWarp < kSortWarps ? (n - round + kWarp - 1) / kWarp : kSortWarps;
    for (int turn = 0; turn < turns; ++turn) {
      if (warp == turn) {
        const int position = listed ? cursor[code] + rank : 0;
        __syncwarp();  // every lane has read its code's cursor before the last one moves it
        if (listed) {
          store(sorted + position, code);
          store(order + position, int32_t(t));
          if (last_of_code) cursor[code] = position + 1;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace

int64_t counting_sort_bytes(int tau) { return ((int64_t(1) << tau) + kSortWarps) * int64_t(sizeof(int)); }

cudaError_t launch_counting_sort(const int32_t* codes, int64_t rows, int n, int tau, int32_t* sorted, int32_t* order,
                                 int32_t* starts, int64_t most_shared_bytes, cudaStream_t stream) {
  if (tau < 0 || tau > 30 || rows > 2147483647) return cudaErrorInvalidValue;  // the host checks first
  if (rows * n == 0) return cudaSuccess;
  const int64_t bytes = counting_sort_bytes(tau);
  const cudaError_t allowed = allow_shared_bytes(counting_sort_kernel, bytes, most_shared_bytes);
  if (allowed != cudaSuccess) return allowed;
  return YOSO_LAUNCH(counting_sort_kernel, dim3(static_cast<unsigned>(rows)), dim3(kSortThreads), bytes, stream, codes,
                     n, tau, sorted, order, starts);
}

}  // namespace yoso
