// The test driver of the CUDA kernels emulated on the CPU (tests/test_cuda_emulation.py): it plays the
// part of csrc/yoso/yoso_cuda.cpp, calling the unchanged host logic of yoso_cuda_host.cpp with a CPU stand-in
// for torch (memory filled with a garbage pattern, std::stable_sort, std::inclusive_scan) around the
// unchanged launchers of csrc/yoso/*.cu, all compiled by the host compiler with -DYOSO_SIMT_EMULATION (and a
// sanitizer). Usage: yoso_driver <folder>; the folder holds request.txt and one raw little-endian .bin file
// per input array; the driver writes <name>.out.bin per output and stats.txt (one line per kernel launch, the
// workspace allocated). An error of the host logic is one "error: ..." line on stderr and exit status 3.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime.h"
#include "yoso_cuda_common.h"
#include "yoso_cuda_host.h"

namespace {

struct Request {
  std::string op;
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, std::vector<float>> f32;
  std::map<std::string, std::vector<int32_t>> i32;
  std::map<std::string, std::vector<uint16_t>> bf16;  // bfloat16 rows, as their bits

  // A row matrix given as float32 (f4) or bfloat16 (b2).
  yoso::Rows rows(const std::string& name) {
    if (bf16.count(name)) return {bf16[name].data(), true};
    return {f32[name].data(), false};  // (absent: empty, as the host checks may refuse before any read)
  }
};

template <typename T>
std::vector<T> read_array(const std::string& path, int64_t count) {
  std::vector<T> data(count);
  std::ifstream file(path, std::ios::binary);
  file.read(reinterpret_cast<char*>(data.data()), count * sizeof(T));
  if (!file) simt::fail("cannot read " + path);
  return data;
}

template <typename T>
void write_array(const std::string& path, const std::vector<T>& data) {
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
}

Request read_request(const std::string& folder) {
  Request request;
  std::ifstream file(folder + "/request.txt");
  std::string kind;
  while (file >> kind) {
    std::string name;
    if (kind == "op") {
      file >> request.op;
    } else if (kind == "int") {
      file >> name >> request.ints[name];
    } else if (kind == "float") {
      file >> name >> request.floats[name];
    } else if (kind == "f4" || kind == "i4" || kind == "b2") {
      int64_t count;
      file >> name >> count;
      const std::string path = folder + "/" + name + ".bin";
      if (kind == "f4") request.f32[name] = read_array<float>(path, count);
      else if (kind == "i4") request.i32[name] = read_array<int32_t>(path, count);
      else request.bf16[name] = read_array<uint16_t>(path, count);
    } else {
      simt::fail("unknown request line " + kind);
    }
  }
  return request;
}

// torch's part, on the CPU: fresh memory holds garbage (the 0x7FA5A5A5 words of the emulated shared
// memory, never a value the kernels use as a sentinel), sorts are stable, scans inclusive.
class CpuDevice final : public yoso::Device {
 public:
  explicit CpuDevice(int64_t most_shared_bytes) : most_shared_bytes_(most_shared_bytes) {}
  float* floats(int64_t count) override {
    float_bytes += 4 * count;
    return reinterpret_cast<float*>(garbage(count));
  }
  int32_t* ints(int64_t count) override { return garbage(count); }
  void zero(float* data, int64_t count) override {
    if (count > 0) std::memset(data, 0, count * sizeof(float));
  }
  void minus_ones(int32_t* data, int64_t count) override { std::fill(data, data + count, -1); }
  std::pair<const int32_t*, const int32_t*> sort_rows(const int32_t* codes, int64_t rows, int64_t n) override {
    int32_t *sorted = garbage(rows * n), *order = garbage(rows * n);
    for (int64_t row = 0; row < rows; ++row) {
      int32_t* o = order + row * n;
      const int32_t* c = codes + row * n;
      std::iota(o, o + n, 0);
      std::stable_sort(o, o + n, [&](int32_t a, int32_t b) { return c[a] < c[b]; });
      for (int64_t r = 0; r < n; ++r) sorted[row * n + r] = c[o[r]];
    }
    return {sorted, order};
  }
  const int32_t* inclusive_scan(const int32_t* values, int64_t count) override {
    int32_t* out = garbage(count);
    std::inclusive_scan(values, values + count, out);
    return out;
  }
  cudaStream_t stream() override { return nullptr; }
  int64_t most_shared_bytes() override { return most_shared_bytes_; }
  void check(cudaError_t status, const char* what) override {
    if (status != cudaSuccess) fail(std::string("yoso: CUDA ") + what + " failed: " + cudaGetErrorString(status));
  }
  [[noreturn]] void fail(const std::string& message) override { throw std::runtime_error(message); }
  int64_t float_bytes = 0;

