// Torch-side wrappers of the YOSO CUDA kernels: outputs from torch's caching allocator, then the host
// logic of yoso_cuda_host.cpp with torch as its device (workspace from the caching allocator, each pair's
// codes sorted with torch's stable sort where the kernels' counting sort does not (sorted_by_code), the
// heavy buckets numbered with torch's cumsum, the current stream, every launch's own error read, cleared and
// raised as that launch's, an earlier one's raised before). Nothing here waits for the device. The
// cumulation and the default backward are deterministic (one writer per output, bitwise repeatable) when
// torch's deterministic algorithms are on (torch.use_deterministic_algorithms; the trainer's
// trainer.deterministic, default true), and otherwise atomic (the YOSO authors' design, faster). Compiled
// only into the CUDA extension (with -DYOSO_WITH_CUDA, alongside yoso_cpu.cpp).
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>
#include <tuple>
#include <vector>

#include "yoso_cuda_host.h"

namespace {

// An output every element of which a kernel writes: not at::empty, which fills new memory with NaNs whenever
// deterministic algorithms are on (torch.utils.deterministic.fill_uninitialized_memory: a launch each).
at::Tensor unfilled(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::Tensor(at::detail::empty_cuda(sizes, options));
}

class TorchDevice final : public yoso::Device {
 public:
  // An error some earlier CUDA operation left pending is raised here, as that operation's, before a YOSO
  // kernel launches (a launch reads and clears the error it finds: it would otherwise be blamed on YOSO).
  explicit TorchDevice(const at::Tensor& like) : options_(like.options()) {
    const cudaError_t pending = cudaGetLastError();
    TORCH_CHECK(pending == cudaSuccess,
                (std::string("a CUDA error was pending before a YOSO op launched anything (left by an earlier CUDA "
                             "operation, not by YOSO): ") + cudaGetErrorString(pending)).c_str());
  }
  // Straight from the caching allocator: at::empty would fill the workspace with NaNs whenever
  // deterministic algorithms are on (torch.utils.deterministic.fill_uninitialized_memory), every call.
  float* floats(int64_t count) override { return static_cast<float*>(raw(count * sizeof(float))); }
  int32_t* ints(int64_t count) override { return static_cast<int32_t*>(raw(count * sizeof(int32_t))); }
  void zero(float* data, int64_t count) override {
    if (count > 0) C10_CUDA_CHECK(cudaMemsetAsync(data, 0, count * sizeof(float), stream()));
  }
  void minus_ones(int32_t* data, int64_t count) override {
    C10_CUDA_CHECK(cudaMemsetAsync(data, 0xFF, count * sizeof(int32_t), stream()));  // every byte 0xFF: -1
  }
  std::pair<const int32_t*, const int32_t*> sort_rows(const int32_t* codes, int64_t rows, int64_t n) override {
    const auto flat = at::from_blob(const_cast<int32_t*>(codes), {rows, n}, options_.dtype(at::kInt));
    auto [sorted, order] = at::sort(flat, /*stable=*/true, /*dim=*/-1, /*descending=*/false);
    keep_.push_back(sorted.contiguous());
    keep_.push_back(order.to(at::kInt).contiguous());
    return {keep_[keep_.size() - 2].data_ptr<int32_t>(), keep_.back().data_ptr<int32_t>()};
  }
  const int32_t* inclusive_scan(const int32_t* values, int64_t count) override {
    const auto flat = at::from_blob(const_cast<int32_t*>(values), {count}, options_.dtype(at::kInt));
    keep_.push_back(unfilled({count}, options_.dtype(at::kInt)));  // at::cumsum's own output would be filled first
    at::cumsum_out(keep_.back(), flat, 0, at::kInt);
    return keep_.back().data_ptr<int32_t>();
  }
  cudaStream_t stream() override { return c10::cuda::getCurrentCUDAStream(); }
  int64_t most_shared_bytes() override {
    int bytes = 0;
    C10_CUDA_CHECK(
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, c10::cuda::current_device()));
    return bytes;
  }
  // ``status``: a launch's own error, already cleared by YOSO_LAUNCH (yoso_simt.h).
  void check(cudaError_t status, const char* what) override {
    TORCH_CHECK(status == cudaSuccess,  // one finished string: no stream (yoso_checks.h says why)
                (std::string("yoso: CUDA ") + what + " failed: " + cudaGetErrorString(status)).c_str());
  }
  [[noreturn]] void fail(const std::string& message) override { TORCH_CHECK(false, message.c_str()); }

 private:
  void* raw(int64_t bytes) {
    memory_.push_back(c10::cuda::CUDACachingAllocator::get()->allocate(std::max<int64_t>(bytes, 4)));
    return memory_.back().get();
  }
  at::TensorOptions options_;
  std::vector<at::Tensor> keep_;  // the sorted codes and scans of one call
  std::vector<at::DataPtr> memory_;  // its workspace: both back to the caching allocator after the call
};

