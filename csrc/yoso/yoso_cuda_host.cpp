// The host side of the YOSO CUDA kernels (yoso_cuda_host.h): checks, sorting, the workspace, launches.
// Nothing here waits for the device: sizes come from the arguments, counts found on the device stay there.
#include "yoso_cuda_host.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {

int narrow(Device& device, int64_t value, const char* name) {
  if (value > 2147483647) {
    device.fail(std::string("yoso: ") + name + " = " + std::to_string(value) +
                " exceeds the 32-bit range of the CUDA kernels");
  }
  return static_cast<int>(value);
}

namespace {

void check_dims(Device& device, int64_t d, int64_t dv, const char* what) {
  if (d > kMaxHeadDim || dv > kMaxHeadDim) {
    device.fail(std::string("yoso: the CUDA ") + what + " takes head and value dims up to " +
                std::to_string(kMaxHeadDim) + ", got " + std::to_string(d) + " and " + std::to_string(dv) +
                "; use attention.impl=torch");
  }
}

// Whether a pair's 2^tau codes are few enough to index rows by code (no more than its n codes twice over):
// the atomic cumulation's direct rows, and the run starts.
bool indexed_by_code(int64_t tau, int64_t n) { return (int64_t(1) << tau) <= 2 * n; }

}  // namespace

SortedCodes sorted_by_code(Device& device, const int32_t* codes, int64_t rows, int64_t n, int tau, bool with_starts,
                           const char* what) {
  narrow(device, rows, "(batch·heads)·hashes");
  int32_t* starts = with_starts && indexed_by_code(tau, n) ? device.ints(rows << tau) : nullptr;
  // Past 48 KB of counters only where they do not outnumber the tokens twice over: else torch's radix sort
  // is the faster (docs/benchmarks.md, Sorting).
  const int64_t counters = counting_sort_bytes(tau);
  const int64_t most = counters <= kTableBytes ? kTableBytes : device.most_shared_bytes();
  if (counters <= kTableBytes || (indexed_by_code(tau, n) && counters <= most)) {
    int32_t *sorted = device.ints(rows * n), *order = device.ints(rows * n);
    device.check(launch_counting_sort(codes, rows, static_cast<int>(n), tau, sorted, order, starts, most,
                                      device.stream()),
                 what);
    return {sorted, order, starts};
  }
  const auto [sorted, order] = device.sort_rows(codes, rows, n);
  if (starts != nullptr) {
    device.minus_ones(starts, rows << tau);
    device.check(launch_run_starts(sorted, rows, static_cast<int>(n), tau, starts, device.stream()), what);
  }
  return {sorted, order, starts};
}

void fast_hash(Device& device, const float* x, const float* diagonals, int32_t* codes, int64_t B, int64_t n, int64_t d,
               int64_t R, int64_t P, int64_t m, int64_t tau) {
  const int N = narrow(device, n, "n"), D = narrow(device, d, "head_dim"), products = narrow(device, R, "products");
  const int padded = narrow(device, P, "P"), hashes = narrow(device, m, "num_hashes");
  const int bits = narrow(device, tau, "hash_code_len");
  if (B * n == 0) return;
  device.check(launch_fast_hash(x, diagonals, codes, B, N, D, products, padded, hashes, bits, device.stream()),
               "fast_hash");
}

