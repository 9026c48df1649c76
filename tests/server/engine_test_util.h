#pragma once
// defines: helpers shared by the engine-core tests (engine_test, engine_spec_test,
//          engine_dflash_test): the single-request reference run and a bounded step loop.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine/spec/drafter.h"
#include "format/model_loader.h"

namespace qwen36::test {

// A suite's CPU backend and model, the golden fixture tests/data/golden/<Dir>, loaded once for
// all of its tests. Dir: a `static constexpr char[]` naming the fixture.
template <const char* Dir>
class GoldenModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(2).release();
    model_ = new Model(load_model_weights(std::string(QWEN36_TEST_DATA) + "/golden/" + Dir), *backend_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }
  static inline Backend* backend_ = nullptr;
  static inline Model* model_ = nullptr;
};

// A drafter that passes every call to `inner`: tests derive from it to watch or rewrite the
// proposals of a real drafter (override propose, call ForwardingDrafter::propose first).
template <typename Inner>
class ForwardingDrafter : public Drafter {
 public:
  explicit ForwardingDrafter(std::unique_ptr<Inner> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  bool wants_hidden() const override { return inner_->wants_hidden(); }
  std::vector<int32_t> capture_layers() const override { return inner_->capture_layers(); }
  void reset(int32_t slot) override { inner_->reset(slot); }
  void resume(int32_t slot, int32_t reused, int32_t next) override { inner_->resume(slot, reused, next); }
  void observe(int32_t slot, int32_t pos0, std::span<const float> hidden, std::span<const int32_t> next) override {
    inner_->observe(slot, pos0, hidden, next);
  }
  void propose(std::span<DraftRequest> requests) override { inner_->propose(requests); }

 protected:
  Inner& inner() { return *inner_; }

 private:
  std::unique_ptr<Inner> inner_;
};

// What generate() gives for this request alone on a fresh one-slot state: the reference every
// scheduler run must reproduce (prefill chunked as the scheduler chunks it).
inline std::vector<int32_t> generate_alone(Model& model, Backend& backend, const RequestParams& p, int32_t chunk,
                                           int64_t ctx = 256) {
  ModelState st(backend, model.config(), 1, ctx, false);
  GenerateOptions g;
  g.max_tokens = p.max_tokens;
  g.sampling = p.sampling;
  g.stop_ids = p.stop_ids;
  g.prefill_chunk = chunk;
  return generate(model, st, p.prompt, g).tokens;
}

// An oracle drafter's drafts: the known greedy continuation (refs: prompt → generate() output)
// of the longest prompt that starts `history`, from the token after it, at most n tokens;
// nullopt where no prompt starts it.
inline std::optional<std::vector<int32_t>> known_continuation(
    const std::map<std::vector<int32_t>, std::vector<int32_t>>& refs, std::span<const int32_t> history, size_t n) {
  const std::vector<int32_t>* ref = nullptr;
  size_t plen = 0;
  for (const auto& [p, out] : refs)
    if (p.size() <= history.size() && p.size() > plen && std::equal(p.begin(), p.end(), history.begin()))
      ref = &out, plen = p.size();
  if (ref == nullptr) return std::nullopt;
  const size_t done = history.size() - plen;
  std::vector<int32_t> next;
  for (size_t i = done; i < ref->size() && next.size() < n; ++i) next.push_back((*ref)[i]);
  return next;
}

// Steps the scheduler until every request finished (bounded: a hang fails the test).
inline void run_until_done(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs) {
  for (int i = 0; i < 10000; ++i) {
    bool all = true;
    for (auto& r : reqs) all = all && r->finished();
    if (all) return;
    s.step();
  }
  FAIL() << "requests did not finish";
}

}  // namespace qwen36::test
