// Launchers of the YOSO CUDA kernels (yoso_cuda_hash.cu, yoso_cuda_kernels.cu, yoso_cuda_heavy.cu,
// yoso_cuda_gradients.cu, yoso_cuda_sort.cu), called by the host logic of yoso_cuda_host.cpp, which owns the
// memory (it allocates, and scans and sorts where no kernel here does, through its caller: torch in
// yoso_cuda.cpp, a CPU stand-in in the emulation's driver). No torch headers. B = batch·heads, m hashes,
// pair p = b·m + h.
//
// Buckets: each pair's codes sorted (stable; sorted codes and token order, [B·m, n] int32 each). A bucket
// is a run of equal codes: a token finds the other side's run by one binary search and walks it.
//
// Two ways to cumulate, chosen by the caller per call:
//  * deterministic (the default backward's when torch's deterministic algorithms are on): every output
//    element has one writer that sums in one fixed order, no atomics: bitwise repeatable;
//  * atomic (the YOSO authors' design): tokens add into shared table rows and gradient rows with
//    atomicAdd, in parallel over hashes as well as tokens; float sums in arrival order.
#pragma once

#include <stdint.h>

#include "yoso_simt.h"

namespace yoso {

// The largest head and value dims the gradient kernels keep per thread.
constexpr int kMaxHeadDim = 256;

// Rows the kernels read (values, q, k, the output's gradient): float32, or bfloat16, the top half of a float32,
// widened exactly as it is loaded, so every product and sum is the float32 one of the same values (and
// bitwise so on the deterministic path) at half the bytes. Tables, weights and outputs stay float32.
struct Rows {
  const void* data = nullptr;
  bool bf16 = false;
};

// codes [B, m, n] (every one written) of x [B, n, d] under diagonals [B, R, 3, P].
cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d, int R,
                             int P, int m, int tau, cudaStream_t stream);

// out [B, nq, dv] += (1/m) Σ_{h in [first, end) of b's pairs} Σ_t weight_q[b,h|0,t,i] T_h[row(code_q(i)), t]:
// p weight channels, weights [B, mq|mk (1 or m), p, n], dv <= kMaxHeadDim. Rows: `direct`, row c is code c
// (2^tau rows a pair, absent codes' rows 0); otherwise a code's row is the first position of its run in
// sorted_k (nk rows a pair).
struct Cumulation {
  const int32_t *codes_q, *codes_k, *sorted_k, *order_k;
  const int32_t* starts_k;  // the keys' run starts by code (launch_run_starts), or null: binary searches
  const float *weight_q, *weight_k;
  Rows values;
  float* out;
  int64_t B;
  int m, mq, mk, p, nq, nk, dv, tau;
};
// Fills the rows of pairs [first, end) (rows_per_pair rows of p·dv floats each, from `rows`): deterministic,
// the first position of each run sums the run (direct must be false); atomic, every key adds itself to its
// row (the rows zeroed by the caller). Then every query reads its rows.
cudaError_t launch_cumulation_chunk(const Cumulation& c, float* rows, int64_t rows_per_pair, bool direct,
                                    bool atomic, int64_t first, int64_t end, cudaStream_t stream);

// Atomic, the table in shared memory: each side's tokens first listed by slice of the 2^tau codes (a block
// per pair and side), then a block per (pair, slice, 32 value columns): the slice's keys add their
// weighted values into its rows with shared-memory atomics, its queries read their rows and add them into
// out with one global atomic a coordinate. No global rows to clear, write and read back, no sort.
// table_rows: the codes a slice holds (a power of two, its rows within kTableBytes), or 0 where a pair
// would need more than 128 slices (p channels wide, or τ > 15): then launch_cumulation_chunk.
constexpr int kTableBytes = 48 * 1024;  // the shared memory a block gets without opting in
int table_rows(int tau, int p);
// The lists (allocated by the caller): starts [B·m, slices + 1], tokens and rows [B·m, n] a side.
struct SliceLists {
  int32_t *starts_q, *tokens_q, *rows_q, *starts_k, *tokens_k, *rows_k;
  int shift, slices;  // 2^shift = table_rows(tau, p); slices = 2^tau / 2^shift
};
cudaError_t launch_table_cumulation(const Cumulation& c, const SliceLists& lists, cudaStream_t stream);

