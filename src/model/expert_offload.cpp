// Expert offload (issue 11): the host-placed layers' routed experts computed by the CPU backend
// (a one-token pass on a pipeline of host workers, beside a share on the main backend) or
// streamed to the main backend for large batches; the staging memory of both. Model's
// members in qwen36.h ("expert offload" there); the layer code that calls in: moe_block in
// qwen36.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <set>
#include <unordered_map>

#include <omp.h>
#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_moe_pass.h"
#include "backend/cpu/host_pool.h"
#include "core/error.h"
#include "model/host_expert_copy.h"
#include "model/qwen36.h"

namespace qwen36 {

// Expert offload's decode pipeline (qwen36.h; host_moe_experts, finish_host_pass).
struct Model::HostPipeline {
  std::unique_ptr<cpu::HostPool> pool;
  std::unique_ptr<cpu::MoePass> in_flight;  // the pass the workers are on (null: none)
  std::atomic<uint64_t>* signal = nullptr;  // backend_.host_signal()
  bool open = false;      // inside forward_rank's layer loop, which finishes the last pass
  // Pipelined passes, logged once (debug level) when the model goes: mean ms of the routing
  // copy, of queuing (the device's work and the sum's upload), of waiting for the pool.
  int64_t passes = 0;
  double ms[3] = {};
  ~HostPipeline() {
    if (pool) pool->join();
    if (passes == 0) return;
    const double n = double(passes);
    spdlog::debug("host experts, {} pipelined one-token passes, mean ms: routing and x to host {:.3f}, device work "
                  "queued {:.3f}, waiting for the host's experts {:.3f}",
                  passes, ms[0] / n, ms[1] / n, ms[2] / n);
  }
};

void Model::init_offload(int host_threads) {
  QWEN36_CHECK(int64_t(placement_.host.size()) == w_.config.n_layers && w_.config.moe,
               "expert placement for {} layers on a {}-layer {} model", placement_.host.size(), w_.config.n_layers,
               w_.config.moe ? "MoE" : "dense");
  // Each step's time at debug level: on a sandboxed host one of them took minutes (not yet
  // known which), and this is where to look.
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* what) {
    const auto t1 = std::chrono::steady_clock::now();
    spdlog::debug("expert offload: {} in {:.0f} ms", what, std::chrono::duration<double, std::milli>(t1 - t0).count());
    t0 = t1;
  };
  const std::set<const Tensor*> host_tensors = host_expert_tensors(w_, placement_);
  lap("host experts listed");
  backend_.prepare_weights_except(w_, host_tensors);
  lap("other weights on the device");
  const ExpertStreamCost cost = expert_stream_cost();
  if (cost.pin && backend_.free_memory() != 0) {  // a device main backend (a host one reads them in place)
    host_copy_ = HostExpertCopy::make(backend_, w_, placement_.host);
    lap("host experts page-locked");
  }
  host_ = make_cpu_backend(host_threads);
  staging_ = std::make_shared<HostStaging>();
  if (backend_.free_memory() != 0) staging_->pin(backend_, w_.config.n_experts_per_tok, w_.config.hidden_size);
  if (staging_->pinned && cost.pipeline) {
    if (std::atomic<uint64_t>* signal = backend_.host_signal()) {
      pipeline_ = std::make_shared<HostPipeline>();
      pipeline_->signal = signal;
      // The calling thread joins in at finish_host_pass: one worker fewer than the host's threads.
      const int threads = host_threads > 0 ? host_threads : omp_get_max_threads();
      pipeline_->pool = std::make_unique<cpu::HostPool>(std::max(1, threads - 1));
    }
  }
  lap("host backend made");
  init_expert_stream();
  lap("expert stream set up");
  // The device share of one-token passes goes through the streaming staging area.
  device_share_ = stream_ ? int(std::min<int64_t>(cost.device_share, w_.config.n_experts_per_tok - 1)) : 0;
  if (device_share_ > 0) init_share_slots();
  if (device_share_ > 0)
    spdlog::info("expert offload: {} of {} routed experts per token of a decode pass on the main backend "
                 "(QWEN36_MOE_DEVICE_SHARE)", device_share_, w_.config.n_experts_per_tok);
  else if (cost.device_share > 0)
    spdlog::debug("expert offload: decode passes entirely on the host (no staging area: QWEN36_MOE_STREAM=never, or "
                  "a host main backend)");
}

