// A layer's residual add + norm with the projections that read it, and the MLP, over tiled
// quantized weights (Backend::add_rms_norm_matmul_multi / add_rms_norm_mlp on CUDA, T ≤ 64):
// the norm kernel quantizes its output for the int8 GEMM after it, and the MLP's SwiGLU is
// computed by the quantization before the down projection, so no kernel runs between a producer
// and its GEMM only to quantize. A decode step of the 27B loses three launches (and kernel
// boundaries) per layer: ~190 of its ~960. At T ≤ 3, with the residual stream's next buffer
// other than its current one (the model's two buffers), there is no norm launch either: every
// block of the first GEMMs computes the norm of the rows itself (quant_tiled_matmul_norm); the
// 27B's decode step loses 127 launches more (bench/RESULTS.md, session 12; T = 2-3 since
// session 27: a speculative verify pass, a small batch). The values are those
// of the composed ops exactly: the same float operations feed the same quantize_quad.
// QWEN36_ACT_QUANT=kernel: the composed ops instead; =norm-kernel: the norm launch at T ≤ 3 too
// (the A/B of the measurements in bench/RESULTS.md). At one token the f32 projections of the same
// x (the MoE router) run in the norm GEMM's launch (quant_tiled_matmul_norm_gemv).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

// QWEN36_ACT_QUANT: unset, the forms of this file; "kernel", the composed ops; "norm-kernel", the
// norm launch at T ≤ 3 too.
const char* act_quant_env() {
  static const char* v = std::getenv("QWEN36_ACT_QUANT");
  return v ? v : "";
}
bool enabled() { return std::strcmp(act_quant_env(), "kernel") != 0; }

// The norm computed by the GEMM blocks: y_out another buffer (quant_tiled_matmul_norm checks the
// rest: up to 3 tokens, their rows fitting shared memory).
bool norm_in_gemm(const Tensor& y, const Tensor& delta, const Tensor& y_out, const Tensor& w, const Tensor& x) {
  const int64_t n = x.numel();
  return std::strcmp(act_quant_env(), "norm-kernel") != 0 && x.rows() >= 1 && y_out.data != y.data &&
         y.numel() == n && delta.numel() == n && y_out.numel() == n && w.numel() == x.cols() &&
         y.dtype == DType::F32 && delta.dtype == DType::F32 && y_out.dtype == DType::F32 && w.dtype == DType::F32;
}

// QWEN36_NORM_GEMV=off: f32 projections after the norm GEMM in a launch of their own
// (matmul_untiled) rather than in its launch (quant_tiled_matmul_norm_gemv).
bool norm_gemv_on() {
  static const bool on = [] {
    const char* v = std::getenv("QWEN36_NORM_GEMV");
    return !(v && std::strcmp(v, "off") == 0);
  }();
  return on;
}

bool any_tiled(std::span<const Tensor* const> ws) {
  return std::any_of(ws.begin(), ws.end(), [](const Tensor* w) { return dtype_is_tiled(w->dtype); });
}

}  // namespace

bool norm_quant_matmul_multi(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                             Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  const int64_t K = x.cols(), T = x.rows();
  if (!enabled() || c.exact_matmul || T < 1 || T > kTiledMaxT || x.dtype != DType::F32 || ws.empty() || !any_tiled(ws))
    return false;
  if (norm_in_gemm(y, delta, y_out, w, x)) {
    // The tiled matrices first: their first launch writes x, which the others read.
    const TiledSplit sp(ws, outs);
    if (!sp.rw.empty() && norm_gemv_on() &&
        quant_tiled_matmul_norm_gemv(c, norm_in(y, delta, y_out, w, eps, x), x, sp.tw, sp.to, sp.rw, sp.ro))
      return true;
    if (quant_tiled_matmul_norm(c, norm_in(y, delta, y_out, w, eps, x), x, sp.tw, sp.to)) {
      matmul_untiled(c, x, sp.rw, sp.ro);
      return true;
    }
  }
  Temp<uint8_t> act(c, quant_act_bytes(T, K));
  if (!add_rms_norm_quant(c, y, delta, y_out, w, eps, x, act.get())) return false;
  // y_out has the delta now: from here on this form must finish (a tiled weight: the tiled branch).
  const bool done = quant_matmul_multi(c, x, ws, outs, act.get());
  QWEN36_CHECK(done, "add_rms_norm_matmul_multi: the projections of {} were not taken", x.shape_str());
  return true;
}

bool norm_quant_mlp(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                    const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out) {
  const int64_t K = x.cols(), T = x.rows(), I = m.gate_proj.rows();
  const Tensor &gate = m.gate_proj, &up = m.up_proj, &down = m.down_proj;
  if (!enabled() || c.exact_matmul || T < 1 || T > kTiledMaxT || x.dtype != DType::F32 || !dtype_is_tiled(gate.dtype) ||
      !dtype_is_tiled(up.dtype) || !dtype_is_tiled(down.dtype) || up.rows() != I || down.cols() != I || I % 32 != 0 ||
      gate_out.dtype != DType::F32 || up_out.dtype != DType::F32 || gate_out.numel() != T * I ||
      up_out.numel() != T * I)
    return false;
  {
    const Tensor* ws[] = {&gate, &up};
    Tensor* os[] = {&gate_out, &up_out};
    const bool in_gemm =
        norm_in_gemm(y, delta, y_out, w, x) && quant_tiled_matmul_norm(c, norm_in(y, delta, y_out, w, eps, x), x, ws, os);
    if (!in_gemm) {
      Temp<uint8_t> act(c, quant_act_bytes(T, K));
      if (!add_rms_norm_quant(c, y, delta, y_out, w, eps, x, act.get())) return false;
      quant_tiled_matmul(c, x, ws, os, act.get());
    }
  }
  // silu(gate) · up quantized straight from the two projections: the GEMM reads only these codes
  // (gate_out keeps the gate projection, which the contract leaves as scratch).
  Temp<uint8_t> act(c, quant_act_bytes(T, I));
  quantize_act(c, gate_out.as<const float>(), up_out.as<const float>(), T, I, act.get());
  const Tensor* ws[] = {&down};
  Tensor* os[] = {&out};
  quant_tiled_matmul(c, gate_out, ws, os, act.get());
  return true;
}

}  // namespace qwen36::cuda
