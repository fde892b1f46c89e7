// The few CUDA constructs the YOSO kernels use, spelled so that one source compiles two ways:
// with nvcc for the GPU, or with a host C++20 compiler and -DYOSO_SIMT_EMULATION to run on the CPU.
// The emulation runs a launch block by block, one host thread per CUDA thread of the block, with a
// real barrier for __syncthreads (a barrier some threads of a block skip, or never reach, aborts
// with a message instead of hanging), per-block dynamic shared memory filled with garbage before each
// block (a read of shared memory nothing wrote gives NaNs, not zeros), and CUDA's launch limits
// asserted on every launch. yoso::load / yoso::store are the kernels' global-memory accesses: plain
// accesses on the GPU, counted per launch in the emulation (tests check the cost model's bytes).
#pragma once

#include <stdint.h>

#if !defined(YOSO_SIMT_EMULATION)  // ------------------------------------------------------- CUDA

#include <cuda_runtime.h>

#if defined(__CUDACC__)  // the kernels' spelling; a host file (the torch wrappers) needs only the types
#define YOSO_GLOBAL __global__
#define YOSO_DEVICE __device__ __forceinline__
// Launch and report a configuration error at once; execution errors surface at the next sync.
#define YOSO_LAUNCH(kernel, grid, block, shared, stream, ...) \
  (kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__), cudaPeekAtLastError())
#define YOSO_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define YOSO_TRAP(condition) \
  do {                       \
    if (!(condition)) __trap(); \
  } while (0)

namespace yoso {
template <typename T>
__device__ __forceinline__ T load(const T* address) {
  return *address;
}
template <typename T>
__device__ __forceinline__ void store(T* address, T value) {
  *address = value;
}
}  // namespace yoso
#endif

#else  // ------------------------------------------------------------------------------------ emulation

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define YOSO_GLOBAL
#define YOSO_DEVICE inline
#define __host__
#define __device__
#define __forceinline__ inline

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrL2CacheSize = 89 };
inline const char* cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated error"; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace simt {

[[noreturn]] inline void fail(const std::string& message) {
  std::fprintf(stderr, "simt: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

constexpr int64_t kDefaultSharedLimit = 48 * 1024;  // without cudaFuncSetAttribute
constexpr int64_t kOptInSharedLimit = 227 * 1024;   // an H100's largest opt-in
constexpr int64_t kL2Bytes = 50 * 1024 * 1024;      // an H100's L2

// A block's threads meet here: at __syncthreads, and at the end of every block. Arrivals are counted
// under a mutex (so that a barrier reached by some threads while others left the kernel is caught);
// waiters sleep on the generation number itself (C++20 atomic wait: one futex, no mutex to retake when
// woken, which is what makes a block of 256 threads on two cores affordable).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  enum Kind { kSync, kExit };
  // The last thread to arrive runs `completion` (if any) before any thread goes on.
  void arrive_and_wait(Kind kind, const dim3& block, const std::function<void()>* completion = nullptr) {
    uint32_t generation;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (arrived_ == 0) {
        kind_ = kind;
      } else if (kind_ != kind) {
        fail("__syncthreads is reached by some threads of block (" + std::to_string(block.x) + ", " +
             std::to_string(block.y) + ", " + std::to_string(block.z) + ") while others left the kernel (a barrier "
             "inside divergent code)");
      }
      generation = generation_.load(std::memory_order_relaxed);
      if (++arrived_ == count_) {
        if (completion != nullptr) (*completion)();
        arrived_ = 0;
        generation_.store(generation + 1, std::memory_order_release);
        generation_.notify_all();
        return;
      }
    }
    while (generation_.load(std::memory_order_acquire) == generation) generation_.wait(generation, std::memory_order_acquire);
  }

 private:
  std::mutex mutex_;
  int count_, arrived_ = 0;
  Kind kind_ = kSync;
  std::atomic<uint32_t> generation_{0};
};

struct LaunchRecord {
  std::string kernel;
  dim3 grid, block;
  int64_t shared_bytes;
  int64_t loaded_bytes, stored_bytes;
};

struct State {
  std::mutex mutex;
  std::vector<LaunchRecord> launches;
  std::map<const void*, int64_t> shared_opt_in;  // kernel → cudaFuncAttributeMaxDynamicSharedMemorySize
};

inline State& state() {
  static State instance;
  return instance;
}

inline thread_local Barrier* current_barrier = nullptr;
inline thread_local unsigned char* current_shared = nullptr;
inline thread_local int64_t thread_loaded = 0, thread_stored = 0;

