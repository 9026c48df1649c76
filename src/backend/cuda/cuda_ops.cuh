#pragma once
// defines: the internal CUDA toolkit of the backend: error checks, the execution context
//          (stream, cuBLAS handle, options), stream-ordered temporaries, small device
//          helpers, and the op entry points implemented in cuda_*.cu. Included by .cu only.

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/scratch_stack.h"

// core/error.h is not included here: nvcc's front end cannot compile fmt's consteval
// format-string checks. .cu files format their messages with the small cuda::format below
// ("{}" placeholders, format specs ignored) and throw qwen36::Error via cuda_error.cpp.
namespace qwen36::cuda {
[[noreturn]] void throw_error(const std::string& message);  // throws qwen36::Error

inline void format_rest(std::ostringstream& o, std::string_view f) { o << f; }
template <typename A, typename... R>
void format_rest(std::ostringstream& o, std::string_view f, const A& a, const R&... r) {
  const size_t open = f.find('{');
  if (open == std::string_view::npos) {
    o << f;
    return;
  }
  const size_t close = f.find('}', open);
  o << f.substr(0, open) << a;
  format_rest(o, close == std::string_view::npos ? std::string_view() : f.substr(close + 1), r...);
}
template <typename... A>
std::string format(std::string_view f, const A&... a) {
  std::ostringstream o;
  format_rest(o, f, a...);
  return o.str();
}
template <typename... A>
[[noreturn]] void fail(std::string_view f, const A&... a) {
  throw_error(format(f, a...));
}
}  // namespace qwen36::cuda

#undef QWEN36_CHECK  // core/error.h's (via backend.h) formats with fmt, which nvcc cannot compile
#define QWEN36_CHECK(cond, ...)                   \
  do {                                            \
    if (!(cond)) ::qwen36::cuda::fail(__VA_ARGS__); \
  } while (0)

#define CUDA_CHECK(expr)                                                                               \
  do {                                                                                                 \
    const cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess) ::qwen36::cuda::fail("CUDA error {} at {}:{}: {}", cudaGetErrorName(err_),     \
                                            __FILE__, __LINE__, cudaGetErrorString(err_));            \
  } while (0)
#define CUBLAS_CHECK(expr)                                                                             \
  do {                                                                                                 \
    const cublasStatus_t st_ = (expr);                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      ::qwen36::cuda::fail("cuBLAS error {} at {}:{}", int(st_), __FILE__, __LINE__);                        \
  } while (0)
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

