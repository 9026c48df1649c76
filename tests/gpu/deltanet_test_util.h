#pragma once
// Helpers of the DeltaNet GPU tests (test_cuda_deltanet.cpp, test_cuda_deltanet_verify.cpp): the
// head shapes of the fused ops and their small weights, random, on the host and the device.
#include <cmath>
#include <random>

#include "gpu_test_util.h"

namespace qwen36::gputest {

struct DecodeShape {
  const char* name;
  int64_t Hk, Hv, dk, dv;
};
constexpr int64_t kConvK = 4;
constexpr float kEps = 1e-6f;

// The small DeltaNet weights the decode op reads, on the host and the device.
struct DecodeWeights {
  HostT conv, a_neg_exp, dt_bias, norm;
  DevT dconv, da, ddt, dnorm;
  DecodeWeights(Backend& gpu, std::mt19937& rng, const DecodeShape& s) {
    const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv;
    conv = random_t(rng, DType::F32, {C, kConvK}, -0.5f, 0.5f);
    a_neg_exp = random_t(rng, DType::F32, {s.Hv}, -2.0f, 1.0f);
    for (int64_t h = 0; h < s.Hv; ++h) a_neg_exp.f()[h] = -std::exp(a_neg_exp.f()[h]);  // −exp(A_log)
    dt_bias = random_t(rng, DType::F32, {s.Hv});
    norm = random_t(rng, DType::F32, {s.dv}, 0.9f, 1.1f);
    dconv = upload(gpu, conv), da = upload(gpu, a_neg_exp), ddt = upload(gpu, dt_bias), dnorm = upload(gpu, norm);
  }
  DeltaNetWeights host() const { return make(conv.t, a_neg_exp.t, dt_bias.t, norm.t); }
  DeltaNetWeights dev() const { return make(dconv.t, da.t, ddt.t, dnorm.t); }
  static DeltaNetWeights make(const Tensor& c, const Tensor& a, const Tensor& dt, const Tensor& n) {
    DeltaNetWeights w;
    w.conv1d = c, w.a_neg_exp = a, w.dt_bias = dt, w.norm = n;
    return w;
  }
};

inline const DecodeShape kDec27B{"27B (Hk 16, Hv 48, d 128)", 16, 48, 128, 128};
inline const DecodeShape kDec35B{"35B (Hk 16, Hv 32, d 128)", 16, 32, 128, 128};
inline const DecodeShape kDecD64{"d64 (Hk 2, Hv 4, d 64)", 2, 4, 64, 64};

}  // namespace qwen36::gputest
