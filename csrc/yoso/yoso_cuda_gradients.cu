// CUDA kernels of YOSO attention's backward (yoso_cuda_kernels.h): the default lower-bound backward with
// exact pair weights, deterministic or atomic, and the *YOSO exact-derivative backward. A team of lanes
// (yoso_cuda_common.h) holds one token's rows in registers; it finds its bucket under a hash by one binary
// search, then reads the bucket's table (heavy) or walks the other side's tokens (light). Templated on
// the head dim (16, 32, 64, 128 with value dim equal; 0: any dims): no stack. Through yoso_simt.h.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {
namespace {

YOSO_DEVICE int32_t table_of(const int32_t* tables, int64_t at) { return tables != nullptr ? load(tables + at) : -1; }

// A token's bucket under one hash: its code, the first sorted position of its run on the other side (-1:
// none), that run's heavy table (-1: none), and of a light run its first token (the other side's, within the
// sequence), that token's weight (1 where the other side has none) and whether the run goes on past it.
struct Bucket {
  int32_t code = -1, first = -1, table = -1, token = -1, more = 0;
  float weight = 0.0f;
};

// The other side of a pair: its sorted codes, their token order and its tokens' weights (null: all 1), from
// the first token of its sequence.
struct OtherSide {
  const int32_t *sorted, *order;
  const float* weights;
  int n;

