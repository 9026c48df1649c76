#include "model/host_expert_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace qwen36 {

namespace {

Tensor& part(MlpWeights& m, int kind) { return kind == 0 ? m.gate_proj : kind == 1 ? m.up_proj : m.down_proj; }

// A layer's expert bytes as disjoint runs of host memory (a GGUF layer: its gate, up and down
// blocks; experts are views into them), in address order, each with its offset in the copy.
struct Run {
  const std::byte* src;
  size_t bytes, dst;
};
std::vector<Run> layer_runs(std::vector<MlpWeights>& experts, size_t& total) {
  std::vector<std::pair<const std::byte*, const std::byte*>> r;
  for (MlpWeights& m : experts)
    for (int kind = 0; kind < 3; ++kind)
      if (const Tensor& t = part(m, kind); !t.empty())
        r.emplace_back(static_cast<const std::byte*>(t.data), static_cast<const std::byte*>(t.data) + t.nbytes());
  std::sort(r.begin(), r.end());
  std::vector<Run> runs;
  total = 0;
  for (size_t i = 0; i < r.size();) {
    const std::byte* b = r[i].first;
    const std::byte* e = r[i].second;
    for (++i; i < r.size() && r[i].first <= e; ++i) e = std::max(e, r[i].second);
    // The source's alignment modulo 256 is kept, so every tensor keeps the alignment it had.
    const size_t dst = (total + 255) / 256 * 256 + size_t(reinterpret_cast<uintptr_t>(b) % 256);
    runs.push_back({b, size_t(e - b), dst});
    total = dst + size_t(e - b);
  }
  return runs;
}

void parallel_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  constexpr size_t kPiece = size_t(4) << 20;
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t o = size_t(i) * kPiece;
    std::memcpy(dst + o, src + o, std::min(kPiece, bytes - o));
  }
}

}  // namespace

std::unique_ptr<HostExpertCopy> HostExpertCopy::make(Backend& backend, ModelWeights& w, const std::vector<bool>& host) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<HostExpertCopy> c(new HostExpertCopy(backend));
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  // Every layer copied and page-locked before any tensor is re-pointed: a refusal part-way
  // leaves the weights as they were.
  std::vector<std::pair<size_t, std::vector<Run>>> done;  // layer, its runs (block: same index)
  for (size_t i = 0; i < w.layers.size() && i < host.size(); ++i) {
    std::vector<MlpWeights>& experts = w.layers[i].moe.experts;
    if (!host[i] || experts.empty()) continue;
    size_t total = 0;
    std::vector<Run> runs = layer_runs(experts, total);
    Block b;
    b.bytes = (total + page - 1) / page * page;
    void* p = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    QWEN36_CHECK(p != MAP_FAILED, "expert offload: no host memory for layer {}'s experts ({:.1f} MiB)", i,
                 double(b.bytes) / double(1 << 20));
    // Huge pages where the kernel offers them (transparent huge pages, "madvise" mode): a
    // decode pass reads ~2 MB of each routed expert from a 20 GB range, one TLB miss and one
    // hardware-prefetch restart per 4 KiB page otherwise. (On the H200 machine, mixed: the
    // isolated expert pass 7% slower with them, the 35B-A3B decode not slower within the
    // machine's start-to-start noise; bench/RESULTS.md, session 19.)
    madvise(p, b.bytes, MADV_HUGEPAGE);
    b.p = static_cast<std::byte*>(p);
    c->blocks_.push_back(b);  // freed by the destructor from here on
    for (const Run& r : runs) parallel_copy(b.p + r.dst, r.src, r.bytes);
    if (!backend.pin_host_memory(b.p, b.bytes)) {
      spdlog::warn("expert offload: the backend could not page-lock the host experts; they stay in the model "
                   "file's pages (pageable: slower uploads, no device share of decode passes)");
      return nullptr;  // ~HostExpertCopy unpins and frees what was made
    }
    c->blocks_.back().pinned = true;
    done.emplace_back(i, std::move(runs));
  }
  for (size_t j = 0; j < done.size(); ++j) {
    const auto& [i, runs] = done[j];
    std::byte* base = c->blocks_[j].p;
    for (MlpWeights& m : w.layers[i].moe.experts)
      for (int kind = 0; kind < 3; ++kind) {
        Tensor& t = part(m, kind);
        if (t.empty()) continue;
        const auto* src = static_cast<const std::byte*>(t.data);
        const auto it = std::upper_bound(runs.begin(), runs.end(), src,
                                         [](const std::byte* x, const Run& r) { return x < r.src; });
        const Run& r = *std::prev(it);  // every tensor lies in a run (layer_runs made them from these)
        t.data = base + r.dst + size_t(src - r.src);
      }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("expert offload: {:.2f} GiB of host experts copied into page-locked memory in {:.1f} s",
               double(c->bytes()) / double(size_t(1) << 30), s);
  return c;
}

HostExpertCopy::~HostExpertCopy() {
  for (const Block& b : blocks_) {
    if (b.pinned) backend_.unpin_host_memory(b.p, b.bytes);
    munmap(b.p, b.bytes);
  }
}

size_t HostExpertCopy::bytes() const {
  size_t n = 0;
  for (const Block& b : blocks_) n += b.bytes;
  return n;
}

}  // namespace qwen36