void cumulation(Device& device, const int32_t* codes_q, const int32_t* codes_k, const float* weight_q, int64_t mq,
                const float* weight_k, int64_t mk, int64_t p, Rows values, float* out, int64_t B, int64_t m,
                int64_t nq, int64_t nk, int64_t dv, int64_t tau, int64_t workspace_bytes, bool deterministic) {
  check_dims(device, 0, dv, "cumulation");
  const Cumulation c{codes_q, codes_k, nullptr, nullptr, nullptr, weight_q, weight_k, values, out, B,
                     narrow(device, m, "num_hashes"), narrow(device, mq, "weight_q hashes"),
                     narrow(device, mk, "weight_k hashes"), narrow(device, p, "channels"), narrow(device, nq, "queries"),
                     narrow(device, nk, "keys"), static_cast<int>(dv), narrow(device, tau, "hash_code_len")};
  if (B * m == 0 || nq == 0 || nk == 0 || dv == 0) return;
  Cumulation call = c;
  const bool atomic = !deterministic, direct = atomic && indexed_by_code(tau, nk);
  if (const int rows = table_rows(c.tau, c.p); atomic && rows > 0) {
    SliceLists lists{};
    lists.slices = static_cast<int>((int64_t(1) << tau) / rows);
    while ((1 << lists.shift) < rows) ++lists.shift;
    narrow(device, B * m * lists.slices, "(batch·heads)·hashes·(code slices)");
    lists.starts_q = device.ints(B * m * (lists.slices + 1));
    lists.starts_k = device.ints(B * m * (lists.slices + 1));
    lists.tokens_q = device.ints(B * m * nq), lists.rows_q = device.ints(B * m * nq);
    lists.tokens_k = device.ints(B * m * nk), lists.rows_k = device.ints(B * m * nk);
    device.check(launch_table_cumulation(c, lists, device.stream()), "cumulation (shared-memory tables)");
    return;
  }
  if (!direct) {
    const SortedCodes keys = sorted_by_code(device, codes_k, B * m, nk, c.tau, true, "cumulation (sorting codes)");
    call.sorted_k = keys.sorted, call.order_k = keys.order, call.starts_k = keys.starts;
  }
  const int64_t rows_per_pair = direct ? int64_t(1) << tau : nk, per_pair = rows_per_pair * p * dv;
  const int64_t total = B * m, chunk = std::clamp<int64_t>(workspace_bytes / 4 / std::max<int64_t>(per_pair, 1), 1,
                                                          std::min<int64_t>(total, 65535));
  float* rows = device.floats(chunk * per_pair);
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t end = std::min(total, first + chunk);
    if (atomic) device.zero(rows, (end - first) * per_pair);
    device.check(launch_cumulation_chunk(call, rows, rows_per_pair, direct, atomic, first, end, device.stream()),
                 "cumulation");
  }
}

