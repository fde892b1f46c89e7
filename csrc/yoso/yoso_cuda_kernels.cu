// CUDA kernels of YOSO attention's LSH cumulation (yoso_cuda_kernels.h): table rows filled from the keys
// (by each run's first position, or by every key with atomicAdd), then read by the queries. Plain CUDA
// through yoso_simt.h: no torch headers, so this file compiles with nvcc on any machine and, with
// -DYOSO_SIMT_EMULATION, with a host compiler to run on the CPU under the suite's sanitizers.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"

namespace yoso {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block: one key, sorted position or query each
constexpr int kValueSlots = 4;    // value coordinates per lane and tile kept in registers
constexpr int kValueTiles = 2;    // tiles of 32 · 4 coordinates: dv ≤ 256

YOSO_DEVICE const float* weights_of(const float* weights, int64_t b, int mw, int64_t h, int p, int n) {
  return weights + (b * mw + (mw == 1 ? 0 : h)) * int64_t(p) * n;
}

// Deterministic. One warp per sorted key position of a pair of the chunk: the first position of a run sums
// the run's weighted values into its row, [p channels × dv], at that position, in sorted order. Lanes run
// over dv.
YOSO_GLOBAL void bucket_rows_kernel(Cumulation c, float* rows, int64_t first_pair) {
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / c.m, h = pair % c.m;
  const int t = blockIdx.x * kRowsPerBlock + threadIdx.y;
  if (t >= c.nk) return;
  const int32_t* sorted = c.sorted_k + pair * c.nk;
  const int32_t code = load(sorted + t);
  if (t > 0 && load(sorted + t - 1) == code) return;  // inside a run: its first position sums it
  const int32_t* order = c.order_k + pair * c.nk;
  const float* weight = weights_of(c.weight_k, b, c.mk, h, c.p, c.nk);
  float* row = rows + (local * c.nk + t) * int64_t(c.p) * c.dv;
  for (int channel = 0; channel < c.p; ++channel) {
    for (int l = threadIdx.x; l < c.dv; l += kWarp) {
      float sum = 0.0f;
      for (int r = t; r < c.nk && load(sorted + r) == code; ++r) {
        const int32_t j = load(order + r);
        const float w = load(weight + int64_t(channel) * c.nk + j);
        if (w != 0.0f) sum += w * load(c.values + (b * c.nk + j) * c.dv + l);
      }
      store(row + int64_t(channel) * c.dv + l, sum);
    }
  }
}

// Atomic. One warp per key of a pair of the chunk: the key adds its weighted value to its code's row
// (direct: row = code; else the first position of its run among the sorted codes). Lanes run over dv.
YOSO_GLOBAL void scatter_rows_kernel(Cumulation c, float* rows, int64_t rows_per_pair, bool direct,
                                     int64_t first_pair) {
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / c.m, h = pair % c.m;
  const int j = blockIdx.x * kRowsPerBlock + threadIdx.y;
  if (j >= c.nk) return;
  const int32_t code = checked_code(c.codes_k, pair * c.nk + j, c.tau);
  const int row_at = direct ? code : lower_bound(c.sorted_k + pair * c.nk, c.nk, code);
  const float* weight = weights_of(c.weight_k, b, c.mk, h, c.p, c.nk) + j;
  float* row = rows + (local * rows_per_pair + row_at) * int64_t(c.p) * c.dv;
  for (int channel = 0; channel < c.p; ++channel) {
    const float w = load(weight + int64_t(channel) * c.nk);
    if (w == 0.0f) continue;
    for (int l = threadIdx.x; l < c.dv; l += kWarp) {
      atomic_add(row + int64_t(channel) * c.dv + l, w * load(c.values + (b * c.nk + j) * c.dv + l));
    }
  }
}

// One warp per query of a batch element of the chunk. The warp's lanes find the query's rows under 32
// hashes at once (a lane per hash: its code; a binary search unless direct) and leave them in shared
// memory; then every lane sums its value coordinates of the found rows, over every hash of the chunk, in
// registers, and adds them to its output once (a single writer: no atomics). dv <= 256.
YOSO_GLOBAL void gather_rows_kernel(Cumulation c, const float* rows, int64_t rows_per_pair, bool direct,
                                    int64_t first_pair, int64_t end_pair, float inv_m) {
  YOSO_DYNAMIC_SHARED(int, found);  // [kRowsPerBlock][kWarp]: a query's row under each hash of the group
  int* position = found + threadIdx.y * kWarp;
  const int64_t b = first_pair / c.m + blockIdx.y;
  const int i = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const bool valid = i < c.nq;  // no early return: every thread meets the block's barriers
  const int64_t begin = first_pair > b * c.m ? first_pair - b * c.m : 0;
  const int64_t end = end_pair < (b + 1) * c.m ? end_pair - b * c.m : c.m;
  float sum[kValueTiles][kValueSlots];
  for (int tile = 0; tile < kValueTiles; ++tile) {
    for (int s = 0; s < kValueSlots; ++s) sum[tile][s] = 0.0f;
  }
  for (int64_t group = begin; group < end; group += kWarp) {
    const int64_t h = group + threadIdx.x;
    int t = -1;  // no row: no key has this code
    if (valid && h < end) {
      const int64_t pair = b * c.m + h;
      const int32_t code = checked_code(c.codes_q, pair * c.nq + i, c.tau);
      t = direct ? code : find_first(c.sorted_k + pair * c.nk, c.nk, code);
    }
    position[threadIdx.x] = t;
    __syncthreads();
    const int count = static_cast<int>(end - group < kWarp ? end - group : kWarp);
    for (int u = 0; valid && u < count; ++u) {
      const int row_at = position[u];
      if (row_at < 0) continue;
      const int64_t pair = b * c.m + group + u;
      const float* row = rows + ((pair - first_pair) * rows_per_pair + row_at) * int64_t(c.p) * c.dv;
      const float* weight = weights_of(c.weight_q, b, c.mq, group + u, c.p, c.nq) + i;
      for (int channel = 0; channel < c.p; ++channel) {
        const float w = load(weight + int64_t(channel) * c.nq);
        if (w == 0.0f) continue;
        for (int tile = 0; tile < kValueTiles; ++tile) {
          for (int s = 0; s < kValueSlots; ++s) {
            const int l = (tile * kValueSlots + s) * kWarp + threadIdx.x;
            if (l < c.dv) sum[tile][s] += w * load(row + int64_t(channel) * c.dv + l);
          }
        }
      }
    }
    __syncthreads();  // the next group overwrites the positions
  }
  if (!valid) return;
  for (int tile = 0; tile < kValueTiles; ++tile) {
    for (int s = 0; s < kValueSlots; ++s) {
      const int l = (tile * kValueSlots + s) * kWarp + threadIdx.x;
      if (l < c.dv) {
        float* y = c.out + (b * c.nq + i) * c.dv + l;
        store(y, load(y) + inv_m * sum[tile][s]);
      }
    }
  }
}

}  // namespace

