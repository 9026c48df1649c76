// Multi-process tensor parallelism: the launcher's environment, process 0's TCP links to the
// other processes (TCP_NODELAY: a decode step's command is ~100 bytes and latency-bound), and
// the byte form of a pass (raw little-endian fields; every process runs the same binary).
#include "engine/tp_remote.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

#include "core/error.h"

namespace qwen36 {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  QWEN36_CHECK(end && *end == '\0' && x >= 0 && x < (1 << 20), "environment: {}={} is not a rank or count", name, v);
  return int(x);
}

// ---- bytes ----

class Writer {
 public:
  template <typename T> void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    s_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T> void put_span(std::span<const T> v) {
    put(uint64_t(v.size()));
    s_.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T> T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, s_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T> std::vector<T> get_vec() {
    const uint64_t n = get<uint64_t>();
    QWEN36_CHECK(n <= s_.size() / sizeof(T), "tensor parallel: corrupt message (a list of {} items)", n);
    std::vector<T> v(static_cast<size_t>(n));
    need(size_t(n) * sizeof(T));
    std::memcpy(v.data(), s_.data() + at_, size_t(n) * sizeof(T));
    at_ += size_t(n) * sizeof(T);
    return v;
  }
  void end() const {
    QWEN36_CHECK(at_ == s_.size(), "tensor parallel: corrupt message ({} trailing bytes)", s_.size() - at_);
  }

 private:
  void need(size_t n) const { QWEN36_CHECK(at_ + n <= s_.size(), "tensor parallel: truncated message"); }
  const std::string& s_;
  size_t at_ = 0;
};

constexpr uint32_t kMagic = 0x71377470;  // "qTp7": a message of this protocol (7: the state type)

// ---- sockets ----

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    QWEN36_CHECK(w > 0, "tensor parallel: sending to another process failed: {}", std::strerror(errno));
    p += w, n -= size_t(w);
  }
}

bool read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= size_t(r);
  }
  return true;
}

void no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

TpProcessEnv tp_process_env() {
  TpProcessEnv e;
  if (std::getenv("WORLD_SIZE")) {
    e.world = env_int("WORLD_SIZE", 1), e.rank = env_int("RANK", 0), e.local_rank = env_int("LOCAL_RANK", 0);
  } else if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    e.world = env_int("OMPI_COMM_WORLD_SIZE", 1), e.rank = env_int("OMPI_COMM_WORLD_RANK", 0),
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  } else if (std::getenv("SLURM_NTASKS") && std::getenv("SLURM_PROCID")) {
    e.world = env_int("SLURM_NTASKS", 1), e.rank = env_int("SLURM_PROCID", 0);
    e.local_rank = env_int("SLURM_LOCALID", 0);
  }
  QWEN36_CHECK(e.world >= 1 && e.rank < e.world, "environment: rank {} of a world of {}", e.rank, e.world);
  if (e.world > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    QWEN36_CHECK(addr && *addr, "a multi-process launch (world size {}) needs MASTER_ADDR (process 0's host)", e.world);
    e.master_addr = addr;
    e.master_port = env_int("MASTER_PORT", 29500);
    QWEN36_CHECK(e.master_port > 0 && e.master_port < 65536, "MASTER_PORT {} is out of range", e.master_port);
  }
  return e;
}

std::unique_ptr<TpLink> TpLink::open(const TpProcessEnv& env, std::chrono::seconds timeout) {
  std::unique_ptr<TpLink> link(new TpLink());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left_ms = [&] {
    return int(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  if (env.rank == 0) {
    const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    QWEN36_CHECK(ls >= 0, "tensor parallel: socket: {}", std::strerror(errno));
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(env.master_port));
    if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, env.world) != 0) {
      const std::string why = std::strerror(errno);
      ::close(ls);
      fail("tensor parallel: cannot listen on port {} (MASTER_PORT): {}", env.master_port, why);
    }
    std::vector<int> by_rank(size_t(env.world), -1);
    for (int n = 1; n < env.world; ++n) {
      pollfd p{ls, POLLIN, 0};
      const int ready = ::poll(&p, 1, left_ms());
      const int fd = ready > 0 ? ::accept(ls, nullptr, nullptr) : -1;
      if (fd < 0) {
        ::close(ls);
        for (int x : by_rank)
          if (x >= 0) ::close(x);
        fail("tensor parallel: {} of {} processes connected to port {} in time", n - 1, env.world - 1, env.master_port);
      }
      no_delay(fd);
      int32_t hello[2] = {0, 0};  // magic, rank
      if (!read_all(fd, reinterpret_cast<char*>(hello), sizeof(hello)) || uint32_t(hello[0]) != kMagic ||
          hello[1] <= 0 || hello[1] >= env.world || by_rank[size_t(hello[1])] >= 0) {
        ::close(fd);
        --n;  // not one of ours (or a duplicate): keep waiting
        continue;
      }
      by_rank[size_t(hello[1])] = fd;
    }
    ::close(ls);
    for (int r = 1; r < env.world; ++r) link->fds_.push_back(by_rank[size_t(r)]);
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(env.master_port);
    for (;;) {
      int fd = -1;
      if (::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &res) == 0) {
        for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
          fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
          if (fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            ::close(fd);
            fd = -1;
          }
        }
        ::freeaddrinfo(res);
      }
      if (fd >= 0) {
        no_delay(fd);
        const int32_t hello[2] = {int32_t(kMagic), env.rank};
        write_all(fd, reinterpret_cast<const char*>(hello), sizeof(hello));
        link->fds_.push_back(fd);
        break;
      }
      QWEN36_CHECK(left_ms() > 0, "tensor parallel: process {} could not reach process 0 at {}:{} in {} s", env.rank,
                   env.master_addr, env.master_port, timeout.count());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  return link;
}