bool deterministic() { return at::globalContext().deterministicAlgorithms(); }

// A float32 or bfloat16 row matrix (yoso_checks.h allows both) as the kernels read it.
yoso::Rows rows_of(const at::Tensor& t) { return {t.data_ptr(), t.scalar_type() == at::kBFloat16}; }

// The float32 gradient of rows like t (float32 whatever t's row dtype), unfilled: exact_backward writes it all.
at::Tensor float_unfilled_like(const at::Tensor& t) { return unfilled(t.sizes(), t.options().dtype(at::kFloat)); }

}  // namespace

at::Tensor fast_hash_cuda(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  const c10::cuda::CUDAGuard guard(x.device());
  TorchDevice device(x);
  auto codes = unfilled({x.size(0), m, x.size(1)}, x.options().dtype(at::kInt));  // every code is written
  yoso::fast_hash(device, x.data_ptr<float>(), diagonals.data_ptr<float>(), codes.data_ptr<int32_t>(), x.size(0),
                  x.size(1), x.size(2), diagonals.size(1), diagonals.size(3), m, tau);
  return codes;
}

at::Tensor cumulation_cuda(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                           const at::Tensor& weight_k, const at::Tensor& values, int64_t tau, int64_t workspace_bytes) {
  const c10::cuda::CUDAGuard guard(values.device());
  TorchDevice device(values);
  const int64_t B = values.size(0), nq = codes_q.size(2);
  auto out = at::zeros({B, nq, values.size(2)}, values.options().dtype(at::kFloat));
  yoso::cumulation(device, codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), weight_q.data_ptr<float>(),
                   weight_q.size(1), weight_k.data_ptr<float>(), weight_k.size(1), weight_q.size(2),
                   rows_of(values), out.data_ptr<float>(), B, codes_q.size(1), nq, values.size(1),
                   values.size(2), tau, workspace_bytes, deterministic());
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cuda(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, int64_t workspace_bytes, bool normalize,
    double eps, bool bf16_units) {
  const c10::cuda::CUDAGuard guard(q.device());
  TorchDevice device(q);
  auto grad_q = float_unfilled_like(q), grad_k = float_unfilled_like(k), grad_v = float_unfilled_like(v);
  yoso::exact_backward(device, codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), rows_of(q), rows_of(k),
                       rows_of(v), key_weight.data_ptr<float>(), rows_of(grad),
                       grad_q.data_ptr<float>(), grad_k.data_ptr<float>(), grad_v.data_ptr<float>(), q.size(0),
                       codes_q.size(1), q.size(1), k.size(1), q.size(2), v.size(2), tau, workspace_bytes,
                       deterministic(), {normalize, static_cast<float>(eps), bf16_units});
  return {grad_q, grad_k, grad_v};
}

at::Tensor pair_gradient_cuda(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                              const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                              int64_t tau, double clamp) {
  const c10::cuda::CUDAGuard guard(a.device());
  TorchDevice device(a);
  auto out = at::zeros_like(a);
  yoso::pair_gradient(device, codes_s.data_ptr<int32_t>(), codes_o.data_ptr<int32_t>(), a.data_ptr<float>(),
                      o.data_ptr<float>(), s.data_ptr<float>(), w.data_ptr<float>(), mask_o.data_ptr<float>(),
                      out.data_ptr<float>(), a.size(0), codes_s.size(1), a.size(1), o.size(1), a.size(2), s.size(2),
                      tau, clamp);
  return out;
}

std::tuple<at::Tensor, at::Tensor> unit_rows_cuda(const at::Tensor& x, double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  TorchDevice device(x);
  auto unit = unfilled(x.sizes(), x.options()), norms = unfilled({x.size(0), x.size(1)}, x.options());
  yoso::unit_rows(device, x.data_ptr<float>(), unit.data_ptr<float>(), norms.data_ptr<float>(), x.size(0) * x.size(1),
                  x.size(2), static_cast<float>(eps));
  return {unit, norms};
}

at::Tensor through_unit_rows_cuda(const at::Tensor& grad, const at::Tensor& unit, const at::Tensor& norms,
                                  double eps) {
  const c10::cuda::CUDAGuard guard(unit.device());
  TorchDevice device(unit);
  auto out = unfilled(unit.sizes(), unit.options());
  yoso::through_unit_rows(device, unit.data_ptr<float>(), norms.data_ptr<float>(), grad.data_ptr<float>(),
                          out.data_ptr<float>(), unit.size(0) * unit.size(1), unit.size(2), static_cast<float>(eps));
  return out;
}
