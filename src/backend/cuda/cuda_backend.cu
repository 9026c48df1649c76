// The CUDA backend: device memory (stream-ordered pool), weight upload, and dispatch of
// every Backend op to the kernels of cuda_*.cu. All work runs on one stream; copies to the
// host synchronise it.
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string_view>
#include <unordered_map>

#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/graph_shape.h"
#include "backend/cuda/host_bounce.h"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cpu/cpu_ops.h"
#include "backend/tree_ops.h"

namespace qwen36 {

namespace cuda {

TokenMap token_map(std::span<const SeqRun> runs, int64_t T) {
  TokenMap m;
  m.slot.assign(size_t(T), -1);
  m.pos.assign(size_t(T), -1);
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.begin >= 0 && r.count >= 0 && r.begin + r.count <= T, "run [{}, +{}) outside a batch of {} rows",
                 r.begin, r.count, T);
    for (int32_t j = 0; j < r.count; ++j) {
      m.slot[size_t(r.begin + j)] = r.slot;
      m.pos[size_t(r.begin + j)] = r.pos0 + j;
    }
  }
  return m;
}

namespace {
template <typename T>
bool same_contents(const std::vector<T>& v, std::span<const T> h) {
  return v.size() == h.size() && (h.empty() || std::memcmp(v.data(), h.data(), h.size_bytes()) == 0);
}
}  // namespace

// QWEN36_NO_PDL: "1" turns programmatic dependent launch off (to measure what it gives, or to
// rule it out); a comma-separated list of names turns it off for the kernels whose (mangled)
// name contains one of them, e.g. QWEN36_NO_PDL=hf_gemv,decode_state — to find which kernel's
// early start breaks a result.
namespace {
const std::string& no_pdl_env() {
  static const std::string v = [] {
    const char* e = std::getenv("QWEN36_NO_PDL");
    return std::string(e ? e : "");
  }();
  return v;
}
}  // namespace

bool pdl_supported() {
  static const bool on = [] {
    const std::string& off = no_pdl_env();
    if (!off.empty() && off != "0" && off.find_first_not_of("0123456789") == std::string::npos) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return on;
}

bool pdl_allowed(const void* kernel) {
  if (!pdl_supported()) return false;
  const std::string& list = no_pdl_env();
  if (list.empty() || list == "0") return true;
  static std::mutex mu;
  static std::map<const void*, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(kernel, true);
  if (fresh) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) {
      cudaGetLastError();
      return true;
    }
    for (size_t b = 0; b <= list.size();) {
      const size_t e = std::min(list.find(',', b), list.size());
      if (e > b && std::strstr(name, list.substr(b, e - b).c_str()) != nullptr) it->second = false;
      b = e + 1;
    }
  }
  return it->second;
}

bool host_work_allowed(Ctx& c) {
  if (!c.capturing) return true;
  c.capture_failed = true;
  return false;
}

static const void* dev_constant(Ctx& c, const void* host, size_t bytes) {
  std::string key(static_cast<const char*>(host), bytes);
  auto it = c.constants.find(key);
  if (it != c.constants.end()) return it->second;
  if (c.constants.size() >= 256 || !host_work_allowed(c)) return nullptr;
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, bytes));
  CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  c.constants.emplace(std::move(key), d);
  return d;
}

const int32_t* dev_constant_i32(Ctx& c, std::span<const int32_t> host) {
  return static_cast<const int32_t*>(dev_constant(c, host.data(), host.size_bytes()));
}

const int32_t* dev_i32(Ctx& c, std::span<const int32_t> host, Temp<int32_t>& tmp, bool constant) {
  const BatchTables& b = c.batch;
  if (b.dev && !host.empty()) {
    if (same_contents(b.tokens, host)) return b.dev;
    if (same_contents(b.rows, host)) return b.dev + b.off_rows;
  }
  if (constant && !host.empty() && host.size() <= 4096)
    if (const void* d = dev_constant(c, host.data(), host.size_bytes())) return static_cast<const int32_t*>(d);
  if (!host_work_allowed(c)) return nullptr;
  return tmp.assign(host);
}

const SeqRun* dev_runs(Ctx& c, std::span<const SeqRun> runs, Temp<SeqRun>& tmp) {
  const BatchTables& b = c.batch;
  if (b.dev && same_contents(b.runs, runs)) return reinterpret_cast<const SeqRun*>(b.dev + b.off_runs);
  if (!host_work_allowed(c)) return nullptr;
  return tmp.assign(runs);
}

const TreeTable* batch_tree(const Ctx& c, const SeqRun& run, std::span<const int32_t> parent) {
  for (const TreeTable& t : c.trees.trees)
    if (t.run.slot == run.slot && t.run.pos0 == run.pos0 && t.run.begin == run.begin && t.run.count == run.count &&
        same_contents(t.parent, parent))
      return &t;
  return nullptr;
}

void dev_token_map(Ctx& c, std::span<const SeqRun> runs, int64_t T, Temp<int32_t>& slot_tmp, Temp<int32_t>& pos_tmp,
                   const int32_t** slot, const int32_t** pos) {
  const BatchTables& b = c.batch;
  if (b.dev && int64_t(b.tokens.size()) == T && same_contents(b.runs, runs)) {
    *slot = b.dev + b.off_tslot;
    *pos = b.dev + b.off_tpos;
    return;
  }
  *slot = *pos = nullptr;
  if (!host_work_allowed(c)) return;
  const TokenMap m = token_map(runs, T);
  *slot = slot_tmp.assign(std::span<const int32_t>(m.slot.data(), m.slot.size()));
  *pos = pos_tmp.assign(std::span<const int32_t>(m.pos.data(), m.pos.size()));
}

const float* dev_const_f32(Ctx& c, std::span<const float> host) {
  return static_cast<const float*>(dev_constant(c, host.data(), host.size_bytes()));
}

void check_weight_dtype(const Tensor& w, const char* op) {
  QWEN36_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F16 || w.dtype == DType::F32,
               "{}: weight dtype {} is not supported by the CUDA backend (bf16, f16, f32)", op, dtype_name(w.dtype));
}

}  // namespace cuda

