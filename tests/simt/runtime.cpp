// The SIMT emulation of csrc/yoso/yoso_simt.h: CUDA threads as fibers, blocks on two host threads.
//
// A launch's blocks are dealt, in a seeded random order, to kSlots host threads ("slots") running at once,
// so two blocks that touch the same memory without atomics race as host threads do (ThreadSanitizer
// reports it).
// Within a slot each CUDA thread of the block is a fiber with a stack of its own; a fiber runs until it
// reaches __syncthreads, a warp exchange (__shfl_*_sync, __syncwarp) or the end of the kernel. The
// slot's scheduler resumes the runnable fibers in one of two seeded ways, alternating between blocks:
// in passes (every runnable fiber once a pass, in a random order: threads interleave closely), or
// warps ahead (always the first runnable fiber of a random order of warps: one warp runs as far as it
// can, its rendezvous and all, before the next moves, so it overwrites shared memory that later warps
// have not read yet where a barrier is missing; in passes every fiber reaches its next rendezvous
// before any passes it, which hides such a write-after-read). A rendezvous completes when
// every thread it needs has arrived (a barrier: the whole block; a warp exchange: every lane of its
// mask); a barrier some threads skip, an exchange naming a lane that left, or a deadlock aborts with a
// message. Fibers are switched without a happens-before edge (ThreadSanitizer's no_sync fibers): the only
// edges are those CUDA guarantees, released before and acquired after each rendezvous, so a missing
// barrier between a write and another thread's read is a reported race. Switching: a few instructions of
// assembly on x86-64 (ucontext elsewhere), with AddressSanitizer's and ThreadSanitizer's fiber hooks.
#include <sys/mman.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "context.h"
#include "runtime.h"
#include "yoso_simt.h"

namespace simt {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "simt: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

constexpr int kSlots = 2;                           // blocks running at once
constexpr size_t kStackBytes = 64 * 1024;           // per fiber (a guard page below: an overflow faults)
constexpr int64_t kDefaultSharedLimit = 48 * 1024;  // without cudaFuncSetAttribute
constexpr uint32_t kSharedPattern = 0x7FA5A5A5u;    // a NaN as a float; as an int neither 0 nor -1 nor negative
constexpr int kMaxWords = 128;

// -------------------------------------------------------------------------------------- fibers
enum State : int { kRunnable, kBarrier, kWarp, kExited };

struct Fiber {
  Thread thread;
  Context context;
  char* stack = nullptr;
  void* tsan = nullptr;
  void* fake_stack = nullptr;
  int linear = 0;
  int64_t barriers = 0;                           // __syncthreads passed in this block (its parity)
  std::vector<std::pair<unsigned, int64_t>> masks;  // exchanges completed per mask in this block
  // What the scheduler reads and writes while the fiber waits: relaxed atomics, no happens-before.
  std::atomic<int> state{kRunnable};
  std::atomic<unsigned> mask{0};
  std::atomic<int> source{-1}, words{0};
  std::atomic<uint32_t> send[kMaxWords], receive[kMaxWords];
  char exit_sync = 0;
};

struct Launch {
  const char* name;
  dim3 grid, block;
  int64_t shared_bytes;
  const std::function<void()>* body;
  std::vector<uint64_t> order;  // blocks in the order the slots take them
  uint64_t seed;
};

dim3 grid_now, block_now;

class Slot {
 public:
  void run(Launch& launch, int s);
  int64_t loaded = 0, stored = 0, atomic = 0;

  // Called on a fiber.
  void barrier();
  void exchange(unsigned mask, const uint32_t* send, uint32_t* receive, int words, int source);
  [[noreturn]] void fiber_loop();

  dim3 block_index;
  std::vector<unsigned char> shared;
  Fiber* running = nullptr;

 private:
  void run_block(Launch& launch, uint64_t index);
  void resume(Fiber* fiber);
  void to_scheduler(Fiber* fiber);
  void settle(Fiber* fiber, int threads);
  void complete_warp(int warp, unsigned mask, int threads);
  [[noreturn]] void deadlock(int threads);
  std::string where() const;

