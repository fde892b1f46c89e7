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
      t = direct ? code : run_of(c.starts_k, pair, c.tau, c.sorted_k + pair * c.nk, c.nk, code);
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

constexpr int kTableWarps = 8;   // warps per block of the shared-table cumulation
constexpr int kTableBatch = 8;   // listed tokens whose loads a lane has in flight at once
constexpr int kMostSlices = 16;  // code slices of a pair's table: each block of them reads every code again
constexpr int kTableChunks = 4;  // 32-token chunks a warp lists at once: their code loads in flight together
constexpr int kWarpTokens = kTableChunks * kWarp;
constexpr int kSlotBytes = kTableWarps * 2 * kWarpTokens * sizeof(int);  // each warp's listed tokens and rows

// The warp's kWarpTokens tokens from `base` (lane l loads tokens base + l, base + 32 + l, ...) whose code lies
// in [first_code, first_code + rows), listed in token order: token[at] and row[at] (code - first_code) for
// at < the count returned. The caller syncs the warp before the next call overwrites them.
YOSO_DEVICE int list_slice(const int32_t* codes, int n, int tau, int base, int first_code, int rows, int* token,
                           int* row) {
  const int lane = threadIdx.x;
  int32_t code[kTableChunks];
#pragma unroll
  for (int u = 0; u < kTableChunks; ++u) {
    const int t = base + u * kWarp + lane;
    code[u] = t < n ? checked_code(codes, t, tau) : -1;
  }
  int count = 0;
#pragma unroll
  for (int u = 0; u < kTableChunks; ++u) {
    const bool in_slice = code[u] >= first_code && code[u] < first_code + rows;
    const unsigned found = ballot(0xffffffffu, in_slice);
    if (in_slice) {
      const int at = count + bit_count(found & ((1u << lane) - 1u));
      token[at] = base + u * kWarp + lane;
      row[at] = code[u] - first_code;
    }
    count += bit_count(found);
  }
  __syncwarp();
  return count;
}

// Atomic, the table in shared memory. Block x: (pair, slice of `rows` codes), block y: 32 value columns, a
// lane each. table[row][channel][lane] is cleared; each key whose code falls in the slice adds w_k·v into
// its row (shared atomics); then each such query adds (1/m) Σ_channel w_q·row into its output (one global
// atomic a coordinate). A warp lists the matches among 128 tokens first (4 code loads in flight a lane),
// then its lanes load for 8 listed tokens at once.
YOSO_GLOBAL void table_cumulation_kernel(Cumulation c, int rows, int slices, float inv_m) {
  YOSO_DYNAMIC_SHARED(float, table);  // [rows][p][32] floats, then each warp's slots
  const int64_t pair = blockIdx.x / slices, b = pair / c.m, h = pair % c.m;
  const int first_code = static_cast<int>(blockIdx.x % slices) * rows;
  const int lane = threadIdx.x, column = blockIdx.y * kWarp + lane;
  const bool mine = column < c.dv;
  const int row_floats = c.p * kWarp, table_floats = rows * row_floats;
  int* token = reinterpret_cast<int*>(table + table_floats) + threadIdx.y * 2 * kWarpTokens;
  int* row = token + kWarpTokens;
  for (int f = threadIdx.y * kWarp + lane; f < table_floats; f += kTableWarps * kWarp) table[f] = 0.0f;
  __syncthreads();
  const float* weight_k = weights_of(c.weight_k, b, c.mk, h, c.p, c.nk);
  for (int base = threadIdx.y * kWarpTokens; base < c.nk; base += kTableWarps * kWarpTokens) {
    const int count = list_slice(c.codes_k + pair * c.nk, c.nk, c.tau, base, first_code, rows, token, row);
    for (int first = 0; first < count; first += kTableBatch) {
      float value[kTableBatch];
#pragma unroll
      for (int s = 0; s < kTableBatch; ++s) {
        const bool listed = first + s < count;
        value[s] = listed && mine ? load(c.values + (b * c.nk + token[first + s]) * c.dv + column) : 0.0f;
      }
      for (int channel = 0; channel < c.p; ++channel) {
        float w[kTableBatch];
#pragma unroll
        for (int s = 0; s < kTableBatch; ++s) {
          w[s] = first + s < count ? load(weight_k + int64_t(channel) * c.nk + token[first + s]) : 0.0f;
        }
#pragma unroll
        for (int s = 0; s < kTableBatch; ++s) {
          if (w[s] != 0.0f && mine) shared_add(table + row[first + s] * row_floats + channel * kWarp + lane, w[s] * value[s]);
        }
      }
    }
    __syncwarp();  // the next tokens overwrite the slots
  }
  __syncthreads();
  const float* weight_q = weights_of(c.weight_q, b, c.mq, h, c.p, c.nq);
  for (int base = threadIdx.y * kWarpTokens; base < c.nq; base += kTableWarps * kWarpTokens) {
    const int count = list_slice(c.codes_q + pair * c.nq, c.nq, c.tau, base, first_code, rows, token, row);
    for (int first = 0; first < count; first += kTableBatch) {
      float sum[kTableBatch];
#pragma unroll
      for (int s = 0; s < kTableBatch; ++s) sum[s] = 0.0f;
      for (int channel = 0; channel < c.p; ++channel) {
        float w[kTableBatch];
#pragma unroll
        for (int s = 0; s < kTableBatch; ++s) {
          w[s] = first + s < count ? load(weight_q + int64_t(channel) * c.nq + token[first + s]) : 0.0f;
        }
#pragma unroll
        for (int s = 0; s < kTableBatch; ++s) {
          if (w[s] != 0.0f) sum[s] += w[s] * table[row[first + s] * row_floats + channel * kWarp + lane];
        }
      }
#pragma unroll
      for (int s = 0; s < kTableBatch; ++s) {
        if (first + s < count && mine) {
          atomic_add(c.out + (b * c.nq + token[first + s]) * c.dv + column, inv_m * sum[s]);
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace

int table_rows(int tau, int p) {
  if (p < 1 || tau < 0 || tau > 30) return 0;
  int64_t rows = int64_t(1) << tau;
  while (rows > 1 && rows * p * kWarp * int64_t(sizeof(float)) + kSlotBytes > kTableBytes) rows >>= 1;
  const bool fits = rows * p * kWarp * int64_t(sizeof(float)) + kSlotBytes <= kTableBytes;
  return fits && (int64_t(1) << tau) / rows <= kMostSlices ? static_cast<int>(rows) : 0;
}

cudaError_t launch_table_cumulation(const Cumulation& c, cudaStream_t stream) {
  const int rows = table_rows(c.tau, c.p);
  if (rows == 0 || c.dv > kValueTiles * kValueSlots * kWarp) return cudaErrorInvalidValue;  // the host checks first
  const int slices = (1 << c.tau) / rows;
  const int64_t blocks = c.B * c.m * slices, shared = int64_t(rows) * c.p * kWarp * sizeof(float) + kSlotBytes;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  return YOSO_LAUNCH(table_cumulation_kernel, dim3(static_cast<unsigned>(blocks), (c.dv + kWarp - 1) / kWarp),
                     dim3(kWarp, kTableWarps), shared, stream, c, rows, slices, 1.0f / c.m);
}

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