void exact_backward(Device& device, const int32_t* codes_q, const int32_t* codes_k, Rows q, Rows k, Rows v,
                    const float* key_weight, Rows grad, float* grad_q, float* grad_k,
                    float* grad_v, int64_t B, int64_t m, int64_t nq, int64_t nk, int64_t d, int64_t dv, int64_t tau,
                    int64_t workspace_bytes, bool deterministic, const Normalization& normalization) {
  check_dims(device, d, dv, "backward");
  Backward a{codes_q, codes_k, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, q, k, v, key_weight, grad, grad_q,
             grad_k, grad_v,
             B, narrow(device, m, "num_hashes"), narrow(device, nq, "queries"), narrow(device, nk, "keys"),
             static_cast<int>(d), static_cast<int>(dv), narrow(device, tau, "hash_code_len")};
  // dv = 0: every pair's weight g·v is 0 and ∇V has no columns; all gradients are 0 (nor is there a head dim
  // to divide by: heavy_side_minimum needs dv + 2d > 0). The deterministic kernels write every row; the atomic
  // ones add into zeroed rows.
  const bool empty = B * m == 0 || nq == 0 || nk == 0 || dv == 0;
  if (empty || !deterministic) {
    device.zero(grad_q, B * nq * d), device.zero(grad_k, B * nk * d), device.zero(grad_v, B * nk * dv);
  }
  if (empty) return;
  UnitRows unit_q{}, unit_k{};
  if (normalization.on) {
    if (q.bf16 || k.bf16) device.fail("yoso: the rows to normalize must be float32");
    // Norms and unit rows outside workspace_bytes, as the sorted codes are (bfloat16 rows in half the words).
    const auto side = [&](Rows x, float* gradient, int64_t rows) {
      return UnitRows{static_cast<const float*>(x.data), device.floats(rows),
                      device.floats(normalization.bf16 ? (rows * d + 1) / 2 : rows * d), normalization.bf16, gradient,
                      gradient, rows};
    };
    unit_q = side(q, grad_q, B * nq), unit_k = side(k, grad_k, B * nk);
    device.check(launch_unit_rows(unit_q, unit_k, a.d, normalization.eps, device.stream()),
                 "exact_weight_backward (unit rows)");
    a.q = {unit_q.unit, normalization.bf16}, a.k = {unit_k.unit, normalization.bf16};
  }
  narrow(device, B * m * std::max(nq, nk), "(batch·heads)·hashes·tokens");
  // The keys' runs are looked up on every path, the queries' where the key gradients do (deterministic).
  const char* sorting = "exact_weight_backward (sorting codes)";
  const SortedCodes queries = sorted_by_code(device, codes_q, B * m, nq, a.tau, deterministic, sorting);
  const SortedCodes keys = sorted_by_code(device, codes_k, B * m, nk, a.tau, true, sorting);
  a.sorted_q = queries.sorted, a.order_q = queries.order, a.starts_q = queries.starts;
  a.sorted_k = keys.sorted, a.order_k = keys.order, a.starts_k = keys.starts;
  Heavy heavy;
  heavy.minimum = static_cast<int>(heavy_side_minimum(d, dv));
  heavy.table_floats = table_floats(a.d, a.dv);
  // Heavy buckets are disjoint runs of at least `minimum` tokens on each side: at most this many a pair.
  const int64_t most = B * m * (std::min(nq, nk) / heavy.minimum);
  heavy.capacity = std::min(most, workspace_bytes / 4 / heavy.table_floats);
  if (heavy.capacity > 0) {
    heavy.flags = device.ints(B * m * nk);
    heavy.table_of_q = device.ints(B * m * nq);
    device.check(launch_find_heavy(a, heavy, device.stream()), "exact_weight_backward (finding heavy buckets)");
    heavy.scan = device.inclusive_scan(heavy.flags, B * m * nk);
    heavy.table_of_k = heavy.flags;
    heavy.runs = device.ints(heavy.capacity * 5);
    heavy.pool = device.floats(heavy.capacity * heavy.table_floats);
    device.check(launch_number_heavy(a, heavy, device.stream()), "exact_weight_backward (numbering heavy buckets)");
  }
  device.check(launch_backward(a, heavy, !deterministic, device.stream()), "exact_weight_backward");
  if (normalization.on) {
    device.check(launch_through_unit_rows(unit_q, unit_k, a.d, normalization.eps, device.stream()),
                 "exact_weight_backward (through the unit rows)");
  }
}

void unit_rows(Device& device, const float* x, float* unit, float* norms, int64_t rows, int64_t width, float eps) {
  check_dims(device, width, width, "output normalization");
  if (width == 0 && rows > 0) device.zero(norms, rows);  // no coordinates: every norm 0 (the kernel launches none)
  device.check(launch_unit_rows(output_rows(x, unit, norms, rows), {}, static_cast<int>(width), eps, device.stream()),
               "unit_rows");
}

void through_unit_rows(Device& device, const float* unit, const float* norms, const float* incoming, float* grad,
                       int64_t rows, int64_t width, float eps) {
  check_dims(device, width, width, "output normalization");
  device.check(launch_through_unit_rows(output_gradient(unit, norms, incoming, grad, rows), {}, static_cast<int>(width),
                                        eps, device.stream()),
               "through_unit_rows");
}

void pair_gradient(Device& device, const int32_t* codes_s, const int32_t* codes_o, const float* a, const float* o,
                   const float* s, const float* w, const float* mask_o, float* out, int64_t B, int64_t m, int64_t ns,
                   int64_t no, int64_t d, int64_t dv, int64_t tau, double clamp) {
  check_dims(device, d, dv, "*YOSO backward");
  const int M = narrow(device, m, "num_hashes"), NS = narrow(device, ns, "n"), NO = narrow(device, no, "n");
  const int bits = narrow(device, tau, "hash_code_len");
  if (B * m == 0 || ns == 0 || no == 0 || d == 0) return;
  const SortedCodes others = sorted_by_code(device, codes_o, B * m, no, bits, false, "pair_gradient (sorting codes)");
  device.check(launch_pair_gradient(codes_s, others.sorted, others.order, a, o, s, w, mask_o, out, B, M, NS, NO,
                                    static_cast<int>(d), static_cast<int>(dv), bits, static_cast<float>(clamp),
                                    device.stream()),
               "pair_gradient");
}

}  // namespace yoso