namespace {

// Backend::wait_host_signal: one thread spinning on the page-locked word until the host raises
// it; each read crosses the bus, so it naps between reads.
__global__ void wait_host_value(const volatile unsigned long long* signal, unsigned long long value) {
  while (*signal < value) __nanosleep(256);
}

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(size_t bytes, cudaStream_t s) : size_(bytes), stream_(s) {
    if (bytes) {
      CUDA_CHECK(cudaMallocAsync(&p_, bytes, stream_));
      CUDA_CHECK(cudaMemsetAsync(p_, 0, bytes, stream_));
    }
  }
  ~CudaBuffer() override {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  void* data() const override { return p_; }
  size_t size() const override { return size_; }

 private:
  void* p_ = nullptr;
  size_t size_;
  cudaStream_t stream_;
};

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Host ranges page-locked for upload() (cudaHostRegister), for streaming host-placed routed
// experts (Backend::pin_host_memory). Kept as whole pages, disjoint: a new range registers only
// its pages not yet registered, since CUDA refuses to register a page twice and neighbouring
// tensors (a layer's expert blocks in one GGUF mapping) share boundary pages. Registration is
// read-only where the device supports it (the weights of a read-only file mapping can be
// pinned only so); a failure is reported once and leaves the range pageable (uploads then
// bounce through the driver's staging buffer: slower, still correct).
class PinnedHostRanges {
 public:
  PinnedHostRanges() = default;
  PinnedHostRanges(const PinnedHostRanges&) = delete;
  PinnedHostRanges& operator=(const PinnedHostRanges&) = delete;
  ~PinnedHostRanges() {
    for (const auto& r : ranges_) cudaHostUnregister(reinterpret_cast<void*>(r.first));
    cudaGetLastError();  // a range whose memory is gone already: nothing left to do
  }
  bool pin(const void* p, size_t bytes, int device, bool writable) {
    if (bytes == 0) return true;
    uintptr_t cur = 0, end = 0;
    page_range(p, bytes, &cur, &end);
    if (read_only_ < 0) {
      int ro = 0;
      read_only_ = cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, device) == cudaSuccess && ro;
      cudaGetLastError();
    }
    bool ok = true;
    auto it = ranges_.upper_bound(cur);  // the first range beginning after cur, or the one holding cur
    if (it != ranges_.begin() && std::prev(it)->second > cur) it = std::prev(it);
    while (cur < end) {
      if (it != ranges_.end() && it->first <= cur) {  // already pinned: skip it
        cur = std::max(cur, it->second);
        ++it;
        continue;
      }
      const uintptr_t stop = it == ranges_.end() ? end : std::min(end, it->first);
      void* q = reinterpret_cast<void*>(cur);
      const bool ro = read_only_ && !writable;
      cudaError_t e = cudaHostRegister(q, stop - cur, ro ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
      if (e != cudaSuccess && ro) {  // a driver refusing the flag for this memory: try without
        cudaGetLastError();
        e = cudaHostRegister(q, stop - cur, cudaHostRegisterDefault);
      }
      if (e == cudaSuccess) {
        ranges_.emplace(cur, stop);  // before `it`, which stays valid
      } else if (e == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError();  // pinned by another owner (another backend on the same weights): fast already, not ours
      } else {
        cudaGetLastError();
        ok = false;
        if (!warned_) {
          std::fprintf(stderr, "qwen36: cudaHostRegister of %.1f MiB of host weights failed (%s); streamed experts are "
                       "copied from pageable memory (slower)\n", double(stop - cur) / (1 << 20), cudaGetErrorString(e));
          warned_ = true;
        }
      }
      cur = stop;
    }
    return ok;
  }
  // Calls f(ptr, n, pinned) for the pieces of [p, p + bytes) cut at the registered ranges' ends: a
  // cudaMemcpyAsync whose host side spans two registrations, or a registered and an unregistered
  // page, is refused (cudaErrorInvalidValue: CudaOffload.PinAndUpload's copy across two pin calls'
  // ranges failed so on the H200; not re-run since), so every piece lies in one registration or
  // in none; `pinned` says which.
  template <typename F>
  void for_each_piece(const void* p, size_t bytes, F&& f) const {
    uintptr_t cur = reinterpret_cast<uintptr_t>(p);
    const uintptr_t end = cur + bytes;
    auto it = ranges_.upper_bound(cur);
    if (it != ranges_.begin() && std::prev(it)->second > cur) it = std::prev(it);
    while (cur < end) {
      uintptr_t stop = end;
      bool pinned = false;
      if (it != ranges_.end() && it->first <= cur) {
        stop = std::min(end, it->second);  // inside a registration
        pinned = true;
        ++it;
      } else if (it != ranges_.end()) {
        stop = std::min(end, it->first);  // pageable up to the next one
      }
      f(reinterpret_cast<const void*>(cur), size_t(stop - cur), pinned);
      cur = stop;
    }
  }
  void unpin(const void* p, size_t bytes) {
    if (bytes == 0) return;
    uintptr_t b = 0, e = 0;
    page_range(p, bytes, &b, &e);
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second > b) it = std::prev(it);
    while (it != ranges_.end() && it->first < e) {
      cudaHostUnregister(reinterpret_cast<void*>(it->first));
      cudaGetLastError();
      it = ranges_.erase(it);
    }
  }

 private:
  static void page_range(const void* p, size_t bytes, uintptr_t* b, uintptr_t* e) {
    static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));  // the unit CUDA pins (a page at most once)
    *b = reinterpret_cast<uintptr_t>(p) / page * page;
    *e = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  }
  std::map<uintptr_t, uintptr_t> ranges_;  // begin → end of each registered range, disjoint
  int read_only_ = -1;                     // the device supports cudaHostRegisterReadOnly (-1: not asked yet)
  bool warned_ = false;
};

