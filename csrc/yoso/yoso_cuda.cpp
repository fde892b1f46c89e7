// Torch-side wrappers of the CUDA launchers: allocate outputs and the bounded hash-table
// workspace, pass the current stream, and turn CUDA errors into Python exceptions.
// Compiled only into the CUDA extension (with -DYOSO_WITH_CUDA, alongside yoso_cpu.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "yoso_cuda_kernels.h"

namespace {

void check_status(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "yoso: CUDA ", what, " failed: ", cudaGetErrorString(status));
}

int narrow(int64_t value, const char* name) {
  TORCH_CHECK(value <= 2147483647, "yoso: ", name, " = ", value, " exceeds the 32-bit range of the CUDA kernels");
  return static_cast<int>(value);
}

}  // namespace

at::Tensor fast_hash_cuda(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0);
  auto codes = at::empty({B, m, x.size(1)}, x.options().dtype(at::kInt));
  check_status(yoso::launch_fast_hash(x.data_ptr<float>(), diagonals.data_ptr<float>(), codes.data_ptr<int32_t>(), B,
                                      narrow(x.size(1), "n"), narrow(x.size(2), "head_dim"),
                                      narrow(diagonals.size(1), "products"), narrow(diagonals.size(3), "P"),
                                      narrow(m, "num_hashes"), narrow(tau, "hash_code_len"),
                                      c10::cuda::getCurrentCUDAStream()),
               "fast_hash");
  return codes;
}

at::Tensor cumulation_cuda(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                           const at::Tensor& weight_k, const at::Tensor& values, int64_t tau,
                           int64_t workspace_bytes) {
  const c10::cuda::CUDAGuard guard(values.device());
  const int64_t B = values.size(0), m = codes_q.size(1), nq = codes_q.size(2), nk = values.size(1);
  const int64_t dv = values.size(2), p = weight_q.size(2);
  auto out = at::zeros({B, nq, dv}, values.options());
  if (B * m == 0 || dv == 0) return out;
  const int64_t table_bytes = (int64_t(1) << tau) * p * dv * static_cast<int64_t>(sizeof(float));
  const int64_t table_pairs =
      std::max<int64_t>(1, std::min({workspace_bytes / table_bytes, B * m, yoso::kMaxTablesPerChunk}));
  auto tables = at::empty({table_pairs, int64_t(1) << tau, p * dv}, values.options());
  check_status(yoso::launch_cumulation(codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(),
                                       weight_q.data_ptr<float>(), narrow(weight_q.size(1), "weight_q hashes"),
                                       weight_k.data_ptr<float>(), narrow(weight_k.size(1), "weight_k hashes"), narrow(p, "channels"),
                                       values.data_ptr<float>(), out.data_ptr<float>(), tables.data_ptr<float>(),
                                       table_pairs, B, narrow(m, "num_hashes"), narrow(nq, "queries"),
                                       narrow(nk, "keys"), narrow(dv, "value dim"), narrow(tau, "hash_code_len"),
                                       c10::cuda::getCurrentCUDAStream()),
               "cumulation");
  return out;
}

at::Tensor pair_gradient_cuda(const at::Tensor& codes_s, const at::Tensor& sorted_o, const at::Tensor& order_o,
                              const at::Tensor& a, const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                              const at::Tensor& mask_o, int64_t tau, double clamp) {
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = at::zeros_like(a);
  check_status(yoso::launch_pair_gradient(
                   codes_s.data_ptr<int32_t>(), sorted_o.data_ptr<int32_t>(), order_o.data_ptr<int32_t>(),
                   a.data_ptr<float>(), o.data_ptr<float>(), s.data_ptr<float>(), w.data_ptr<float>(),
                   mask_o.data_ptr<float>(), out.data_ptr<float>(), a.size(0), narrow(codes_s.size(1), "num_hashes"),
                   narrow(a.size(1), "n"), narrow(o.size(1), "n"), narrow(a.size(2), "head_dim"),
                   narrow(s.size(2), "value dim"), narrow(tau, "hash_code_len"), static_cast<float>(clamp),
                   c10::cuda::getCurrentCUDAStream()),
               "pair_gradient");
  return out;
}