void Model::set_pipeline_open(bool open) {
  if (pipeline_) pipeline_->open = open;
}

// ---- expert offload's decode pipeline (Model::HostPipeline: top of the file) ----

int64_t Model::pipelined_host_passes() const { return pipeline_ ? pipeline_->passes : 0; }

void Model::finish_host_pass() {
  HostPipeline* p = pipeline_.get();
  if (!p || !p->in_flight) return;
  const auto t0 = std::chrono::steady_clock::now();
  p->pool->join();  // the pass raised the signal when it ended
  p->in_flight.reset();
  p->ms[2] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Model::host_moe_experts(const Tensor& x, Tensor& pack, std::span<const MlpWeights> experts, Tensor& y,
                             Tensor& spare, const std::function<void()>& device_work) {
  finish_host_pass();  // the previous layer's (pipeline): its sum must be in before this routing copy waits
  const int64_t T = x.rows(), D = x.cols(), K = w_.config.n_experts_per_tok;
  const HostPack hp(T, K, D);
  const Tensor weights = hp.weights(pack.data), ids = hp.ids(pack.data);
  HostStaging& h = *staging_;
  // Where a pass's time goes (debug level, passes of more than one token: a prefill logs once
  // per layer): on the GPU machine's sandboxed host a 512-token pass with host experts did not
  // finish in a minute, one thread busy in the kernel, and this is where to look.
  auto t0 = std::chrono::steady_clock::now();
  auto ms = [&] {
    const auto t1 = std::chrono::steady_clock::now();
    const double d = std::chrono::duration<double, std::milli>(t1 - t0).count();
    t0 = t1;
    return d;
  };
  // Which experts the pass routes to decides between the host and streaming
  // (stream_moe_experts), which needs only the routing on the host: a pass that may stream
  // copies the routing first and x only when the host computes; any other (decode) copies
  // routing and x together, one wait for the stream instead of two.
  const bool may_stream = may_stream_experts(T);
  const bool pinned = h.pinned && T <= HostStaging::kPinnedTokens;
  if (!pinned) {
    h.pack.resize(size_t(hp.floats()) * sizeof(float));
    h.y.resize(size_t(T * D));
  }
  std::byte* host_pack = pinned ? h.pinned : h.pack.data();
  float* host_y = pinned ? reinterpret_cast<float*>(h.pinned + h.pinned_y) : h.y.data();
  Tensor head(pack.data, DType::F32, {hp.x_offset()});
  if (!may_stream) {
    Tensor xpart = hp.x(pack.data);
    backend_.copy(x, xpart);
  }
  backend_.copy_to_host(may_stream ? head : pack, host_pack);
  const Tensor hw = hp.weights(host_pack), hi = hp.ids(host_pack);
  const double t_route = ms();
  // Above the exact path's pair bound, experts it would take stream whatever the cost model
  // says: the main backend's moe_experts is then the all-GPU run's computation exactly (the
  // host's would not be).
  const bool decide = !cpu::MoePass::exact_for(experts);
  if (may_stream && stream_moe_experts(x, weights, ids, std::span(hi.as<const int32_t>(), size_t(T * K)), experts, y,
                                       device_work, decide)) {
    if (T > 1) spdlog::debug("host experts, {} tokens: routing to host {:.1f} ms, streamed {:.1f} ms", T, t_route, ms());
    return;
  }
  Tensor hx = hp.x(host_pack);
  if (may_stream) backend_.copy_to_host(x, hx.data);
  // A one-token pass may give the main backend the token's first `share` routed experts (their
  // weights uploaded into the staging area, by DMA from the page-locked copy) while the host
  // computes the other K − share: both are bound by moving the weights out of host memory, and
  // the copy engine and the cores together beat the cores alone. y gets the device's part, then
  // the host's is added (a different summation order from one backend's: not bitwise the same).
  int64_t share = T == 1 && !spare.empty() && streams_layer(experts) ? device_share_ : 0;
  // The device's work (its share: uploads and kernels; then device_work) runs while the host
  // computes.
  auto queue_device = [&] {
    if (share == 0) return device_work();
    const Tensor dw(weights.data, DType::F32, {1, share}), di(ids.data, DType::I32, {1, share});
    const bool queued = stream_moe_experts(x, dw, di, std::span(hi.as<const int32_t>(), size_t(share)), experts, y,
                                           device_work, /*decide=*/false);
    QWEN36_CHECK(queued, "expert offload: the device share of a layer without a staging area");
  };
  Tensor hy(host_y, DType::F32, {T, D});
  const Tensor sw(hw.as<float>() + share, DType::F32, {T, K - share}),
      si(hi.as<int32_t>() + share, DType::I32, {T, K - share});
  const Tensor &host_w = share > 0 ? sw : hw, &host_ids = share > 0 ? si : hi;
  Tensor& sum = share > 0 ? spare : y;
  const size_t sum_bytes = size_t(T * D) * sizeof(float);
  // The pipeline (HostPipeline): the pass goes to the pool's workers and this thread queues the
  // device's work, then the sum's upload behind a wait for the host's signal, and returns to
  // queue the next layer. The pass raises the signal itself when its last item is done (so no
  // driver call of this thread that waits for the device can deadlock), and is joined at the
  // next host pass or when the layer loop ends. The sum lands in the page-locked staging,
  // which nothing touches until the next pass's routing copy, after the upload has run.
  if (HostPipeline* pipe = pipeline_.get(); pipe && pipe->open && T == 1 && pinned) {
    if (std::unique_ptr<cpu::MoePass> pass = cpu::MoePass::make(hx, host_w, host_ids, experts, hy)) {
      const uint64_t v = pipe->signal->load(std::memory_order_relaxed) + 1;
      pipe->pool->submit(*pass, pipe->signal, v);
      pipe->in_flight = std::move(pass);
      queue_device();
      backend_.wait_host_signal(v);
      backend_.upload(host_y, sum.data, sum_bytes);
      if (share > 0) backend_.add(y, spare);
      ++pipe->passes;
      pipe->ms[0] += t_route;
      pipe->ms[1] += ms();
      return;
    }
  }
  queue_device();
  const double t_out = ms();
  host_->moe_experts(hx, host_w, host_ids, experts, hy);
  const double t_host = ms();
  if (pinned)
    backend_.upload(host_y, sum.data, sum_bytes);
  else
    backend_.copy_from_host(host_y, sum);
  if (share > 0) backend_.add(y, spare);
  const double t_back = ms();
  if (T > 1) {
    spdlog::debug("host experts, {} tokens: routing (and x) to host {:.1f} ms, device work queued {:.1f} ms, host "
                  "experts {:.1f} ms, sum back {:.1f} ms",
                  T, t_route, t_out, t_host, t_back);
    return;
  }
  ++h.decode_passes;
  for (int i = 0; const double v : {t_route, t_out, t_host, t_back}) h.decode_ms[i++] += v;
}


void Model::HostStaging::pin(Backend& b, int64_t k, int64_t d) {
  const HostPack hp(kPinnedTokens, k, d);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  pinned_y = (size_t(hp.floats()) * sizeof(float) + page - 1) / page * page;
  // y: the host's sums [T, d], or on the exact path its pairs' rows [T · k, d].
  const size_t bytes = pinned_y + (size_t(kPinnedTokens * k * d) * sizeof(float) + page - 1) / page * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  if (!b.pin_host_memory(p, bytes, /*device_writes=*/true)) {
    munmap(p, bytes);
    return;
  }
  pinned_by = &b, pinned = static_cast<std::byte*>(p), pinned_bytes = bytes;
}

Model::HostStaging::~HostStaging() {
  if (pinned) {
    pinned_by->unpin_host_memory(pinned, pinned_bytes);
    munmap(pinned, pinned_bytes);
  }
  if (decode_passes == 0) return;
  const double n = double(decode_passes);
  spdlog::debug("host experts, {} one-token passes, mean ms: routing and x to host {:.3f}, device work {:.3f}, host "
                "experts {:.3f}, sum back {:.3f}",
                decode_passes, decode_ms[0] / n, decode_ms[1] / n, decode_ms[2] / n, decode_ms[3] / n);
}

// ---- streaming host-placed experts to the main backend (issue 11) ----
// A large prefill pass routes to nearly every expert of a layer, and its expert math grows with
// the tokens while the layer's bytes do not: for a 4096-token pass of 35B-A3B the host would
// need ~8 TFLOP for 40 layers, while uploading a layer (~0.45 GB at Q4_K_M) takes ~10-20 ms
// over PCIe. So per layer and pass, when stream_experts_faster says so, the experts some token
// routed to are uploaded into one staging area and the main backend's moe_experts runs on
// views of them (GGUF layout, never tiled: the CUDA op dequantizes untiled experts for its
// grouped GEMM). One staging area on the main stream: each upload is queued after the previous
// layer's moe_experts (which read the area) and before this one's, so the stream orders them
// and nothing waits on the host; the upload does not overlap the previous layer's compute (a
// second area, a copy stream and events would; not done). The staging layout mirrors the host
// storage: tensors contiguous on the host (a GGUF layer's gate, up and down blocks, expert
// after expert) stay contiguous, so a run of routed experts is one copy; anything else starts
// 256-byte aligned (the CUDA expert kernels need 16). Experts no token routed to keep whatever
// bytes the area held (another layer's): moe_experts reads only routed experts.
struct Model::ExpertStream {
  struct Piece {  // one tensor's bytes (tensors of one storage: one piece)
    const std::byte* src = nullptr;
    size_t dst = 0, bytes = 0;  // dst: offset in the staging area
    std::vector<int32_t> experts;  // the experts that read it
  };
  struct Layer {
    std::vector<Piece> pieces;                    // in host (and staging) address order
    std::vector<std::array<size_t, 3>> offsets;   // per expert: gate, up, down offsets
    std::vector<MlpWeights> views;                // the experts in the staging area: same dtypes, shapes
    std::vector<MlpWeights> tiled_views;          // the experts in `tiled` (with it only)
    size_t bytes = 0;                             // staging bytes the layer spans
  };
  ExpertStreamMode mode;
  ExpertStreamCost cost;
  std::unique_ptr<DeviceBuffer> buf;
  // Passes of more pairs than the main backend's exact rows take (Backend::moe_row_pairs) that
  // its tiled experts still compute on its int8 kernels (Backend::moe_tiled_pairs; CUDA: the
  // grouped kernels from 1,024 to 4,096 pairs): the routed experts repacked from the staging area
  // into `tiled` at the same offsets (Backend::tile_into), so that such a pass computes what the
  // all-GPU run's resident (tiled) experts compute, not the file layout's dequantizing path.
  // Null: every streamed pass reads the file layout.
  std::unique_ptr<DeviceBuffer> tiled;
  std::unordered_map<const MlpWeights*, Layer> layers;  // by the layer's host experts (span data)
  bool pinned = false;  // the host experts are page-locked (Model::host_copy_): uploads by DMA

  explicit ExpertStream(ExpertStreamMode m) : mode(m), cost(expert_stream_cost()) {}
  ExpertStream(const ExpertStream&) = delete;
  ExpertStream& operator=(const ExpertStream&) = delete;

  // Expert offload's exact path (host_moe_rows): the device share's experts repacked from the
  // staging area into slots of the main backend's expert layout (Backend::tile_into), slot j
  // holding the pass's j-th routed expert, seen as experts 0 .. share − 1 (a fixed pointer table
  // for the backend, whatever experts the pass routes to). Null slots: no exact device share.
  std::unique_ptr<DeviceBuffer> slots, slot_ids_buf;
  std::array<size_t, 3> slot_part{};  // gate, up, down offsets in a slot
  size_t slot_bytes = 0;
  std::vector<MlpWeights> slot_views;
  Tensor slot_ids;  // [1, share]: 0, 1, ...

  static const Tensor& part(const MlpWeights& m, int kind) {
    return kind == 0 ? m.gate_proj : kind == 1 ? m.up_proj : m.down_proj;
  }
  // One host-to-staging copy: the pieces routed experts read, runs contiguous in both memories
  // merged.
  struct Copy {
    const std::byte* src;
    size_t dst, bytes;
  };
  // The copies that bring in the experts `used` marks; touched: their bytes (B_touched).
  static std::vector<Copy> copies_for(const Layer& l, const std::vector<uint8_t>& used, size_t& touched) {
    std::vector<Copy> copies;
    touched = 0;
    for (const Piece& p : l.pieces) {
      if (std::none_of(p.experts.begin(), p.experts.end(), [&](int32_t e) { return used[size_t(e)] != 0; })) continue;
      touched += p.bytes;
      if (!copies.empty() && copies.back().src + copies.back().bytes == p.src &&
          copies.back().dst + copies.back().bytes == p.dst)
        copies.back().bytes += p.bytes;
      else
        copies.push_back({p.src, p.dst, p.bytes});
    }
    return copies;
  }
  // One part to repack (Backend::tile_into): its bytes, where the repacked bytes go, and the
  // view that then points at them.
  struct TileJob {
    const Tensor* src;
    void* dst;
    Tensor* view;
  };
  // Every job's part repacked in one tile_into call, each view set; false (views untouched) when
  // the backend does not repack them.
  static bool tile_parts(Backend& b, std::span<const TileJob> jobs) {
    std::vector<Tensor> src, out(jobs.size());
    std::vector<void*> dst;
    for (const TileJob& j : jobs) src.push_back(*j.src), dst.push_back(j.dst);
    if (!b.tile_into(src, dst, out)) return false;
    for (size_t i = 0; i < jobs.size(); ++i) *jobs[i].view = out[i];
    return true;
  }
  // Layer l's experts `experts` repacked from the staging area into `tiled` at the same offsets,
  // l.tiled_views updated; false when the backend does not repack them.
  bool tile(Backend& b, Layer& l, std::span<const int32_t> experts) const {
    auto* from = static_cast<std::byte*>(buf->data());
    auto* to = static_cast<std::byte*>(tiled->data());
    std::vector<TileJob> jobs;
    for (const int32_t e : experts)
      for (int kind = 0; kind < 3; ++kind)
        if (const Tensor& t = part(l.views[size_t(e)], kind); !t.empty())
          jobs.push_back({&t, to + (static_cast<const std::byte*>(t.data) - from), &part(l.tiled_views[size_t(e)], kind)});
    return tile_parts(b, jobs);
  }
  void upload(Backend& b, const std::vector<Copy>& copies) const {
    auto* base = static_cast<std::byte*>(buf->data());
    std::vector<Backend::UploadPiece> pieces;
    pieces.reserve(copies.size());
    for (const Copy& c : copies) pieces.push_back({c.src, base + c.dst, c.bytes});
    b.upload_batch(pieces);
  }
  static Tensor& part(MlpWeights& m, int kind) {
    return kind == 0 ? m.gate_proj : kind == 1 ? m.up_proj : m.down_proj;
  }
  // Lays out a host layer's experts in the staging area in host address order, so that bytes
  // contiguous on the host are contiguous here too, whatever the tensors' order in the file.
  void add_layer(std::span<const MlpWeights> experts) {
    Layer& l = layers[experts.data()];
    l.views.assign(experts.begin(), experts.end());
    l.offsets.assign(experts.size(), {0, 0, 0});
    struct Ref {
      const std::byte* src;
      size_t bytes;
      int32_t expert;
      int kind;
    };
    std::vector<Ref> refs;
    for (size_t e = 0; e < experts.size(); ++e)
      for (int kind = 0; kind < 3; ++kind)
        if (const Tensor& t = part(experts[e], kind); !t.empty())
          refs.push_back({static_cast<const std::byte*>(t.data), t.nbytes(), int32_t(e), kind});
    std::stable_sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.src < b.src; });
    const std::byte* prev_end = nullptr;
    size_t cur = 0;
    for (const Ref& r : refs) {
      if (!l.pieces.empty() && l.pieces.back().src == r.src && l.pieces.back().bytes == r.bytes) {  // shared storage
        l.pieces.back().experts.push_back(r.expert);
        l.offsets[size_t(r.expert)][size_t(r.kind)] = l.pieces.back().dst;
        continue;
      }
      const size_t dst = r.src == prev_end && cur % 16 == 0 ? cur : (cur + 255) / 256 * 256;
      l.pieces.push_back({r.src, dst, r.bytes, {r.expert}});
      l.offsets[size_t(r.expert)][size_t(r.kind)] = dst;
      cur = dst + r.bytes;
      prev_end = r.src + r.bytes;
    }
    l.bytes = cur;
  }
};