// QWEN36_NO_TILE: 1 tiles nothing; "experts" all but the routed experts, "dense" only them
// (to tell which layout a difference between two runs comes from); unset or 0 both.
struct TileChoice {
  bool dense, experts;
};
TileChoice tile_choice() {
  const char* no_tile = std::getenv("QWEN36_NO_TILE");
  const std::string nt = no_tile ? no_tile : "";
  if (nt.empty() || nt == "0") return {true, true};
  if (nt == "experts") return {true, false};
  if (nt == "dense") return {false, true};
  return {false, false};
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& o) {
    std::string why;
    QWEN36_CHECK(cuda_available(&why), "CUDA backend: {}", why);
    CUDA_CHECK(cudaSetDevice(o.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&ctx_.cublas));
    CUBLAS_CHECK(cublasSetStream(ctx_.cublas, ctx_.stream));
    ctx_.exact_matmul = o.exact_matmul;
    // QWEN36_GEMV_SPLIT_ROWS=N: the row count up to which GEMVs split K over a block (tuning).
    if (const char* e = std::getenv("QWEN36_GEMV_SPLIT_ROWS"); e && *e) ctx_.gemv_split_rows = std::atoll(e);
    // Keep freed pool memory cached: every forward allocates its activations again.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, o.device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    // A fixed cuBLAS workspace: nothing is allocated inside a recorded decode step.
    CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
    CUBLAS_CHECK(cublasSetWorkspace(ctx_.cublas, cublas_ws_, kCublasWorkspace));
    // The op temporaries' stack (cuda_ops.cuh): QWEN36_SCRATCH_MB=0 turns it off (every
    // temporary stream-ordered memory, as before it existed: to measure what it gives).
    size_t scratch_bytes = cuda::ScratchStack::kBytes;
    if (const char* e = std::getenv("QWEN36_SCRATCH_MB"); e && *e) scratch_bytes = size_t(std::atoll(e)) << 20;
    if (scratch_bytes) {
      scratch_bytes = std::max(scratch_bytes, size_t(cuda::ScratchStack::kCounters) * sizeof(int));
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, scratch_bytes));
      CUDA_CHECK(cudaMemset(p, 0, size_t(cuda::ScratchStack::kCounters) * sizeof(int)));
      scratch_.init(p, scratch_bytes);
      ctx_.scratch = &scratch_;
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&ctx_.batch.uploaded, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&ctx_.trees.uploaded, cudaEventDisableTiming));
    const char* prof = std::getenv("QWEN36_PROFILE");
    profile_ = prof && *prof && std::string(prof) != "0";
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream);
    for (auto* q : {&downloads_, &idle_downloads_})
      for (const PendingDownload& d : *q) {
        cudaFreeHost(d.pinned);
        cudaEventDestroy(d.done);
      }
    if (signal_) cudaFreeHost(signal_);
    if (profile_) print_profile();
    drop_graphs();
    for (auto& kv : ctx_.constants) cudaFree(kv.second);
    cudaFree(ctx_.batch.dev);
    cudaFreeHost(ctx_.batch.pinned);
    cudaEventDestroy(ctx_.batch.uploaded);
    cudaFree(ctx_.trees.dev);
    cudaFreeHost(ctx_.trees.pinned);
    cudaEventDestroy(ctx_.trees.uploaded);
    cudaFree(cublas_ws_);
    cudaFree(scratch_.base());
    for (auto& kv : ctx_.expert_tables) cudaFree(kv.second.dev);
    if (weights_) cudaFree(weights_);
    cublasDestroy(ctx_.cublas);
    cudaStreamDestroy(ctx_.stream);
  }
  std::string name() const override { return "cuda"; }

  std::unique_ptr<DeviceBuffer> alloc(size_t bytes) override {
    return std::make_unique<CudaBuffer>(bytes, ctx_.stream);
  }
  void copy_to_host(const Tensor& src, void* dst) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    if (profile_) collect_profile();
  }
  // Each download lands in a page-locked slot of its own (cudaMemcpyAsync into pageable memory
  // would wait for the stream) and is copied to dst by wait_download; slots of earlier tickets
  // never waited for are recycled then, uncopied.
  uint64_t download(const Tensor& src, void* dst) override {
    QWEN36_CHECK(!ctx_.capturing, "download cannot be recorded");
    PendingDownload d;
    if (!idle_downloads_.empty()) d = idle_downloads_.back(), idle_downloads_.pop_back();
    if (!d.done) CUDA_CHECK(cudaEventCreateWithFlags(&d.done, cudaEventDisableTiming));
    if (d.cap < src.nbytes()) {
      if (d.pinned) CUDA_CHECK(cudaFreeHost(d.pinned));
      d.cap = std::max<size_t>(src.nbytes(), 4096);
      CUDA_CHECK(cudaMallocHost(&d.pinned, d.cap));
    }
    CUDA_CHECK(cudaMemcpyAsync(d.pinned, src.data, src.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream));
    CUDA_CHECK(cudaEventRecord(d.done, ctx_.stream));
    d.ticket = ++download_tickets_, d.dst = dst, d.bytes = src.nbytes();
    downloads_.push_back(d);
    return d.ticket;
  }
  void wait_download(uint64_t ticket) override {
    while (!downloads_.empty() && downloads_.front().ticket <= ticket) {
      PendingDownload d = downloads_.front();
      downloads_.pop_front();
      CUDA_CHECK(cudaEventSynchronize(d.done));
      if (d.ticket == ticket) std::memcpy(d.dst, d.pinned, d.bytes);
      idle_downloads_.push_back(d);
    }
  }
  void copy_from_host(const void* src, Tensor& dst) override {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, ctx_.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void fill_zero(Tensor& t) override { CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), ctx_.stream)); }
  void copy(const Tensor& src, Tensor& dst) override {
    QWEN36_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: {} → {}", src.shape_str(),
                 dst.shape_str());
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  void copy_column_blocks(const Tensor& x, Tensor& q, Tensor& k, Tensor& v) override {
    {
      Prof p_(*this, "copy_column_blocks");
      if (cuda::copy_column_blocks(ctx_, x, q, k, v)) return;
    }
    Backend::copy_column_blocks(x, q, k, v);
  }
  void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) override {
    Prof p_(*this, "copy_cols");
    cuda::copy_cols(ctx_, src, src_col0, dst, dst_col0, width);
  }
  void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst) override {
    Prof p_(*this, "get_rows");
    cuda::get_rows(ctx_, src, rows, dst);
  }
  void compact_rows(std::span<Tensor> ts, std::span<const int32_t> from) override {
    Prof p_(*this, "compact_rows");
    if (!cuda::compact_rows(ctx_, ts, from)) Backend::compact_rows(ts, from);
  }
  void prepare_weights(ModelWeights& w) override { prepare_weights_except(w, {}); }
  void prepare_weights_except(ModelWeights& w, const std::set<const Tensor*>& keep) override;
  void tile_weights(ModelWeights& w);
  size_t free_memory() override {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }
  size_t resident_bytes(ModelWeights& w) override;
  // Streaming host memory in (expert offload): page-locked ranges, and uploads queued on the
  // op stream (async from pinned memory; a pageable source is staged by the driver).
  bool pin_host_memory(const void* p, size_t bytes, bool device_writes) override {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    return pinned_.pin(p, bytes, device, device_writes);
  }
  void unpin_host_memory(const void* p, size_t bytes) override { pinned_.unpin(p, bytes); }
  void upload(const void* src, void* dst, size_t bytes) override {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s0 = static_cast<const uint8_t*>(src);
    pinned_.for_each_piece(src, bytes, [&](const void* piece, size_t n, bool pinned) {
      uint8_t* to = d + (static_cast<const uint8_t*>(piece) - s0);
      if (!pinned && n >= cuda::HostBounce::kMinBytes && !ctx_.capturing && bounce_.upload(piece, to, n, ctx_.stream)) return;
      CUDA_CHECK(cudaMemcpyAsync(to, piece, n, cudaMemcpyHostToDevice, ctx_.stream));
    });
  }
  std::atomic<uint64_t>* host_signal() override {
    if (!signal_) {
      void* p = nullptr;
      CUDA_CHECK(cudaHostAlloc(&p, sizeof(std::atomic<uint64_t>), cudaHostAllocMapped));
      signal_ = new (p) std::atomic<uint64_t>(0);
      void* d = nullptr;
      CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
      signal_dev_ = static_cast<const unsigned long long*>(d);
    }
    return signal_;
  }
  void wait_host_signal(uint64_t value) override {
    QWEN36_CHECK(signal_ != nullptr && !ctx_.capturing, "wait_host_signal: no host_signal() yet, or a recording");
    wait_host_value<<<1, 1, 0, ctx_.stream>>>(signal_dev_, value);
    CUDA_CHECK(cudaGetLastError());
  }
  void upload_batch(std::span<const UploadPiece> pieces) override {
    if (ctx_.capturing || !batch_copies_ || pieces.size() < 2) return Backend::upload_batch(pieces);
    batch_dst_.clear(), batch_src_.clear(), batch_bytes_.clear();
    for (const UploadPiece& u : pieces) {
      auto* d = static_cast<uint8_t*>(u.dst);
      const auto* s0 = static_cast<const uint8_t*>(u.src);
      pinned_.for_each_piece(u.src, u.bytes, [&](const void* piece, size_t n, bool pinned) {
        uint8_t* to = d + (static_cast<const uint8_t*>(piece) - s0);
        if (!pinned) return upload(piece, to, n);
        batch_dst_.push_back(to), batch_src_.push_back(piece), batch_bytes_.push_back(n);
      });
    }
    if (batch_dst_.empty()) return;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(batch_dst_.data(), batch_src_.data(), batch_bytes_.data(),
                                               batch_dst_.size(), &attr, &first, 1, ctx_.stream);
    if (e == cudaSuccess) return;
    // A driver without batched copies: one call a piece from now on.
    cudaGetLastError();
    batch_copies_ = false;
    std::fprintf(stderr, "qwen36: cudaMemcpyBatchAsync failed (%s); uploads go one copy at a time\n",
                 cudaGetErrorString(e));
    for (size_t i = 0; i < batch_dst_.size(); ++i)
      CUDA_CHECK(cudaMemcpyAsync(batch_dst_[i], batch_src_[i], batch_bytes_[i], cudaMemcpyHostToDevice, ctx_.stream));
  }

  void set_batch(std::span<const int32_t> tokens, std::span<const SeqRun> runs,
                 std::span<const int32_t> rows) override;
  void set_batch_trees(std::span<const SeqRun> runs, std::span<const std::span<const int32_t>> parents) override;
  void table_room(int32_t*& dev, int32_t*& pinned, size_t& cap, cudaEvent_t uploaded, size_t ints, size_t min_cap);
  bool begin_capture() override {
    if (profile_ || ctx_.capturing) return false;  // profiling times ops one by one
    CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
    ctx_.capturing = true;
    ctx_.capture_failed = false;
    return true;
  }
  bool end_capture(uint64_t key, bool keep) override {
    if (!ctx_.capturing) return false;
    cudaGraph_t g = nullptr;
    ctx_.capturing = false;
    CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &g));
    if (ctx_.capture_failed) cuda::log_graph_dropped(key);
    keep = keep && !ctx_.capture_failed && g != nullptr;
    if (keep) cuda::log_graph_shape(g);
    cudaGraphExec_t exec = nullptr;
    if (keep) CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    if (g) cudaGraphDestroy(g);
    if (!keep) return false;
    if (graphs_.size() >= 64) drop_graphs();
    if (auto it = graphs_.find(key); it != graphs_.end()) cudaGraphExecDestroy(it->second);
    graphs_[key] = exec;
    return true;
  }
  void* native_stream() override { return ctx_.stream; }  // tensor-parallel collectives (comm_nccl)
  bool replay(uint64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    CUDA_CHECK(cudaGraphLaunch(it->second, ctx_.stream));
    return true;
  }

  void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override {
    Prof p_(*this, "embed");
    cuda::embed(ctx_, table, ids, out);
  }
  void embed_ids(const Tensor& table, const Tensor& ids, Tensor& out) override {
    Prof p_(*this, "embed");
    QWEN36_CHECK(ids.dtype == DType::I32, "embed_ids: ids {} are not I32", ids.shape_str());
    cuda::embed_rows(ctx_, table, ids.as<int32_t>(), ids.numel(), out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    Prof p_(*this, "rms_norm");
    cuda::rms_norm(ctx_, x, w, eps, out);
  }
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) override {
    Prof p_(*this, "gated_rms_norm");
    cuda::gated_rms_norm(ctx_, x, z, w, eps, out);
  }
  void add(Tensor& y, const Tensor& x) override {
    Prof p_(*this, "add");
    cuda::add(ctx_, y, x);
  }
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override {
    Prof p_(*this, "swiglu");
    cuda::swiglu(ctx_, gate, up, out);
  }
  void sigmoid_mul(Tensor& x, const Tensor& gate) override {
    Prof p_(*this, "sigmoid_mul");
    cuda::sigmoid_mul(ctx_, x, gate);
  }
  void gated_matmul(Tensor& x, const Tensor& gate, const Tensor& w, Tensor& out) override {
    {
      Prof p_(*this, "sigmoid_mul");
      if (cuda::gated_matmul_prefill(ctx_, x, gate, w, out)) return;
      cuda::sigmoid_mul(ctx_, x, gate, cuda::release_late_before(ctx_, w));
    }
    matmul(x, w, out);
  }
  void gated_norm_matmul(Tensor& x, const Tensor& z, const Tensor& norm, float eps, const Tensor& w,
                         Tensor& out) override {
    {
      Prof p_(*this, "gated_norm + matmul");
      if (cuda::gated_norm_matmul_prefill(ctx_, x, z, norm, eps, w, out)) return;
    }
    Backend::gated_norm_matmul(x, z, norm, eps, w, out);
  }
  void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) override {
    Prof p_(*this, "add_sigmoid_scaled");
    cuda::add_sigmoid_scaled(ctx_, y, x, s);
  }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    Prof p_(*this, profile_ ? "matmul " + std::string(x.rows() <= 8 ? "gemv " : "gemm ") + std::to_string(w.rows()) +
                                  "x" + std::to_string(w.cols())
                            : std::string());
    cuda::matmul(ctx_, x, w, out);
  }
  void matmul_multi(const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) override {
    {
      Prof p_(*this, profile_ ? "matmul_multi " + std::to_string(ws.size()) + "x" + std::to_string(x.cols()) : std::string());
      if (cuda::matmul_multi(ctx_, x, ws, outs) || cuda::quant_matmul_multi(ctx_, x, ws, outs) ||
          cuda::matmul_multi_prefill(ctx_, x, ws, outs))
        return;
    }
    Backend::matmul_multi(x, ws, outs);
  }
  void matmul_swiglu(const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& gate_out,
                     Tensor& up_out) override {
    {
      Prof p_(*this, profile_ ? "matmul_swiglu " + std::to_string(gate.rows()) + "x" + std::to_string(gate.cols())
                              : std::string());
      if (cuda::matmul_swiglu(ctx_, x, gate, up, gate_out) || cuda::quant_matmul_swiglu(ctx_, x, gate, up, gate_out, up_out) ||
          cuda::matmul_swiglu_prefill(ctx_, x, gate, up, gate_out))
        return;
    }
    Backend::matmul_swiglu(x, gate, up, gate_out, up_out);
  }
  void mlp(const Tensor& x, const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out) override {
    if (x.rows() > 8) {  // decode composes the fused GEMV forms (each profiled on its own)
      Prof p_(*this, profile_ ? "mlp " + std::to_string(m.gate_proj.rows()) + "x" + std::to_string(m.gate_proj.cols())
                              : std::string());
      if (cuda::mlp_prefill(ctx_, x, m, out)) return;
    }
    Backend::mlp(x, m, gate_out, up_out, out);
  }
  void add_rms_norm(Tensor& y, const Tensor& delta, const Tensor& w, float eps, Tensor& out) override {
    Prof p_(*this, "add_rms_norm");
    cuda::add_rms_norm(ctx_, y, delta, w, eps, out);
  }
  void add_rms_norm_into(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                         Tensor& out) override {
    Prof p_(*this, "add_rms_norm");
    cuda::add_rms_norm_quant(ctx_, y, delta, y_out, w, eps, out, nullptr);  // reads y, writes y_out: no copy
  }
  void add_rms_norm_matmul_multi(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                                 Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) override {
    {
      Prof p_(*this, profile_ ? "add_rms_norm + matmul_multi " + std::to_string(ws.size()) + "x" + std::to_string(x.cols())
                              : std::string());
      if (cuda::norm_quant_matmul_multi(ctx_, y, delta, y_out, w, eps, x, ws, outs) ||
          cuda::norm_gemv_multi(ctx_, y, delta, y_out, w, eps, x, ws, outs) ||
          cuda::norm_matmul_multi_prefill(ctx_, y, delta, y_out, w, eps, x, ws, outs))
        return;
    }
    Backend::add_rms_norm_matmul_multi(y, delta, y_out, w, eps, x, ws, outs);
  }
  void add_rms_norm_mlp(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                        const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out) override {
    {
      Prof p_(*this, profile_ ? "add_rms_norm + mlp " + std::to_string(m.gate_proj.rows()) + "x" +
                                    std::to_string(m.gate_proj.cols())
                              : std::string());
      if (cuda::norm_quant_mlp(ctx_, y, delta, y_out, w, eps, x, m, gate_out, up_out, out) ||
          cuda::norm_gemv_mlp(ctx_, y, delta, y_out, w, eps, x, m, gate_out, out) ||
          cuda::norm_mlp_prefill(ctx_, y, delta, y_out, w, eps, x, m, out))
        return;
    }
    Backend::add_rms_norm_mlp(y, delta, y_out, w, eps, x, m, gate_out, up_out, out);
  }
  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override {
    Prof p_(*this, "split_q_gate");
    cuda::split_q_gate(ctx_, qg, q, gate);
  }
  void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) override {
    Prof p_(*this, "rope");
    cuda::rope(ctx_, x, runs, rotary_dim, theta);
  }
  void qk_norm_rope(const Tensor& qg, Tensor& q, Tensor* gate, Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                    float eps, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) override {
    {
      Prof p_(*this, "qk_norm_rope");
      if (cuda::qk_norm_rope(ctx_, qg, q, gate, k, q_norm, k_norm, eps, runs, rotary_dim, theta)) return;
    }
    Backend::qk_norm_rope(qg, q, gate, k, q_norm, k_norm, eps, runs, rotary_dim, theta);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                 std::span<const SeqRun> runs, float scale, Tensor& out) override {
    Prof p_(*this, "attention");
    cuda::attention(ctx_, q, k, v, k_cache, v_cache, runs, scale, out);
  }
  // RoPE at each tree token's position pos0 + depth: one launch over the batch (the tree's rows
  // at their positions, the others left) from set_batch_trees' table; a tree without one takes
  // the composition.
  void rope_tree(Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim,
                 float theta) override {
    const int64_t T = x.ndim == 3 ? x.dim(0) : 0;
    if (const cuda::TreeTable* t = cuda::batch_tree(ctx_, run, parent); t && int64_t(ctx_.batch.tokens.size()) == T) {
      Prof p_(*this, "rope_tree");
      return cuda::rope_at(ctx_, x, ctx_.trees.dev + t->off_pos, rotary_dim, theta);
    }
    Backend::rope_tree(x, run, parent, rotary_dim, theta);
  }
  // One pass over the tree: every token's K/V to cache row pos0 + i as for a chain, then each
  // token's decode attention over the context and the rows its ancestor mask shows (≤ 64 tokens:
  // kMaxTreeBudget + the root). The masks come from set_batch_trees' table (a recording can hold
  // the pass), else they are uploaded (not while recording). Anything else takes the
  // composition of chain ops.
  void attention_tree(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                      const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out) override {
    const int64_t T = q.dim(0);
    const cuda::TreeTable* t = cuda::batch_tree(ctx_, run, parent);
    if (t && int64_t(ctx_.batch.tokens.size()) != T) t = nullptr;
    if (run.count < 1 || run.count > cuda::kMaxTreeTokens || size_t(run.count) != parent.size() || run.begin < 0 ||
        run.begin + run.count > T || (ctx_.capturing && !t))
      return Backend::attention_tree(q, k, v, k_cache, v_cache, run, parent, scale, out);
    Prof p_(*this, "attention_tree");
    tree_ops::check_tree(run, parent);
    if (t) {
      const int32_t* d = ctx_.trees.dev;
      return cuda::attention(ctx_, q, k, v, k_cache, v_cache, std::span(&run, 1), scale, out,
                             {reinterpret_cast<const uint64_t*>(d + t->off_mask), d + t->off_base});
    }
    const std::vector<uint64_t> mask = tree_masks(run, parent, T);
    const std::vector<int32_t> base(size_t(T), run.pos0);
    cuda::Temp<uint64_t> dmask(ctx_, std::span<const uint64_t>(mask));
    cuda::Temp<int32_t> dbase(ctx_, std::span<const int32_t>(base));
    cuda::attention(ctx_, q, k, v, k_cache, v_cache, std::span(&run, 1), scale, out, {dmask.get(), dbase.get()});
  }
  // Per batch row (T): the ancestor mask of the tree token it holds (bit j: token j of the run
  // is itself or an ancestor), 0 for the other rows.
  static std::vector<uint64_t> tree_masks(const SeqRun& run, std::span<const int32_t> parent, int64_t T) {
    std::vector<uint64_t> mask(size_t(T), 0);
    for (int32_t i = 0; i < run.count; ++i) {
      const int32_t pa = parent[size_t(i)];
      mask[size_t(run.begin + i)] = (pa < 0 ? 0 : mask[size_t(run.begin + pa)]) | (uint64_t(1) << i);
    }
    return mask;
  }
  void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) override {
    Prof p_(*this, "conv1d");
    cuda::causal_conv1d_silu(ctx_, x, w, conv_state, runs);
  }
  void causal_conv1d_silu_split(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs,
                                Tensor& q, Tensor& k, Tensor& v) override {
    {
      Prof p_(*this, "conv1d");
      if (cuda::causal_conv1d_silu_split(ctx_, x, w, conv_state, runs, q, k, v)) return;
    }
    Backend::causal_conv1d_silu_split(x, w, conv_state, runs, q, k, v);
  }
  void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias, Tensor& g,
                      Tensor& beta) override {
    Prof p_(*this, "deltanet_gates");
    cuda::deltanet_gates(ctx_, a, b, a_neg_exp, dt_bias, g, beta);
  }
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) override {
    Prof p_(*this, "delta_rule");
    cuda::gated_delta_rule(ctx_, q, k, v, g, beta, state, runs, out, mode);
  }
  void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state,
                                   std::span<const SeqRun> runs) override {
    Prof p_(*this, "conv1d_readonly");
    cuda::causal_conv1d_silu_readonly(ctx_, x, w, conv_state, runs);
  }
  void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                 const Tensor& beta, const Tensor& state, std::span<const SeqRun> runs,
                                 Tensor& out) override {
    Prof p_(*this, "delta_rule_readonly");
    cuda::gated_delta_rule_readonly(ctx_, q, k, v, g, beta, state, runs, out);
  }
  void causal_conv1d_silu_tree_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                                        std::span<const int32_t> parent) override {
    {
      Prof p_(*this, "conv1d_tree_readonly");
      if (cuda::causal_conv1d_silu_tree_readonly(ctx_, x, w, conv_state, run, parent)) return;
    }
    Backend::causal_conv1d_silu_tree_readonly(x, w, conv_state, run, parent);
  }
  void gated_delta_rule_tree_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                      const Tensor& beta, const Tensor& state, const SeqRun& run,
                                      std::span<const int32_t> parent, Tensor& out) override {
    {
      Prof p_(*this, "delta_rule_tree_readonly");
      if (cuda::gated_delta_rule_tree_readonly(ctx_, q, k, v, g, beta, state, run, parent, out)) return;
    }
    Backend::gated_delta_rule_tree_readonly(q, k, v, g, beta, state, run, parent, out);
  }
  void deltanet_decode(Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w,
                       float eps, Tensor& conv_state, Tensor& ssm_state, std::span<const SeqRun> runs,
                       Tensor& out) override {
    {
      Prof p_(*this, "deltanet_decode");
      if (cuda::deltanet_decode(ctx_, mixed, z, a, b, w, eps, conv_state, ssm_state, runs, out)) return;
    }
    Backend::deltanet_decode(mixed, z, a, b, w, eps, conv_state, ssm_state, runs, out);
  }
  bool deltanet_verify(Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w,
                       float eps, Tensor& conv_state, Tensor& ssm_state, std::span<const SeqRun> runs,
                       std::span<const SeqRun> verify, Tensor& conv_in, Tensor& g_in, Tensor& beta_in,
                       Tensor& out) override {
    Prof p_(*this, "deltanet_verify");
    return cuda::deltanet_verify(ctx_, mixed, z, a, b, w, eps, conv_state, ssm_state, runs, verify, conv_in, g_in,
                                 beta_in, out);
  }
  bool deltanet_verify_tree(Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w,
                            float eps, Tensor& conv_state, Tensor& ssm_state, const SeqRun& run,
                            std::span<const int32_t> parent, Tensor& conv_in, Tensor& g_in, Tensor& beta_in,
                            Tensor& out) override {
    // QWEN36_TREE_FUSED=off: the model composes the tree ops instead (the A / B of
    // bench/RESULTS.md, session 53: H100, DDTree budget 22, 419.4 → 427.1 t/s SIMULATED).
    static std::atomic<int> tree_fused{-1};
    if (cuda::variant(tree_fused, "QWEN36_TREE_FUSED", "on", "off") == cuda::kSecondForm) return false;
    Prof p_(*this, "deltanet_verify_tree");
    return cuda::deltanet_verify_tree(ctx_, mixed, z, a, b, w, eps, conv_state, ssm_state, run, parent, conv_in, g_in,
                                      beta_in, out);
  }
  bool deltanet_commit(const DeltaNetWeights& w, Tensor& conv_state, Tensor& ssm_state, std::span<const SeqRun> runs,
                       const Tensor& conv_in, const Tensor& g_in, const Tensor& beta_in, Tensor& mixed) override {
    Prof p_(*this, "deltanet_commit");
    return cuda::deltanet_commit(ctx_, w, conv_state, ssm_state, runs, conv_in, g_in, beta_in, mixed);
  }
  void moe_local_ids(Tensor& ids, int64_t e0, int64_t n) override {
    Prof p_(*this, "moe_local_ids");
    cuda::moe_local_ids(ctx_, ids, e0, n);
  }
  void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) override {
    Prof p_(*this, "moe_route");
    cuda::moe_route(ctx_, logits, k, renorm, weights, ids);
  }
  // An experts call takes moe_route's record of the ids it wrote (Ctx::routed_ids), whichever
  // kernels serve it: no later call can match it by a reused address.
  struct RoutedIdsTaken {
    cuda::Ctx& c;
    ~RoutedIdsTaken() { c.routed_ids = nullptr; }
  };
  void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                   Tensor& out) override {
    Prof p_(*this, "moe_experts");
    RoutedIdsTaken taken{ctx_};
    cuda::moe_experts(ctx_, x, weights, ids, experts, out);
  }
  bool moe_expert_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows) override {
    Prof p_(*this, "moe_expert_rows");
    RoutedIdsTaken taken{ctx_};
    return cuda::moe_expert_rows(ctx_, x, ids, experts, rows);
  }
  bool moe_shared_row(std::span<const MlpWeights> experts, int64_t k, const Tensor& sh_gate, const Tensor& sh_up,
                      const Tensor& down, Tensor& sh_row) override {
    Prof p_(*this, "moe_shared_row");
    return cuda::moe_shared_row(ctx_, experts, k, sh_gate, sh_up, down, sh_row);
  }
  void moe_combine_rows(const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E, const Tensor* sh_row,
                        const Tensor* s, Tensor& out) override {
    Prof p_(*this, "moe_combine_rows");
    cuda::moe_combine_rows(ctx_, rows, weights, ids, E, sh_row, s, out);
  }
  int64_t moe_row_pairs() const override { return cuda::moe_row_pairs(); }
  int64_t moe_tiled_pairs() const override { return cuda::moe_tiled_pairs(); }
  // Not where QWEN36_NO_TILE keeps the routed experts in the GGUF layout: a repacked copy would
  // compute on other kernels than the resident experts do (expert offload's streamed passes
  // must compute what the all-GPU run computes).
  bool tile_into(std::span<const Tensor> ws, std::span<void* const> dsts, std::span<Tensor> tiled) override {
    if (!tile_choice().experts) return false;
    Prof p_(*this, "tile_into");
    return cuda::quant_tile_into(ctx_, ws, dsts, tiled);
  }
  void moe_experts_shared(const Tensor& x, const Tensor& weights, const Tensor& ids,
                          std::span<const MlpWeights> experts, Tensor& sh_gate, const Tensor& sh_up,
                          const Tensor& down, const Tensor& s, Tensor& sh_out, Tensor& out) override {
    RoutedIdsTaken taken{ctx_};
    {
      Prof p_(*this, "moe_experts_shared");
      if (cuda::moe_experts_shared(ctx_, x, weights, ids, experts, {sh_gate, sh_up, down, s}, out)) return;
    }
    Backend::moe_experts_shared(x, weights, ids, experts, sh_gate, sh_up, down, s, sh_out, out);
  }
  void sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows, std::span<const PenaltyEntry> penalties,
                         int32_t k, int32_t* ids, float* vals, float* stats) override {
    Prof p_(*this, "sample_candidates");
    cuda::sample_candidates(ctx_, logits, rows, penalties, k, ids, vals, stats);
  }
  void argmax_rows(const Tensor& logits, Tensor& ids) override {
    Prof p_(*this, "argmax_rows");
    cuda::argmax_rows(ctx_, logits, ids);
  }

 private:
  // QWEN36_PROFILE=1: every op between two cudaEvents; per-op totals printed at exit.
  class Prof {
   public:
    Prof(CudaBackend& b, std::string name) : b_(b.profile_ ? &b : nullptr) {
      if (!b_) return;
      name_ = std::move(name);
      e0_ = b_->event();
      CUDA_CHECK(cudaEventRecord(e0_, b_->ctx_.stream));
    }
    ~Prof() {
      if (!b_) return;
      cudaEvent_t e1 = b_->event();
      cudaEventRecord(e1, b_->ctx_.stream);
      b_->pending_.push_back({std::move(name_), e0_, e1});
    }
    Prof(const Prof&) = delete;
    Prof& operator=(const Prof&) = delete;

   private:
    CudaBackend* b_;
    std::string name_;
    cudaEvent_t e0_ = nullptr;
  };
  struct Pending {
    std::string name;
    cudaEvent_t e0, e1;
  };
  struct OpTime {
    double ms = 0;
    int64_t calls = 0;
  };
  cudaEvent_t event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  void collect_profile() {
    for (Pending& p : pending_) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, p.e0, p.e1));
      OpTime& t = op_times_[p.name];
      t.ms += ms;
      ++t.calls;
      free_events_.push_back(p.e0);
      free_events_.push_back(p.e1);
    }
    pending_.clear();
  }
  void print_profile() {
    collect_profile();
    std::vector<std::pair<std::string, OpTime>> v(op_times_.begin(), op_times_.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& [n, t] : v) total += t.ms;
    const double fw = double(std::max<int64_t>(forwards_, 1));
    std::fprintf(stderr, "\nQWEN36_PROFILE: %lld forward passes, op time %.3f ms per forward (GPU time between "
                 "events around each op, eager launches)\n", (long long)forwards_, total / fw);
    std::fprintf(stderr, "| op | calls/forward | ms/forward | us/call | share |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (const auto& [n, t] : v)
      std::fprintf(stderr, "| %s | %.1f | %.3f | %.1f | %.1f%% |\n", n.c_str(), double(t.calls) / fw, t.ms / fw,
                   1000 * t.ms / double(t.calls), 100 * t.ms / std::max(total, 1e-9));
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    free_events_.clear();
  }
  void drop_recordings() override { drop_graphs(); }
  void drop_graphs() {
    for (auto& kv : graphs_) cudaGraphExecDestroy(kv.second);
    graphs_.clear();
  }

  static constexpr size_t kCublasWorkspace = size_t(32) << 20;
  cuda::Ctx ctx_;
  void* weights_ = nullptr;  // one allocation holding every uploaded weight
  void* cublas_ws_ = nullptr;
  cuda::ScratchStack scratch_;  // op temporaries (ctx_.scratch)
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  bool profile_ = false;
  int64_t forwards_ = 0;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::string, OpTime> op_times_;
  PinnedHostRanges pinned_;  // host ranges page-locked for upload()
  bool batch_copies_ = true;  // cudaMemcpyBatchAsync works here (upload_batch)
  std::vector<void*> batch_dst_;  // upload_batch's arrays, kept between calls
  std::vector<const void*> batch_src_;
  std::vector<size_t> batch_bytes_;
  cuda::HostBounce bounce_;      // upload()'s path for large pageable ranges
  std::atomic<uint64_t>* signal_ = nullptr;  // host_signal(): page-locked, mapped
  struct PendingDownload {  // download(): its page-locked slot and the event after its copy
    uint64_t ticket = 0;
    cudaEvent_t done = nullptr;
    void* pinned = nullptr;
    size_t cap = 0, bytes = 0;
    void* dst = nullptr;
  };
  std::deque<PendingDownload> downloads_, idle_downloads_;  // queued (in ticket order); reusable
  uint64_t download_tickets_ = 0;
  const unsigned long long* signal_dev_ = nullptr;
};

