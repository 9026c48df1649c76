// Byte-level alphabet and the BPE merge loop.
//
// The merge loop follows Hugging Face's BPE exactly: every adjacent pair that has a merge goes
// into a min-heap keyed by (rank, position); the smallest is applied if it is still current,
// and the pairs it forms with its new neighbours are pushed. Ties in rank go to the leftmost
// pair, which is what makes "aaa" -> "aa" + "a".
#include "text/bpe.h"

#include <algorithm>
#include <array>
#include <functional>

#include "core/error.h"
#include "text/unicode.h"

namespace qwen36::text {

namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::unordered_map<char32_t, uint8_t> to_byte;
  Alphabet() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_char[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return alphabet().to_char[b]; }

int char_to_byte(char32_t c) {
  const auto& m = alphabet().to_byte;
  auto it = m.find(c);
  return it == m.end() ? -1 : it->second;
}

std::string bytes_to_token_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

std::string token_text_to_bytes(std::string_view text) {
  if (!is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const int b = char_to_byte(next_code_point(text, pos));
    if (b < 0) return std::string(text);
    out += static_cast<char>(b);
  }
  return out;
}

BpeMerger::BpeMerger(const std::vector<int32_t>& byte_ids, const std::vector<Merge>& merges) {
  QWEN36_CHECK(byte_ids.size() == 256, "BPE: byte table must have 256 entries");
  std::copy(byte_ids.begin(), byte_ids.end(), byte_ids_);
  size_t cap = 16;
  while (cap < merges.size() * 2) cap *= 2;
  table_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m.left)) << 32) |
                         static_cast<uint32_t>(m.right);
    uint64_t h = (key * 0x9E3779B97F4A7C15ULL) >> 17;
    for (;; ++h) {
      Slot& s = table_[h & mask_];
      if (s.key == kEmpty) {
        s = Slot{key, static_cast<uint32_t>(rank), m.result};
        break;
      }
      if (s.key == key) {  // a repeated pair: the later line wins, as in Hugging Face
        s.rank = static_cast<uint32_t>(rank);
        s.result = m.result;
        break;
      }
    }
  }
  merge_count_ = merges.size();
}

const BpeMerger::Slot* BpeMerger::find(int32_t left, int32_t right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  for (uint64_t h = (key * 0x9E3779B97F4A7C15ULL) >> 17;; ++h) {
    const Slot& s = table_[h & mask_];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
  }
}

void BpeMerger::encode(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(bytes[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (bytes.size() > kCacheMaxWordBytes) {
    merge_uncached(bytes, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_uncached(bytes, out);
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= kCacheMaxEntries) cache_.clear();
  cache_.emplace(std::string(bytes), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
}

void BpeMerger::merge_uncached(std::string_view bytes, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // linked list over live symbols; -1 at the ends
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;  // min-heap via std::push_heap / pop_heap
  const auto cmp = std::greater<>{};

  symbols.clear();
  for (char c : bytes) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Slot* s = find(symbols[i].id, symbols[i + 1].id))
      heap.push_back(Candidate{s->rank, static_cast<int32_t>(i), s->result});
  }
  std::make_heap(heap.begin(), heap.end(), cmp);
  auto push = [&](Candidate c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    const Symbol right = symbols[static_cast<size_t>(left.next)];
    // Skip entries made stale by earlier merges: the pair must still yield the same token.
    const Slot* now = find(left.id, right.id);
    if (now == nullptr || now->result != top.result) continue;

    symbols[static_cast<size_t>(left.next)].alive = false;
    left.id = top.result;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      if (const Slot* s = find(symbols[static_cast<size_t>(left.prev)].id, left.id))
        push(Candidate{s->rank, left.prev, s->result});
    }
    if (left.next >= 0) {
      if (const Slot* s = find(left.id, symbols[static_cast<size_t>(left.next)].id))
        push(Candidate{s->rank, top.pos, s->result});
    }
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace qwen36::text
