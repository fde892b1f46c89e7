// CUDA kernels of YOSO attention's LSH cumulation (yoso_cuda_kernels.h): table rows filled from the keys
// (by each run's first position, or by every key with atomicAdd), then read by the queries. Plain CUDA
// through yoso_simt.h: no torch headers, so this file compiles with nvcc on any machine and, with
// -DYOSO_SIMT_EMULATION, with a host compiler to run on the CPU under the suite's sanitizers.
#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"

namespace yoso {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block of the atomic rows: a key each

YOSO_DEVICE const float* weights_of(const float* weights, int64_t b, int mw, int64_t h, int p, int n) {
  return weights + (b * mw + (mw == 1 ? 0 : h)) * int64_t(p) * n;
}

// Deterministic. One team (yoso_cuda_common.h; kChainedCoords coordinates a lane: 32 positions a block, whose
// threads bound the SM) per sorted key position of a pair of the chunk: the first position of a run sums the
// run's weighted values into its row, [p channels × dv], at that position, in sorted order, each channel's sum
// in the team's registers.
template <int D>
YOSO_GLOBAL void bucket_rows_kernel(Cumulation c, float* rows, int64_t first_pair) {
  using T = Team<D, kChainedCoords>;
  const T team = T::of_thread();
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / c.m, h = pair % c.m;
  const int64_t position = team_index<D, kChainedCoords>();
  if (position >= c.nk) return;
  const int t = static_cast<int>(position);
  const int32_t* sorted = c.sorted_k + pair * c.nk;
  const int32_t code = load(sorted + t);
  if (t > 0 && load(sorted + t - 1) == code) return;  // inside a run: its first position sums it
  const int32_t* order = c.order_k + pair * c.nk;
  const float* weight = weights_of(c.weight_k, b, c.mk, h, c.p, c.nk);
  float* row = rows + (local * c.nk + t) * int64_t(c.p) * c.dv;
  for (int channel = 0; channel < c.p; ++channel) {
    float sum[T::kSlots] = {};
    for (int r = t; r < c.nk && load(sorted + r) == code; ++r) {
      const int32_t j = load(order + r);
      const float w = load(weight + int64_t(channel) * c.nk + j);
      if (w == 0.0f) continue;
      float v[T::kSlots];
      team.read(c.values, b * c.nk + j, c.dv, v);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) sum[s] += w * v[s];
    }
    team.write(row + int64_t(channel) * c.dv, c.dv, sum);
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
      atomic_add(row + int64_t(channel) * c.dv + l, w * element(c.values, (b * c.nk + j) * c.dv + l));
    }
  }
}

// One team per query of a batch element of the chunk. The team's lanes find the query's rows under as many
// hashes at once (a lane per hash: its code; its run's start unless direct), shuffled to the team one after
// another; the team sums the found rows over every hash of the chunk in its registers and adds them to its
// output once (a single writer: no atomics). dv <= 256.
template <int D>
YOSO_GLOBAL void gather_rows_kernel(Cumulation c, const float* rows, int64_t rows_per_pair, bool direct,
                                    int64_t first_pair, int64_t end_pair, float inv_m) {
  using T = Team<D>;
  const T team = T::of_thread();
  const int64_t b = first_pair / c.m + blockIdx.y, query = team_index<D>();
  if (query >= c.nq) return;  // a whole team: its shuffles name its own lanes alone
  const int i = static_cast<int>(query);
  const int64_t begin = first_pair > b * c.m ? first_pair - b * c.m : 0;
  const int64_t end = end_pair < (b + 1) * c.m ? end_pair - b * c.m : c.m;
  float sum[T::kSlots] = {};
  for (int64_t group = begin; group < end; group += T::kLanes) {
    const int64_t h = group + team.rank;
    int found = -1;  // no row: no key has this code
    if (h < end) {
      const int64_t pair = b * c.m + h;
      const int32_t code = checked_code(c.codes_q, pair * c.nq + i, c.tau);
      found = direct ? code : run_of(c.starts_k, pair, c.tau, c.sorted_k + pair * c.nk, c.nk, code);
    }
    const int count = static_cast<int>(end - group < T::kLanes ? end - group : T::kLanes);
    for (int u = 0; u < count; ++u) {
      const int row_at = __shfl_sync(team.mask, found, u, T::kLanes);
      if (row_at < 0) continue;
      const int64_t pair = b * c.m + group + u;
      const float* row = rows + ((pair - first_pair) * rows_per_pair + row_at) * int64_t(c.p) * c.dv;
      const float* weight = weights_of(c.weight_q, b, c.mq, group + u, c.p, c.nq) + i;
      for (int channel = 0; channel < c.p; ++channel) {
        const float w = load(weight + int64_t(channel) * c.nq);
        if (w == 0.0f) continue;
        float x[T::kSlots];
        team.read(row + int64_t(channel) * c.dv, c.dv, x);
#pragma unroll
        for (int s = 0; s < T::kSlots; ++s) sum[s] += w * x[s];
      }
    }
  }
  float* y = c.out + (b * c.nq + i) * c.dv;
  float out[T::kSlots];
  team.read(y, c.dv, out);
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) out[s] += inv_m * sum[s];
  team.write(y, c.dv, out);
}