// Room for `ints` in a device table (dev, cap ints) and its pinned staging: a larger pair (at
// least min_cap) when it does not fit, after the stream's work and the recordings that read the
// old table are gone; else once the last upload has left the staging buffer.
void CudaBackend::table_room(int32_t*& dev, int32_t*& pinned, size_t& cap, cudaEvent_t uploaded, size_t ints,
                             size_t min_cap) {
  if (ints <= cap) {
    CUDA_CHECK(cudaEventSynchronize(uploaded));
    return;
  }
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  drop_graphs();
  cudaFree(dev);
  cudaFreeHost(pinned);
  cap = std::max(ints, min_cap);
  CUDA_CHECK(cudaMalloc(&dev, cap * 4));
  CUDA_CHECK(cudaMallocHost(&pinned, cap * 4));
}

void CudaBackend::set_batch(std::span<const int32_t> tokens, std::span<const SeqRun> runs,
                            std::span<const int32_t> rows) {
  ++forwards_;
  ctx_.trees.trees.clear();  // until set_batch_trees names this pass's
  cuda::BatchTables& b = ctx_.batch;
  const int64_t T = int64_t(tokens.size());
  const cuda::TokenMap m = cuda::token_map(runs, T);
  b.tokens.assign(tokens.begin(), tokens.end());
  b.runs.assign(runs.begin(), runs.end());
  b.rows.assign(rows.begin(), rows.end());
  b.tslot = m.slot;
  b.tpos = m.pos;
  static_assert(sizeof(SeqRun) == 4 * sizeof(int32_t));
  b.off_runs = size_t(T);
  b.off_tslot = b.off_runs + 4 * runs.size();
  b.off_tpos = b.off_tslot + size_t(T);
  b.off_rows = b.off_tpos + size_t(T);
  const size_t total = b.off_rows + rows.size();
  table_room(b.dev, b.pinned, b.cap, b.uploaded, total, size_t(1) << 16);
  std::copy(tokens.begin(), tokens.end(), b.pinned);
  std::memcpy(b.pinned + b.off_runs, runs.data(), runs.size_bytes());
  std::copy(m.slot.begin(), m.slot.end(), b.pinned + b.off_tslot);
  std::copy(m.pos.begin(), m.pos.end(), b.pinned + b.off_tpos);
  std::copy(rows.begin(), rows.end(), b.pinned + b.off_rows);
  CUDA_CHECK(cudaMemcpyAsync(b.dev, b.pinned, total * 4, cudaMemcpyHostToDevice, ctx_.stream));
  CUDA_CHECK(cudaEventRecord(b.uploaded, ctx_.stream));
}