TpLink::~TpLink() {
  for (int fd : fds_) ::close(fd);
}

void TpLink::send_all(const std::string& msg) {
  const uint64_t n = msg.size();
  for (int fd : fds_) {
    write_all(fd, reinterpret_cast<const char*>(&n), sizeof(n));
    write_all(fd, msg.data(), msg.size());
  }
}

std::string TpLink::recv() {
  QWEN36_CHECK(fds_.size() == 1, "tensor parallel: only a follower process receives");
  uint64_t n = 0;
  QWEN36_CHECK(read_all(fds_[0], reinterpret_cast<char*>(&n), sizeof(n)),
               "tensor parallel: process 0 closed the link without a shutdown (it failed or was killed)");
  QWEN36_CHECK(n < (uint64_t(1) << 34), "tensor parallel: corrupt message length {}", n);
  std::string s(static_cast<size_t>(n), '\0');
  QWEN36_CHECK(read_all(fds_[0], s.data(), s.size()), "tensor parallel: process 0 closed the link mid-message");
  return s;
}

PeerPass TpMessage::view() const {
  PeerPass p;
  p.kind = pass;
  p.batch = batch.get();
  p.hidden = hidden, p.next_tokens = next_tokens, p.output_rows = output_rows, p.runs = runs;
  p.commits = commits;
  return p;
}

std::string encode_pass(const PeerPass& p, const ModelState& state) {
  Writer w;
  w.put(kMagic);
  w.put(TpMessage::Kind::Pass);
  w.put(uint64_t(reinterpret_cast<uintptr_t>(&state)));
  w.put(state.slots());
  w.put(state.spec_max_tokens());
  w.put(state.capacity());
  w.put(uint8_t(state.has_mtp()));
  w.put(state.kv_dtype());
  w.put(state.state_dtype());
  w.put(p.kind);
  switch (p.kind) {
    case PeerPass::Kind::Forward: {
      const ForwardBatch& b = *p.batch;
      w.put_span<int32_t>(b.tokens);
      w.put_span<SeqRun>(b.runs);
      w.put_span<int32_t>(b.output_rows);
      w.put(b.deltanet_mode);
      w.put_span<int32_t>(b.verify_runs);
      w.put_span<int32_t>(b.hidden_rows);
      break;
    }
    case PeerPass::Kind::Mtp:
      w.put_span(p.hidden);
      w.put_span(p.next_tokens);
      w.put_span(p.runs);
      w.put_span(p.output_rows);
      break;
    case PeerPass::Kind::Commit:
      w.put_span(p.commits);
      break;
  }
  return w.take();
}

std::string encode_shutdown() {
  Writer w;
  w.put(kMagic);
  w.put(TpMessage::Kind::Shutdown);
  return w.take();
}

TpMessage decode_message(const std::string& bytes) {
  Reader r(bytes);
  QWEN36_CHECK(r.get<uint32_t>() == kMagic, "tensor parallel: a message of another protocol version");
  TpMessage m;
  m.kind = r.get<TpMessage::Kind>();
  if (m.kind == TpMessage::Kind::Shutdown) {
    r.end();
    return m;
  }
  QWEN36_CHECK(m.kind == TpMessage::Kind::Pass, "tensor parallel: unknown message kind {}", int(m.kind));
  m.state_key = r.get<uint64_t>();
  m.slots = r.get<int32_t>();
  m.spec_tokens = r.get<int32_t>();
  m.capacity = r.get<int64_t>();
  m.mtp = r.get<uint8_t>() != 0;
  m.kv = r.get<DType>();
  m.state = r.get<DType>();
  m.pass = r.get<PeerPass::Kind>();
  switch (m.pass) {
    case PeerPass::Kind::Forward:
      m.batch = std::make_unique<ForwardBatch>();
      m.batch->tokens = r.get_vec<int32_t>();
      m.batch->runs = r.get_vec<SeqRun>();
      m.batch->output_rows = r.get_vec<int32_t>();
      m.batch->deltanet_mode = r.get<DeltaRuleMode>();
      m.batch->verify_runs = r.get_vec<int32_t>();
      m.batch->hidden_rows = r.get_vec<int32_t>();
      break;
    case PeerPass::Kind::Mtp:
      m.hidden = r.get_vec<float>();
      m.next_tokens = r.get_vec<int32_t>();
      m.runs = r.get_vec<SeqRun>();
      m.output_rows = r.get_vec<int32_t>();
      break;
    case PeerPass::Kind::Commit:
      m.commits = r.get_vec<SpecCommit>();
      break;
    default:
      fail("tensor parallel: unknown pass kind {}", int(m.pass));
  }
  r.end();
  return m;
}

}  // namespace qwen36