constexpr int kTableWarps = 8;   // warps per block of the shared-table cumulation
constexpr int kTableBatch = 8;   // listed tokens whose loads a lane has in flight at once
// Code slices of a pair's table, each one a block that clears its rows and takes the slice's listed tokens:
// 128 keeps the tables in shared memory up to tau = 15 (n = 32,768 at the default tau), ~256 tokens a slice,
// where more would go to rows in global memory (launch_cumulation_chunk).
constexpr int kMostSlices = 128;
constexpr int kListThreads = 256;

// visit(token, code) for each of this thread's tokens: threadIdx.x, + blockDim.x, ... up to n, one code
// load at a time. (Counters per warp with 4 loads in flight, 449b886, measured 0.133 ms a call against this
// loop's 0.089 ms on an H100 at 16 x 4096, m = 32: docs/benchmarks.md.)
template <typename Visit>
YOSO_DEVICE void for_each_code(const int32_t* codes, int n, int tau, Visit visit) {
  for (int t = threadIdx.x; t < n; t += blockDim.x) visit(t, checked_code(codes, t, tau));
}

// Block x: a pair, block y: its queries (0) or keys (1). The side's tokens grouped by the slice of their
// code (code >> shift) and listed with their row in it (code's low bits): tokens[pair·n + at] and
// rows[pair·n + at] for at in [starts[pair·(slices + 1) + s], starts[...+ s + 1]). Counted with shared
// atomics, the slices' starts by one thread's scan (at most kMostSlices), then every token placed; in no
// fixed order within a slice (this path sums in arrival order anyway).
YOSO_GLOBAL void slice_lists_kernel(Cumulation c, SliceLists lists) {
  YOSO_DYNAMIC_SHARED(int, count);  // [slices] counts, then [slices] cursors
  int* cursor = count + lists.slices;
  const int64_t pair = blockIdx.x;
  const bool keys = blockIdx.y == 1;
  const int n = keys ? c.nk : c.nq, low = (1 << lists.shift) - 1;
  const int32_t* codes = (keys ? c.codes_k : c.codes_q) + pair * n;
  int32_t* starts = (keys ? lists.starts_k : lists.starts_q) + pair * (lists.slices + 1);
  int32_t* tokens = (keys ? lists.tokens_k : lists.tokens_q) + pair * n;
  int32_t* rows = (keys ? lists.rows_k : lists.rows_q) + pair * n;
  for (int s = threadIdx.x; s < lists.slices; s += blockDim.x) count[s] = 0;
  __syncthreads();
  for_each_code(codes, n, c.tau, [&](int, int32_t code) { shared_increment(count + (code >> lists.shift)); });
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int s = 0; s < lists.slices; ++s) {
      cursor[s] = sum;
      store(starts + s, int32_t(sum));
      sum += count[s];
    }
    store(starts + lists.slices, int32_t(sum));
  }
  __syncthreads();
  for_each_code(codes, n, c.tau, [&](int token, int32_t code) {
    const int at = shared_increment(cursor + (code >> lists.shift));
    store(tokens + at, int32_t(token));
    store(rows + at, int32_t(code & low));
  });
}

// One side's listed tokens of a block's slice (from slice_lists_kernel): positions [begin, end) of the pair's
// tokens and rows, and the pair's weights [p, n].
struct ListedSlice {
  const int32_t *tokens, *rows;
  const float* weight;
  int n, begin, end;
};