void Model::init_expert_stream() {
  const ExpertStreamMode mode = expert_stream_mode();
  // auto on a host main backend (free_memory 0: untracked host memory) would copy host memory
  // to host memory for nothing.
  if (mode == ExpertStreamMode::Never || (mode == ExpertStreamMode::Auto && backend_.free_memory() == 0)) return;
  auto st = std::make_shared<ExpertStream>(mode);
  st->pinned = host_copy_ != nullptr;
  size_t need = 0;
  for (size_t i = 0; i < w_.layers.size() && i < placement_.host.size(); ++i) {
    if (!placement_.host[i] || w_.layers[i].moe.experts.empty()) continue;
    st->add_layer(w_.layers[i].moe.experts);
    need = std::max(need, st->layers[w_.layers[i].moe.experts.data()].bytes);
  }
  if (need == 0) return;
  st->buf = backend_.alloc(need);  // now, so that the memory plan's check sees it taken (memory_plan.h)
  auto* base = static_cast<std::byte*>(st->buf->data());
  for (auto& [key, l] : st->layers)
    for (size_t e = 0; e < l.views.size(); ++e)
      for (int kind = 0; kind < 3; ++kind) {
        Tensor& t = ExpertStream::part(l.views[e], kind);
        if (!t.empty()) t.data = base + l.offsets[e][size_t(kind)];
      }
  stream_ = std::move(st);
  if (backend_.moe_tiled_pairs() > backend_.moe_row_pairs()) init_tiled_stream(need);
}

