// Tensor parallelism on the CPU: N ranks as threads over the host communicator must
// reproduce the single-rank model — logits of a prefill, decode steps, a two-sequence batch,
// the MTP head and a speculative verify + commit, and greedy generation token for token —
// on random tiny models (dense and MoE, even and uneven splits, replicated kv heads) and the
// golden fixtures. Also: plan errors are one line; the host all-reduce is deterministic; the
// multi-process link and message format work (the multi-process collectives need GPUs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <random>
#include <thread>

#include <unistd.h>

#include "backend/comm.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/tp_remote.h"
#include "engine/tp_runner.h"
#include "format/model_loader.h"
#include "model/presets.h"
#include "model/random_weights.h"
#include "model/tp_shard.h"

namespace qwen36 {
namespace {

// Logits tolerance. A rank's row-parallel matmul sums its share of the columns and the
// all-reduce adds the shares: the same terms as one rank's dot product in another order, so
// only f32 rounding differs (~1e-7 relative per sum, compounded over a few layers of O(1)
// activations). The tiny models' logits are O(1); 1e-4 is ~100x that noise and far below
// any indexing mistake (a wrong head or column range changes logits by O(0.1-1)).
constexpr float kTol = 1e-4f;

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

int32_t argmax(const float* p, int64_t n) { return int32_t(std::max_element(p, p + n) - p); }

// A random tiny member: 4 layers (3 DeltaNet + 1 attention) plus MTP. kv heads 4 (dense) or
// 2 (MoE: at 4 ranks each kv head is replicated on two).
ModelConfig tiny_config(bool moe) {
  ModelConfig c = model_preset(moe ? "tiny-moe" : "tiny-dense", 4);
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.n_heads = 8, c.n_kv_heads = moe ? 2 : 4, c.head_dim = 16, c.rotary_dim = 8;
  c.linear_k_heads = 4, c.linear_v_heads = 8, c.linear_k_dim = 16, c.linear_v_dim = 16;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 64, c.shared_expert_intermediate_size = 64;
  c.validate();
  return c;
}

struct Case {
  std::string name;
  std::function<ModelWeights()> weights;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"random-dense", [] { return make_random_weights(tiny_config(false), DType::BF16, 7); }});
  v.push_back({"random-moe", [] { return make_random_weights(tiny_config(true), DType::BF16, 8); }});
  for (const char* g : {"moe-shared", "dense-gqa", "moe-mtp"})
    v.push_back({g, [g] {
                   return load_model_weights((std::filesystem::path(QWEN36_TEST_DATA) / "golden" / g).string());
                 }});
  return v;
}

// Everything the comparison looks at, from one model (TP or not).
struct Trace {
  std::vector<float> prefill, decode, batch, mtp, after_commit;
  std::vector<int32_t> greedy;
};