void CudaBackend::set_batch_trees(std::span<const SeqRun> runs, std::span<const std::span<const int32_t>> parents) {
  QWEN36_CHECK(runs.size() == parents.size(), "set_batch_trees: {} runs, {} parent lists", runs.size(), parents.size());
  cuda::TreeTables& tt = ctx_.trees;
  tt.trees.clear();
  const int64_t T = int64_t(ctx_.batch.tokens.size());
  // Each tree's region: its size depends on the tree's token count and T only (even offsets:
  // the masks are 8-byte words). A leaf path holds at most count tokens, so the paths' rows
  // fit in count · (count + 1) / 2.
  auto even = [](size_t n) { return (n + 1) & ~size_t(1); };
  size_t total = 0;
  for (size_t j = 0; j < runs.size(); ++j) {
    const SeqRun& r = runs[j];
    tree_ops::check_tree(r, parents[j]);
    if (r.count > cuda::kMaxTreeTokens) continue;  // such a tree takes the composition
    QWEN36_CHECK(r.begin >= 0 && r.begin + r.count <= T, "set_batch_trees: rows {} .. +{} of {}", r.begin, r.count, T);
    cuda::TreeTable t;
    t.run = r;
    t.parent.assign(parents[j].begin(), parents[j].end());
    const size_t n = size_t(r.count);
    t.off = total;
    t.off_pos = t.off + even(n);
    t.off_mask = t.off_pos + even(size_t(T));
    t.off_base = t.off_mask + 2 * size_t(T);
    t.off_paths = t.off_base + even(size_t(T));
    t.off_rows = t.off_paths + 4 * n;
    t.off_first = t.off_rows + even(n * (n + 1) / 2);
    total = t.off_first + even(n);
    tt.trees.push_back(std::move(t));
  }
  if (total == 0) return;
  table_room(tt.dev, tt.pinned, tt.cap, tt.uploaded, total, size_t(1) << 14);
  int32_t* h = tt.pinned;
  std::fill(h, h + total, 0);
  for (const cuda::TreeTable& t : tt.trees) {
    const SeqRun& r = t.run;
    std::copy(t.parent.begin(), t.parent.end(), h + t.off);
    const std::vector<int32_t> depth = cpu::tree_depths(t.parent);
    std::fill(h + t.off_pos, h + t.off_pos + T, -1);
    for (int32_t i = 0; i < r.count; ++i) h[t.off_pos + size_t(r.begin + i)] = r.pos0 + depth[size_t(i)];
    const std::vector<uint64_t> mask = tree_masks(r, t.parent, T);
    std::memcpy(h + t.off_mask, mask.data(), mask.size() * sizeof(uint64_t));
    std::fill(h + t.off_base, h + t.off_base + T, r.pos0);
    const tree_ops::Paths p = tree_ops::leaf_paths(r, t.parent);
    // (L leaves' paths hold at most n − L + 1 tokens each: L · (n − L + 1) ≤ n · (n + 1) / 2)
    QWEN36_CHECK(p.rows.size() <= size_t(r.count) * size_t(r.count + 1) / 2 && p.runs.size() <= size_t(r.count),
                 "set_batch_trees: {} leaf paths of {} rows for {} tokens", p.runs.size(), p.rows.size(), r.count);
    std::vector<SeqRun> padded(p.runs);
    padded.resize(size_t(r.count), SeqRun{r.slot, r.pos0, 0, 0});  // empty runs: blocks that return at once
    std::memcpy(h + t.off_paths, padded.data(), padded.size() * sizeof(SeqRun));
    std::copy(p.rows.begin(), p.rows.end(), h + t.off_rows);
    std::copy(p.last.begin(), p.last.end(), h + t.off_first);
  }
  CUDA_CHECK(cudaMemcpyAsync(tt.dev, tt.pinned, total * 4, cudaMemcpyHostToDevice, ctx_.stream));
  CUDA_CHECK(cudaEventRecord(tt.uploaded, ctx_.stream));
}

