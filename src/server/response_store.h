#pragma once
// defines: ResponseStore (the Responses API's stored responses: previous_response_id,
//          GET / DELETE /v1/responses/{id})
//
// Each response keeps only its own part of a conversation — the input items of its request
// (instructions apart, as OpenAI does not carry them over) and its output items — and the id of
// the response it followed; a conversation is rebuilt by walking back that chain. The store holds
// at most `capacity` responses and forgets the least recently used (using a response as
// previous_response_id renews its whole chain), so a long-idle conversation ends with a 400.

#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace qwen36::server {

class ResponseStore {
 public:
  using Json = nlohmann::ordered_json;
  struct Entry {
    std::string previous;  // "" for a conversation's first response
    Json input;            // this request's input items
    Json output;           // its output items
    Json object;           // the response object as answered
  };

  explicit ResponseStore(size_t capacity = 1024) : capacity_(capacity) {}
  void set_capacity(size_t capacity);

  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  // The items of the conversation that `id` ends (each response's input, then its output, oldest
  // first); nullopt when it, or one before it, is not held.
  std::optional<Json> conversation(const std::string& id);
  size_t size() const;

 private:
  using Order = std::list<std::string>;  // most recently used first
  struct Held {
    Entry entry;
    Order::iterator at;
  };
  void touch(Held& h);  // mu_ held
  void evict();         // mu_ held: the least recently used past the capacity

  size_t capacity_;
  mutable std::mutex mu_;
  Order order_;
  std::unordered_map<std::string, Held> held_;
};

}  // namespace qwen36::server