Trace trace(Model& m, Backend& be) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size, H = c.hidden_size;
  Trace t;
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(13);
  for (int32_t& x : prompt) x = int32_t(rng() % uint32_t(V));
  const bool mtp = m.has_mtp();
  ModelState st(be, c, 3, 64, mtp);
  st.enable_speculation(4);

  // Prefill (every row's logits and hidden), then 4 greedy decode steps.
  const int32_t P = int32_t(prompt.size());
  t.prefill.resize(size_t(P * V));
  std::vector<float> hidden(size_t(P * H));
  ForwardBatch pre = ForwardBatch::single(prompt, 0, 0, true);
  m.forward(pre, st, t.prefill.data(), hidden.data());
  int32_t tok = argmax(&t.prefill[size_t((P - 1) * V)], V);
  std::vector<float> logits(static_cast<size_t>(V));
  for (int32_t i = 0; i < 4; ++i) {
    const int32_t one[1] = {tok};
    m.forward(ForwardBatch::single(one, P + i, 0), st, logits.data());
    t.decode.insert(t.decode.end(), logits.begin(), logits.end());
    tok = argmax(logits.data(), V);
  }
  const int32_t pos = P + 4;

  // One batch: a decode token of slot 0 and a 5-token prefill of slot 1.
  ForwardBatch b;
  b.tokens = {tok, 3, 1, 4, 1, 5};
  b.runs = {{0, pos, 0, 1}, {1, 0, 1, 5}};
  b.output_rows = {0, 5};
  t.batch.resize(size_t(2 * V));
  m.forward(b, st, t.batch.data());

  // MTP head over the prompt's hidden states (its own KV cache in slot 2).
  if (mtp) {
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(argmax(&t.prefill[size_t((P - 1) * V)], V));
    const SeqRun run{2, 0, 0, P};
    t.mtp.resize(size_t(P * V));
    m.mtp_forward(hidden, next, std::span(&run, 1), st, t.mtp.data());
  }

  // Speculative verify of 3 tokens on slot 1, keep 2, then one decode step.
  ForwardBatch ver = ForwardBatch::single(std::vector<int32_t>{9, 2, 6}, 5, 1, true);
  ver.verify_runs = {0};
  std::vector<float> vlog(size_t(3 * V));
  m.forward(ver, st, vlog.data());
  const SpecCommit cm{1, 2};
  m.commit_speculative(st, std::span(&cm, 1));
  const int32_t one[1] = {6};
  t.after_commit.resize(size_t(V));
  m.forward(ForwardBatch::single(one, 7, 1), st, t.after_commit.data());
  t.after_commit.insert(t.after_commit.end(), vlog.begin(), vlog.end());

  ModelState gs(be, c, 1, 64, false);
  GenerateOptions g;
  g.max_tokens = 12;
  g.sampling = SamplingParams::greedy();
  g.prefill_chunk = 5;  // several prefill passes
  t.greedy = generate(m, gs, prompt, g).tokens;
  return t;
}

void compare(const std::string& name, int ranks, std::span<const double> split, bool expert_parallel = false) {
  SCOPED_TRACE(name + " tp=" + std::to_string(ranks) + (expert_parallel ? " expert parallel" : ""));
  const Case* cs = nullptr;
  static const std::vector<Case> all = cases();
  for (const Case& x : all)
    if (x.name == name) cs = &x;
  ASSERT_NE(cs, nullptr);
  auto be = make_cpu_backend(1);
  Model ref(cs->weights(), *be);
  const Trace want = trace(ref, *be);

  const ModelWeights full = cs->weights();
  TpOptions o;
  o.ranks = ranks;
  o.split.assign(split.begin(), split.end());
  o.expert_parallel = expert_parallel;
  auto be0 = make_cpu_backend(1);
  std::unique_ptr<Model> tp = make_tp_model(full, o, *be0, [](int r) { return make_rank_backend("cpu", r, 1); });
  ASSERT_NE(tp->peers(), nullptr);
  if (expert_parallel) {  // rank 0 holds its share of whole experts, and the shared expert
    EXPECT_EQ(tp->config().expert0, 0);
    EXPECT_GT(tp->config().local_experts, 0);
    EXPECT_LT(tp->config().local_experts, full.config.n_experts);
    EXPECT_EQ(int64_t(tp->weights().layers[0].moe.experts.size()), tp->config().local_experts);
    EXPECT_EQ(tp->config().moe_intermediate_size, full.config.moe_intermediate_size);
  }
  const Trace got = trace(*tp, *be0);

  const float d[] = {max_diff(want.prefill, got.prefill), max_diff(want.decode, got.decode),
                     max_diff(want.batch, got.batch), max_diff(want.mtp, got.mtp),
                     max_diff(want.after_commit, got.after_commit)};
  std::printf("[ %s tp=%d ] max |logit diff| prefill %.2g, decode %.2g, batch %.2g, mtp %.2g, verify/commit %.2g\n",
              name.c_str(), ranks, d[0], d[1], d[2], d[3], d[4]);
  for (float x : d) EXPECT_LE(x, kTol);
  EXPECT_EQ(want.greedy, got.greedy);
}