// Every weight tensor of `w`, once per distinct data pointer (a tied head is its embedding).
std::vector<Tensor*> weight_tensors(ModelWeights& w) {
  std::vector<Tensor*> v{&w.embed_tokens, &w.final_norm, &w.lm_head};
  auto mlp = [&](MlpWeights& m) { v.insert(v.end(), {&m.gate_proj, &m.up_proj, &m.down_proj}); };
  auto layer = [&](LayerWeights& l) {
    v.insert(v.end(), {&l.input_norm, &l.post_attention_norm, &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj,
                       &l.attn.o_proj, &l.attn.q_norm, &l.attn.k_norm, &l.deltanet.in_proj_qkv,
                       &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.conv1d,
                       &l.deltanet.dt_bias, &l.deltanet.a_neg_exp, &l.deltanet.norm, &l.deltanet.out_proj,
                       &l.moe.router, &l.moe.shared_gate});
    mlp(l.mlp);
    mlp(l.moe.shared);
    for (auto& e : l.moe.experts) mlp(e);
  };
  for (auto& l : w.layers) layer(l);
  if (w.mtp) {
    v.insert(v.end(), {&w.mtp->fc, &w.mtp->pre_fc_norm_embedding, &w.mtp->pre_fc_norm_hidden, &w.mtp->norm});
    layer(w.mtp->layer);
  }
  std::vector<Tensor*> out;
  for (Tensor* t : v)
    if (!t->empty()) out.push_back(t);
  return out;
}

