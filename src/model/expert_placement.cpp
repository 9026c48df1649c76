#include "model/expert_placement.h"

#include <fmt/format.h>

#include <regex.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "core/error.h"

namespace qwen36 {

namespace {

// A POSIX extended regular expression, searched anywhere in a name (as std::regex_search).
// Not std::regex: GCC 12's libstdc++ <regex> trips -Wmaybe-uninitialized (an error here) in the
// sanitizer build, and the override patterns need nothing beyond ERE.
class Pattern {
 public:
  explicit Pattern(const std::string& p) : err_(regcomp(&re_, p.c_str(), REG_EXTENDED | REG_NOSUB)) {}
  ~Pattern() {
    if (err_ == 0) regfree(&re_);
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  bool ok() const { return err_ == 0; }
  std::string error() const {
    char buf[256];
    regerror(err_, &re_, buf, sizeof(buf));
    return buf;
  }
  bool search(const std::string& s) const { return regexec(&re_, s.c_str(), 0, nullptr, 0) == 0; }

 private:
  regex_t re_{};
  int err_;
};

}  // namespace

bool ExpertPlacement::any() const { return std::find(host.begin(), host.end(), true) != host.end(); }

int32_t ExpertPlacement::count() const { return int32_t(std::count(host.begin(), host.end(), true)); }

std::string ExpertPlacement::describe() const {
  std::string ranges;
  for (size_t i = 0; i < host.size();) {
    if (!host[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < host.size() && host[j + 1]) ++j;
    ranges += fmt::format("{}{}", ranges.empty() ? "" : ",", i == j ? fmt::format("{}", i) : fmt::format("{}-{}", i, j));
    i = j + 1;
  }
  return fmt::format("routed experts of {} of {} layers on the host{}", count(), host.size(),
                     ranges.empty() ? "" : " (layers " + ranges + ")");
}

std::vector<TensorOverride> parse_override_tensor(const std::string& spec) {
  std::vector<TensorOverride> rules;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.rfind('=');
    QWEN36_CHECK(eq != std::string::npos && eq > 0,
                 "--override-tensor \"{}\": expected REGEX=DEVICE (e.g. exps=cpu)", item);
    std::string dev = item.substr(eq + 1);
    std::transform(dev.begin(), dev.end(), dev.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    TensorOverride r;
    r.pattern = item.substr(0, eq);
    if (dev == "cpu")
      r.host = true;
    else if (dev == "cuda" || dev == "cuda0" || dev == "gpu")
      r.host = false;
    else
      fail("--override-tensor \"{}\": unknown device \"{}\" (known: cpu, cuda)", item, item.substr(eq + 1));
    if (const Pattern check(r.pattern); !check.ok())
      fail("--override-tensor \"{}\": bad regular expression \"{}\": {}", item, r.pattern, check.error());
    rules.push_back(std::move(r));
  }
  QWEN36_CHECK(!rules.empty(), "--override-tensor \"{}\": no rule given", spec);
  return rules;
}

std::vector<std::string> expert_tensor_names(int32_t layer) {
  std::vector<std::string> names;
  for (const char* p : {"gate", "up", "down"}) names.push_back(fmt::format("blk.{}.ffn_{}_exps.weight", layer, p));
  for (const char* p : {"gate", "up", "down"})
    names.push_back(fmt::format("model.layers.{}.mlp.experts.{}_proj.weight", layer, p));
  return names;
}

ExpertPlacement resolve_expert_placement(const ModelConfig& c, const PlacementOptions& o) {
  ExpertPlacement p;
  if (!c.moe) {
    QWEN36_CHECK(o.empty(), "--n-cpu-moe / --cpu-moe / --override-tensor: this model has no routed experts (dense)");
    return p;
  }
  QWEN36_CHECK(o.n_cpu_moe >= 0, "--n-cpu-moe {}: must be 0 or more", o.n_cpu_moe);
  std::vector<TensorOverride> rules;
  for (const std::string& s : o.override_tensor)
    for (TensorOverride& r : parse_override_tensor(s)) rules.push_back(std::move(r));
  std::vector<std::unique_ptr<Pattern>> res;
  for (const TensorOverride& r : rules) res.push_back(std::make_unique<Pattern>(r.pattern));
  p.host.assign(size_t(c.n_layers), false);
  for (int32_t i = 0; i < c.n_layers; ++i) {
    bool host = o.cpu_moe || i < o.n_cpu_moe;
    const std::vector<std::string> names = expert_tensor_names(i);
    for (size_t r = 0; r < rules.size(); ++r) {
      if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return res[r]->search(n); })) {
        host = rules[r].host;
        break;
      }
    }
    p.host[size_t(i)] = host;
  }
  return p;
}

