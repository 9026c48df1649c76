#include "engine/spec/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace qwen36 {

void SpecMetrics::add_round(int32_t n_drafted, int32_t n_accepted) {
  if (n_drafted <= 0) return;
  ++rounds;
  drafted += uint64_t(n_drafted);
  accepted += uint64_t(n_accepted);
  emitted += uint64_t(n_accepted) + 1;
  if (drafted_at.size() < size_t(n_drafted)) {
    drafted_at.resize(size_t(n_drafted));
    accepted_at.resize(size_t(n_drafted));
  }
  for (int32_t i = 0; i < n_drafted; ++i) ++drafted_at[size_t(i)];
  for (int32_t i = 0; i < n_accepted; ++i) ++accepted_at[size_t(i)];
}

void SpecMetrics::merge(const SpecMetrics& o) {
  rounds += o.rounds;
  drafted += o.drafted;
  accepted += o.accepted;
  emitted += o.emitted;
  const size_t n = std::max(drafted_at.size(), o.drafted_at.size());
  drafted_at.resize(n);
  accepted_at.resize(n);
  for (size_t i = 0; i < o.drafted_at.size(); ++i) {
    drafted_at[i] += o.drafted_at[i];
    accepted_at[i] += o.accepted_at[i];
  }
}

std::vector<double> SpecMetrics::acceptance_per_position() const {
  std::vector<double> r(drafted_at.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = drafted_at[i] ? double(accepted_at[i]) / double(drafted_at[i]) : 0;
  return r;
}

std::string SpecMetrics::summary() const {
  std::string s = fmt::format("{} rounds, {} drafted, {} accepted ({:.1f}%), mean accepted length {:.2f}", rounds,
                              drafted, accepted, 100 * acceptance_rate(), mean_accepted_length());
  const auto per = acceptance_per_position();
  if (!per.empty()) {
    s += ", acceptance by position:";
    for (size_t i = 0; i < per.size(); ++i) s += fmt::format(" {}:{:.2f}", i + 1, per[i]);
  }
  return s;
}

}  // namespace qwen36
