// The test driver of the CUDA kernels emulated on the CPU (tests/test_cuda_emulation.py): it plays the
// part of csrc/yoso/yoso_cuda.cpp (sorts each pair's codes, allocates outputs and the workspace the
// launcher asks for) around the unchanged launchers of csrc/yoso/*.cu, compiled by the host compiler
// with -DYOSO_SIMT_EMULATION (and a sanitizer). Usage: yoso_driver <folder>; the folder holds
// request.txt and one raw little-endian .bin file per input array; the driver writes <name>.out.bin
// per output and stats.txt (one line per kernel launch, and the workspace used).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "yoso_cuda_kernels.h"

namespace {

struct Request {
  std::string op;
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, std::vector<float>> f32;
  std::map<std::string, std::vector<int32_t>> i32;
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
    } else if (kind == "f4" || kind == "i4") {
      int64_t count;
      file >> name >> count;
      if (kind == "f4") request.f32[name] = read_array<float>(folder + "/" + name + ".bin", count);
      else request.i32[name] = read_array<int32_t>(folder + "/" + name + ".bin", count);
    } else {
      simt::fail("unknown request line " + kind);
    }
  }
  return request;
}

// Each (batch, hash) pair's codes sorted stably, with the token order: what the torch wrapper does.
void sort_codes(const std::vector<int32_t>& codes, int64_t pairs, int64_t n, std::vector<int32_t>& sorted,
                std::vector<int32_t>& order) {
  sorted.resize(codes.size());
  order.resize(codes.size());
  for (int64_t p = 0; p < pairs; ++p) {
    int32_t* o = order.data() + p * n;
    std::iota(o, o + n, 0);
    const int32_t* c = codes.data() + p * n;
    std::stable_sort(o, o + n, [&](int32_t a, int32_t b) { return c[a] < c[b]; });
    for (int64_t r = 0; r < n; ++r) sorted[p * n + r] = c[o[r]];
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) simt::fail(std::string(what) + " returned an error");
}