size_t CudaBackend::resident_bytes(ModelWeights& w) {
  size_t bytes = 0;
  for (const Tensor* t : weight_tensors(w))
    if (is_device_pointer(t->data)) bytes += t->nbytes();
  return bytes;
}

void CudaBackend::prepare_weights_except(ModelWeights& w, const std::set<const Tensor*>& keep) {
  QWEN36_CHECK(weights_ == nullptr, "CUDA backend: prepare_weights called twice (one model per backend)");
  for (const LayerWeights& l : w.layers)
    if (!l.moe.experts.empty()) {
      const DType t = l.moe.experts[0].gate_proj.dtype;
      ctx_.route_release_early = t == DType::BF16 || t == DType::F16;
      break;
    }
  std::vector<Tensor*> all = weight_tensors(w);
  // Kept tensors stay host pointers (routed experts a host backend computes); tile_weights
  // tiles a layer's experts only when all of them are in device memory, so these keep the
  // GGUF layout the host backend reads.
  all.erase(std::remove_if(all.begin(), all.end(), [&](const Tensor* t) { return keep.count(t) > 0; }), all.end());
  // Host pointer → offset in the device block; tensors already on the device stay put.
  std::map<const void*, size_t> offset;
  size_t total = 0;
  int on_device = 0;
  for (Tensor* t : all) {
    if (offset.count(t->data)) continue;
    if (is_device_pointer(t->data)) {
      ++on_device;
      continue;
    }
    offset[t->data] = total;
    total += (t->nbytes() + 255) / 256 * 256;
  }
  if (total == 0) return tile_weights(w);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  QWEN36_CHECK(total < free_b, "CUDA backend: the weights need {} GiB but only {} GiB of device memory is free",
               double(total) / (1 << 30), double(free_b) / (1 << 30));
  CUDA_CHECK(cudaMalloc(&weights_, total));
  auto* base = static_cast<std::byte*>(weights_);
  std::map<const void*, bool> copied;
  for (Tensor* t : all) {
    auto it = offset.find(t->data);
    if (it == offset.end()) continue;
    void* dev = base + it->second;
    if (!copied[t->data]) {
      CUDA_CHECK(cudaMemcpy(dev, t->data, t->nbytes(), cudaMemcpyHostToDevice));
      copied[t->data] = true;
    }
  }
  for (Tensor* t : all) {
    auto it = offset.find(t->data);
    if (it != offset.end()) t->data = base + it->second;
  }
  // Every tensor now lives on the device: the host copies (mapped files, buffers) can go.
  if (on_device == 0 && keep.empty()) w.storage.clear();
  tile_weights(w);
}