// The default backward (eq. 4 with exact pair weights): grad_q, grad_k [B, n, d] and grad_v [B, nk, dv]
// (zeroed by the caller) receive the gradients of Y = (1/m) Σ_h B_h (w · V). A heavy bucket (yoso_math.h)
// goes through its tables: M = Σ w v kᵀ [dv x d] for its queries, N = Σ g qᵀ [dv x d] and Σ g [dv] for
// its keys; a light one through its colliding pairs.
struct Backward {
  const int32_t *codes_q, *codes_k, *sorted_q, *order_q, *sorted_k, *order_k;
  // Each pair's run starts by code ([B·m, 2^tau]: the first sorted position of a code, or -1 where the side
  // lacks it), for the side whose runs are looked up; null: a binary search in the sorted codes instead.
  const int32_t *starts_q, *starts_k;
  Rows q, k, v;
  const float* key_weight;
  Rows grad;
  float *grad_q, *grad_k, *grad_v;
  int64_t B;
  int m, nq, nk, d, dv, tau;
};
// The heavy buckets found on the device, counted and numbered in one pass. Null table_of_*: none can be
// heavy (every side shorter than heavy_side_minimum). runs[id] = {pair, k_first, k_last, q_first, q_last};
// table_of_k[pair·nk + t] (table_of_q[pair·nq + t]) is the table of the bucket whose keys (queries) start
// at sorted position t, or -1; table `id` is pool[id·table_floats, …): M, N, Σ g. Only the first `capacity`
// heavy buckets (in pair and code order) have tables; the others' pairs are read from their runs as a light
// bucket's are.
struct Heavy {
  int32_t *table_of_q = nullptr, *table_of_k = nullptr, *flags = nullptr, *runs = nullptr;
  const int32_t* scan = nullptr;  // inclusive prefix sum of flags: scan[B·m·nk - 1] heavy buckets in all
  float* pool = nullptr;
  int64_t capacity = 0, table_floats = 0;
  int minimum = 0;  // heavy_side_minimum(d, dv)
};
int64_t table_floats(int d, int dv);
// Marks the first key position of every heavy bucket in flags (0 elsewhere) and sets table_of_q to -1.
cudaError_t launch_find_heavy(const Backward& a, const Heavy& heavy, cudaStream_t stream);
// From the caller's scan of the flags: table_of_k, table_of_q and runs of the numbered buckets.
cudaError_t launch_number_heavy(const Backward& a, const Heavy& heavy, cudaStream_t stream);
// The tables of the numbered buckets (one block each; called by launch_backward).
cudaError_t launch_heavy_tables(const Backward& a, const Heavy& heavy, cudaStream_t stream);
// The tables of the numbered buckets, then every gradient: one launch each, over all pairs.
cudaError_t launch_backward(const Backward& a, const Heavy& heavy, bool atomic, cudaStream_t stream);

// Rows of any length and their unit rows (yoso_cuda_rows.cu): one side's rows x [rows, width] (float32),
// their norms [rows], their unit rows x / max(‖x‖, eps) (float32, or rounded to bfloat16 to nearest even, as
// torch rounds), and the gradient `incoming` of the unit rows pulled back to x into `grad` [rows, width]:
// (g − y (g·y)) / max(‖x‖, eps), y the float32 unit row, g·y taken as 0 where ‖x‖ < eps (as F.normalize's
// backward). The default backward: q and k, both sides in one launch each, the gradient taken on the unit
// rows and pulled back in place (incoming = grad); the output's normalization: one side, its backward reading
// the float32 unit rows it made (x null).
struct UnitRows {
  const float* x;
  float* norms;
  void* unit;
  bool bf16;
  const float* incoming;
  float* grad;
  int64_t rows;
};
// The output's one side: its rows, to be made unit rows and norms; then, from those, its gradient.
inline UnitRows output_rows(const float* x, float* unit, float* norms, int64_t rows) {
  return {x, norms, unit, false, nullptr, nullptr, rows};
}
inline UnitRows output_gradient(const float* unit, const float* norms, const float* incoming, float* grad,
                                int64_t rows) {
  return {nullptr, const_cast<float*>(norms), const_cast<float*>(unit), false, incoming, grad, rows};
}
cudaError_t launch_unit_rows(const UnitRows& queries, const UnitRows& keys, int width, float eps,
                             cudaStream_t stream);
cudaError_t launch_through_unit_rows(const UnitRows& queries, const UnitRows& keys, int width, float eps,
                                     cudaStream_t stream);

// Each of `rows` rows of n codes sorted stably (sorted codes and token order, [rows, n] each; bitwise what a
// stable sort gives), by a counting sort in shared memory, a block a row: its 2^tau counters take
// counting_sort_bytes(tau), within kTableBytes up to tau = 13, past them opted into (cudaFuncSetAttribute) up to
// most_shared_bytes, the device's largest block (an H100's 227 KB holds tau = 15). starts (or null):
// [rows, 2^tau], every entry written, as launch_run_starts writes it.
int64_t counting_sort_bytes(int tau);
cudaError_t launch_counting_sort(const int32_t* codes, int64_t rows, int n, int tau, int32_t* sorted, int32_t* order,
                                 int32_t* starts, int64_t most_shared_bytes, cudaStream_t stream);

// starts [rows, 2^tau] (filled with -1 by the caller): starts[row][code] = the first position of code's run in
// sorted [rows, n]. One load then finds a token's bucket instead of a binary search's log2 n dependent ones.
cudaError_t launch_run_starts(const int32_t* sorted, int64_t rows, int n, int tau, int32_t* starts,
                              cudaStream_t stream);

// The *YOSO backward (eq. 3): out [B, ns, d] (zeroed by the caller) += (1/m) Σ_h Σ_{o colliding}
// mask_o (s_s · w_o) ρ(a_s · o_o) o_o. Deterministic: one team per token s.
cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream);

}  // namespace yoso