  // The weight of the token of sequence b at `token`.
  YOSO_DEVICE float weight_of(int64_t b, int32_t token) const {
    return weights != nullptr ? load(weights + b * n + token) : 1.0f;
  }
};

// visit(pair, bucket) for each of a token's hashes in order whose bucket holds tokens of the other side. The
// buckets are found kLanes hashes at a time, a lane each (code, run start; then the run's table, first token
// and next code; then that token's weight), so that a team has that many chains of dependent loads in flight
// instead of one, then handed to every lane of the team in turn in four shuffles (the run start or the table
// in one word, the token and whether the run goes on past it in another): a light run's first pair costs the
// team only its rows.
template <typename T, typename Visit>
YOSO_DEVICE void for_each_bucket(const T& team, int64_t b, int m, int tau, const int32_t* codes, int n_own, int own,
                                 const int32_t* starts, const OtherSide& other, const int32_t* tables, Visit visit) {
  constexpr int L = T::kLanes;
  for (int group = 0; group < m; group += L) {
    Bucket mine;
    if (group + team.rank < m) {
      const int64_t pair = b * m + group + team.rank, at = pair * other.n;
      mine.code = checked_code(codes, pair * n_own + own, tau);
      mine.first = run_of(starts, pair, tau, other.sorted + at, other.n, mine.code);
      if (mine.first >= 0) mine.table = table_of(tables, at + mine.first);
      if (mine.first >= 0 && mine.table < 0) {
        mine.token = load(other.order + at + mine.first);
        mine.more = mine.first + 1 < other.n && load(other.sorted + at + mine.first + 1) == mine.code;
        mine.weight = other.weight_of(b, mine.token);
      }
    }
    const int32_t where = mine.table >= 0 ? -2 - mine.table : mine.first;  // -1: no run; -2 - t: heavy table t
    const uint32_t token_more = static_cast<uint32_t>(mine.token) ^ (static_cast<uint32_t>(mine.more) << 31);
    const int count = m - group < L ? m - group : L;
    for (int u = 0; u < count; ++u) {
      const int32_t found = __shfl_sync(team.mask, where, u, L);
      const int32_t code = __shfl_sync(team.mask, mine.code, u, L);
      const uint32_t packed = __shfl_sync(team.mask, token_more, u, L);
      const float weight = __shfl_sync(team.mask, mine.weight, u, L);
      if (found == -1) continue;
      Bucket bucket;
      bucket.code = code, bucket.weight = weight;
      if (found < -1) {
        bucket.first = 0, bucket.table = -2 - found;
      } else {
        bucket.first = found;
        bucket.token = static_cast<int32_t>(packed & 0x7fffffffu), bucket.more = static_cast<int>(packed >> 31);
      }
      visit(b * m + group + u, bucket);
    }
  }
}

// step(token, weight) for each token of a light bucket's run on the other side, in sorted order: the first as
// the bucket was found with it, the rest kLanes positions at a time, a lane each (its code and token read
// together, then the token's weight where the code is the bucket's), handed to the team in turn; a chunk
// whose last lane is still in the run is followed by the next.
template <typename T, typename Step>
YOSO_DEVICE void for_each_in_run(const T& team, const Bucket& bucket, int64_t b, int64_t pair, const OtherSide& other,
                                 Step step) {
  constexpr int L = T::kLanes;
  step(bucket.token, bucket.weight);
  const int64_t at = pair * other.n;
  for (int from = bucket.first + 1, more = bucket.more; more; from += L) {
    const int r = from + team.rank;
    int32_t token = -1;  // past the run
    float weight = 0.0f;
    if (r < other.n) {
      const int32_t code = load(other.sorted + at + r), candidate = load(other.order + at + r);
      if (code == bucket.code) token = candidate, weight = other.weight_of(b, candidate);
    }
    for (int u = 0; u < L && more; ++u) {
      const int32_t next = __shfl_sync(team.mask, token, u, L);
      const float next_weight = __shfl_sync(team.mask, weight, u, L);
      if (next < 0) {
        more = 0;
      } else {
        step(next, next_weight);
      }
    }
  }
}

// The deterministic gradients' teams hold kChainedCoords coordinates a lane: their registers bound how many
// tokens an SM holds at once (ptxas, sm_90, nvcc 13, D = 32: query_gradients capped at 64 registers without a
// spill, 8 blocks of 32 tokens an SM; key_gradients 72, which spills under a cap of 64: 7 blocks; with 4
// coordinates a lane 64 and 62 registers, 8 blocks of 16 tokens).
constexpr int kQueryGradientBlocks = 8;  // resident blocks a query_gradients launch bounds its registers for

// Deterministic. One team per query i, over every hash in turn (its buckets found kLanes hashes at a time):
// ∇Q_i = (τ/2m) Σ_h Σ_{j in i's bucket} w_j (g_i·v_j) k_j, a heavy bucket's part as g_i M. One writer per
// row, one order.
template <int D>
YOSO_GLOBAL void YOSO_LAUNCH_BOUNDS(kTeamThreads, kQueryGradientBlocks)
query_gradients_kernel(Backward a, Heavy heavy, float scale) {
  using T = Team<D, kChainedCoords>;
  const T team = T::of_thread();
  const int64_t token = team_index<D, kChainedCoords>();
  if (token >= a.B * a.nq) return;
  const int64_t b = token / a.nq;
  const int i = static_cast<int>(token - b * a.nq);
  float g[T::kSlots], sum[T::kSlots] = {};
  team.read(a.grad, token, a.dv, g);
  const OtherSide keys{a.sorted_k, a.order_k, a.key_weight, a.nk};
  for_each_bucket(team, b, a.m, a.tau, a.codes_q, a.nq, i, a.starts_k, keys, heavy.table_of_k,
                  [&](int64_t pair, const Bucket& bucket) {
    if (bucket.table >= 0) {
      team.add_times_table(a.grad, token, a.dv, heavy.pool + bucket.table * heavy.table_floats, a.d, sum);
      return;
    }
    for_each_in_run(team, bucket, b, pair, keys, [&](int32_t key, float w) {
      if (w == 0.0f) return;
      const int64_t j = b * a.nk + key;
      float v[T::kSlots], k[T::kSlots];
      team.read(a.v, j, a.dv, v);
      const float weight = w * team.dot(g, v);
      team.read(a.k, j, a.d, k);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) sum[s] += weight * k[s];
    });
  });
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) sum[s] *= scale;
  team.write(a.grad_q + token * a.d, a.d, sum);
}

