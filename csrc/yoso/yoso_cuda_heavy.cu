// CUDA kernels of YOSO's default backward, heavy buckets (yoso_cuda_kernels.h): found and counted in
// parallel (one thread per sorted key position; a run starts where the sorted code changes), numbered by
// the caller's prefix sum, and their tables summed by one block each. Through yoso_simt.h, as the others.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {
namespace {

constexpr int kThreads = 256;
constexpr int kTableThreads = 128;
constexpr int kTile = 16;   // tokens staged in shared memory at once
constexpr int kCells = 12;  // table cells per thread and pass: a 32 x 33 table in one pass
constexpr int kRunFields = 5;

// One thread per (pair, position < max(nq, nk)): clears table_of_q, and flags the first key position of
// each heavy bucket. A run shorter than heavy_side_minimum is light whatever its other side (one load
// says so); only a longer one searches for its length and its queries.
YOSO_GLOBAL void find_heavy_kernel(Backward a, Heavy heavy, int span) {
  const int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, pair = index / span;
  const int t = static_cast<int>(index - pair * span);
  if (pair >= a.B * a.m) return;
  if (t < a.nq) store(heavy.table_of_q + pair * a.nq + t, -1);
  if (t >= a.nk) return;
  const int32_t* sorted = a.sorted_k + pair * a.nk;
  const int32_t code = load(sorted + t);
  int32_t flag = 0;
  if ((t == 0 || load(sorted + t - 1) != code) && t + heavy.minimum <= a.nk &&
      load(sorted + t + heavy.minimum - 1) == code) {
    const int keys = lower_bound(sorted + t, a.nk - t, code + 1);
    const int32_t* sorted_q = a.sorted_q + pair * a.nq;
    const int q_first = lower_bound(sorted_q, a.nq, code);
    const int queries = lower_bound(sorted_q + q_first, a.nq - q_first, code + 1);
    flag = heavy_bucket(queries, keys, a.d, a.dv) ? 1 : 0;
  }
  store(heavy.flags + pair * a.nk + t, flag);
}

// One thread per (pair, key position): bucket number id = scan − 1 where the scan steps, if id < capacity.
YOSO_GLOBAL void number_heavy_kernel(Backward a, Heavy heavy) {
  const int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= a.B * a.m * a.nk) return;
  const int32_t through = load(heavy.scan + index), before = index > 0 ? load(heavy.scan + index - 1) : 0;
  const int32_t id = through - 1;
  const bool numbered = through != before && id < heavy.capacity;
  store(heavy.table_of_k + index, numbered ? id : -1);  // (the flags' memory: they are read no more)
  if (!numbered) return;
  const int64_t pair = index / a.nk;
  const int t = static_cast<int>(index - pair * a.nk);
  const int32_t* sorted = a.sorted_k + pair * a.nk;
  const int32_t code = load(sorted + t);
  const int32_t* sorted_q = a.sorted_q + pair * a.nq;
  const int q_first = lower_bound(sorted_q, a.nq, code);
  const int32_t run[kRunFields] = {static_cast<int32_t>(pair), t, t + lower_bound(sorted + t, a.nk - t, code + 1), q_first,
                                   q_first + lower_bound(sorted_q + q_first, a.nq - q_first, code + 1)};
  for (int f = 0; f < kRunFields; ++f) store(heavy.runs + int64_t(id) * kRunFields + f, run[f]);
  store(heavy.table_of_q + pair * a.nq + q_first, id);
}