// A kernel that does nothing, to probe the emulation's checks of a launch configuration.
YOSO_GLOBAL void probe_kernel(int* marker) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) *marker = 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) simt::fail("usage: yoso_driver <folder>");
  const std::string folder = argv[1];
  Request r = read_request(folder);
  auto I = [&](const char* name) { return r.ints.at(name); };
  int64_t workspace_floats = 0;
  std::map<std::string, std::vector<float>> outputs_f32;
  std::map<std::string, std::vector<int32_t>> outputs_i32;
  if (r.op == "fast_hash") {
    auto& codes = outputs_i32["codes"];
    codes.assign(I("B") * I("m") * I("n"), -1);  // poison: every code must be written
    check(yoso::launch_fast_hash(r.f32["x"].data(), r.f32["diagonals"].data(), codes.data(), I("B"), I("n"), I("d"),
                                 I("R"), I("P"), I("m"), I("tau"), nullptr),
          "launch_fast_hash");
  } else if (r.op == "cumulation") {
    std::vector<int32_t> sorted_k, order_k;
    sort_codes(r.i32["codes_k"], I("B") * I("m"), I("nk"), sorted_k, order_k);
    workspace_floats = yoso::cumulation_workspace(I("B"), I("m"), I("nk"), I("p"), I("dv"), I("workspace_bytes"));
    std::vector<float> workspace(workspace_floats);
    auto& out = outputs_f32["out"];
    out.assign(I("B") * I("nq") * I("dv"), 0.0f);
    check(yoso::launch_cumulation(r.i32["codes_q"].data(), sorted_k.data(), order_k.data(), r.f32["weight_q"].data(),
                                  I("mq"), r.f32["weight_k"].data(), I("mk"), I("p"), r.f32["values"].data(), out.data(),
                                  workspace.data(), workspace_floats, I("B"), I("m"), I("nq"), I("nk"), I("dv"), I("tau"),
                                  nullptr),
          "launch_cumulation");
  } else if (r.op == "exact_backward") {
    std::vector<int32_t> sorted_q, order_q, sorted_k, order_k;
    sort_codes(r.i32["codes_q"], I("B") * I("m"), I("nq"), sorted_q, order_q);
    sort_codes(r.i32["codes_k"], I("B") * I("m"), I("nk"), sorted_k, order_k);
    workspace_floats = yoso::exact_backward_workspace(I("B"), I("m"), I("nq"), I("nk"), I("d"), I("dv"),
                                                      I("workspace_bytes"));
    std::vector<float> workspace(workspace_floats);
    auto &grad_q = outputs_f32["grad_q"], &grad_k = outputs_f32["grad_k"], &grad_v = outputs_f32["grad_v"];
    grad_q.assign(I("B") * I("nq") * I("d"), 0.0f);
    grad_k.assign(I("B") * I("nk") * I("d"), 0.0f);
    grad_v.assign(I("B") * I("nk") * I("dv"), 0.0f);
    check(yoso::launch_exact_backward(r.i32["codes_q"].data(), r.i32["codes_k"].data(), sorted_q.data(), order_q.data(),
                                      sorted_k.data(), order_k.data(), r.f32["q"].data(), r.f32["k"].data(),
                                      r.f32["v"].data(), r.f32["key_weight"].data(), r.f32["grad"].data(), grad_q.data(),
                                      grad_k.data(), grad_v.data(), workspace.data(), workspace_floats, I("B"), I("m"),
                                      I("nq"), I("nk"), I("d"), I("dv"), I("tau"), nullptr),
          "launch_exact_backward");
  } else if (r.op == "pair_gradient") {
    std::vector<int32_t> sorted_o, order_o;
    sort_codes(r.i32["codes_o"], I("B") * I("m"), I("no"), sorted_o, order_o);
    auto& out = outputs_f32["out"];
    out.assign(I("B") * I("ns") * I("d"), 0.0f);
    check(yoso::launch_pair_gradient(r.i32["codes_s"].data(), sorted_o.data(), order_o.data(), r.f32["a"].data(),
                                     r.f32["o"].data(), r.f32["s"].data(), r.f32["w"].data(), r.f32["mask_o"].data(),
                                     out.data(), I("B"), I("m"), I("ns"), I("no"), I("d"), I("dv"), I("tau"),
                                     static_cast<float>(r.floats.at("clamp")), nullptr),
          "launch_pair_gradient");
  } else if (r.op == "probe") {
    int marker = 0;
    if (I("opt_in")) check(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(I("opt_in"))), "cudaFuncSetAttribute");
    check(YOSO_LAUNCH(probe_kernel, dim3(I("gx"), I("gy"), I("gz")), dim3(I("bx"), I("by"), I("bz")), I("shared"),
                      nullptr, &marker),
          "probe");
    outputs_i32["codes"] = {marker};
  } else {
    simt::fail("unknown op " + r.op);
  }
  for (auto& [name, data] : outputs_f32) write_array(folder + "/" + name + ".out.bin", data);
  for (auto& [name, data] : outputs_i32) write_array(folder + "/" + name + ".out.bin", data);
  std::ofstream stats(folder + "/stats.txt");
  for (const auto& l : simt::state().launches) {
    stats << "launch " << l.kernel << " " << l.grid.x << " " << l.grid.y << " " << l.grid.z << " " << l.block.x << " "
          << l.block.y << " " << l.block.z << " " << l.shared_bytes << " " << l.loaded_bytes << " " << l.stored_bytes
          << "\n";
  }
  // The peak resident set of this program: VmHWM, not getrusage's ru_maxrss, which keeps the peak of the
  // process before exec (the Python test that starts the driver).
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t peak_kb = -1;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) peak_kb = std::stoll(line.substr(6));
  }
  stats << "workspace_floats " << workspace_floats << "\n" << "max_rss_kb " << peak_kb << "\n";
  return 0;
}