  std::vector<std::unique_ptr<Fiber>> fibers_;
  Context scheduler_;
  void* host_tsan_ = nullptr;
  void* host_fake_stack_ = nullptr;
  const void* host_bottom_ = nullptr;
  size_t host_size_ = 0;
  const std::function<void()>* body_ = nullptr;
  const char* name_ = "";
  int waiting_at_barrier_ = 0, exited_ = 0;
  char start_sync_ = 0, barrier_sync_[2] = {0, 0};
  std::vector<char> warp_sync_;  // [warp][32 mask hashes][2 parities]
};

thread_local Slot* current_slot = nullptr;
thread_local std::atomic<Fiber*> current_fiber{nullptr};

void fiber_main() { current_slot->fiber_loop(); }

Fiber* make_fiber() {
  auto fiber = std::make_unique<Fiber>();
  void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stack == MAP_FAILED) fail("cannot map a fiber stack");
  mprotect(stack, 4096, PROT_NONE);  // a guard page: a stack overflow faults instead of corrupting
  fiber->stack = static_cast<char*>(stack);
#ifdef SIMT_TSAN
  fiber->tsan = __tsan_create_fiber(0);
#endif
  return fiber.release();
}

void Slot::resume(Fiber* fiber) {
  running = fiber;
  current_fiber.store(fiber, std::memory_order_relaxed);
  void* to = target(fiber->context);
#ifdef SIMT_TSAN
  __tsan_switch_to_fiber(fiber->tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef SIMT_ASAN
  __sanitizer_start_switch_fiber(&host_fake_stack_, fiber->stack, kStackBytes);
#endif
  switch_context(scheduler_, to);
#ifdef SIMT_ASAN
  __sanitizer_finish_switch_fiber(host_fake_stack_, nullptr, nullptr);
#endif
  current_fiber.store(nullptr, std::memory_order_relaxed);
  running = nullptr;
}

void Slot::to_scheduler(Fiber* fiber) {
  void* to = target(scheduler_);
#ifdef SIMT_TSAN
  __tsan_switch_to_fiber(host_tsan_, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef SIMT_ASAN
  __sanitizer_start_switch_fiber(&fiber->fake_stack, host_bottom_, host_size_);
#endif
  switch_context(fiber->context, to);
#ifdef SIMT_ASAN
  __sanitizer_finish_switch_fiber(fiber->fake_stack, nullptr, nullptr);
#endif
}

void Slot::fiber_loop() {
#ifdef SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &host_bottom_, &host_size_);
#endif
  for (;;) {
    Fiber* fiber = current_fiber.load(std::memory_order_relaxed);
    acquire(&start_sync_);
    (*body_)();
    release(&fiber->exit_sync);
    fiber->state.store(kExited, std::memory_order_relaxed);
    to_scheduler(fiber);  // resumed when the next block starts
  }
}

std::string Slot::where() const {
  return std::string(" in ") + name_ + ", block (" + std::to_string(block_index.x) + ", " +
         std::to_string(block_index.y) + ", " + std::to_string(block_index.z) + ")";
}

void Slot::barrier() {
  Fiber* fiber = current_fiber.load(std::memory_order_relaxed);
  const int parity = static_cast<int>(fiber->barriers++ & 1);
  release(&barrier_sync_[parity]);
  fiber->state.store(kBarrier, std::memory_order_relaxed);
  to_scheduler(fiber);
  acquire(&barrier_sync_[parity]);
}

void Slot::exchange(unsigned mask, const uint32_t* send, uint32_t* receive, int words, int source) {
  Fiber* fiber = current_fiber.load(std::memory_order_relaxed);
  const int lane = fiber->linear % 32, warp = fiber->linear / 32;
  if (!(mask >> lane & 1u)) fail("a warp exchange whose mask leaves out the calling lane" + where());
  if (words > kMaxWords) fail("a warp exchange of too many words" + where());
  auto found = std::find_if(fiber->masks.begin(), fiber->masks.end(), [&](auto& m) { return m.first == mask; });
  if (found == fiber->masks.end()) found = fiber->masks.insert(fiber->masks.end(), {mask, 0});
  const int64_t parity = found->second++ & 1;
  char* sync = &warp_sync_[(size_t(warp) * 32 + (mask * 2654435761u >> 27)) * 2 + parity];
  for (int w = 0; w < words; ++w) fiber->send[w].store(send[w], std::memory_order_relaxed);
  fiber->mask.store(mask, std::memory_order_relaxed);
  fiber->source.store(source, std::memory_order_relaxed);
  fiber->words.store(words, std::memory_order_relaxed);
  release(sync);
  fiber->state.store(kWarp, std::memory_order_relaxed);
  to_scheduler(fiber);
  acquire(sync);
  for (int w = 0; w < words; ++w) receive[w] = fiber->receive[w].load(std::memory_order_relaxed);
}

// Scheduler side: what a fiber that just switched back means for its block.
void Slot::settle(Fiber* fiber, int threads) {
  const int state = fiber->state.load(std::memory_order_relaxed);
  if (state == kExited) {
    ++exited_;
    if (waiting_at_barrier_ > 0) {
      fail("__syncthreads is reached by some threads while others left the kernel (a barrier inside divergent "
           "code)" + where());
    }
  } else if (state == kBarrier) {
    if (exited_ > 0) {
      fail("__syncthreads is reached by some threads while others left the kernel (a barrier inside divergent "
           "code)" + where());
    }
    if (++waiting_at_barrier_ == threads) {
      waiting_at_barrier_ = 0;
      for (int t = 0; t < threads; ++t) fibers_[t]->state.store(kRunnable, std::memory_order_relaxed);
    }
  } else if (state == kWarp) {
    complete_warp(fiber->linear / 32, fiber->mask.load(std::memory_order_relaxed), threads);
  }
}

void Slot::complete_warp(int warp, unsigned mask, int threads) {
  for (int lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    const int t = warp * 32 + lane;
    if (t >= threads) fail("a warp exchange names lane " + std::to_string(lane) + ", past the block's threads" + where());
    const int state = fibers_[t]->state.load(std::memory_order_relaxed);
    if (state == kExited) fail("a warp exchange names lane " + std::to_string(lane) + ", which left the kernel" + where());
    if (state != kWarp) return;  // not there yet
    if (fibers_[t]->mask.load(std::memory_order_relaxed) != mask) return;  // a deadlock, unless it moves on
  }
  for (int lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    Fiber& member = *fibers_[warp * 32 + lane];
    const int source = member.source.load(std::memory_order_relaxed), words = member.words.load(std::memory_order_relaxed);
    if (words > 0) {
      if (source < 0 || source > 31 || !(mask >> source & 1u)) {
        fail("a shuffle reads lane " + std::to_string(source) + ", outside its mask" + where());
      }
      const Fiber& from = *fibers_[warp * 32 + source];
      if (from.words.load(std::memory_order_relaxed) != words) fail("lanes of one exchange send different sizes" + where());
      for (int w = 0; w < words; ++w) {
        member.receive[w].store(from.send[w].load(std::memory_order_relaxed), std::memory_order_relaxed);
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    if (mask >> lane & 1u) fibers_[warp * 32 + lane]->state.store(kRunnable, std::memory_order_relaxed);
  }
}

void Slot::deadlock(int threads) {
  std::string states;
  for (int t = 0; t < threads && states.size() < 600; ++t) {
    const int state = fibers_[t]->state.load(std::memory_order_relaxed);
    states += " " + std::to_string(t) + (state == kBarrier ? ":barrier" : state == kExited ? ":exited" : ":warp");
    if (state == kWarp) states += "(mask " + std::to_string(fibers_[t]->mask.load(std::memory_order_relaxed)) + ")";
  }
  fail("the block's threads wait for each other forever (a barrier or warp exchange not reached by every "
       "thread it names)" + where() + ":" + states);
}

void Slot::run_block(Launch& launch, uint64_t index) {
  const dim3 &grid = launch.grid, &block = launch.block;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  block_index = dim3(index % grid.x, (index / grid.x) % grid.y, index / (uint64_t(grid.x) * grid.y));
  for (size_t at = 0; at + 4 <= shared.size(); at += 4) std::memcpy(&shared[at], &kSharedPattern, 4);
  while (static_cast<int>(fibers_.size()) < threads) {
    fibers_.emplace_back(make_fiber());
    prepare(fibers_.back()->context, fibers_.back()->stack, kStackBytes, fiber_main);
  }
  const int warps = (threads + 31) / 32;
  warp_sync_.assign(size_t(warps) * 64, 0);
  std::mt19937_64 random(launch.seed ^ (index * 0x9E3779B97F4A7C15ull));
  const bool ahead = ((launch.seed >> 17) ^ index) & 1;  // neighbouring blocks schedule the other way
  std::vector<int> order(threads);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), random);
  if (ahead) {  // warps in a random order, each warp's lanes together (in a random order too)
    std::vector<int> rank(warps);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), random);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rank[a / 32] < rank[b / 32]; });
  }
  for (int t = 0; t < threads; ++t) {
    Fiber& fiber = *fibers_[t];
    fiber.linear = t;
    fiber.thread.index = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    fiber.thread.loaded = fiber.thread.stored = fiber.thread.atomic = 0;
    fiber.barriers = 0;
    fiber.masks.clear();
    fiber.state.store(kRunnable, std::memory_order_relaxed);
  }
  name_ = launch.name;
  body_ = launch.body;
  waiting_at_barrier_ = exited_ = 0;
  release(&start_sync_);
  if (ahead) {
    // The first runnable fiber of `order`, again and again. A fiber becomes runnable only when a rendezvous
    // of the fiber just resumed completes (it is runnable again itself): only then can the first runnable
    // one lie before it, so the scan restarts; otherwise it goes on from there.
    size_t at = 0;
    while (exited_ < threads) {
      while (at < order.size() && fibers_[order[at]]->state.load(std::memory_order_relaxed) != kRunnable) ++at;
      if (at == order.size()) deadlock(threads);
      Fiber* fiber = fibers_[order[at]].get();
      resume(fiber);
      settle(fiber, threads);
      if (fiber->state.load(std::memory_order_relaxed) == kRunnable) at = 0;
    }
  }
  while (exited_ < threads) {
    bool progressed = false;
    for (int t : order) {
      Fiber* fiber = fibers_[t].get();
      if (fiber->state.load(std::memory_order_relaxed) != kRunnable) continue;
      progressed = true;
      resume(fiber);
      settle(fiber, threads);
    }
    if (!progressed) deadlock(threads);
  }
  for (int t = 0; t < threads; ++t) {
    acquire(&fibers_[t]->exit_sync);
    loaded += fibers_[t]->thread.loaded;
    stored += fibers_[t]->thread.stored;
    atomic += fibers_[t]->thread.atomic;
  }
}

