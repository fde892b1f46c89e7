// Torch-side wrappers of the CUDA launchers (yoso_cuda_kernels.h): outputs and workspace from
// torch's caching allocator, each pair's codes sorted with torch's (stable, deterministic) sort, the
// current stream, and every launch checked with C10_CUDA_KERNEL_LAUNCH_CHECK. Nothing here waits for
// the device. Compiled only into the CUDA extension (with -DYOSO_WITH_CUDA, alongside yoso_cpu.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>

#include "yoso_cuda_kernels.h"

namespace {

int narrow(int64_t value, const char* name) {
  TORCH_CHECK(value <= 2147483647, "yoso: ", name, " = ", value, " exceeds the 32-bit range of the CUDA kernels");
  return static_cast<int>(value);
}

void check(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "yoso: CUDA ", what, " failed: ", cudaGetErrorString(status));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Each (batch, hash) pair's codes sorted (stable), with the token order as int32: [B·m, n] each.
std::tuple<at::Tensor, at::Tensor> sort_codes(const at::Tensor& codes) {
  auto flat = codes.reshape({codes.size(0) * codes.size(1), codes.size(2)});
  auto [sorted, order] = at::sort(flat, /*stable=*/true, /*dim=*/-1, /*descending=*/false);
  return {sorted.contiguous(), order.to(at::kInt).contiguous()};
}

at::Tensor workspace(int64_t floats, const at::Tensor& like) {
  return at::empty({std::max<int64_t>(floats, 1)}, like.options().dtype(at::kFloat));
}

}  // namespace

at::Tensor fast_hash_cuda(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0);
  auto codes = at::empty({B, m, x.size(1)}, x.options().dtype(at::kInt));  // every code is written
  check(yoso::launch_fast_hash(x.data_ptr<float>(), diagonals.data_ptr<float>(), codes.data_ptr<int32_t>(), B,
                               narrow(x.size(1), "n"), narrow(x.size(2), "head_dim"),
                               narrow(diagonals.size(1), "products"), narrow(diagonals.size(3), "P"),
                               narrow(m, "num_hashes"), narrow(tau, "hash_code_len"), c10::cuda::getCurrentCUDAStream()),
        "fast_hash");
  return codes;
}

at::Tensor cumulation_cuda(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                           const at::Tensor& weight_k, const at::Tensor& values, int64_t tau, int64_t workspace_bytes) {
  const c10::cuda::CUDAGuard guard(values.device());
  const int64_t B = values.size(0), m = codes_q.size(1), nq = codes_q.size(2), nk = values.size(1);
  const int64_t dv = values.size(2), p = weight_q.size(2);
  TORCH_CHECK(dv <= yoso::kMaxHeadDim, "yoso: the CUDA cumulation takes value dims up to ", yoso::kMaxHeadDim,
              ", got ", dv, "; use attention.impl=torch");
  auto out = at::zeros({B, nq, dv}, values.options());
  if (B * m == 0 || nq == 0 || nk == 0 || dv == 0) return out;
  auto [sorted_k, order_k] = sort_codes(codes_k);
  const int64_t floats = yoso::cumulation_workspace(B, narrow(m, "num_hashes"), narrow(nk, "keys"), narrow(p, "channels"),
                                                    narrow(dv, "value dim"), workspace_bytes);
  auto tables = workspace(floats, values);
  check(yoso::launch_cumulation(codes_q.data_ptr<int32_t>(), sorted_k.data_ptr<int32_t>(), order_k.data_ptr<int32_t>(),
                                weight_q.data_ptr<float>(), narrow(weight_q.size(1), "weight_q hashes"),
                                weight_k.data_ptr<float>(), narrow(weight_k.size(1), "weight_k hashes"), static_cast<int>(p),
                                values.data_ptr<float>(), out.data_ptr<float>(), tables.data_ptr<float>(), floats, B,
                                static_cast<int>(m), narrow(nq, "queries"), static_cast<int>(nk), static_cast<int>(dv),
                                narrow(tau, "hash_code_len"), c10::cuda::getCurrentCUDAStream()),
        "cumulation");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cuda(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, int64_t workspace_bytes) {
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = q.size(0), m = codes_q.size(1), nq = q.size(1), nk = k.size(1), d = q.size(2), dv = v.size(2);
  TORCH_CHECK(d <= yoso::kMaxHeadDim && dv <= yoso::kMaxHeadDim, "yoso: the CUDA backward takes head and value dims up to ",
              yoso::kMaxHeadDim, ", got ", d, " and ", dv, "; use attention.impl=torch");
  auto grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  if (B * m == 0 || nq == 0 || nk == 0) return {grad_q, grad_k, grad_v};
  auto [sorted_q, order_q] = sort_codes(codes_q);
  auto [sorted_k, order_k] = sort_codes(codes_k);
  const int64_t floats = yoso::exact_backward_workspace(B, narrow(m, "num_hashes"), narrow(nq, "queries"),
                                                        narrow(nk, "keys"), static_cast<int>(d), static_cast<int>(dv),
                                                        workspace_bytes);
  auto tables = workspace(floats, q);
  check(yoso::launch_exact_backward(
            codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), sorted_q.data_ptr<int32_t>(),
            order_q.data_ptr<int32_t>(), sorted_k.data_ptr<int32_t>(), order_k.data_ptr<int32_t>(), q.data_ptr<float>(),
            k.data_ptr<float>(), v.data_ptr<float>(), key_weight.data_ptr<float>(), grad.data_ptr<float>(),
            grad_q.data_ptr<float>(), grad_k.data_ptr<float>(), grad_v.data_ptr<float>(), tables.data_ptr<float>(), floats,
            B, static_cast<int>(m), static_cast<int>(nq), static_cast<int>(nk), static_cast<int>(d), static_cast<int>(dv),
            narrow(tau, "hash_code_len"), c10::cuda::getCurrentCUDAStream()),
        "exact_weight_backward");
  return {grad_q, grad_k, grad_v};
}

at::Tensor pair_gradient_cuda(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                              const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                              int64_t tau, double clamp) {
  const c10::cuda::CUDAGuard guard(a.device());
  TORCH_CHECK(a.size(2) <= yoso::kMaxHeadDim && s.size(2) <= yoso::kMaxHeadDim, "yoso: the CUDA *YOSO backward takes "
              "head and value dims up to ", yoso::kMaxHeadDim, "; use attention.impl=torch");
  auto out = at::zeros_like(a);
  if (codes_s.size(1) == 0 || a.size(1) == 0 || o.size(1) == 0) return out;
  auto [sorted_o, order_o] = sort_codes(codes_o);
  check(yoso::launch_pair_gradient(codes_s.data_ptr<int32_t>(), sorted_o.data_ptr<int32_t>(), order_o.data_ptr<int32_t>(),
                                   a.data_ptr<float>(), o.data_ptr<float>(), s.data_ptr<float>(), w.data_ptr<float>(),
                                   mask_o.data_ptr<float>(), out.data_ptr<float>(), a.size(0),
                                   narrow(codes_s.size(1), "num_hashes"), narrow(a.size(1), "n"), narrow(o.size(1), "n"),
                                   narrow(a.size(2), "head_dim"), narrow(s.size(2), "value dim"),
                                   narrow(tau, "hash_code_len"), static_cast<float>(clamp),
                                   c10::cuda::getCurrentCUDAStream()),
        "pair_gradient");
  return out;
}