TEST(TensorParallel, RandomDenseTwoRanks) { compare("random-dense", 2, {}); }
TEST(TensorParallel, RandomDenseFourRanks) { compare("random-dense", 4, {}); }
TEST(TensorParallel, RandomDenseUnevenSplit) {
  const double split[] = {3, 1};
  compare("random-dense", 2, split);
}
TEST(TensorParallel, RandomMoeTwoRanks) { compare("random-moe", 2, {}); }
TEST(TensorParallel, RandomMoeFourRanksReplicatedKv) { compare("random-moe", 4, {}); }
TEST(TensorParallel, GoldenMoeShared) { compare("moe-shared", 2, {}); }
// --expert-parallel: whole routed experts per rank (each rank computes the chosen experts it
// holds, the others' ids −1), the shared expert on rank 0; the same all-reduce completes the sum.
TEST(TensorParallel, RandomMoeExpertParallelTwoRanks) { compare("random-moe", 2, {}, true); }
TEST(TensorParallel, RandomMoeExpertParallelFourRanks) { compare("random-moe", 4, {}, true); }
TEST(TensorParallel, RandomMoeExpertParallelUneven) {
  const double split[] = {3, 2};  // kv heads 1 + 1, key heads 2 + 2, experts 5 + 3
  compare("random-moe", 2, split, true);
}
TEST(TensorParallel, GoldenMoeSharedExpertParallel) { compare("moe-shared", 2, {}, true); }
TEST(TensorParallel, GoldenDenseGqaReplicatedKv) { compare("dense-gqa", 2, {}); }

// A batch the model refuses fails on rank 0 before the other ranks see it; the model stays usable.
TEST(TensorParallel, BadBatchLeavesTheGroupUsable) {
  const ModelWeights full = make_random_weights(tiny_config(false), DType::BF16, 7);
  auto be0 = make_cpu_backend(1);
  TpOptions o;
  o.ranks = 2;
  auto tp = make_tp_model(full, o, *be0, [](int d) { return make_rank_backend("cpu", d, 1); });
  ModelState st(*be0, tp->config(), 1, 16, false);
  std::vector<float> logits(static_cast<size_t>(tp->config().vocab_size));
  const int32_t toks[2] = {1, 2};
  EXPECT_THROW(tp->forward(ForwardBatch::single(toks, 0, /*slot=*/3), st, logits.data()), Error);
  EXPECT_THROW(tp->forward(ForwardBatch::single(toks, 15, 0), st, logits.data()), Error);  // past the context
  EXPECT_NO_THROW(tp->forward(ForwardBatch::single(toks, 0, 0), st, logits.data()));
}

TEST(TensorParallel, PlanApportionsWholeUnits) {
  const ModelConfig c = tiny_config(false);  // 8 q / 4 kv heads, 4 key heads, intermediate 128
  const double split[] = {3, 1};
  const auto p = plan_tensor_parallel(c, 2, split, 32);
  EXPECT_EQ(p[0].kv_heads, 3);
  EXPECT_EQ(p[0].q_heads, 6);
  EXPECT_EQ(p[1].q_head0, 6);
  EXPECT_EQ(p[1].k_head0, 3);
  EXPECT_EQ(p[0].ffn, 96);  // 4 blocks of 32: 3 + 1
  EXPECT_EQ(p[1].ffn0, 96);
  const ModelConfig s1 = shard_config(c, p[1]);
  EXPECT_EQ(s1.n_heads, 2);
  EXPECT_EQ(s1.linear_v_heads, 2);
  EXPECT_EQ(s1.intermediate_size, 32);
  // The DeltaNet b / a shards carry whole 16-row tiles: 2 heads' rows, then zero rows.
  EXPECT_EQ(s1.gate_rows(), 16);
  const ModelWeights full = make_random_weights(c, DType::F32, 9);
  const ModelWeights w1 = shard_weights(full, p[1]);
  const Tensor& b1 = w1.layers[0].deltanet.in_proj_b;
  ASSERT_EQ(b1.rows(), 16);
  const int64_t H = c.hidden_size, h0 = p[1].k_head0 * (c.linear_v_heads / c.linear_k_heads);
  const float* got = b1.as<const float>();
  const float* want = full.layers[0].deltanet.in_proj_b.as<const float>() + h0 * H;
  EXPECT_TRUE(std::equal(got, got + 2 * H, want));
  EXPECT_TRUE(std::all_of(got + 2 * H, got + 16 * H, [](float v) { return v == 0.0f; }));
}