// Slot s runs the blocks at places s, s + kSlots, … of the launch's order: blocks neighbouring in that
// (random) order run on different host threads, whatever the timing.
void Slot::run(Launch& launch, int s) {
  current_slot = this;
#ifdef SIMT_TSAN
  if (host_tsan_ == nullptr) host_tsan_ = __tsan_get_current_fiber();
#endif
  shared.assign(static_cast<size_t>(std::max<int64_t>(launch.shared_bytes, 4)), 0);
  for (size_t at = s; at < launch.order.size(); at += kSlots) run_block(launch, launch.order[at]);
}

// Host threads kept for the whole program, one per slot: a launch hands itself to all of them.
class Workers {
 public:
  static Workers& instance() {
    static Workers* workers = new Workers;  // never destroyed: its threads may sit in a fiber at exit
    return *workers;
  }
  void run(Launch& launch) {
    std::unique_lock<std::mutex> lock(mutex_);
    launch_ = &launch;
    remaining_ = kSlots;
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    launch_ = nullptr;
  }
  Slot slots[kSlots];

 private:
  Workers() {
    for (int s = 0; s < kSlots; ++s) std::thread([this, s] { loop(s); }).detach();
  }
  void loop(int s) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Launch* launch = launch_;
      lock.unlock();
      slots[s].run(*launch, s);
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::mutex mutex_;
  std::condition_variable start_, done_;
  Launch* launch_ = nullptr;
  int remaining_ = 0;
  uint64_t generation_ = 0;
};