void Model::init_tiled_stream(size_t bytes) {
  ExpertStream& st = *stream_;
  st.tiled = backend_.alloc(bytes);
  auto* from = static_cast<std::byte*>(st.buf->data());
  auto* to = static_cast<std::byte*>(st.tiled->data());
  for (auto& [key, l] : st.layers) {
    // Whether the backend repacks this layer's experts, tried on expert 0 (whatever bytes the
    // area holds: a byte permutation); the others' views follow from its types (every expert of
    // a layer shares them) and their offsets.
    l.tiled_views = l.views;
    const int32_t first = 0;
    if (!st.tile(backend_, l, std::span(&first, 1))) {
      spdlog::debug("expert offload: the main backend does not repack streamed experts; they stay in the file layout");
      for (auto& [k2, l2] : st.layers) l2.tiled_views.clear();
      st.tiled.reset();
      return;
    }
    for (size_t e = 1; e < l.views.size(); ++e)
      for (int kind = 0; kind < 3; ++kind) {
        Tensor& t = ExpertStream::part(l.tiled_views[e], kind);
        if (t.empty()) continue;
        t.dtype = ExpertStream::part(l.tiled_views[0], kind).dtype;
        t.data = to + (static_cast<std::byte*>(t.data) - from);
      }
  }
}

