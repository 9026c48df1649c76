#pragma once
// defines: helpers shared by the engine-core tests (engine_test, engine_spec_test,
//          engine_dflash_test): the single-request reference run and a bounded step loop.

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"

namespace qwen36::test {

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