struct Registry {
  std::mutex mutex;
  std::vector<LaunchRecord> launches;
  std::vector<std::pair<const void*, int64_t>> shared_opt_in;
  uint64_t seed = 0, count = 0;
};
Registry& registry() {
  static Registry instance;
  return instance;
}

void check_limits(const char* name, dim3 grid, dim3 block, int64_t shared_bytes, int64_t shared_limit) {
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

}  // namespace

Thread& this_thread() {
  Fiber* fiber = current_fiber.load(std::memory_order_relaxed);
  if (fiber == nullptr) fail("a device function called outside a kernel");
  return fiber->thread;
}
const dim3& block_index() { return current_slot->block_index; }
const dim3& block_dim() { return block_now; }
const dim3& grid_dim() { return grid_now; }
unsigned char* block_shared() { return current_slot->shared.data(); }
void block_barrier() {
  if (current_fiber.load(std::memory_order_relaxed) == nullptr) fail("__syncthreads outside a kernel");
  current_slot->barrier();
}
void warp_exchange(unsigned mask, const uint32_t* send, uint32_t* receive, int words, int source) {
  if (current_fiber.load(std::memory_order_relaxed) == nullptr) fail("a warp exchange outside a kernel");
  current_slot->exchange(mask, send, receive, words, source);
}