bool Model::may_stream_experts(int64_t tokens) const {
  return stream_ && (stream_->mode == ExpertStreamMode::Always || tokens >= stream_->cost.min_tokens);
}

bool Model::streams_layer(std::span<const MlpWeights> experts) const {
  return stream_ && stream_->layers.contains(experts.data());
}

bool Model::stream_moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids,
                               std::span<const int32_t> host_ids, std::span<const MlpWeights> experts, Tensor& y,
                               const std::function<void()>& device_work, bool decide) {
  ExpertStream& st = *stream_;
  auto it = st.layers.find(experts.data());
  if (it == st.layers.end()) return false;
  ExpertStream::Layer& l = it->second;
  const int64_t E = int64_t(experts.size());
  std::vector<uint8_t> used(size_t(E), 0);
  for (const int32_t id : host_ids)
    if (id >= 0 && id < E) used[size_t(id)] = 1;
  size_t touched = 0;
  const std::vector<ExpertStream::Copy> copies = ExpertStream::copies_for(l, used, touched);
  if (decide && st.mode == ExpertStreamMode::Auto) {
    ExpertPassWork w;
    w.tokens = x.rows();
    w.k = ids.cols();
    w.intermediate = experts[0].gate_proj.rows();
    w.hidden = x.cols();
    w.upload_bytes = touched;
    w.pinned = st.pinned;
    if (!stream_experts_faster(w, st.cost)) return false;
  }
  st.upload(backend_, copies);
  if (st.tiled && x.rows() * ids.cols() <= backend_.moe_tiled_pairs()) {
    std::vector<int32_t> routed;
    for (int64_t e = 0; e < E; ++e)
      if (used[size_t(e)]) routed.push_back(int32_t(e));
    QWEN36_CHECK(st.tile(backend_, l, routed), "expert offload: the main backend did not repack the streamed experts");
    backend_.moe_experts(x, weights, ids, l.tiled_views, y);
  } else {
    backend_.moe_experts(x, weights, ids, l.views, y);
  }
  device_work();
  return true;
}