TEST(TensorParallel, PlanExpertParallel) {
  const ModelConfig c = tiny_config(true);  // 8 experts of 64 columns, shared expert 64, 2 kv heads
  const double split[] = {3, 2};
  const auto p = plan_tensor_parallel(c, 2, split, 32, /*expert_parallel=*/true);
  EXPECT_EQ(p[0].expert0, 0);
  EXPECT_EQ(p[0].experts, 5);  // rank 0 ends at round(8 · 3/5)
  EXPECT_EQ(p[1].expert0, 5);
  EXPECT_EQ(p[1].experts, 3);
  EXPECT_EQ(p[1].moe, 64);  // experts whole
  EXPECT_EQ(p[0].shared, 64);
  EXPECT_EQ(p[1].shared, 0);
  const ModelConfig s1 = shard_config(c, p[1]);
  EXPECT_EQ(s1.n_local_experts(), 3);
  EXPECT_EQ(s1.expert0, 5);
  EXPECT_EQ(s1.n_experts, 8);  // the router still scores every expert
  EXPECT_EQ(s1.shared_expert_intermediate_size, 0);
  const ModelWeights full = make_random_weights(c, DType::BF16, 8);
  const ModelWeights w1 = shard_weights(full, p[1]);
  ASSERT_EQ(w1.layers[0].moe.experts.size(), 3u);
  EXPECT_EQ(w1.layers[0].moe.experts[0].gate_proj.data, full.layers[0].moe.experts[5].gate_proj.data);  // a view
  EXPECT_TRUE(w1.layers[0].moe.shared.gate_proj.empty());
  EXPECT_EQ(w1.layers[0].moe.router.rows(), 8);
}

// Errors are one line naming what cannot be split.
void expect_one_line_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(TensorParallel, SplitErrors) {
  // moe-mtp: 2 q heads on 1 kv head split (the kv head replicated), its 1 DeltaNet key head cannot.
  const ModelWeights w = load_model_weights((std::filesystem::path(QWEN36_TEST_DATA) / "golden" / "moe-mtp").string());
  auto be = make_cpu_backend(1);
  TpOptions o;
  o.ranks = 2;
  expect_one_line_error([&] { make_tp_model(w, o, *be, [](int r) { return make_rank_backend("cpu", r, 1); }); },
                        "DeltaNet key heads (1) cannot be split evenly over 2 ranks");

  const ModelConfig c = tiny_config(false);
  expect_one_line_error([&] { plan_tensor_parallel(c, 3); }, "attention kv heads (4) cannot be split evenly over 3");
  expect_one_line_error([&] { plan_tensor_parallel(c, 8); }, "key heads (4) cannot be split evenly over 8");
  const double bad[] = {1, 1, 1};
  expect_one_line_error([&] { plan_tensor_parallel(c, 2, bad); }, "--tensor-split has 3 values for 2 ranks");
  const double lopsided[] = {20, 1};
  expect_one_line_error([&] { plan_tensor_parallel(c, 2, lopsided); }, "leaves rank 1 no");
  expect_one_line_error([&] { plan_tensor_parallel(c, 2, {}, 256); }, "not a whole number of 256-element blocks");
  expect_one_line_error([&] { parse_tensor_split("3,x"); }, "not a positive number");
  expect_one_line_error([&] { plan_tensor_parallel(c, 2, {}, 1, /*expert_parallel=*/true); },
                        "--expert-parallel: the model has no routed experts");
  EXPECT_EQ(parse_tensor_split("3,1.5"), (std::vector<double>{3, 1.5}));
}

