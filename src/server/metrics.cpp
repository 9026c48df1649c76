// /metrics in the Prometheus text exposition format, written by hand (no client library).
#include <sstream>
#include <vector>

#include "server/api.h"

namespace qwen36::server {

namespace {

class Writer {
 public:
  void metric(const char* name, const char* type, const char* help, double value) {
    head(name, type, help);
    out_ << name << ' ' << value << '\n';
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < Histogram::kBuckets; ++i) {
      cumulative += h.counts[i];
      out_ << name << "_bucket{le=\"" << Histogram::kBounds[i] << "\"} " << cumulative << '\n';
    }
    out_ << name << "_bucket{le=\"+Inf\"} " << h.total << '\n';
    out_ << name << "_sum " << h.sum << '\n' << name << "_count " << h.total << '\n';
  }
  // One sample per position 1..n: name{position="i"}.
  void per_position(const char* name, const char* type, const char* help, const std::vector<uint64_t>& values) {
    head(name, type, help);
    for (size_t i = 0; i < values.size(); ++i) out_ << name << "{position=\"" << i + 1 << "\"} " << values[i] << '\n';
  }
  std::string str() const { return out_.str(); }

 private:
  void head(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  std::ostringstream out_;
};

}  // namespace

std::string render_metrics(const HttpServer::Api& api) {
  const SchedulerStats s = api.ctx.engine->stats();
  Writer w;
  w.metric("qwen36_requests_running", "gauge", "Requests holding a state slot.", s.running);
  w.metric("qwen36_requests_waiting", "gauge", "Requests queued for a slot.", s.waiting);
  w.metric("qwen36_requests_finished_total", "counter", "Requests finished (any reason).", double(s.requests_finished));
  w.metric("qwen36_requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).",
           double(s.requests_cancelled));
  w.metric("qwen36_requests_rejected_total", "counter", "Requests refused because the queue was full.",
           double(s.requests_rejected));
  w.metric("qwen36_http_requests_total", "counter", "HTTP requests received.", double(api.http_requests.load()));
  w.metric("qwen36_http_errors_total", "counter", "HTTP requests answered with an error.",
           double(api.http_errors.load()));
  w.metric("qwen36_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  w.metric("qwen36_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.",
           double(s.prompt_tokens_cached));
  w.metric("qwen36_prefill_tokens_total", "counter", "Prompt tokens run through the model.",
           double(s.prefilled_tokens));
  w.metric("qwen36_generation_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  w.metric("qwen36_prefix_cache_hit_rate", "gauge", "Prompt tokens reused / prompt tokens, since start.",
           s.cache_hit_rate());
  w.metric("qwen36_prefix_checkpoints", "gauge", "Saved prompt states (prefix-cache checkpoints) held.",
           double(s.snapshots.entries));
  w.metric("qwen36_prefix_checkpoint_device_bytes", "gauge", "Device memory held by checkpoints.",
           double(s.snapshots.device_bytes));
  w.metric("qwen36_prefix_checkpoint_host_bytes", "gauge", "Host RAM held by checkpoints.",
           double(s.snapshots.host_bytes));
  w.metric("qwen36_prefix_checkpoint_hits_total", "counter", "Requests that resumed from a checkpoint.",
           double(s.snapshots.hits));
  w.metric("qwen36_prefix_checkpoint_saved_total", "counter", "Checkpoints saved.", double(s.snapshots.saved));
  w.metric("qwen36_prefix_checkpoint_evicted_total", "counter", "Checkpoints evicted to fit their budget.",
           double(s.snapshots.evicted));
  w.metric("qwen36_state_slots", "gauge", "Sequence state slots (GDN state + KV).", s.slots);
  w.metric("qwen36_state_slots_busy", "gauge", "Slots running a request.", s.slots_busy);
  w.metric("qwen36_state_slots_cached", "gauge", "Slots holding a finished sequence for prefix reuse.",
           s.slots_cached);
  w.metric("qwen36_kv_positions_used", "gauge", "KV positions held by running requests.", double(s.kv_positions_used));
  w.metric("qwen36_kv_positions_total", "gauge", "KV positions (slots x context).", double(s.slots * s.context));
  w.metric("qwen36_engine_steps_total", "counter", "Forward passes (batches) run.", double(s.steps));
  w.metric("qwen36_logit_rows_to_host_total", "counter",
           "Output rows whose whole logits were copied to the host (the others were sampled on the backend).",
           double(s.logit_rows_to_host));
  w.histogram("qwen36_time_to_first_token_seconds", "Submit to first generated token.", s.ttft);
  w.histogram("qwen36_inter_token_latency_seconds", "Time between consecutive tokens of a request.", s.inter_token);
  if (api.ctx.engine->options().spec.method != SpecMethod::None) {  // speculative decoding
    w.metric("qwen36_spec_rounds_total", "counter", "Verify rounds that carried drafts.", double(s.spec.rounds));
    w.per_position("qwen36_spec_draft_tokens_total", "counter", "Draft tokens proposed, by depth in the round.",
                   s.spec.drafted_at);
    w.per_position("qwen36_spec_accepted_tokens_total", "counter", "Draft tokens accepted, by depth in the round.",
                   s.spec.accepted_at);
    w.metric("qwen36_spec_mean_accepted_length", "gauge",
             "Tokens per verify round (accepted drafts + the target's own), since start.",
             s.spec.mean_accepted_length());
    w.metric("qwen36_spec_undrafted_tokens_total", "counter",
             "Decode tokens of sequences that had no drafts in their step.", double(s.spec_undrafted));
  }
  return w.str();
}

}  // namespace qwen36::server