// ---- the exact path (issue 11: outputs identical to all-GPU execution) ----
// Where the main backend computes moe_experts as per-pair rows and one sum
// (Backend::moe_expert_rows / moe_combine_rows: the CUDA backend's tiled kernels up to their pair
// bound) and the host can compute those rows with the same arithmetic (cpu::MoePass's exact
// path, MoePass::exact_for), a host layer's pass is: the device share's rows on the main backend
// (its experts uploaded, then repacked into the slots), the other pairs' rows by the host, the
// host's rows uploaded next to them, and the main backend's sum over all rows in routing order
// with the shared expert folded as moe_experts_shared would fold it. Every float the all-GPU run
// adds is added here in the same order: the logits are bitwise those of all-GPU execution.
// QWEN36_MOE_EXACT=0 takes the other path (the host's sum added to the device share's: f32
// summation order differs, ~1e-7 relative).

bool Model::host_rows_exact(std::span<const MlpWeights> experts, int64_t T) const {
  return host_ && T * w_.config.n_experts_per_tok <= backend_.moe_row_pairs() && cpu::MoePass::exact_for(experts);
}

void Model::init_share_slots() {
  ExpertStream& st = *stream_;
  const int64_t share = device_share_;
  // A slot holds the largest expert of any host layer, each part at a fixed offset.
  std::array<size_t, 3> most{};
  for (const auto& [key, l] : st.layers)
    for (const MlpWeights& m : l.views)
      for (int kind = 0; kind < 3; ++kind) most[size_t(kind)] = std::max(most[size_t(kind)], ExpertStream::part(m, kind).nbytes());
  auto up256 = [](size_t n) { return (n + 255) / 256 * 256; };
  st.slot_part = {0, up256(most[0]), up256(most[0]) + up256(most[1])};
  st.slot_bytes = up256(st.slot_part[2] + most[2]);
  st.slots = backend_.alloc(size_t(share) * st.slot_bytes);
  st.slot_views.assign(size_t(share), MlpWeights{});
  // Whether the main backend repacks every host layer's experts (tried on expert 0's bytes in
  // the staging area, whatever they are: a byte permutation).
  for (const auto& [key, l] : st.layers)
    if (!tile_share(l.views, std::vector<int32_t>{0})) {
      st.slots.reset();
      return;
    }
  std::vector<int32_t> ids(static_cast<size_t>(share));
  for (int64_t j = 0; j < share; ++j) ids[size_t(j)] = int32_t(j);
  st.slot_ids_buf = backend_.alloc(ids.size() * sizeof(int32_t));
  st.slot_ids = Tensor(st.slot_ids_buf->data(), DType::I32, {1, share});
  backend_.copy_from_host(ids.data(), st.slot_ids);
}