cudaError_t launch_cumulation_chunk(const Cumulation& c, float* rows, int64_t rows_per_pair, bool direct,
                                    bool atomic, int64_t first, int64_t end, cudaStream_t stream) {
  if (c.dv > kValueTiles * kValueSlots * kWarp || end - first > 65535 || (direct && !atomic)) {
    return cudaErrorInvalidValue;  // the host logic says so first
  }
  const dim3 block(kWarp, kRowsPerBlock);
  const dim3 keys((c.nk + kRowsPerBlock - 1) / kRowsPerBlock, static_cast<unsigned>(end - first));
  const cudaError_t status =
      atomic ? YOSO_LAUNCH(scatter_rows_kernel, keys, block, 0, stream, c, rows, rows_per_pair, direct, first)
             : YOSO_LAUNCH(bucket_rows_kernel, keys, block, 0, stream, c, rows, first);
  if (status != cudaSuccess) return status;
  const int64_t batches = (end - 1) / c.m - first / c.m + 1;
  return YOSO_LAUNCH(gather_rows_kernel, dim3((c.nq + kRowsPerBlock - 1) / kRowsPerBlock, static_cast<unsigned>(batches)),
                     block, kRowsPerBlock * kWarp * sizeof(int), stream, c, rows, rows_per_pair, direct, first, end,
                     1.0f / c.m);
}

}  // namespace yoso