namespace qwen36::cuda {

struct DevInfo {
  int sms = 0, smem_optin = 0, smem_per_sm = 0;
};
// The current device's SM count and opt-in shared memory per block, cached per device.
inline DevInfo dev_info() {
  static DevInfo cache[16];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  DevInfo& d = cache[dev & 15];
  if (d.sms == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  }
  return d;
}

struct ExpertTable {
  std::vector<const void*> host;  // [gate, up, down] per expert, to detect a reused span address
  void* dev = nullptr;
};

// The current forward pass's host tables (Backend::set_batch) and their device copy:
// [tokens | runs (4 ints each) | token slot | token position | output rows].
struct BatchTables {
  std::vector<int32_t> tokens, rows, tslot, tpos;
  std::vector<SeqRun> runs;
  int32_t* dev = nullptr;     // device copy
  int32_t* pinned = nullptr;  // staging for the upload
  size_t cap = 0;             // ints in dev and pinned
  size_t off_runs = 0, off_tslot = 0, off_tpos = 0, off_rows = 0;
  cudaEvent_t uploaded = nullptr;
};

// The tree ops' tables of the current pass's tree verify runs (Backend::set_batch_trees), each
// tree in a region of a fixed size for its token count and the batch's T, so that a recording's
// pointers hold for any tree of that size. Per tree, ints from `off`: parent [count], rope
// positions [T] (pos0 + depth on the tree's rows, −1 elsewhere: left as they are), ancestor masks
// [T] u64, mask bases [T], the leaf paths' runs [count] (padded with empty runs), their rows, and
// where in those rows each token first occurs [count].
// A tree verify run's tokens the CUDA tree ops take (kMaxTreeBudget + the root; one mask bit
// each); a larger tree has no table and takes the composition of chain ops.
constexpr int kMaxTreeTokens = 64;
struct TreeTable {
  SeqRun run;
  std::vector<int32_t> parent;
  size_t off = 0, off_pos = 0, off_mask = 0, off_base = 0, off_paths = 0, off_rows = 0, off_first = 0;
};
struct TreeTables {
  std::vector<TreeTable> trees;
  int32_t* dev = nullptr;
  int32_t* pinned = nullptr;
  size_t cap = 0;  // ints in dev and pinned
  cudaEvent_t uploaded = nullptr;
};

struct Ctx {
  cudaStream_t stream = nullptr;
  ScratchStack* scratch = nullptr;  // owned by the backend; null: every Temp is stream-ordered memory
  cublasHandle_t cublas = nullptr;
  bool exact_matmul = false;
  int64_t gemv_split_rows = 2048;  // GEMVs of at most this many rows split K across a block
  // A one-token moe_route lets the experts' kernels start at once (set for bf16 / f16 experts:
  // their decode kernels gain, the int8 tiled ones lose; bench/RESULTS.md, session 37).
  bool route_release_early = false;
  // The ids the last moe_route wrote when its kernel released its dependents only after its own
  // wait (else null): the experts' kernels of the next call reading those ids start after every
  // kernel before the route has ended, so they may read x before their own wait (x must not be
  // rewritten between the route and that call). The experts' call clears it.
  const void* routed_ids = nullptr;
  // MoE: experts span address → device table of [gate, up, down] pointers per expert
  std::unordered_map<const void*, ExpertTable> expert_tables;
  BatchTables batch;
  TreeTables trees;
  // small constant tables (RoPE frequencies, head orders) by content → device copy
  std::unordered_map<std::string, void*> constants;
  bool capturing = false;       // ops are being recorded into a graph (Backend::begin_capture)
  bool capture_failed = false;  // an op needed host work while recording: the recording is dropped
};


// An op's temporary: from the context's scratch stack when it fits, else stream-ordered memory
// (cudaMallocAsync / cudaFreeAsync on the context's stream).
template <typename T>
class Temp {
 public:
  Temp(const Ctx& c, size_t n) : stream_(c.stream), scratch_(c.scratch), n_(n) {
    if (n) p_ = static_cast<T*>(scratch_ ? scratch_->take(n * sizeof(T)) : nullptr);
    if (n && !p_) CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), stream_));
  }
  Temp(const Ctx& c, std::span<const T> host) : Temp(c, host.size()) {
    if (n_) CUDA_CHECK(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream_));
  }
  ~Temp() { release(); }
  Temp(const Temp&) = delete;
  Temp& operator=(const Temp&) = delete;
  // Replaces the contents with a copy of `host` (stream-ordered upload from pageable memory).
  T* assign(std::span<const T> host) {
    release();
    n_ = host.size();
    if (n_) {
      CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n_ * sizeof(T), stream_));
      CUDA_CHECK(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream_));
    }
    return p_;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_ && !(scratch_ && scratch_->give(p_))) cudaFreeAsync(p_, stream_);
    p_ = nullptr;
  }
  cudaStream_t stream_;
  ScratchStack* scratch_;
  size_t n_;
  T* p_ = nullptr;
};

// Device copies of host tables handed to an op. Spans equal to the current batch's tables
// (set_batch) read its device copy; small constant tables are uploaded once and cached;
// anything else is uploaded into `tmp` (not while recording: that marks the recording failed
// and returns null). `constant`: a table that recurs (a head order), cached by content.
const int32_t* dev_i32(Ctx& c, std::span<const int32_t> host, Temp<int32_t>& tmp, bool constant = false);
// A table of the model's (a layer's head order) as a device constant, cached by content; null
// while recording a table not seen before (the recording is then marked failed).
const int32_t* dev_constant_i32(Ctx& c, std::span<const int32_t> host);
const SeqRun* dev_runs(Ctx& c, std::span<const SeqRun> runs, Temp<SeqRun>& tmp);
// The current pass's table of the tree (run, parent) (set_batch_trees), or null.
const TreeTable* batch_tree(const Ctx& c, const SeqRun& run, std::span<const int32_t> parent);
// Whether a tree verify op's one-launch kernels take the tree (run, parent) of a pass of `rows`
// rows, and its table: a tree of at most kMaxTreeTokens, with a table or not while recording
// (then the op uploads its own). A malformed tree is refused (fail) as the composition refuses it.
struct TreeTake {
  bool take;               // the one-launch kernels run
  const TreeTable* table;  // set_batch_trees' table of the tree, or null (then uploads)
};
TreeTake tree_kernels_take(const Ctx& c, const SeqRun& run, std::span<const int32_t> parent, int64_t rows);
// The per-token slot and position of `runs` (T rows) on the device.
void dev_token_map(Ctx& c, std::span<const SeqRun> runs, int64_t T, Temp<int32_t>& slot_tmp, Temp<int32_t>& pos_tmp,
                   const int32_t** slot, const int32_t** pos);