cudaError_t set_shared_opt_in(const void* kernel, int value) {
  if (value > kOptInSharedLimit) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> guard(registry().mutex);
  registry().shared_opt_in.emplace_back(kernel, value);
  return cudaSuccess;
}

cudaError_t run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, int64_t shared_bytes,
                     const std::function<void()>& body) {
  int64_t limit = kDefaultSharedLimit;
  uint64_t seed;
  {
    std::lock_guard<std::mutex> guard(registry().mutex);
    for (auto& [which, value] : registry().shared_opt_in) {
      if (which == kernel) limit = value;
    }
    seed = registry().seed * 0x9E3779B97F4A7C15ull + ++registry().count;
  }
  check_limits(name, grid, block, shared_bytes, limit);
  Launch launch{name, grid, block, shared_bytes, &body, {}, seed};
  launch.order.resize(uint64_t(grid.x) * grid.y * grid.z);
  std::iota(launch.order.begin(), launch.order.end(), uint64_t(0));
  std::shuffle(launch.order.begin(), launch.order.end(), std::mt19937_64(seed));
  grid_now = grid;
  block_now = block;
  Workers& workers = Workers::instance();
  for (Slot& slot : workers.slots) slot.loaded = slot.stored = slot.atomic = 0;
  workers.run(launch);
  LaunchRecord record{name, grid, block, shared_bytes, 0, 0, 0};
  for (Slot& slot : workers.slots) {
    record.loaded_bytes += slot.loaded;
    record.stored_bytes += slot.stored;
    record.atomic_bytes += slot.atomic;
  }
  std::lock_guard<std::mutex> guard(registry().mutex);
  registry().launches.push_back(record);
  return cudaSuccess;
}

void set_seed(uint64_t seed) {
  std::lock_guard<std::mutex> guard(registry().mutex);
  registry().seed = seed;
}

std::vector<LaunchRecord> launches() {
  std::lock_guard<std::mutex> guard(registry().mutex);
  return registry().launches;
}

}  // namespace simt