YOSO_DEVICE ListedSlice listed_slice(const int32_t* tokens, const int32_t* rows, const int32_t* starts,
                                     const float* weight, int n, int64_t pair, int64_t slice) {
  return {tokens + pair * n, rows + pair * n, weight, n, load(starts + slice), load(starts + slice + 1)};
}

// A warp's batch of a slice's listed tokens, positions first ... first + kTableBatch, and their rows; past
// the slice's end, token -1 and row 0.
YOSO_DEVICE void load_listed(const ListedSlice& side, int first, int32_t (&token)[kTableBatch],
                             int32_t (&row)[kTableBatch]) {
#pragma unroll
  for (int s = 0; s < kTableBatch; ++s) {
    const bool listed = first + s < side.end;
    token[s] = listed ? load(side.tokens + first + s) : -1;
    row[s] = listed ? load(side.rows + first + s) : 0;
  }
}

// Channel `channel`'s weights of a batch's tokens; 0 for a token past the slice's end.
YOSO_DEVICE void load_weights(const ListedSlice& side, int channel, const int32_t (&token)[kTableBatch],
                              float (&w)[kTableBatch]) {
#pragma unroll
  for (int s = 0; s < kTableBatch; ++s) {
    w[s] = token[s] >= 0 ? load(side.weight + int64_t(channel) * side.n + token[s]) : 0.0f;
  }
}

// Atomic, the table in shared memory. Block x: (pair, slice of 2^shift codes), block y: 32 value columns, a
// lane each. table[row][channel][lane] is cleared; the slice's keys (from slice_lists_kernel) add w_k·v into
// their rows (shared atomics), 8 at a time a warp; then its queries add (1/m) Σ_channel w_q·row into their
// outputs (one global atomic a coordinate).
YOSO_GLOBAL void table_cumulation_kernel(Cumulation c, SliceLists lists, float inv_m) {
  YOSO_DYNAMIC_SHARED(float, table);  // [2^shift rows][p][32]
  const int64_t pair = blockIdx.x / lists.slices, b = pair / c.m, h = pair % c.m;
  const int64_t slice = pair * (lists.slices + 1) + blockIdx.x % lists.slices;
  const int lane = threadIdx.x, column = blockIdx.y * kWarp + lane;
  const bool mine = column < c.dv;
  const int row_floats = c.p * kWarp, table_floats = (1 << lists.shift) * row_floats;
  for (int f = threadIdx.y * kWarp + lane; f < table_floats; f += kTableWarps * kWarp) table[f] = 0.0f;
  __syncthreads();
  const ListedSlice keys = listed_slice(lists.tokens_k, lists.rows_k, lists.starts_k,
                                        weights_of(c.weight_k, b, c.mk, h, c.p, c.nk), c.nk, pair, slice);
  for (int first = keys.begin + threadIdx.y * kTableBatch; first < keys.end; first += kTableWarps * kTableBatch) {
    int32_t token[kTableBatch], row[kTableBatch];
    float value[kTableBatch];
    load_listed(keys, first, token, row);
#pragma unroll
    for (int s = 0; s < kTableBatch; ++s) {
      value[s] = token[s] >= 0 && mine ? element(c.values, (b * c.nk + token[s]) * c.dv + column) : 0.0f;
    }
    for (int channel = 0; channel < c.p; ++channel) {
      float w[kTableBatch];
      load_weights(keys, channel, token, w);
#pragma unroll
      for (int s = 0; s < kTableBatch; ++s) {
        if (w[s] != 0.0f && mine) {
          shared_add(table + row[s] * row_floats + channel * kWarp + lane, w[s] * value[s]);
        }
      }
    }
  }
  __syncthreads();
  const ListedSlice queries = listed_slice(lists.tokens_q, lists.rows_q, lists.starts_q,
                                           weights_of(c.weight_q, b, c.mq, h, c.p, c.nq), c.nq, pair, slice);
  for (int first = queries.begin + threadIdx.y * kTableBatch; first < queries.end;
       first += kTableWarps * kTableBatch) {
    int32_t token[kTableBatch], row[kTableBatch];
    float sum[kTableBatch] = {};
    load_listed(queries, first, token, row);
    for (int channel = 0; channel < c.p; ++channel) {
      float w[kTableBatch];
      load_weights(queries, channel, token, w);
#pragma unroll
      for (int s = 0; s < kTableBatch; ++s) {
        if (w[s] != 0.0f) sum[s] += w[s] * table[row[s] * row_floats + channel * kWarp + lane];
      }
    }
#pragma unroll
    for (int s = 0; s < kTableBatch; ++s) {
      if (token[s] >= 0 && mine) atomic_add(c.out + (b * c.nq + token[s]) * c.dv + column, inv_m * sum[s]);
    }
  }
}

}  // namespace