// Deterministic. One team per key j (its buckets found kLanes hashes at a time): ∇K_j = (τ/2m) w_j Σ_h
// Σ_{i in j's bucket} (g_i·v_j) q_i and ∇V_j = (w_j/m) Σ_h Σ_i g_i, a heavy bucket's part as v_j N and Σ g.
template <int D>
YOSO_GLOBAL void key_gradients_kernel(Backward a, Heavy heavy, float scale, float inv_m) {
  using T = Team<D, kChainedCoords>;
  const T team = T::of_thread();
  const int64_t token = team_index<D, kChainedCoords>();
  if (token >= a.B * a.nk) return;
  const float w = load(a.key_weight + token);
  float v[T::kSlots], sum_k[T::kSlots] = {}, sum_v[T::kSlots] = {};
  if (w == 0.0f) {  // a padded key: no gradient, its rows written 0 (the outputs come unfilled)
    team.write(a.grad_k + token * a.d, a.d, sum_k);
    team.write(a.grad_v + token * a.dv, a.dv, sum_v);
    return;
  }
  const int64_t b = token / a.nk;
  const int j = static_cast<int>(token - b * a.nk);
  team.read(a.v, token, a.dv, v);
  const OtherSide queries{a.sorted_q, a.order_q, nullptr, a.nq};
  for_each_bucket(team, b, a.m, a.tau, a.codes_k, a.nk, j, a.starts_q, queries, heavy.table_of_q,
                  [&](int64_t pair, const Bucket& bucket) {
    if (bucket.table >= 0) {
      const float* N = heavy.pool + bucket.table * heavy.table_floats + int64_t(a.dv) * a.d;
      float g[T::kSlots];
      team.add_times_table(a.v, token, a.dv, N, a.d, sum_k);
      team.read(N + int64_t(a.dv) * a.d, a.dv, g);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) sum_v[s] += g[s];
      return;
    }
    for_each_in_run(team, bucket, b, pair, queries, [&](int32_t query, float) {
      const int64_t i = b * a.nq + query;
      float g[T::kSlots], q[T::kSlots];
      team.read(a.grad, i, a.dv, g);
      const float weight = team.dot(g, v);
      team.read(a.q, i, a.d, q);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) {
        sum_v[s] += g[s];
        sum_k[s] += weight * q[s];
      }
    });
  });
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) {
    sum_k[s] *= scale * w;
    sum_v[s] *= inv_m * w;
  }
  team.write(a.grad_k + token * a.d, a.d, sum_k);
  team.write(a.grad_v + token * a.dv, a.dv, sum_v);
}

// Atomic (the authors' design: tokens add into shared rows). One team per (pair, query i): the pairs of a
// light bucket, each adding its share to ∇K_j and ∇V_j and, summed, to ∇Q_i, with atomicAdd. A heavy
// bucket is left to heavy_apply_kernel.
template <int D>
YOSO_GLOBAL void scatter_pairs_kernel(Backward a, Heavy heavy, float scale, float inv_m) {
  using T = Team<D>;
  const T team = T::of_thread();
  const int64_t index = team_index<D>();
  if (index >= a.B * a.m * a.nq) return;
  const int64_t pair = index / a.nq, b = pair / a.m;
  const int i = static_cast<int>(index - pair * a.nq);
  const int32_t code = checked_code(a.codes_q, pair * a.nq + i, a.tau);
  const int32_t* sorted = a.sorted_k + pair * a.nk;
  const int first = run_of(a.starts_k, pair, a.tau, sorted, a.nk, code);
  if (first < 0 || table_of(heavy.table_of_k, pair * a.nk + first) >= 0) return;
  const int64_t query = b * a.nq + i;
  float g[T::kSlots], q[T::kSlots], sum[T::kSlots] = {};
  team.read(a.grad, query, a.dv, g);
  team.read(a.q, query, a.d, q);
  for (int r = first; r < a.nk && load(sorted + r) == code; ++r) {
    const int64_t j = b * a.nk + load(a.order_k + pair * a.nk + r);
    const float w = load(a.key_weight + j);
    if (w == 0.0f) continue;
    float v[T::kSlots], k[T::kSlots], to_k[T::kSlots], to_v[T::kSlots];
    team.read(a.v, j, a.dv, v);
    const float weight = w * team.dot(g, v);
    team.read(a.k, j, a.d, k);
#pragma unroll
    for (int s = 0; s < T::kSlots; ++s) {
      sum[s] += weight * k[s];
      to_k[s] = scale * weight * q[s];
      to_v[s] = inv_m * w * g[s];
    }
    team.add(a.grad_k + j * a.d, a.d, to_k);
    team.add(a.grad_v + j * a.dv, a.dv, to_v);
  }
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) sum[s] *= scale;
  team.add(a.grad_q + query * a.d, a.d, sum);
}