// Every rank gets the same bits, equal to summing in rank order, every time.
TEST(HostComm, AllReduceIsDeterministic) {
  constexpr int N = 3;
  constexpr int64_t n = 1001;  // not a multiple of the rank count: uneven chunks
  auto comms = make_host_comms(N);
  std::vector<std::vector<float>> in(N), out(N);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (auto& v : in) {
    v.resize(n);
    for (float& x : v) x = u(rng) * std::pow(10.0f, float(int(rng() % 7) - 3));
  }
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = (in[0][size_t(i)] + in[1][size_t(i)]) + in[2][size_t(i)];
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> th;
    for (int r = 0; r < N; ++r)
      th.emplace_back([&, r] {
        auto be = make_cpu_backend(1);
        out[size_t(r)] = in[size_t(r)];
        Tensor t(out[size_t(r)].data(), DType::F32, {n});
        comms[size_t(r)]->all_reduce_sum(*be, t);
        comms[size_t(r)]->all_reduce_sum(*be, t);  // twice: the buffers are reusable
      });
    for (auto& x : th) x.join();
    for (int r = 0; r < N; ++r) {
      // the second reduction sums three identical copies: (x + x) + x
      std::vector<float> twice(n);
      for (int64_t i = 0; i < n; ++i) twice[size_t(i)] = (want[size_t(i)] + want[size_t(i)]) + want[size_t(i)];
      EXPECT_EQ(0, std::memcmp(out[size_t(r)].data(), twice.data(), size_t(n) * sizeof(float))) << "rank " << r;
    }
  }
}

TEST(HostComm, AbortWakesWaitingRanks) {
  auto comms = make_host_comms(2);
  auto be = make_cpu_backend(1);
  std::vector<float> x(8, 1.0f);
  Tensor t(x.data(), DType::F32, {8});
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    comms[1]->abort();
  });
  EXPECT_THROW(comms[0]->all_reduce_sum(*be, t), Error);
  other.join();
  EXPECT_THROW(comms[0]->all_reduce_sum(*be, t), Error);  // the group stays failed
}