int table_rows(int tau, int p) {
  if (p < 1 || tau < 0 || tau > 30) return 0;
  int64_t rows = int64_t(1) << tau;
  while (rows > 1 && rows * p * kWarp * int64_t(sizeof(float)) > kTableBytes) rows >>= 1;
  const bool fits = rows * p * kWarp * int64_t(sizeof(float)) <= kTableBytes;
  return fits && (int64_t(1) << tau) / rows <= kMostSlices ? static_cast<int>(rows) : 0;
}

cudaError_t launch_table_cumulation(const Cumulation& c, const SliceLists& lists, cudaStream_t stream) {
  const int rows = table_rows(c.tau, c.p);
  if (rows != (1 << lists.shift) || lists.slices != (1 << c.tau) / rows ||
      c.dv > kMaxHeadDim || c.B * c.m * lists.slices > 2147483647) {
    return cudaErrorInvalidValue;  // the host checks first
  }
  const cudaError_t status = YOSO_LAUNCH(slice_lists_kernel, dim3(static_cast<unsigned>(c.B * c.m), 2),
                                         dim3(kListThreads), 2 * lists.slices * sizeof(int), stream, c,
                                         lists);
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(c.B * c.m * lists.slices), (c.dv + kWarp - 1) / kWarp);
  return YOSO_LAUNCH(table_cumulation_kernel, grid, dim3(kWarp, kTableWarps),
                     int64_t(rows) * c.p * kWarp * sizeof(float), stream, c, lists, 1.0f / c.m);
}

namespace {

template <int D>
cudaError_t launch_chunk(const Cumulation& c, float* rows, int64_t rows_per_pair, bool direct, bool atomic,
                         int64_t first, int64_t end, cudaStream_t stream) {
  constexpr int L = Team<D>::kLanes;
  const unsigned pairs = static_cast<unsigned>(end - first);
  const cudaError_t status =
      atomic ? YOSO_LAUNCH(scatter_rows_kernel, dim3((c.nk + kRowsPerBlock - 1) / kRowsPerBlock, pairs),
                           dim3(kWarp, kRowsPerBlock), 0, stream, c, rows, rows_per_pair, direct, first)
             : YOSO_LAUNCH(bucket_rows_kernel<D>, dim3(blocks_for(c.nk, Team<D, kChainedCoords>::kLanes), pairs),
                           dim3(kTeamThreads), 0, stream, c, rows, first);
  if (status != cudaSuccess) return status;
  const int64_t batches = (end - 1) / c.m - first / c.m + 1;
  return YOSO_LAUNCH(gather_rows_kernel<D>, dim3(blocks_for(c.nq, L), static_cast<unsigned>(batches)),
                     dim3(kTeamThreads), 0, stream, c, rows, rows_per_pair, direct, first, end, 1.0f / c.m);
}

}  // namespace

cudaError_t launch_cumulation_chunk(const Cumulation& c, float* rows, int64_t rows_per_pair, bool direct,
                                    bool atomic, int64_t first, int64_t end, cudaStream_t stream) {
  if (c.dv > kMaxHeadDim || end - first > 65535 || (direct && !atomic)) {
    return cudaErrorInvalidValue;  // the host logic says so first
  }
  switch (instance(c.dv, c.dv, {c.values.data, c.out, rows})) {
    case 16: return launch_chunk<16>(c, rows, rows_per_pair, direct, atomic, first, end, stream);
    case 32: return launch_chunk<32>(c, rows, rows_per_pair, direct, atomic, first, end, stream);
    case 64: return launch_chunk<64>(c, rows, rows_per_pair, direct, atomic, first, end, stream);
    case 128: return launch_chunk<128>(c, rows, rows_per_pair, direct, atomic, first, end, stream);
    default: return launch_chunk<0>(c, rows, rows_per_pair, direct, atomic, first, end, stream);
  }
}

}  // namespace yoso
