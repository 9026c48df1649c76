// The Responses API's stored responses (server/response_store.h).
#include "server/response_store.h"

#include <algorithm>
#include <vector>

namespace qwen36::server {

void ResponseStore::touch(Held& h) { order_.splice(order_.begin(), order_, h.at); }

void ResponseStore::evict() {
  while (held_.size() > capacity_) {
    held_.erase(order_.back());
    order_.pop_back();
  }
}

void ResponseStore::set_capacity(size_t capacity) {
  std::lock_guard lock(mu_);
  capacity_ = capacity;
  evict();
}

void ResponseStore::put(const std::string& id, Entry e) {
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  if (auto it = held_.find(id); it != held_.end()) {
    it->second.entry = std::move(e);
    touch(it->second);
    return;
  }
  order_.push_front(id);
  held_.emplace(id, Held{std::move(e), order_.begin()});
  evict();
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return std::nullopt;
  touch(it->second);
  return it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  order_.erase(it->second.at);
  held_.erase(it);
  return true;
}

std::optional<ResponseStore::Json> ResponseStore::conversation(const std::string& id) {
  std::lock_guard lock(mu_);
  std::vector<Held*> chain;  // newest first
  for (std::string at = id; !at.empty();) {
    auto it = held_.find(at);
    if (it == held_.end() || chain.size() > held_.size()) return std::nullopt;  // gone, or a loop
    chain.push_back(&it->second);
    at = it->second.entry.previous;
  }
  Json items = Json::array();
  for (auto h = chain.rbegin(); h != chain.rend(); ++h) {
    for (const Json& item : (*h)->entry.input) items.push_back(item);
    for (const Json& item : (*h)->entry.output) items.push_back(item);
  }
  for (auto h = chain.rbegin(); h != chain.rend(); ++h) touch(**h);  // the newest ends up first
  return items;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

}  // namespace qwen36::server