std::set<const Tensor*> host_expert_tensors(const ModelWeights& w, const ExpertPlacement& p) {
  std::set<const Tensor*> s;
  for (size_t i = 0; i < w.layers.size() && i < p.host.size(); ++i) {
    if (!p.host[i]) continue;
    for (const MlpWeights& e : w.layers[i].moe.experts)
      for (const Tensor* t : {&e.gate_proj, &e.up_proj, &e.down_proj})
        if (!t->empty()) s.insert(t);
  }
  return s;
}

std::vector<size_t> expert_bytes_per_layer(const ModelWeights& w) {
  std::vector<size_t> v;
  for (const LayerWeights& l : w.layers) {
    std::set<const void*> seen;
    size_t b = 0;
    for (const MlpWeights& e : l.moe.experts)
      for (const Tensor* t : {&e.gate_proj, &e.up_proj, &e.down_proj})
        if (!t->empty() && seen.insert(t->data).second) b += t->nbytes();
    v.push_back(b);
  }
  return v;
}

ExpertStreamMode expert_stream_mode() {
  const char* e = std::getenv("QWEN36_MOE_STREAM");
  const std::string v = e ? e : "";
  if (v.empty() || v == "auto") return ExpertStreamMode::Auto;
  if (v == "always") return ExpertStreamMode::Always;
  if (v == "never") return ExpertStreamMode::Never;
  fail("QWEN36_MOE_STREAM=\"{}\": expected auto, always or never", v);
}

ExpertStreamCost expert_stream_cost() {
  ExpertStreamCost c;
  auto positive = [](const char* name, double* out, double unit) {
    const char* e = std::getenv(name);
    if (!e || !*e) return;
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    QWEN36_CHECK(end && *end == '\0' && v > 0, "{}=\"{}\": expected a positive number", name, e);
    *out = v * unit;
  };
  positive("QWEN36_MOE_HOST_GFLOPS", &c.host_flops, 1e9);
  positive("QWEN36_MOE_PCIE_GBS", &c.pinned_bytes_per_s, 1e9);
  auto flag = [](const char* name, bool* out) {
    const char* e = std::getenv(name);
    if (!e || !*e) return;
    const std::string v = e;
    QWEN36_CHECK(v == "0" || v == "1", "{}=\"{}\": expected 0 or 1", name, v);
    *out = v == "1";
  };
  flag("QWEN36_MOE_PIN", &c.pin);
  flag("QWEN36_HOST_PIPELINE", &c.pipeline);
  if (const char* e = std::getenv("QWEN36_MOE_DEVICE_SHARE"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    QWEN36_CHECK(end && *end == '\0' && v >= 0 && v < 64, "QWEN36_MOE_DEVICE_SHARE=\"{}\": expected a count of routed "
                 "experts, 0 .. k - 1", e);
    c.device_share = int(v);
  }
  return c;
}

namespace {
double expert_flops(const ExpertPassWork& w) {
  return 2.0 * double(w.tokens) * double(w.k) * 3.0 * double(w.intermediate) * double(w.hidden);
}
}  // namespace

double expert_host_seconds(const ExpertPassWork& w, const ExpertStreamCost& c) { return expert_flops(w) / c.host_flops; }

double expert_stream_seconds(const ExpertPassWork& w, const ExpertStreamCost& c) {
  const double bw = w.pinned ? c.pinned_bytes_per_s : c.pageable_bytes_per_s;
  return double(w.upload_bytes) / bw + expert_flops(w) / c.device_flops;
}

bool stream_experts_faster(const ExpertPassWork& w, const ExpertStreamCost& c) {
  return w.tokens >= c.min_tokens && expert_stream_seconds(w, c) < expert_host_seconds(w, c);
}

size_t expected_touched_bytes(size_t layer_bytes, int64_t tokens, int64_t k, int64_t n_experts) {
  if (n_experts <= 0 || tokens <= 0) return 0;
  const double miss = std::pow(1.0 - double(std::min(k, n_experts)) / double(n_experts), double(tokens));
  return size_t(double(layer_bytes) * (1.0 - miss));
}

}  // namespace qwen36