// Atomic. One block per numbered heavy bucket, its teams over the bucket's queries (∇Q_i += (τ/2m) g_i M)
// and keys (∇K_j += (τ/2m) w_j v_j N, ∇V_j += (w_j/m) Σ g), with atomicAdd.
template <int D>
YOSO_GLOBAL void heavy_apply_kernel(Backward a, Heavy heavy, float scale, float inv_m) {
  using T = Team<D>;
  const T team = T::of_thread();
  const int teams = blockDim.x / T::kLanes, slot = threadIdx.x / T::kLanes;
  const int32_t total = load(heavy.scan + a.B * a.m * a.nk - 1);
  const int64_t count = total < heavy.capacity ? total : heavy.capacity;
  for (int64_t id = blockIdx.x; id < count; id += gridDim.x) {
    int32_t run[5];  // pair, k_first, k_last, q_first, q_last
    for (int f = 0; f < 5; ++f) run[f] = load(heavy.runs + id * 5 + f);
    const int64_t pair = run[0], b = pair / a.m;
    const float* M = heavy.pool + id * heavy.table_floats;
    const float* N = M + int64_t(a.dv) * a.d;
    for (int r = run[3] + slot; r < run[4]; r += teams) {
      const int64_t i = b * a.nq + load(a.order_q + pair * a.nq + r);
      float sum[T::kSlots] = {};
      team.add_times_table(a.grad, i, a.dv, M, a.d, sum);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) sum[s] *= scale;
      team.add(a.grad_q + i * a.d, a.d, sum);
    }
    for (int r = run[1] + slot; r < run[2]; r += teams) {
      const int64_t j = b * a.nk + load(a.order_k + pair * a.nk + r);
      const float w = load(a.key_weight + j);
      if (w == 0.0f) continue;
      float sum[T::kSlots] = {}, g[T::kSlots];
      team.add_times_table(a.v, j, a.dv, N, a.d, sum);
      team.read(N + int64_t(a.dv) * a.d, a.dv, g);
#pragma unroll
      for (int s = 0; s < T::kSlots; ++s) {
        sum[s] *= scale * w;
        g[s] *= inv_m * w;
      }
      team.add(a.grad_k + j * a.d, a.d, sum);
      team.add(a.grad_v + j * a.dv, a.dv, g);
    }
  }
}

// Deterministic. One team per token s: (1/m) Σ_h Σ_{o colliding} mask_o (s_s·w_o) ρ(a_s·o_o) o_o, ρ as
// yoso_math.h.
template <int D>
YOSO_GLOBAL void pair_gradient_kernel(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                      const float* a, const float* o, const float* s, const float* w,
                                      const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d,
                                      int dv, int tau, float clamp, float inv_m) {
  using T = Team<D>;
  const T team = T::of_thread();
  const int64_t token = team_index<D>();
  if (token >= B * ns) return;
  const int64_t b = token / ns;
  const int i = static_cast<int>(token - b * ns);
  float a_i[T::kSlots], s_i[T::kSlots], sum[T::kSlots] = {};
  team.read(a + token * d, d, a_i);
  team.read(s + token * dv, dv, s_i);
  for (int h = 0; h < m; ++h) {
    const int64_t pair = b * m + h;
    const int32_t code = checked_code(codes_s, pair * ns + i, tau);
    const int32_t* sorted = sorted_o + pair * no;
    const int first = find_first(sorted, no, code);
    if (first < 0) continue;
    for (int r = first; r < no && load(sorted + r) == code; ++r) {
      const int64_t j = b * no + load(order_o + pair * no + r);
      const float mask = load(mask_o + j);
      if (mask == 0.0f) continue;
      float o_j[T::kSlots], w_j[T::kSlots], dots[2] = {0.0f, 0.0f};
      team.read(o + j * d, d, o_j);
      team.read(w + j * dv, dv, w_j);
#pragma unroll
      for (int u = 0; u < T::kSlots; ++u) {
        dots[0] += a_i[u] * o_j[u];
        dots[1] += s_i[u] * w_j[u];
      }
      team.reduce(dots);
      const float coefficient = mask * inv_m * dots[1] * exact_ratio(dots[0], tau, clamp);
#pragma unroll
      for (int u = 0; u < T::kSlots; ++u) sum[u] += coefficient * o_j[u];
    }
  }
  team.write(out + token * d, d, sum);
}

// A thread per sorted position: the first position of each run writes itself into its code's start.
YOSO_GLOBAL void run_starts_kernel(const int32_t* sorted, int64_t rows, int n, int tau, int32_t* starts) {
  const int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * n) return;
  const int64_t row = index / n;
  const int t = static_cast<int>(index - row * n);
  const int32_t code = checked_code(sorted, index, tau);
  if (t == 0 || load(sorted + index - 1) != code) store(starts + (row << tau) + code, int32_t(t));
}