inline void check_limits(const char* name, dim3 grid, dim3 block, int64_t shared_bytes, int64_t shared_limit) {
  auto bad = [&](const std::string& what) {
    fail(std::string("launch of ") + name + " breaks CUDA's limits: " + what + " (grid " + std::to_string(grid.x) +
         " x " + std::to_string(grid.y) + " x " + std::to_string(grid.z) + ", block " + std::to_string(block.x) +
         " x " + std::to_string(block.y) + " x " + std::to_string(block.z) + ", " + std::to_string(shared_bytes) +
         " bytes of shared memory)");
  };
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) bad("an empty grid or block");
  if (block.x > 1024 || block.y > 1024 || block.z > 64) bad("a block dimension over 1024 (x, y) or 64 (z)");
  if (int64_t(block.x) * block.y * block.z > 1024) bad("more than 1,024 threads per block");
  if (grid.x > 2147483647u) bad("grid.x over 2^31 - 1");
  if (grid.y > 65535 || grid.z > 65535) bad("grid.y or grid.z over 65,535");
  if (shared_bytes > shared_limit) bad("more dynamic shared memory than the kernel may use");
}

// Host threads kept for the whole program, one per CUDA thread of the largest block so far: a launch
// hands its body to the first `count` of them and returns when they have all finished it.
class Workers {
 public:
  static Workers& instance() {
    static Workers workers;
    return workers;
  }
  void run(int count, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (static_cast<int>(threads_.size()) < count) {
      const int rank = static_cast<int>(threads_.size());
      threads_.emplace_back([this, rank, seen = generation_] { loop(rank, seen); });
    }
    job_ = &job;
    active_ = remaining_ = count;
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopping_ = true;
      ++generation_;
    }
    start_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

 private:
  void loop(int rank, uint64_t seen) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stopping_) return;
      if (rank >= active_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(rank);
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

// Runs kernel(args...) for every block of the grid, one host thread per CUDA thread of a block.
template <typename... Params, typename... Args>
cudaError_t launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, int64_t shared_bytes,
                   Args... args) {
  int64_t limit = kDefaultSharedLimit;
  {
    std::lock_guard<std::mutex> guard(state().mutex);
    auto found = state().shared_opt_in.find(reinterpret_cast<const void*>(kernel));
    if (found != state().shared_opt_in.end()) limit = found->second;
  }
  check_limits(name, grid, block, shared_bytes, limit);
  gridDim = grid;
  blockDim = block;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  Barrier barrier(threads);
  std::vector<unsigned char> shared(static_cast<size_t>(std::max<int64_t>(shared_bytes, 1)));
  const std::function<void()> garbage = [&] { std::memset(shared.data(), 0xFF, shared.size()); };  // as on a GPU
  garbage();
  std::atomic<int64_t> loaded{0}, stored{0};
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  const std::function<void(int)> body = [&](int rank) {
    current_barrier = &barrier;
    current_shared = shared.data();
    thread_loaded = thread_stored = 0;
    threadIdx = dim3(rank % block.x, (rank / block.x) % block.y, rank / (block.x * block.y));
    for (uint64_t index = 0; index < blocks; ++index) {
      blockIdx = dim3(index % grid.x, (index / grid.x) % grid.y, index / (uint64_t(grid.x) * grid.y));
      kernel(args...);
      barrier.arrive_and_wait(Barrier::kExit, blockIdx, &garbage);  // the next block starts on fresh garbage
    }
    loaded += thread_loaded;
    stored += thread_stored;
    current_barrier = nullptr;
    current_shared = nullptr;
  };
  Workers::instance().run(threads, body);
  std::lock_guard<std::mutex> guard(state().mutex);
  state().launches.push_back({name, grid, block, shared_bytes, loaded.load(), stored.load()});
  return cudaSuccess;
}

}  // namespace simt

inline void __syncthreads() {
  if (simt::current_barrier == nullptr) simt::fail("__syncthreads outside a kernel");
  simt::current_barrier->arrive_and_wait(simt::Barrier::kSync, blockIdx);
}

inline void __trap() { simt::fail("a kernel trapped (__trap)"); }

template <typename Kernel>
inline cudaError_t cudaFuncSetAttribute(Kernel kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value > simt::kOptInSharedLimit) {
    return cudaErrorInvalidValue;
  }
  std::lock_guard<std::mutex> guard(simt::state().mutex);
  simt::state().shared_opt_in[reinterpret_cast<const void*>(kernel)] = value;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  if (attribute != cudaDevAttrL2CacheSize) return cudaErrorInvalidValue;
  *value = static_cast<int>(simt::kL2Bytes);
  return cudaSuccess;
}

#define YOSO_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ::simt::launch(#kernel, kernel, (grid), (block), (shared), __VA_ARGS__)
#define YOSO_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::simt::current_shared)
#define YOSO_TRAP(condition)                                                    \
  do {                                                                          \
    if (!(condition)) ::simt::fail(std::string("device check failed: ") + #condition); \
  } while (0)

namespace yoso {
template <typename T>
inline T load(const T* address) {
  simt::thread_loaded += sizeof(T);
  return *address;
}
template <typename T>
inline void store(T* address, T value) {
  simt::thread_stored += sizeof(T);
  *address = value;
}
}  // namespace yoso

#endif