bool Model::tile_share(std::span<const MlpWeights> views, std::span<const int32_t> experts) {
  ExpertStream& st = *stream_;
  auto* base = static_cast<std::byte*>(st.slots->data());
  std::vector<ExpertStream::TileJob> jobs;
  for (size_t j = 0; j < experts.size(); ++j)
    for (int kind = 0; kind < 3; ++kind)
      jobs.push_back({&ExpertStream::part(views[size_t(experts[j])], kind),
                      base + j * st.slot_bytes + st.slot_part[size_t(kind)], &ExpertStream::part(st.slot_views[j], kind)});
  return ExpertStream::tile_parts(backend_, jobs);
}

// The device share's rows: its experts uploaded into the staging area, repacked into the slots,
// their rows into rows [share, D].
void Model::share_rows(const Tensor& x, std::span<const int32_t> host_ids, std::span<const MlpWeights> experts,
                       Tensor& rows) {
  ExpertStream& st = *stream_;
  const ExpertStream::Layer& l = st.layers.at(experts.data());
  const int64_t share = int64_t(host_ids.size());
  std::vector<uint8_t> used(experts.size(), 0);
  for (const int32_t id : host_ids) used[size_t(id)] = 1;
  size_t touched = 0;
  st.upload(backend_, ExpertStream::copies_for(l, used, touched));
  QWEN36_CHECK(tile_share(l.views, host_ids), "expert offload: the main backend did not repack the device share's experts");
  const Tensor ids(st.slot_ids.data, DType::I32, {1, share});
  QWEN36_CHECK(backend_.moe_expert_rows(x, ids, std::span(st.slot_views.data(), size_t(share)), rows),
               "expert offload: the main backend did not compute the device share's rows");
}

