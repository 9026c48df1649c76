// The CUDA backend: device memory (stream-ordered pool), weight upload, and dispatch of
// every Backend op to the kernels of cuda_*.cu. All work runs on one stream; copies to the
// host synchronise it.
#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"

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

void check_weight_dtype(const Tensor& w, const char* op) {
  QWEN36_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F16 || w.dtype == DType::F32,
               "{}: weight dtype {} is not supported by the CUDA backend (bf16, f16, f32)", op, dtype_name(w.dtype));
}

}  // namespace cuda

namespace {

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
    // Keep freed pool memory cached: every forward allocates its activations again.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, o.device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream);
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
  void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) override {
    cuda::copy_cols(ctx_, src, src_col0, dst, dst_col0, width);
  }
  void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst) override {
    cuda::get_rows(ctx_, src, rows, dst);
  }
  void prepare_weights(ModelWeights& w) override;

  void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override {
    cuda::embed(ctx_, table, ids, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    cuda::rms_norm(ctx_, x, w, eps, out);
  }
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) override {
    cuda::gated_rms_norm(ctx_, x, z, w, eps, out);
  }
  void add(Tensor& y, const Tensor& x) override { cuda::add(ctx_, y, x); }
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override { cuda::swiglu(ctx_, gate, up, out); }
  void sigmoid_mul(Tensor& x, const Tensor& gate) override { cuda::sigmoid_mul(ctx_, x, gate); }
  void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) override {
    cuda::add_sigmoid_scaled(ctx_, y, x, s);
  }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override { cuda::matmul(ctx_, x, w, out); }
  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override { cuda::split_q_gate(ctx_, qg, q, gate); }
  void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) override {
    cuda::rope(ctx_, x, runs, rotary_dim, theta);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                 std::span<const SeqRun> runs, float scale, Tensor& out) override {
    cuda::attention(ctx_, q, k, v, k_cache, v_cache, runs, scale, out);
  }
  void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) override {
    cuda::causal_conv1d_silu(ctx_, x, w, conv_state, runs);
  }
  void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias, Tensor& g,
                      Tensor& beta) override {
    cuda::deltanet_gates(ctx_, a, b, a_neg_exp, dt_bias, g, beta);
  }
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) override {
    cuda::gated_delta_rule(ctx_, q, k, v, g, beta, state, runs, out, mode);
  }
  void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) override {
    cuda::moe_route(ctx_, logits, k, renorm, weights, ids);
  }
  void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                   Tensor& out) override {
    cuda::moe_experts(ctx_, x, weights, ids, experts, out);
  }

 private:
  cuda::Ctx ctx_;
  void* weights_ = nullptr;  // one allocation holding every uploaded weight
};

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

void CudaBackend::prepare_weights(ModelWeights& w) {
  QWEN36_CHECK(weights_ == nullptr, "CUDA backend: prepare_weights called twice (one model per backend)");
  std::vector<Tensor*> all = weight_tensors(w);
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
  if (total == 0) return;
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
  if (on_device == 0) w.storage.clear();
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

double cuda_copy_bandwidth_gbs(size_t bytes, int reps) {
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMemset(a, 1, bytes));
  CUDA_CHECK(cudaMemset(b, 0, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(e0);
    CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
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
  auto run = [&] {
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero,
                              c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
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
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * double(n) * n * n / (double(best) * 1e-3) / 1e12;
}

}  // namespace qwen36