// The projections that only go through matmul / matmul_multi / matmul_swiglu / mlp are repacked
// into the tiled layout of the tensor-core GEMM (cuda_quant_mma.cu) where type and shape allow,
// and so are routed experts (per-expert views; each expert's bytes are contiguous, so a view
// tiles in place) for moe_experts' tensor-core path: a layer's experts all or none (the op
// takes one layout per layer), and only those in device memory (expert offload leaves a layer's
// experts on the host for the CPU backend). Never the embedding (rows are read by token) nor
// anything sharing storage with a tensor not tiled (a tied lm_head). QWEN36_NO_TILE=1 keeps
// the GGUF layout.
void CudaBackend::tile_weights(ModelWeights& w) {
  const TileChoice choice = tile_choice();
  if (!choice.dense && !choice.experts) return;
  const bool tile_dense = choice.dense, tile_experts = choice.experts;
  std::vector<Tensor*> cand;
  if (tile_dense) cand.push_back(&w.lm_head);
  auto mlp = [&](MlpWeights& m) {
    if (tile_dense) cand.insert(cand.end(), {&m.gate_proj, &m.up_proj, &m.down_proj});
  };
  std::vector<std::vector<Tensor*>> expert_sets;  // per layer whose experts are candidates
  auto experts = [&](MoeWeights& m) {
    std::vector<Tensor*> v;
    if (!tile_experts) return;
    for (MlpWeights& e : m.experts) v.insert(v.end(), {&e.gate_proj, &e.up_proj, &e.down_proj});
    if (v.empty() || !std::all_of(v.begin(), v.end(), [](const Tensor* t) {
          return cuda::quant_tile_ok(*t) && is_device_pointer(t->data);
        }))
      return;
    cand.insert(cand.end(), v.begin(), v.end());
    expert_sets.push_back(std::move(v));
  };
  auto layer = [&](LayerWeights& l) {
    if (tile_dense)
      cand.insert(cand.end(), {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj,
                               &l.deltanet.in_proj_qkv, &l.deltanet.in_proj_z, &l.deltanet.in_proj_b,
                               &l.deltanet.in_proj_a, &l.deltanet.out_proj, &l.moe.router, &l.moe.shared_gate});
    mlp(l.mlp);
    mlp(l.moe.shared);
    experts(l.moe);
  };
  for (auto& l : w.layers) layer(l);
  if (w.mtp) {
    if (tile_dense) cand.push_back(&w.mtp->fc);
    layer(w.mtp->layer);
  }
  std::set<const Tensor*> is_cand(cand.begin(), cand.end());
  std::set<const void*> keep;  // storage that some other tensor reads
  for (Tensor* t : weight_tensors(w))
    if (!is_cand.count(t)) keep.insert(t->data);
  // A layer's experts are tiled all or none: one kept (shared) storage keeps the whole set.
  for (const std::vector<Tensor*>& v : expert_sets)
    if (std::any_of(v.begin(), v.end(), [&](const Tensor* t) { return keep.count(t->data) > 0; }))
      for (const Tensor* t : v) keep.insert(t->data);
  std::map<const void*, std::vector<Tensor*>> by_data;
  for (Tensor* t : cand)
    if (!t->empty() && !keep.count(t->data)) by_data[t->data].push_back(t);
  int tiled = 0;
  for (auto& [data, ts] : by_data) {
    const bool same = std::all_of(ts.begin(), ts.end(), [&](const Tensor* t) {
      return t->dtype == ts[0]->dtype && t->ndim == ts[0]->ndim && t->shape == ts[0]->shape;
    });
    if (!same || !cuda::quant_tile(ctx_, *ts[0])) continue;
    for (Tensor* t : ts) t->dtype = ts[0]->dtype;
    ++tiled;
  }
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  (void)tiled;
}

}  // namespace

bool cuda_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e)
                                     : std::string("no CUDA device present");
    cudaGetLastError();
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& opts) { return std::make_unique<CudaBackend>(opts); }

std::string cuda_device_name(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

void cuda_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

namespace {

// The fastest of `reps` timed runs of `run` (ms, events on the default stream), after one
// untimed warm-up run.
template <class F>
float best_ms(int reps, F&& run) {
  run();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(e0);
    run();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

}  // namespace

double cuda_copy_bandwidth_gbs(size_t bytes, int reps) {
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMemset(a, 1, bytes));
  CUDA_CHECK(cudaMemset(b, 0, bytes));
  const float best = best_ms(reps, [&] { CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (double(best) * 1e-3) / 1e9;
}

double cuda_bf16_gemm_tflops(int n, int reps) {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  const size_t e = size_t(n) * size_t(n);
  CUDA_CHECK(cudaMalloc(&a, e * 2));
  CUDA_CHECK(cudaMalloc(&b, e * 2));
  CUDA_CHECK(cudaMalloc(&c, e * 2));
  CUDA_CHECK(cudaMemset(a, 0x3c, e * 2));  // bf16 0x3c3c ≈ 0.0115: finite, non-zero
  CUDA_CHECK(cudaMemset(b, 0x3c, e * 2));
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  const float one = 1, zero = 0;
  const float best = best_ms(reps, [&] {
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero,
                              c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * double(n) * n * n / (double(best) * 1e-3) / 1e12;
}

}  // namespace qwen36