const float* dev_const_f32(Ctx& c, std::span<const float> host);
// Work that needs the host in the middle of an op (a sync, an upload): false while recording,
// which marks the recording failed (the caller then skips the op; nothing of it runs anyway).
bool host_work_allowed(Ctx& c);

inline int blocks_for(int64_t n, int threads) { return int((n + threads - 1) / threads); }

// Runs set() once per device (`done`: a static mask of the devices done). For raising kernels'
// dynamic shared memory limits: a limit belongs to the kernel's instance on one device, so a
// process driving several GPUs (tensor parallelism, one thread per GPU) must raise it on each.
template <typename F>
void once_per_device(std::atomic<uint64_t>& done, F&& set) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev % 64);
  if (done.load(std::memory_order_acquire) & bit) return;
  set();
  done.fetch_or(bit, std::memory_order_release);
}

// A kernel variant switch of two named forms and auto: kFirstForm for a, kSecondForm for b,
// kAutoForm for null, empty, "auto" or anything else.
enum : int { kAutoForm = 0, kFirstForm = 1, kSecondForm = 2 };
inline int parse_variant(const char* v, const char* a, const char* b) {
  if (v == nullptr || *v == 0 || std::strcmp(v, "auto") == 0) return kAutoForm;
  if (std::strcmp(v, a) == 0) return kFirstForm;
  if (std::strcmp(v, b) == 0) return kSecondForm;
  return kAutoForm;
}
// The switch `env` read once into v (−1: not read yet; a test hook stores a choice, or −1 to
// read the environment again).
inline int variant(std::atomic<int>& v, const char* env, const char* a, const char* b) {
  int x = v.load(std::memory_order_relaxed);
  if (x < 0) {
    x = parse_variant(std::getenv(env), a, b);
    v.store(x, std::memory_order_relaxed);
  }
  return x;
}

