// bench_host_experts: times the CPU backend's routed-expert pass (cpu::moe_experts) for one
// token, the host's share of a decode step with experts on the CPU (--n-cpu-moe), on
// expert weights of a Qwen3.6-35B-A3B layer's shape in memory far larger than the caches.
// Each pass takes the next layer and k distinct random experts, so the weights come from DRAM
// as they do in a decode step. Reports the pass time and the bytes read per second.
//   bench_host_experts --layers 8 --experts 5 --passes 2000
// --gap-us makes the calling thread busy-wait between passes, as a decode step's GPU work
// does; --huge-pages asks the kernel for transparent huge pages on the weights.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <numeric>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "backend/cpu/cpu_ops.h"
#include "core/dtype.h"
#include "quant/quant.h"

using namespace qwen36;

namespace {

struct Options {
  int64_t layers = 8, experts = 256, k = 5, hidden = 2048, intermediate = 512, passes = 2000, gap_us = 0;
  std::string up_type = "q4_k", down_type = "q6_k";
  bool huge_pages = false;
};

DType parse_type(const std::string& s) {
  if (s == "q4_k") return DType::Q4_K;
  if (s == "q5_k") return DType::Q5_K;
  if (s == "q6_k") return DType::Q6_K;
  if (s == "q8_0") return DType::Q8_0;
  throw CLI::ValidationError("type", "expected q4_k, q5_k, q6_k or q8_0, got " + s);
}

// One layer's experts in one mapping, GGUF order: every gate, every up, every down.
struct Layer {
  std::byte* p = nullptr;
  size_t bytes = 0;
  std::vector<MlpWeights> experts;
};

// One expert's three matrices quantized from random floats; every expert of every layer is a
// copy (the time depends on the bytes read, not their values).
std::vector<std::byte> quantized_rows(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(cols)));
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t rb = dtype_row_bytes(t, cols);
  std::vector<std::byte> out(rb * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = nd(rng);
    quantize_row(t, row.data(), out.data() + size_t(r) * rb, cols);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Times the CPU routed-expert pass of one token (the host's part of an --n-cpu-moe decode step)."};
  app.add_option("--layers", o.layers, "layers of experts allocated (passes cycle through them)")->check(CLI::Range(1, 1000));
  app.add_option("--n-experts", o.experts, "experts per layer")->check(CLI::Range(1, 4096));
  app.add_option("-k,--experts", o.k, "routed experts per pass (a token's top-k less the GPU's share)")
      ->check(CLI::Range(1, 64));
  app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::Range(256, 65536));
  app.add_option("--intermediate", o.intermediate, "expert intermediate size")->check(CLI::Range(256, 65536));
  app.add_option("--up-type", o.up_type, "gate / up weight type (q4_k q5_k q6_k q8_0)");
  app.add_option("--down-type", o.down_type, "down weight type");
  app.add_option("--passes", o.passes, "timed passes")->check(CLI::Range(1, 10000000));
  app.add_option("--gap-us", o.gap_us, "busy-wait between passes, microseconds")->check(CLI::Range(0, 100000));
  app.add_flag("--huge-pages", o.huge_pages, "madvise(MADV_HUGEPAGE) on the weights");
  CLI11_PARSE(app, argc, argv);
  if (o.k > o.experts) {
    fmt::print(stderr, "bench_host_experts: -k {} exceeds --n-experts {}\n", o.k, o.experts);
    return 2;
  }
  const DType tu = parse_type(o.up_type), td = parse_type(o.down_type);
  const int64_t D = o.hidden, I = o.intermediate, E = o.experts;
  if (D % dtype_block_elems(tu) || I % dtype_block_elems(td)) {
    fmt::print(stderr, "bench_host_experts: hidden {} / intermediate {} are not multiples of the types' blocks\n", D, I);
    return 2;
  }
  std::mt19937 rng(1);
  const std::vector<std::byte> g = quantized_rows(tu, I, D, rng), u = quantized_rows(tu, I, D, rng),
                               d = quantized_rows(td, D, I, rng);
  const size_t expert_bytes = g.size() + u.size() + d.size();
  std::vector<Layer> layers(size_t(o.layers));
  const auto t_fill = std::chrono::steady_clock::now();
  for (Layer& l : layers) {
    l.bytes = expert_bytes * size_t(E);
    void* p = mmap(nullptr, l.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      fmt::print(stderr, "bench_host_experts: no memory for {} layers of {:.0f} MiB\n", o.layers,
                 double(l.bytes) / double(1 << 20));
      return 1;
    }
    if (o.huge_pages) madvise(p, l.bytes, MADV_HUGEPAGE);
    l.p = static_cast<std::byte*>(p);
    std::byte* gate = l.p;
    std::byte* up = gate + g.size() * size_t(E);
    std::byte* down = up + u.size() * size_t(E);
#pragma omp parallel for
    for (int64_t e = 0; e < E; ++e) {
      std::memcpy(gate + size_t(e) * g.size(), g.data(), g.size());
      std::memcpy(up + size_t(e) * u.size(), u.data(), u.size());
      std::memcpy(down + size_t(e) * d.size(), d.data(), d.size());
    }
    for (int64_t e = 0; e < E; ++e)
      l.experts.push_back({Tensor(gate + size_t(e) * g.size(), tu, {I, D}), Tensor(up + size_t(e) * u.size(), tu, {I, D}),
                           Tensor(down + size_t(e) * d.size(), td, {D, I})});
  }
  // What the kernel gave: transparent huge pages backing the process's anonymous memory.
  std::string huge = "?";
  if (std::ifstream smaps("/proc/self/smaps_rollup"); smaps)
    for (std::string line; std::getline(smaps, line);)
      if (line.rfind("AnonHugePages:", 0) == 0) huge = line.substr(line.find_first_not_of(' ', 14));
  fmt::print("{} layers x {} experts ({:.2f} MiB each: {} gate / up, {} down), {:.1f} GiB in {:.1f} s{} (anonymous "
             "huge pages: {}); {} threads\n",
             o.layers, E, double(expert_bytes) / double(1 << 20), o.up_type, o.down_type,
             double(expert_bytes) * double(E * o.layers) / double(1 << 30),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fill).count(),
             o.huge_pages ? ", huge pages asked" : "", huge, omp_get_max_threads());

  std::vector<float> x(static_cast<size_t>(D)), y(static_cast<size_t>(D)), w(static_cast<size_t>(o.k), 1.0f / float(o.k));
  std::vector<int32_t> ids(static_cast<size_t>(E));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  Tensor tx(x.data(), DType::F32, {1, D}), ty(y.data(), DType::F32, {1, D}), tw(w.data(), DType::F32, {1, o.k});
  std::vector<double> us;
  us.reserve(size_t(o.passes));
  const int64_t warm = std::min<int64_t>(o.passes, 20);
  for (int64_t i = 0; i < o.passes + warm; ++i) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t j = 0; j < o.k; ++j) std::swap(ids[size_t(j)], ids[size_t(j + int64_t(rng() % uint32_t(E - j)))]);
    Tensor ti(ids.data(), DType::I32, {1, o.k});
    const Layer& l = layers[size_t(i % o.layers)];
    const auto t0 = std::chrono::steady_clock::now();
    cpu::moe_experts(tx, tw, ti, l.experts, ty);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warm) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (o.gap_us > 0)
      while (std::chrono::steady_clock::now() - t1 < std::chrono::microseconds(o.gap_us)) {
      }
  }
  std::sort(us.begin(), us.end());
  const double mean = std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
  auto pct = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  const double bytes = double(expert_bytes) * double(o.k);
  fmt::print("{} passes of {} experts ({:.2f} MB read a pass): mean {:.1f} us ({:.1f} GB/s), p10 {:.1f}, median {:.1f}, "
             "p90 {:.1f}, max {:.1f}\n",
             us.size(), o.k, bytes / 1e6, mean, bytes / mean / 1e3, pct(0.1), pct(0.5), pct(0.9), us.back());
  for (Layer& l : layers) munmap(l.p, l.bytes);
  return 0;
}