template <int D>
cudaError_t launch_gradients(const Backward& a, const Heavy& heavy, bool atomic, cudaStream_t stream) {
  const float scale = static_cast<float>(a.tau) / (2.0f * a.m), inv_m = 1.0f / a.m;
  constexpr int L = Team<D>::kLanes;
  if (!atomic) {
    constexpr int lanes = Team<D, kChainedCoords>::kLanes;
    const cudaError_t status = YOSO_LAUNCH(query_gradients_kernel<D>, dim3(blocks_for(a.B * a.nq, lanes)),
                                           dim3(kTeamThreads), 0, stream, a, heavy, scale);
    if (status != cudaSuccess) return status;
    return YOSO_LAUNCH(key_gradients_kernel<D>, dim3(blocks_for(a.B * a.nk, lanes)), dim3(kTeamThreads), 0, stream, a,
                       heavy, scale, inv_m);
  }
  const cudaError_t status = YOSO_LAUNCH(scatter_pairs_kernel<D>, dim3(blocks_for(a.B * a.m * a.nq, L)), dim3(kTeamThreads),
                                         0, stream, a, heavy, scale, inv_m);
  if (status != cudaSuccess || heavy.table_of_k == nullptr) return status;
  return YOSO_LAUNCH(heavy_apply_kernel<D>, dim3(static_cast<unsigned>(std::min<int64_t>(heavy.capacity, 2048))),
                     dim3(kTeamThreads), 0, stream, a, heavy, scale, inv_m);
}

}  // namespace

cudaError_t launch_run_starts(const int32_t* sorted, int64_t rows, int n, int tau, int32_t* starts,
                              cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  const int64_t blocks = (rows * n + kTeamThreads - 1) / kTeamThreads;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  return YOSO_LAUNCH(run_starts_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kTeamThreads), 0, stream, sorted, rows, n,
                     tau, starts);
}

cudaError_t launch_backward(const Backward& a, const Heavy& heavy, bool atomic, cudaStream_t stream) {
  if (a.d > kMaxHeadDim || a.dv > kMaxHeadDim) return cudaErrorInvalidValue;  // the host logic says so first
  if (a.B * a.m == 0 || a.nq == 0 || a.nk == 0) return cudaSuccess;
  if (heavy.table_of_k != nullptr) {
    const cudaError_t status = launch_heavy_tables(a, heavy, stream);
    if (status != cudaSuccess) return status;
  }
  switch (instance(a.d, a.dv, {a.q.data, a.k.data, a.v.data, a.grad.data, a.grad_q, a.grad_k, a.grad_v, heavy.pool})) {
    case 16: return launch_gradients<16>(a, heavy, atomic, stream);
    case 32: return launch_gradients<32>(a, heavy, atomic, stream);
    case 64: return launch_gradients<64>(a, heavy, atomic, stream);
    case 128: return launch_gradients<128>(a, heavy, atomic, stream);
    default: return launch_gradients<0>(a, heavy, atomic, stream);
  }
}

template <int D>
cudaError_t launch_pairs(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o, const float* a,
                         const float* o, const float* s, const float* w, const float* mask_o, float* out, int64_t B,
                         int m, int ns, int no, int d, int dv, int tau, float clamp, cudaStream_t stream) {
  return YOSO_LAUNCH(pair_gradient_kernel<D>, dim3(blocks_for(B * ns, Team<D>::kLanes)), dim3(kTeamThreads), 0, stream,
                     codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, 1.0f / m);
}

cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream) {
  if (d > kMaxHeadDim || dv > kMaxHeadDim) return cudaErrorInvalidValue;
  if (B * ns == 0 || m == 0 || no == 0) return cudaSuccess;
  switch (instance(d, dv, {a, o, s, w, out})) {
    case 16: return launch_pairs<16>(codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, stream);
    case 32: return launch_pairs<32>(codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, stream);
    case 64: return launch_pairs<64>(codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, stream);
    case 128: return launch_pairs<128>(codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, stream);
    default: return launch_pairs<0>(codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, B, m, ns, no, d, dv, tau, clamp, stream);
  }
}

}  // namespace yoso
