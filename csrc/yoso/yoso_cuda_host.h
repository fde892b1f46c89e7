// The host side of the YOSO CUDA kernels, without torch: argument checks, sorting, the workspace and the
// sequence of launches of each operation. yoso_cuda.cpp calls it with torch's allocator, sort, scan and
// stream; the CPU emulation's driver (tests/simt/yoso_driver.cpp) with a stand-in for each, so this logic
// is tested wherever the suite runs. Outputs are allocated, and zeroed, by the caller, but exact_backward's:
// it writes or zeroes every element of those itself.
#pragma once

#include <stdint.h>

#include <string>
#include <utility>

#include "yoso_cuda_kernels.h"
#include "yoso_simt.h"

namespace yoso {

// What the host logic needs from its caller.
class Device {
 public:
  virtual ~Device() = default;
  // Uninitialised device memory for `count` values (count >= 0), alive until the host call returns.
  virtual float* floats(int64_t count) = 0;
  virtual int32_t* ints(int64_t count) = 0;
  virtual void zero(float* data, int64_t count) = 0;
  virtual void minus_ones(int32_t* data, int64_t count) = 0;
  // Each of `rows` rows of n codes sorted stably: (sorted codes, token order), [rows, n] int32 each (where the
  // kernels' counting sort does not: sorted_by_code).
  virtual std::pair<const int32_t*, const int32_t*> sort_rows(const int32_t* codes, int64_t rows, int64_t n) = 0;
  // The inclusive prefix sum of `count` int32 values.
  virtual const int32_t* inclusive_scan(const int32_t* values, int64_t count) = 0;
  virtual cudaStream_t stream() = 0;
  // The most dynamic shared memory a block of this device may opt into: only to choose how codes are sorted
  // (sorted_by_code), never what the kernels compute.
  virtual int64_t most_shared_bytes() = 0;
  // A launcher's status: anything but success ends the call with an error naming `what`.
  virtual void check(cudaError_t status, const char* what) = 0;
  [[noreturn]] virtual void fail(const std::string& message) = 0;
};

// `value` as an int, or one error naming it when it exceeds the kernels' 32-bit indices.
int narrow(Device& device, int64_t value, const char* name);

// Each of `rows` pairs' n codes sorted stably, with their run starts by code where `with_starts` and there are
// no more than 2n codes (for lookups by one load; else null: binary searches): by the counting sort where its
// counters fit 48 KB of shared memory, or, with no more than 2n codes, the most a block of this device may
// opt into (one launch, the starts with it); else by the device's sort and launch_run_starts: the same
// outputs either way. The failure of a launch names `what`.
struct SortedCodes {
  const int32_t *sorted = nullptr, *order = nullptr, *starts = nullptr;
};
SortedCodes sorted_by_code(Device& device, const int32_t* codes, int64_t rows, int64_t n, int tau, bool with_starts,
                           const char* what);

// codes [B, m, n] of x [B, n, d] under diagonals [B, R, 3, P].
void fast_hash(Device& device, const float* x, const float* diagonals, int32_t* codes, int64_t B, int64_t n, int64_t d,
               int64_t R, int64_t P, int64_t m, int64_t tau);

// out [B, nq, dv] (zeroed) of the LSH cumulation (yoso_cuda_kernels.h). Tables in chunks of (batch, hash)
// pairs within workspace_bytes (a chunk is at least one pair), the chunks fixed by the arguments alone:
// the same on every GPU. Deterministic: one writer per table row and per output; else atomic rows, indexed
// in shared memory where table_rows allows (each side's tokens listed by slice of the codes: no sort, no
// global rows; the lists, 8 bytes a token and hash a side, are outside workspace_bytes, as a sort's output
// is), else by code when 2^tau <= 2 nk (no sort), else by the sorted codes.
void cumulation(Device& device, const int32_t* codes_q, const int32_t* codes_k, const float* weight_q, int64_t mq,
                const float* weight_k, int64_t mk, int64_t p, Rows values, float* out, int64_t B, int64_t m,
                int64_t nq, int64_t nk, int64_t dv, int64_t tau, int64_t workspace_bytes, bool deterministic);

// The default backward on q and k of any length (`on`): float32 rows whose unit rows x / max(‖x‖, eps) the
// estimator is taken on (read as bfloat16 where `bf16`), the gradients those of the rows given (UnitRows).
struct Normalization {
  bool on = false;
  float eps = 0.0f;
  bool bf16 = false;
};

// grad_q, grad_k [B, n, d], grad_v [B, nk, dv] (unfilled: every element written) of the default backward, in
// one pass: heavy buckets found, counted and numbered on the device, tables for at most workspace_bytes of them.
void exact_backward(Device& device, const int32_t* codes_q, const int32_t* codes_k, Rows q, Rows k, Rows v,
                    const float* key_weight, Rows grad, float* grad_q, float* grad_k,
                    float* grad_v, int64_t B, int64_t m, int64_t nq, int64_t nk, int64_t d, int64_t dv, int64_t tau,
                    int64_t workspace_bytes, bool deterministic, const Normalization& normalization = {});

// The output's normalization (N-YOSO): unit [rows, width] = x / max(‖x‖, eps) and norms [rows] = ‖x‖ of x; then,
// from those unit rows and norms, grad [rows, width], the gradient `incoming` of the unit rows pulled back to x
// (UnitRows), float32 throughout.
void unit_rows(Device& device, const float* x, float* unit, float* norms, int64_t rows, int64_t width, float eps);
void through_unit_rows(Device& device, const float* unit, const float* norms, const float* incoming, float* grad,
                       int64_t rows, int64_t width, float eps);

// out [B, ns, d] (zeroed) of the *YOSO backward.
void pair_gradient(Device& device, const int32_t* codes_s, const int32_t* codes_o, const float* a, const float* o,
                   const float* s, const float* w, const float* mask_o, float* out, int64_t B, int64_t m, int64_t ns,
                   int64_t no, int64_t d, int64_t dv, int64_t tau, double clamp);

}  // namespace yoso