// ---- device helpers ----
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Element i of a weight tensor of runtime dtype (F32, F16, BF16) as f32.
__device__ __forceinline__ float load_any(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// ---- programmatic dependent launch (Hopper and later) ----
// A kernel launched with launch_pdl may start while the kernel before it in the stream is
// still finishing: it must call griddep_wait() before reading that kernel's results or
// writing anything the kernel may still read. Work that depends on neither (streaming
// weights) goes before the wait, so a decode step's GEMVs start loading while the norm or
// GEMV before them drains. Kernels call griddep_trigger() once their blocks are running, to
// let a waiting dependent be scheduled. Both are no-ops before sm_90 and when not launched so.
// Results of earlier kernels are read with coherent loads (plain, __ldca or __ldcg), not __ldg: the
// non-coherent path assumes data read-only for the reader's whole lifetime, which under PDL
// overlaps the writer's. (The HF GEMV read its activations with __ldg: token-by-token decode of
// the W4 / NVFP4 fixtures went wrong by several logits with PDL, exact with QWEN36_NO_PDL=hf_gemv.)
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// An atomic add with acquire-release semantics at device scope: with a barrier before it
// (__syncwarp / __syncthreads) it publishes every participating thread's earlier stores, and
// with a barrier after it the last arriver's threads see every earlier arriver's — the
// "last block / warp finishes the reduction" pattern without two sequentially consistent
// __threadfence (ncu: those were ~8% of a T = 1 tiled GEMM's stall samples).
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

bool pdl_supported();                 // the current device is sm_90 or later (and QWEN36_NO_PDL ≠ 1)
bool pdl_allowed(const void* kernel);  // and the kernel is not named in QWEN36_NO_PDL's list
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_allowed(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The per-token (slot, position) of a batch laid out by runs (-1 for uncovered rows).
struct TokenMap {
  std::vector<int32_t> slot, pos;
};
TokenMap token_map(std::span<const SeqRun> runs, int64_t T);

void check_weight_dtype(const Tensor& w, const char* op);

// ---- ops (semantics: backend/backend.h) ----
void embed(Ctx&, const Tensor& table, std::span<const int32_t> ids, Tensor& out);
// embed over n ids already in device memory (Backend::embed_ids; checked where they were chosen).
void embed_rows(Ctx&, const Tensor& table, const int32_t* ids, int64_t n, Tensor& out);
void rms_norm(Ctx&, const Tensor& x, const Tensor& w, float eps, Tensor& out);
void gated_rms_norm(Ctx&, const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);
void add(Ctx&, Tensor& y, const Tensor& x);
void add_rms_norm(Ctx&, Tensor& y, const Tensor& delta, const Tensor& w, float eps, Tensor& out);
// y_out = y + delta (y_out is y, or a buffer overlapping neither), out = its norm, out also
// quantized into act (quant_act_bytes(rows, cols) bytes) for the tiled GEMM that reads it next
// (act null: not); false (nothing done) when act is given and the shape has no quantizing form.
bool add_rms_norm_quant(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                        Tensor& out, void* act);
// The same with out also rounded to bf16 into xh (rows × cols, 8-byte aligned) for the prefill
// GEMMs that read it; false (nothing done) where the shape has no vector form.
bool add_rms_norm_half(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                       Tensor& out, __nv_bfloat16* xh);
// gated_rms_norm's rows (D ≤ 512, more than one) rounded to bf16 into out, and x ⊙ sigmoid(gate)
// likewise (whole float4s, 16-byte aligned), for the prefill GEMM that reads them; false
// (nothing done) for other shapes.
bool gated_rms_norm_half(Ctx&, const Tensor& x, const Tensor& z, const Tensor& w, float eps, __nv_bfloat16* out);
bool sigmoid_mul_half(Ctx&, const Tensor& x, const Tensor& gate, __nv_bfloat16* out);
void swiglu(Ctx&, const Tensor& gate, const Tensor& up, Tensor& out);
// release_late: the launch after it starts only after its work (release_late_before).
void sigmoid_mul(Ctx&, Tensor& x, const Tensor& gate, bool release_late = false);
void add_sigmoid_scaled(Ctx&, Tensor& y, const Tensor& x, const Tensor& s);
void copy_cols(Ctx&, const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width);
// Backend::qk_norm_rope in one launch; false (nothing done) for shapes it does not take.
bool qk_norm_rope(Ctx&, const Tensor& qg, Tensor& q, Tensor* gate, Tensor& k, const Tensor& q_norm,
                  const Tensor& k_norm, float eps, std::span<const SeqRun> runs, int64_t rotary_dim, float theta);
void get_rows(Ctx&, const Tensor& src, std::span<const int32_t> rows, Tensor& dst);
// Backend::compact_rows in one launch per 32 tensors; false (nothing done) where a row is not
// whole 4-byte words or more than 64 rows move (cuda_compact_rows.cu).
bool compact_rows(Ctx&, std::span<Tensor> ts, std::span<const int32_t> from);
// get_rows with the row list already on the device (n rows)
void get_rows_dev(Ctx&, const float* src, int64_t D, const int32_t* rows, int64_t n, float* dst);

void matmul(Ctx&, const Tensor& x, const Tensor& w, Tensor& out);
// The prefill GEMM's parts (cuda_matmul.cu): x rounded to bf16 / f16 into xh, and out (row
// stride ldo) [T, N] = xh[T, K] · w[N, K]ᵀ, both bf16 or both f16, f32 accumulation.
void round_activations(Ctx&, const float* x, void* xh, int64_t n, bool to_bf16);
void gemm_half(Ctx&, const void* w, const void* xh, bool bf16, int T, int N, int K, float* out, int ldo);
// out[T, N] = x[T, K] · w[N, K]ᵀ for weights a kernel can only dequantize: slices of rows (a
// multiple of row_align, ≤ 96 M weights; 48 M with exact_matmul) go through dequant(n0, ns, dst,
// f32), which writes rows n0 .. n0 + ns − 1 to dst as bf16 (f32 when exact_matmul), and each
// slice is one cuBLAS GEMM into out's columns (bf16 with x rounded to bf16, or f32). xh: x
// already rounded to bf16 (several matrices of one x; null: rounded here).
void sliced_dequant_gemm_erased(Ctx&, const float* x, float* out, int T, int N, int K, int row_align,
                                const std::function<void(int n0, int ns, void* dst, bool f32)>& dequant,
                                const void* xh = nullptr);
// The same with a dequantizer callable as launch(n0, ns, float*) and launch(n0, ns, bf16*).
template <typename Launch>
void sliced_dequant_gemm(Ctx& c, const float* x, float* out, int T, int N, int K, int row_align, Launch&& launch,
                         const void* xh = nullptr) {
  sliced_dequant_gemm_erased(
      c, x, out, T, N, K, row_align,
      [&](int n0, int ns, void* dst, bool f32) {
        if (f32)
          launch(n0, ns, static_cast<float*>(dst));
        else
          launch(n0, ns, static_cast<__nv_bfloat16*>(dst));
      },
      xh);
}
// Weight rows in bf16 for the prefill GEMMs: rows r0 .. r0 + n − 1 of w to out (row-major), as
// the dequantizing GEMM writes them. quant_dequant_rows: any quantized type the backend reads
// (tiled: r0 and n multiples of 16); false (nothing done) for others. quant_tiled_dequant_rows:
// tiled types only.
bool quant_dequant_rows(Ctx&, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out);
bool quant_tiled_dequant_rows(Ctx&, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out);
// Block-quantized (GGUF) weights (cuda_quant_matmul.cu); matmul and embed forward them here.
bool quant_supported(DType t);
void quant_matmul(Ctx&, const Tensor& x, const Tensor& w, Tensor& out);
void quant_embed_rows(Ctx&, const Tensor& table, const int32_t* ids, int64_t n, Tensor& out);
// n weights of random blocks of type t at dst (std ≈ sigma, mean ≈ 0), on the default stream.
void quant_random_fill(DType t, void* dst, int64_t n, float sigma, uint64_t seed);
// Fused decode forms for quantized weights (Backend::matmul_multi / matmul_swiglu, T ≤ 8):
// false when not taken (the caller composes). multi: one launch per quantized type in ws, the
// other matrices through matmul_multi / matmul. swiglu: up_out is scratch.
bool quant_matmul_multi(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs,
                        const void* act = nullptr);  // act: as quant_tiled_matmul's, for its tiled ws
bool quant_matmul_swiglu(Ctx&, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& gate_out,
                         Tensor& up_out);
// A call's matrices split into the tiled ones (quant_tiled_matmul) and the others, in order, with
// their outputs; matmul_untiled: outs[i] = x · ws[i]ᵀ for the others (the quantized GEMVs, the
// multi-GEMV or one matmul each).
struct TiledSplit {
  std::vector<const Tensor*> tw, rw;
  std::vector<Tensor*> to, ro;
  TiledSplit(std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
};
void matmul_untiled(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
// Quantized MoE experts, decode (moe_experts semantics; table: device [E][gate, up, down]
// pointers, gate/up [I, D] of type gate_up, down [D, I] of type down): false when not taken.
bool quant_moe_decode(Ctx&, const Tensor& x, const Tensor& weights, const Tensor& ids, const void* const* table,
                      DType gate_up, DType down, int64_t E, int64_t I, Tensor& out);
// MoE prefill: matrices kind0 .. kind0 + nkind - 1 (0 gate, 1 up, 2 down; rows x K, type t) of
// experts e0 .. e0 + ne - 1 with pairs (off[e + 1] > off[e]) to bf16, expert slot es at
// scratch + es·3·rows·K, kind κ at + κ·rows·K.
void quant_dequant_experts(Ctx&, DType t, const void* const* table, int kind0, int nkind, const int32_t* off, int e0,
                           int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch);
// Fused decode forms (Backend::matmul_multi / matmul_swiglu): false when the shapes or dtypes
// are not ones the one-launch kernels handle; the caller then composes the plain ops.
bool matmul_multi(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
bool matmul_swiglu(Ctx&, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out);
// Whether a one-to-eight-token GEMV of N rows of K takes the split-K kernel (a block per row, its
// warps splitting K: few rows) rather than a warp per row (cuda_matmul.cu's launch_gemv).
bool gemv_split_k(const Ctx&, int64_t N, int64_t K);
// Whether a kernel computing x for matmul(x, w) at decode should let that launch start only after
// its own work rather than at its start: w dense (bf16 / f16 / f32) on the warp-per-row GEMV. That
// GEMV's grid is less than a wave of blocks; released early, they become resident only where the
// releasing kernel (and the one before it) leave room, settle unevenly over the SMs, and the
// unevenness carries down the layer's programmatically dependent launches (H200, 27B bf16: the
// MLP down GEMVs 64-70 µs against 44; bench/RESULTS.md sessions 34 and 35). Tiled and other
// quantized weights and the split-K GEMV (a grid of many small blocks) gain from the early start.
bool release_late_before(const Ctx&, const Tensor& w);
// Their prefill forms for weights stored back to back (cuda_matmul_fused.cu).
bool matmul_multi_prefill(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
bool matmul_swiglu_prefill(Ctx&, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out);
bool mlp_prefill(Ctx&, const Tensor& x, const MlpWeights& m, Tensor& out);
// Backend::add_rms_norm_matmul_multi / add_rms_norm_mlp at prefill over bf16 weights: the norm
// writes x and its bf16 rounding in one pass (add_rms_norm_half), the GEMMs read the latter (no
// rounding kernel); false (nothing done) where these forms do not apply.
bool norm_matmul_multi_prefill(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                               Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
bool norm_mlp_prefill(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                      const MlpWeights& m, Tensor& out);
// The same at one token over bf16 / f16 weights: every block of the GEMV computes the norm itself
// (no norm launch; y_out must be another buffer than y), bitwise as the norm launch followed by
// matmul_multi / matmul_swiglu and the down matmul (cuda_matmul_norm.cu); false (nothing done)
// where these forms do not apply.
bool norm_gemv_multi(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                     std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
bool norm_gemv_mlp(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                   const MlpWeights& m, Tensor& gate_out, Tensor& out);
// Backend::gated_matmul and gated_norm_matmul at prefill over a bf16 matrix: the gate (norm)
// kernel writes the GEMM's bf16 input, no f32 intermediate or rounding kernel; false (nothing
// done) where these forms do not apply.
bool gated_matmul_prefill(Ctx&, const Tensor& x, const Tensor& gate, const Tensor& w, Tensor& out);
bool gated_norm_matmul_prefill(Ctx&, const Tensor& x, const Tensor& z, const Tensor& norm, float eps, const Tensor& w,
                               Tensor& out);
// Tiled quantized weights (cuda_quant_mma.cu): Q4_K / Q6_K / Q8_0 / W4_G128 / W4_G32 / NVFP4
// matrices with N % 16 == 0 and K % 256 == 0 repacked on the device into 16-row tiles for the
// int8 tensor-core GEMM. quant_tiled_type: the tiled DType of such a type (F32: none).
// quant_tile: repacks w in place
// (w.dtype becomes the tiled type); false when w does not qualify. quant_tiled_matmul: outs[i]
// = x · ws[i]ᵀ for tiled ws of one width K (T ≤ 64: the tensor-core GEMM, activations quantized
// once for all; T > 64 or exact_matmul: dequantized slices and cuBLAS).
DType quant_tiled_type(DType t);
bool quant_tile_ok(const Tensor& w);
bool quant_tile(Ctx&, Tensor& w);
// ws[i] (a tileable type, device) repacked into dsts[i] (ws[i].nbytes(), 16-byte aligned, not overlapping
// any w), up to 32 matrices a launch: tiled[i] the tiled view of dsts[i]; false (nothing done)
// when one of them does not tile.
bool quant_tile_into(Ctx&, std::span<const Tensor> ws, std::span<void* const> dsts, std::span<Tensor> tiled);
// out [T, N] = x [T, K] · wᵀ for a tiled w: row slices (multiples of 16) dequantized to bf16 (f32
// with exact_matmul), one cuBLAS GEMM each; xh: x already rounded to bf16, or null
// (cuda_quant_tile_layout.cu; the T > 64 and exact path of quant_tiled_matmul).
void quant_tiled_dequant_gemm(Ctx&, const Tensor& w, const float* x, float* out, int T, int N, int K, const void* xh);
// kTiledMaxT: the most tokens of one int8 tensor-core launch (8 n8 tiles); beyond it the
// dequantizing GEMMs. act: x already quantized for that GEMM (by the kernel that produced x;
// null: quantized here). quant_act_bytes: its size; quantize_act: x [T, K] (with `up`: silu(x) · up, the SwiGLU)
// into act, as quant_tiled_matmul itself quantizes.
inline constexpr int64_t kTiledMaxT = 64;
void quant_tiled_matmul(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs,
                        const void* act = nullptr);
// Up to 3 tokens whose GEMM blocks compute their rows x = rms_norm(y + delta) · w themselves (each
// block for itself, in the order of the norm kernel: bitwise its x), the first block also writing y_out
// = y + delta and x: the layer's residual add and norm without a launch of their own. y_out must
// not overlap y, which every block reads.
struct NormIn {
  const float* y = nullptr;
  const float* delta = nullptr;
  const float* w = nullptr;
  float eps = 0.0f;
  float* y_out = nullptr;
  float* x = nullptr;
};
// The NormIn of a layer's f32 tensors (the callers check their shapes).
inline NormIn norm_in(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x) {
  return {y.as<const float>(), delta.as<const float>(), w.as<const float>(), eps, y_out.as<float>(), x.as<float>()};
}
// quant_tiled_matmul for those tokens (x: where x goes): false (nothing done) when the form does
// not apply (T > 3 or short rows at T = 3, the rows too long for shared memory, or their shared
// memory would change the plain call's grid or warps per block).
bool quant_tiled_matmul_norm(Ctx&, const NormIn& norm, const Tensor& x, std::span<const Tensor* const> ws,
                             std::span<Tensor* const> outs);
// The same at T = 1 with f32 projections of x (fws, fouts: the MoE router and shared expert gate)
// in the GEMM's launch, on blocks of their own that compute the norm too: false (nothing done)
// where that form does not apply (other types or shapes, no SM left beside the GEMM's blocks).
bool quant_tiled_matmul_norm_gemv(Ctx&, const NormIn& norm, const Tensor& x, std::span<const Tensor* const> ws,
                                  std::span<Tensor* const> outs, std::span<const Tensor* const> fws,
                                  std::span<Tensor* const> fouts);
size_t quant_act_bytes(int64_t T, int64_t K);
void quantize_act(Ctx&, const float* x, const float* up, int64_t T, int64_t K, void* act);
// The layer forms of Backend::add_rms_norm_matmul_multi (add_rms_norm + matmul_multi) and
// add_rms_norm_mlp (add_rms_norm + mlp) whose norm (and SwiGLU) quantize their outputs for the
// tiled GEMMs after them: no quantization launch before those GEMMs; at T = 1 with y_out other
// than y the GEMMs compute the norm themselves (quant_tiled_matmul_norm: no norm launch either;
// cuda_quant_norm.cu). False when not taken (no tiled weight, T > kTiledMaxT, exact_matmul, a
// shape without the quantizing norm).
bool norm_quant_matmul_multi(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                             Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
bool norm_quant_mlp(Ctx&, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                    const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out);
// Its T > 64 form without exact_matmul (cuda_quant_gemm.cu): outs[i] = x · ws[i]ᵀ on the bf16
// tensor cores, tiles dequantized in registers (the values of the dequantize → bf16 → cuBLAS
// path); false when not taken: by default (slower than dequantize + cuBLAS since its
// dequantizer takes a warp per tile; QWEN36_QGEMM=fused | dequant forces either) and with too
// little shared memory per block.
bool quant_tiled_gemm(Ctx&, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
// Whether quant_tiled_gemm takes T tokens of these matrices (else: dequantize + cuBLAS).
bool quant_tiled_gemm_takes(int64_t T, std::span<const Tensor* const> ws);
// The shared expert's second half (Backend::moe_experts_shared): its gate and up projections
// [T, I], its down matrix [D, I], its gate logit [T, 1].
struct SharedDown {
  const Tensor &gate, &up, &down, &logit;
};
// Tiled MoE experts (gate/up of tiled type gate_up, down of tiled type down): quant_tiled_moe is
// quant_moe_decode on the tensor cores, per (token, expert) pair, with sh (if given) one more
// pair of every token (false, nothing launched, when not taken: types, shapes, exact_matmul,
// > 65535 pairs, sh's down not of the routed down's type and shape); quant_dequant_tiled_experts
// is quant_dequant_experts.
bool quant_tiled_moe(Ctx&, const Tensor& x, const Tensor& weights, const Tensor& ids, const void* const* table,
                     DType gate_up, DType down, int64_t E, int64_t I, Tensor& out, const SharedDown* sh = nullptr);
// Whether quant_tiled_moe takes matrices of D, I with kk pairs a token (the routed, + 1 with a
// shared expert) as far as its shapes and shared memory go.
bool quant_tiled_moe_fits(int64_t D, int64_t I, int64_t kk);
// Expert offload's exact combination: the rows quant_tiled_moe's down kernel weights and sums, unweighted —
// rows [T, k, D] (row t·k + j for ids[t, j] in [0, E); others untouched) and with sh the shared
// expert's, sh_row [T, D] (sh.logit unused). ids may be empty (k = 0, x unused): the shared row only.
bool quant_tiled_moe_rows(Ctx&, int64_t T, int64_t D, const Tensor* x, const Tensor& ids, const void* const* table,
                          DType gate_up, DType down, int64_t E, int64_t I, Tensor* rows, const SharedDown* sh,
                          Tensor* sh_row);
// The grouped form of the routed experts: cuda_quant_moe_grouped.cuh.
void quant_dequant_tiled_experts(Ctx&, DType t, const void* const* table, int kind0, int nkind, const int32_t* off,
                                 int e0, int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch);

void split_q_gate(Ctx&, const Tensor& qg, Tensor& q, Tensor& gate);
void rope(Ctx&, Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta);
// Tree verification (Backend::attention_tree): token t of the call sees a cache position p ≥
// base[t] only where bit p − base[t] of mask[t] is set (its ancestors and itself, whose K/V sit
// at rows base + index); positions below base (the context) always. Both on the device (a
// recording reads the pass's), one per token of the call; mask null: no tree.
struct TreeMask {
  const uint64_t* mask = nullptr;
  const int32_t* base = nullptr;
};
// x's [q | k | v] column blocks copied out in one launch (Backend::copy_column_blocks); false
// (nothing done) unless every block is whole 16-byte units.
bool copy_column_blocks(Ctx&, const Tensor& x, Tensor& q, Tensor& k, Tensor& v);
// rope at the device positions pos (one per row of x; a row at −1 is left as it is).
void rope_at(Ctx&, Tensor& x, const int32_t* pos, int64_t rotary_dim, float theta);
void attention(Ctx&, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               std::span<const SeqRun> runs, float scale, Tensor& out, TreeMask tree = {});

void causal_conv1d_silu(Ctx&, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs);
// The same for runs of many tokens, parallel over tokens (cuda_conv1d.cu); false: not taken.
bool conv1d_silu_prefill(Ctx&, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs);
// Backend::causal_conv1d_silu_split where the prefill kernel takes the runs (x left as it was),
// shapes checked; false (nothing done) elsewhere: the conv in place, then copies.
bool causal_conv1d_silu_split(Ctx&, const Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs,
                              Tensor& q, Tensor& k, Tensor& v);
bool conv1d_silu_prefill_split(Ctx&, const Tensor& x, const Tensor& w, Tensor& conv_state,
                               std::span<const SeqRun> runs, Tensor& q, Tensor& k, Tensor& v);
void deltanet_gates(Ctx&, const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias,
                    Tensor& g, Tensor& beta);
void gated_delta_rule(Ctx&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode);
void causal_conv1d_silu_readonly(Ctx&, Tensor& x, const Tensor& w, const Tensor& conv_state,
                                 std::span<const SeqRun> runs);
void gated_delta_rule_readonly(Ctx&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                               const Tensor& beta, const Tensor& state, std::span<const SeqRun> runs, Tensor& out);
// The Backend tree read-only DeltaNet ops in one launch each; false (nothing done) where they do
// not apply (cuda_deltanet.cu).
bool causal_conv1d_silu_tree_readonly(Ctx&, Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                                      std::span<const int32_t> parent);
bool gated_delta_rule_tree_readonly(Ctx&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                    const Tensor& beta, const Tensor& state, const SeqRun& run,
                                    std::span<const int32_t> parent, Tensor& out);
// Backend::deltanet_decode in two launches; false: shapes or dtypes the fused kernels do not
// handle (the caller then composes the plain ops).
bool deltanet_decode(Ctx&, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w,
                     float eps, Tensor& conv_state, Tensor& ssm_state, std::span<const SeqRun> runs, Tensor& out);
// Backend::deltanet_verify in the same two launches; false: not taken (nothing launched).
bool deltanet_verify(Ctx&, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w,
                     float eps, Tensor& conv_state, Tensor& ssm_state, std::span<const SeqRun> runs,
                     std::span<const SeqRun> verify, Tensor& conv_in, Tensor& g_in, Tensor& beta_in, Tensor& out);
// Backend::deltanet_verify_tree in two launches; false: not taken (nothing launched).
bool deltanet_verify_tree(Ctx&, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                          const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state, const SeqRun& run,
                          std::span<const int32_t> parent, Tensor& conv_in, Tensor& g_in, Tensor& beta_in, Tensor& out);
// Backend::deltanet_commit in the same two launches; false: not taken (nothing launched).
bool deltanet_commit(Ctx&, const DeltaNetWeights& w, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, const Tensor& conv_in, const Tensor& g_in, const Tensor& beta_in,
                     Tensor& mixed);

void sample_candidates(Ctx&, Tensor& logits, std::span<const SampleRowParams> rows,
                       std::span<const PenaltyEntry> penalties, int32_t k, int32_t* ids, float* vals, float* stats);
void argmax_rows(Ctx&, const Tensor& logits, Tensor& ids);

void moe_route(Ctx&, const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids);
void moe_local_ids(Ctx&, Tensor& ids, int64_t e0, int64_t n);
void moe_experts(Ctx&, const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out);
// Backend::moe_expert_rows / moe_shared_row / moe_combine_rows / moe_row_pairs (expert offload's
// exact combination; backend.h).
bool moe_expert_rows(Ctx&, const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows);
bool moe_shared_row(Ctx&, std::span<const MlpWeights> experts, int64_t k, const Tensor& sh_gate, const Tensor& sh_up,
                    const Tensor& down, Tensor& sh_row);
void moe_combine_rows(Ctx&, const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E,
                      const Tensor* sh_row, const Tensor* s, Tensor& out);
int64_t moe_row_pairs();
// The most pairs moe_experts computes on tiled experts' int8 kernels (per pair or grouped; above: dequantized).
int64_t moe_tiled_pairs();
// Backend::moe_experts_shared in the tiled experts' kernels (the shared expert one more pair of
// every token); false, nothing launched, where they do not take the call.
bool moe_experts_shared(Ctx&, const Tensor& x, const Tensor& weights, const Tensor& ids,
                        std::span<const MlpWeights> experts, const SharedDown& sh, Tensor& out);

}  // namespace qwen36::cuda
