#pragma once
// defines: SpecMetrics (acceptance counters of speculative decoding, for logs and the server)

#include <cstdint>
#include <string>
#include <vector>

namespace qwen36 {

struct SpecMetrics {
  uint64_t rounds = 0;            // verify passes that carried at least one draft
  uint64_t drafted = 0;           // draft tokens proposed
  uint64_t accepted = 0;          // draft tokens accepted
  uint64_t emitted = 0;           // tokens emitted by those rounds (accepted + 1 each, before stops)
  std::vector<uint64_t> drafted_at, accepted_at;  // [i]: drafts at depth i + 1 proposed / accepted

  // A round that proposed `drafted` tokens and accepted the first `accepted`.
  void add_round(int32_t drafted, int32_t accepted);
  void merge(const SpecMetrics& o);
  // Tokens committed per verify pass (accepted drafts + the target's own token).
  double mean_accepted_length() const { return rounds ? double(accepted + rounds) / double(rounds) : 0; }
  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0; }
  // Conditional-free acceptance per depth: accepted_at[i] / drafted_at[i].
  std::vector<double> acceptance_per_position() const;
  std::string summary() const;  // one line for logs
};

}  // namespace qwen36