// out[l][e] = Σ_{r in [first, last)} x_r[l] · y_r[e] (l < rows, e < cols) over the tokens order[r] of batch
// element b, x_r = weight · X[token] (weight 1 when null), y_r = Y[token] and, when cols = width + 1, a
// last column of ones (its sums go to out_ones[l]). The block stages kTile tokens' x and y in shared
// memory at a time; each thread keeps kCells cells in registers and sums its tokens in sorted order.
YOSO_DEVICE void sum_outer_products(const int32_t* order, int first, int last, const Rows& X, const float* weight,
                                    const Rows& Y, int64_t b, int n, int rows, int width, int cols, float* out,
                                    float* out_ones, float* tile) {
  const int stride = rows + width + 1, cells = rows * cols;
  for (int base = 0; base < cells; base += kTableThreads * kCells) {
    float sum[kCells];
    for (int c = 0; c < kCells; ++c) sum[c] = 0.0f;
    for (int start = first; start < last; start += kTile) {
      const int count = last - start < kTile ? last - start : kTile;
      __syncthreads();  // the previous tile is read
      for (int at = threadIdx.x; at < count * stride; at += kTableThreads) {
        const int t = at / stride, column = at - t * stride;
        const int64_t token = b * n + load(order + start + t);
        float value = 1.0f;
        if (column < rows) {
          value = element(X, token * rows + column) * (weight != nullptr ? load(weight + token) : 1.0f);
        } else if (column < rows + width) {
          value = element(Y, token * width + column - rows);
        }
        tile[at] = value;
      }
      __syncthreads();
      for (int c = 0; c < kCells; ++c) {
        const int cell = base + c * kTableThreads + threadIdx.x;
        if (cell >= cells) break;
        const int l = cell / cols, e = cell - l * cols;
        for (int t = 0; t < count; ++t) sum[c] += tile[t * stride + l] * tile[t * stride + rows + e];
      }
    }
    for (int c = 0; c < kCells; ++c) {
      const int cell = base + c * kTableThreads + threadIdx.x;
      if (cell >= cells) break;
      const int l = cell / cols, e = cell - l * cols;
      if (e < width) store(out + l * width + e, sum[c]); else store(out_ones + l, sum[c]);
    }
  }
}

// One block per numbered heavy bucket (a grid-stride loop: the count is known on the device only):
// M = Σ w_j v_j k_jᵀ over its keys, N = Σ g_i q_iᵀ and Σ g_i over its queries.
YOSO_GLOBAL void heavy_tables_kernel(Backward a, Heavy heavy) {
  YOSO_DYNAMIC_SHARED(float, tile);  // [kTile][dv + d + 1]
  const int32_t total = load(heavy.scan + a.B * a.m * a.nk - 1);
  const int64_t count = total < heavy.capacity ? total : heavy.capacity;
  for (int64_t id = blockIdx.x; id < count; id += gridDim.x) {
    int32_t run[kRunFields];
    for (int f = 0; f < kRunFields; ++f) run[f] = load(heavy.runs + id * kRunFields + f);
    const int64_t pair = run[0], b = pair / a.m;
    float* M = heavy.pool + id * heavy.table_floats;
    float* N = M + int64_t(a.dv) * a.d;
    sum_outer_products(a.order_k + pair * a.nk, run[1], run[2], a.v, a.key_weight, a.k, b, a.nk, a.dv, a.d, a.d, M,
                       nullptr, tile);
    sum_outer_products(a.order_q + pair * a.nq, run[3], run[4], a.grad, nullptr, a.q, b, a.nq, a.dv, a.d, a.d + 1, N,
                       N + int64_t(a.dv) * a.d, tile);
  }
}

}  // namespace

int64_t table_floats(int d, int dv) { return (int64_t(dv) * (2 * d + 1) + 3) / 4 * 4; }  // 16-byte aligned tables

cudaError_t launch_find_heavy(const Backward& a, const Heavy& heavy, cudaStream_t stream) {
  const int span = std::max(a.nq, a.nk);
  const int64_t blocks = (a.B * a.m * span + kThreads - 1) / kThreads;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  return YOSO_LAUNCH(find_heavy_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, a, heavy, span);
}

cudaError_t launch_number_heavy(const Backward& a, const Heavy& heavy, cudaStream_t stream) {
  const int64_t blocks = (a.B * a.m * a.nk + kThreads - 1) / kThreads;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  return YOSO_LAUNCH(number_heavy_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, a, heavy);
}

cudaError_t launch_heavy_tables(const Backward& a, const Heavy& heavy, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(heavy.capacity, 2048));
  return YOSO_LAUNCH(heavy_tables_kernel, dim3(blocks), dim3(kTableThreads),
                     int64_t(kTile) * (a.dv + a.d + 1) * sizeof(float), stream, a, heavy);
}

}  // namespace yoso