bool Model::host_moe_rows(const Tensor& x, Tensor& pack, std::span<const MlpWeights> experts, Tensor& y, Tensor& rows,
                          const HostShared* sh, const std::function<void()>& device_work) {
  finish_host_pass();  // the previous layer's (pipeline): its rows must be in before this routing copy waits
  const int64_t T = x.rows(), D = x.cols(), K = w_.config.n_experts_per_tok;
  const HostPack hp(T, K, D);
  const Tensor weights = hp.weights(pack.data), ids = hp.ids(pack.data);
  HostStaging& h = *staging_;
  const bool pinned = h.pinned && T <= HostStaging::kPinnedTokens;
  if (!pinned) {
    h.pack.resize(size_t(hp.floats()) * sizeof(float));
    h.y.resize(size_t(T * K * D));
  }
  std::byte* host_pack = pinned ? h.pinned : h.pack.data();
  float* host_rows = pinned ? reinterpret_cast<float*>(h.pinned + h.pinned_y) : h.y.data();
  Tensor xpart = hp.x(pack.data);
  backend_.copy(x, xpart);
  backend_.copy_to_host(pack, host_pack);
  const Tensor hi = hp.ids(host_pack), hx = hp.x(host_pack);
  // A one-token pass gives the main backend its first `share` routed experts, as the other path.
  const int64_t share = T == 1 && stream_ && stream_->slots && streams_layer(experts) ? device_share_ : 0;
  const Tensor host_ids(hi.as<int32_t>() + share, DType::I32, {T, K - share});
  Tensor hrows(host_rows, DType::F32, {T * (K - share), D}), dev_rows(rows.as<float>() + share * D, DType::F32, {T * (K - share), D});
  bool folded = false;
  auto queue_device = [&] {
    folded = sh && backend_.moe_shared_row(experts, K, sh->gate, sh->up, sh->down, sh->row);
    if (!folded) device_work();  // (folded: its SwiGLU would overwrite sh->gate, which the row read)
    if (share == 0) return;
    Tensor share_out(rows.data, DType::F32, {share, D});
    share_rows(x, std::span(hi.as<const int32_t>(), size_t(share)), experts, share_out);
  };
  auto combine = [&] {
    backend_.moe_combine_rows(rows, weights, ids, int64_t(experts.size()), folded ? &sh->row : nullptr,
                              sh ? &sh->logit : nullptr, y);
  };
  if (HostPipeline* pipe = pipeline_.get(); pipe && pipe->open && T == 1 && pinned) {
    if (std::unique_ptr<cpu::MoePass> pass = cpu::MoePass::make_rows(hx, host_ids, experts, hrows)) {
      const uint64_t v = pipe->signal->load(std::memory_order_relaxed) + 1;
      pipe->pool->submit(*pass, pipe->signal, v);
      pipe->in_flight = std::move(pass);
      queue_device();
      backend_.wait_host_signal(v);
      backend_.upload(host_rows, dev_rows.data, size_t(dev_rows.nbytes()));
      combine();
      ++pipe->passes;
      return folded;
    }
  }
  queue_device();
  QWEN36_CHECK(host_->moe_expert_rows(hx, host_ids, experts, hrows), "expert offload: the host's exact pass did not apply");
  if (pinned)
    backend_.upload(host_rows, dev_rows.data, size_t(dev_rows.nbytes()));
  else
    backend_.copy_from_host(host_rows, dev_rows);
  combine();
  return folded;
}

}  // namespace qwen36