// The multi-process pieces that need no GPU: a pass survives its byte form; process 0 and
// two "processes" (threads here) exchange messages over the TCP link; the launcher's
// environment is read.
TEST(TpRemote, PassRoundTrip) {
  auto be = make_cpu_backend(1);
  ModelState st(*be, tiny_config(false), 3, 64, true, DType::F32, DType::BF16);
  st.enable_speculation(4);
  ForwardBatch b;
  b.tokens = {5, 6, 7};
  b.runs = {{1, 9, 0, 2}, {2, 0, 2, 1}};
  b.output_rows = {1, 2};
  b.verify_runs = {0};
  b.hidden_rows = {0};
  b.deltanet_mode = DeltaRuleMode::Recurrent;
  PeerPass p;
  p.batch = &b;
  TpMessage m = decode_message(encode_pass(p, st));
  EXPECT_EQ(m.kind, TpMessage::Kind::Pass);
  EXPECT_EQ(m.state_key, uint64_t(reinterpret_cast<uintptr_t>(&st)));
  EXPECT_EQ(m.slots, 3);
  EXPECT_EQ(m.capacity, 64);
  EXPECT_TRUE(m.mtp);
  EXPECT_EQ(m.kv, DType::F32);
  EXPECT_EQ(m.state, DType::BF16);  // a follower's mirror holds the state in rank 0's type
  EXPECT_EQ(m.spec_tokens, 4);
  ASSERT_TRUE(m.batch);
  EXPECT_EQ(m.batch->tokens, b.tokens);
  ASSERT_EQ(m.batch->runs.size(), 2u);
  EXPECT_EQ(m.batch->runs[1].slot, 2);
  EXPECT_EQ(m.batch->runs[0].pos0, 9);
  EXPECT_EQ(m.batch->output_rows, b.output_rows);
  EXPECT_EQ(m.batch->verify_runs, b.verify_runs);
  EXPECT_EQ(m.batch->hidden_rows, b.hidden_rows);
  EXPECT_EQ(m.batch->deltanet_mode, DeltaRuleMode::Recurrent);

  const std::vector<float> hidden = {1.5f, -2.0f};
  const std::vector<int32_t> next = {4}, rows = {0};
  const SeqRun run{2, 0, 0, 1};
  PeerPass q;
  q.kind = PeerPass::Kind::Mtp;
  q.hidden = hidden, q.next_tokens = next, q.output_rows = rows, q.runs = std::span(&run, 1);
  m = decode_message(encode_pass(q, st));
  EXPECT_EQ(m.hidden, hidden);
  EXPECT_EQ(m.next_tokens, next);
  EXPECT_EQ(m.view().runs.size(), 1u);

  const SpecCommit cm[2] = {{1, 3}, {2, 0}};
  PeerPass c;
  c.kind = PeerPass::Kind::Commit;
  c.commits = cm;
  m = decode_message(encode_pass(c, st));
  ASSERT_EQ(m.commits.size(), 2u);
  EXPECT_EQ(m.commits[0].keep, 3);
  EXPECT_EQ(decode_message(encode_shutdown()).kind, TpMessage::Kind::Shutdown);
  std::string bad = encode_pass(c, st);
  bad.pop_back();
  EXPECT_THROW(decode_message(bad), Error);
}

TEST(TpRemote, LinkCarriesMessagesInOrder) {
  TpProcessEnv env;
  env.world = 3;
  env.master_addr = "127.0.0.1";
  env.master_port = 20000 + int(::getpid() % 20000);
  std::vector<std::string> got[3];
  std::string err;
  std::vector<std::thread> followers;
  for (int r = 1; r < 3; ++r)
    followers.emplace_back([&, r] {
      TpProcessEnv e = env;
      e.rank = r;
      try {
        auto link = TpLink::open(e, std::chrono::seconds(20));
        for (int i = 0; i < 3; ++i) got[r].push_back(link->recv());
        link->recv();  // process 0 closed: an Error
      } catch (const Error& x) {
        got[r].push_back(std::string("closed: ") + x.what());
      }
    });
  {
    auto link = TpLink::open(env, std::chrono::seconds(20));
    link->send_all("one");
    link->send_all(std::string(100000, 'x'));
    link->send_all("");
  }
  for (auto& t : followers) t.join();
  for (int r = 1; r < 3; ++r) {
    ASSERT_EQ(got[r].size(), 4u) << "process " << r;
    EXPECT_EQ(got[r][0], "one");
    EXPECT_EQ(got[r][1].size(), 100000u);
    EXPECT_EQ(got[r][2], "");
    EXPECT_NE(got[r][3].find("closed the link"), std::string::npos) << got[r][3];
  }
}

TEST(TpRemote, EnvironmentOfTorchrun) {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "3", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  const TpProcessEnv e = tp_process_env();
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29511);
  EXPECT_EQ(tp_first_local_device(8), 2);  // 2 ranks per process, LOCAL_RANK 1
  ::unsetenv("MASTER_ADDR");
  EXPECT_THROW(tp_process_env(), Error);
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"}) ::unsetenv(v);
  EXPECT_EQ(tp_process_env().world, 1);
}

}  // namespace
}  // namespace qwen36