 private:
  int32_t* garbage(int64_t count) {
    blocks_.emplace_back(static_cast<size_t>(std::max<int64_t>(count, 1)), int32_t(0x7FA5A5A5));
    return blocks_.back().data();
  }
  std::list<std::vector<int32_t>> blocks_;
  int64_t most_shared_bytes_;
};

// A kernel that does nothing, to probe the emulation's checks of a launch configuration.
YOSO_GLOBAL void probe_kernel(int* marker) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) *marker = 1;
}

// Probes of the emulation itself (tests/test_cuda_emulation.py): bugs it must catch, and its garbage.
// Every block adds 1 to *counter with a plain read and write: a race between blocks.
YOSO_GLOBAL void racing_blocks_kernel(float* counter) {
  if (threadIdx.x == 0) yoso::store(counter, yoso::load(counter) + 1.0f);
}
// Thread t writes its slot of shared memory and reads thread t + 1's, after a barrier or (barrier = 0)
// without one.
YOSO_GLOBAL void neighbours_kernel(float* out, int barrier) {
  YOSO_DYNAMIC_SHARED(float, slots);
  slots[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (barrier) __syncthreads();
  yoso::store(out + blockIdx.x * blockDim.x + threadIdx.x, slots[(threadIdx.x + 1) % blockDim.x]);
}
// Thread t reads word t of shared memory that nothing wrote.
YOSO_GLOBAL void unwritten_shared_kernel(int32_t* out) {
  YOSO_DYNAMIC_SHARED(int32_t, words);
  yoso::store(out + blockIdx.x * blockDim.x + threadIdx.x, words[threadIdx.x]);
}

// bits[i] = x[i] rounded to bfloat16 by the kernels' rounding (yoso::rounded_bf16), one block.
YOSO_GLOBAL void round_bf16_kernel(const float* x, int32_t* bits, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) yoso::store(bits + i, int32_t(yoso::rounded_bf16(yoso::load(x + i))));
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) simt::fail(std::string(what) + " returned an error");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) simt::fail("usage: yoso_driver <folder>");
  const std::string folder = argv[1];
  Request r = read_request(folder);
  auto I = [&](const char* name) { return r.ints.at(name); };
  auto option = [&](const char* name, int64_t otherwise) { return r.ints.count(name) ? r.ints.at(name) : otherwise; };
  simt::set_seed(static_cast<uint64_t>(option("seed", 0)));
  const bool deterministic = option("deterministic", 1) != 0;
  CpuDevice device(option("most_shared_bytes", simt::kOptInSharedLimit));
  std::map<std::string, std::vector<float>> outputs_f32;
  std::map<std::string, std::vector<int32_t>> outputs_i32;
  try {
    if (r.op == "fast_hash") {
      auto& codes = outputs_i32["codes"];
      codes.assign(I("B") * I("m") * I("n"), int32_t(0x7FA5A5A5));  // garbage: every code must be written
      yoso::fast_hash(device, r.f32["x"].data(), r.f32["diagonals"].data(), codes.data(), I("B"), I("n"), I("d"),
                      I("R"), I("P"), I("m"), I("tau"));
    } else if (r.op == "cumulation") {
      auto& out = outputs_f32["out"];
      out.assign(I("B") * I("nq") * I("dv"), 0.0f);
      yoso::cumulation(device, r.i32["codes_q"].data(), r.i32["codes_k"].data(), r.f32["weight_q"].data(), I("mq"),
                       r.f32["weight_k"].data(), I("mk"), I("p"), r.rows("values"), out.data(), I("B"), I("m"),
                       I("nq"), I("nk"), I("dv"), I("tau"), I("workspace_bytes"), deterministic);
    } else if (r.op == "exact_backward") {
      auto &grad_q = outputs_f32["grad_q"], &grad_k = outputs_f32["grad_k"], &grad_v = outputs_f32["grad_v"];
      const float unfilled = std::nanf("");  // as torch hands them over: the host logic writes or zeroes them all
      grad_q.assign(I("B") * I("nq") * I("d"), unfilled);
      grad_k.assign(I("B") * I("nk") * I("d"), unfilled);
      grad_v.assign(I("B") * I("nk") * I("dv"), unfilled);
      yoso::exact_backward(device, r.i32["codes_q"].data(), r.i32["codes_k"].data(), r.rows("q"), r.rows("k"),
                           r.rows("v"), r.f32["key_weight"].data(), r.rows("grad"),
                           grad_q.data(), grad_k.data(), grad_v.data(), I("B"), I("m"), I("nq"), I("nk"), I("d"),
                           I("dv"), I("tau"), I("workspace_bytes"), deterministic,
                           {option("normalize", 0) != 0, static_cast<float>(r.floats.count("eps") ? r.floats["eps"] : 0.0),
                            option("bf16_units", 0) != 0});
    } else if (r.op == "unit_rows" || r.op == "through_unit_rows") {  // the output's normalization, one side
      const int64_t rows = I("rows"), width = I("width");
      const float eps = static_cast<float>(r.floats.at("eps")), unwritten = std::nanf("");
      if (r.op == "unit_rows") {
        auto &unit = outputs_f32["unit"], &norms = outputs_f32["norms"];
        unit.assign(rows * width, unwritten);
        norms.assign(rows, unwritten);
        yoso::unit_rows(device, r.f32["x"].data(), unit.data(), norms.data(), rows, width, eps);
      } else {
        auto& grad = outputs_f32["grad"];
        grad.assign(rows * width, unwritten);
        yoso::through_unit_rows(device, r.f32["unit"].data(), r.f32["norms"].data(), r.f32["incoming"].data(),
                                grad.data(), rows, width, eps);
      }
    } else if (r.op == "pair_gradient") {
      auto& out = outputs_f32["out"];
      out.assign(I("B") * I("ns") * I("d"), 0.0f);
      yoso::pair_gradient(device, r.i32["codes_s"].data(), r.i32["codes_o"].data(), r.f32["a"].data(),
                          r.f32["o"].data(), r.f32["s"].data(), r.f32["w"].data(), r.f32["mask_o"].data(), out.data(),
                          I("B"), I("m"), I("ns"), I("no"), I("d"), I("dv"), I("tau"), r.floats.at("clamp"));
    } else if (r.op == "sort") {
      const int64_t rows = I("rows"), n = I("n"), tau = I("tau");
      const yoso::SortedCodes sorted =
          yoso::sorted_by_code(device, r.i32["codes"].data(), rows, n, static_cast<int>(tau), I("with_starts") != 0,
                               "sort");
      outputs_i32["sorted"].assign(sorted.sorted, sorted.sorted + rows * n);
      outputs_i32["order"].assign(sorted.order, sorted.order + rows * n);
      auto& starts = outputs_i32["starts"];  // empty where the host made none
      if (sorted.starts != nullptr) starts.assign(sorted.starts, sorted.starts + (rows << tau));
    } else if (r.op == "probe") {
      int marker = 0;
      if (I("opt_in")) check(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(I("opt_in"))), "cudaFuncSetAttribute");
      check(YOSO_LAUNCH(probe_kernel, dim3(I("gx"), I("gy"), I("gz")), dim3(I("bx"), I("by"), I("bz")), I("shared"),
                        nullptr, &marker),
            "probe");
      outputs_i32["codes"] = {marker};
    } else if (r.op == "round_bf16") {
      auto& bits = outputs_i32["codes"];
      bits.assign(r.f32["x"].size(), 0);
      check(YOSO_LAUNCH(round_bf16_kernel, dim3(1), dim3(128), 0, nullptr, r.f32["x"].data(), bits.data(),
                        static_cast<int>(bits.size())),
            "round_bf16");
    } else if (r.op == "racing_blocks") {
      auto& out = outputs_f32["out"];
      out.assign(1, 0.0f);
      check(YOSO_LAUNCH(racing_blocks_kernel, dim3(I("blocks")), dim3(32), 0, nullptr, out.data()), "racing_blocks");
    } else if (r.op == "neighbours") {
      auto& out = outputs_f32["out"];
      out.assign(I("blocks") * I("threads"), 0.0f);
      check(YOSO_LAUNCH(neighbours_kernel, dim3(I("blocks")), dim3(I("threads")), I("threads") * 4, nullptr,
                        out.data(), static_cast<int>(I("barrier"))),
            "neighbours");
    } else if (r.op == "unwritten_shared") {
      auto& out = outputs_i32["codes"];
      out.assign(I("blocks") * I("threads"), 0);
      check(YOSO_LAUNCH(unwritten_shared_kernel, dim3(I("blocks")), dim3(I("threads")), I("threads") * 4, nullptr,
                        out.data()),
            "unwritten_shared");
    } else {
      simt::fail("unknown op " + r.op);
    }
  } catch (const std::runtime_error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 3;
  }
  for (auto& [name, data] : outputs_f32) write_array(folder + "/" + name + ".out.bin", data);
  for (auto& [name, data] : outputs_i32) write_array(folder + "/" + name + ".out.bin", data);
  std::ofstream stats(folder + "/stats.txt");
  for (const auto& l : simt::launches()) {
    stats << "launch " << l.kernel << " " << l.grid.x << " " << l.grid.y << " " << l.grid.z << " " << l.block.x << " "
          << l.block.y << " " << l.block.z << " " << l.shared_bytes << " " << l.loaded_bytes << " " << l.stored_bytes
          << " " << l.atomic_bytes << "\n";
  }
  // The peak resident set of this program: VmHWM, not getrusage's ru_maxrss, which keeps the peak of the
  // process before exec (the Python test that starts the driver).
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t peak_kb = -1;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) peak_kb = std::stoll(line.substr(6));
  }
  stats << "workspace_floats " << device.float_bytes / 4 << "\n" << "max_rss_kb " << peak_kb << "\n";
  return 0;
}
