#include "backends/ucx/tcp_lanes.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>

#include "idist/common/addresses.hpp"

namespace idist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// What a connecting rank says first: whose listener it meant (the nonce
// published beside the address, so that a stray connection is turned away) and
// which rank it is.
struct Hello {
  std::uint64_t nonce;
  std::uint32_t rank;
  std::uint32_t magic;
};
constexpr std::uint32_t kMagic = 0x69647463;  // "idtc"
constexpr const char* kClosed = "closed by the peer: it exited, or failed a collective of its own";

// A message's header: the collective's tag and the length, checked by the
// receiver.
struct Header {
  std::uint64_t tag;
  std::uint64_t bytes;
};
static_assert(sizeof(Header) == sizeof(TcpLanes::Transfer::header));

std::string error_text(int err) { return std::strerror(err); }

// The whole of a handshake's few bytes, out (`send`) or in, by the deadline; false if the
// connection ended or the deadline came first.
bool move_all(int fd, char* data, std::size_t bytes, bool send, Clock::time_point deadline) {
  while (bytes > 0) {
    const auto n = send ? ::send(fd, data, bytes, MSG_DONTWAIT | MSG_NOSIGNAL) : ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (!common::wait_fd(fd, send ? POLLOUT : POLLIN, deadline)) return false;
  }
  return true;
}

// host:port's first address that takes a connection by the deadline; -1 and `why` if none.
int connect_to(const std::string& host, const std::string& port, Clock::time_point deadline, std::string& why) {
  int fd = -1;
  const auto tried = common::try_addresses(host, port, SOCK_STREAM, [&](const addrinfo& a, std::string& reason) {
    fd = common::connect_within(a, deadline, reason);
    return fd >= 0;
  });
  if (!tried.ok) why = tried.error;
  return fd;
}

// Our listener and what we publish of it: "ADDRESS PORT NONCE", or empty for none (no
// address given, or none could be bound). The listener is closed with this.
struct Offer {
  int listener = -1;
  std::uint64_t nonce = 0;
  std::string text;
  Offer() = default;
  Offer(const Offer&) = delete;
  Offer& operator=(const Offer&) = delete;
  ~Offer() {
    if (listener >= 0) ::close(listener);
  }
};

void listen_on(const std::string& address, Offer& offer) {
  if (address.empty()) return;
  int& listener = offer.listener;
  const auto tried = common::try_addresses(address, "0", SOCK_STREAM, [&](const addrinfo& a, std::string& reason) {
    listener = ::socket(a.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listener >= 0 && ::bind(listener, a.ai_addr, a.ai_addrlen) == 0 && ::listen(listener, SOMAXCONN) == 0)
      return true;
    reason = error_text(errno);
    if (listener >= 0) ::close(listener);
    listener = -1;
    return false;
  });
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (!tried.ok || ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return;
  const auto port = bound.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                               : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  try {
    std::random_device device;
    offer.nonce = (std::uint64_t{device()} << 32) | device();
  } catch (const std::exception&) {  // no entropy source: the nonce only turns strays away
    offer.nonce = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^ static_cast<std::uint64_t>(::getpid());
  }
  offer.text = address + " " + std::to_string(port) + " " + std::to_string(offer.nonce);
}

// Every peer's offer (ours at `rank`, empty), as each published it by the deadline.
std::vector<std::string> read_offers(Store& store, const std::string& prefix, int rank, int size,
                                     Clock::time_point deadline, const std::function<std::string(int)>& who) {
  std::vector<std::string> offers(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto value =
        read_published(store, prefix, r, deadline, who(r), "did not say in time whether it takes TCP lanes");
    offers[static_cast<std::size_t>(r)].assign(value.begin(), value.end());
  }
  return offers;
}

// A connection to the peer that made `theirs` ("ADDRESS PORT NONCE"), which has been told who
// we are; throws naming the peer where none can be made.
int dial(const std::string& theirs, int rank, Clock::time_point deadline, const std::string& peer) {
  // No field holds a space (an IPv6 address has none either).
  const auto first = theirs.find(' '), second = theirs.rfind(' ');
  const std::string host = theirs.substr(0, first), port = theirs.substr(first + 1, second - first - 1);
  std::string why;
  const int fd = connect_to(host, port, deadline, why);
  const Hello hello{std::strtoull(theirs.c_str() + second + 1, nullptr, 10), static_cast<std::uint32_t>(rank), kMagic};
  if (fd < 0 || !move_all(fd, reinterpret_cast<char*>(const_cast<Hello*>(&hello)), sizeof(hello), true, deadline)) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("ucx: cannot open a TCP lane to " + peer + " at " + host + ":" + port + " (" +
                             (why.empty() ? "the hello was not taken" : why) +
                             "); IDIST_UCX_TCP_FROM=off carries everything over UCX");
  }
  return fd;
}

// Takes the connections of the `expected` higher ranks that `wanted` into fds, turning strays
// away, by the deadline.
void accept_lanes(const Offer& offer, int rank, int expected, std::vector<int>& fds,
                  const std::function<bool(int)>& wanted, Clock::time_point deadline,
                  const std::function<std::string(int)>& who) {
  const int size = static_cast<int>(fds.size());
  while (expected > 0) {
    if (!common::wait_fd(offer.listener, POLLIN, deadline)) {
      std::string missing;
      for (int r = rank + 1; r < size; ++r)
        if (wanted(r) && fds[static_cast<std::size_t>(r)] < 0) missing += (missing.empty() ? "" : ", ") + who(r);
      throw TimeoutFailure("ucx: no TCP lane from " + missing +
                           " within the deadline: stopped, or its connection blocked between the hosts? "
                           "IDIST_UCX_TCP_FROM=off carries everything over UCX");
    }
    const int fd = ::accept4(offer.listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      throw std::runtime_error("ucx: cannot take a TCP lane's connection (accept: " + error_text(errno) +
                               "): raise the open files limit (ulimit -n), or IDIST_UCX_TCP_FROM=off "
                               "carries everything over UCX");
    }
    Hello hello{};
    // A stray or wrong connection is closed and forgotten: only ours count.
    if (!move_all(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false,
                  std::min(deadline, Clock::now() + std::chrono::seconds(1))) ||
        hello.magic != kMagic || hello.nonce != offer.nonce || hello.rank <= static_cast<std::uint32_t>(rank) ||
        hello.rank >= static_cast<std::uint32_t>(size) || fds[hello.rank] >= 0) {
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fds[hello.rank] = fd;
    --expected;
  }
}

}  // namespace

std::vector<char> read_published(Store& store, const std::string& prefix, int r, Clock::time_point deadline,
                                 const std::string& who, const std::string& late) {
  const auto key = prefix + std::to_string(r);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    store.wait({key}, std::max(std::chrono::milliseconds(1), left));
  } catch (const TimeoutFailure&) {
    throw TimeoutFailure("ucx: " + who + " " + late + ": stopped, or never reached this group's creation?");
  }
  return store.get(key);
}

std::size_t tcp_lanes_from(const env::Contract& contract) {
  return contract.tuning.ucx_tcp_from.value_or(64 * 1024);
}

// The higher rank of a pair connects, the lower accepts.
TcpLanes::TcpLanes(Store& store, const std::string& prefix, int rank, int size,
                   const std::string& address,
                   const std::function<bool(int)>& apart, Clock::time_point deadline,
                   const std::function<std::string(int)>& who)
    : fds_(static_cast<std::size_t>(size), -1), lanes_(static_cast<std::size_t>(size)) {
  Offer offer;
  listen_on(address, offer);
  try {
    store.set(prefix + std::to_string(rank), std::vector<char>(offer.text.begin(), offer.text.end()));
    const auto offers = read_offers(store, prefix, rank, size, deadline, who);
    // A lane to r where both offer one and r is on another host.
    const auto wanted = [&](int r) {
      return !offer.text.empty() && !offers[static_cast<std::size_t>(r)].empty() && apart(r);
    };
    for (int r = 0; r < rank; ++r)
      if (wanted(r)) fds_[static_cast<std::size_t>(r)] = dial(offers[static_cast<std::size_t>(r)], rank, deadline, who(r));
    int expected = 0;
    for (int r = rank + 1; r < size; ++r) expected += wanted(r) ? 1 : 0;
    accept_lanes(offer, rank, expected, fds_, wanted, deadline, who);
  } catch (...) {
    for (auto& fd : fds_)
      if (fd >= 0) ::close(fd), fd = -1;
    throw;
  }
}

TcpLanes::~TcpLanes() {
  for (const int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void TcpLanes::push(std::deque<std::shared_ptr<Transfer>>& queue, const std::shared_ptr<Transfer>& t, int peer) {
  auto& lane = lanes_[static_cast<std::size_t>(peer)];
  if (lane.broken()) {
    t->state = lane.state;
    t->why = lane.why;
    return;
  }
  queue.push_back(t);
  progress(peer);
}

std::shared_ptr<TcpLanes::Transfer> TcpLanes::send(const void* data, std::size_t bytes, int peer, std::uint64_t tag) {
  auto t = std::make_shared<Transfer>();
  t->data = static_cast<char*>(const_cast<void*>(data));  // only read
  t->bytes = bytes;
  t->tag = tag;
  push(lanes_[static_cast<std::size_t>(peer)].sends, t, peer);
  return t;
}

std::shared_ptr<TcpLanes::Transfer> TcpLanes::recv(void* data, std::size_t bytes, int peer, std::uint64_t tag) {
  auto t = std::make_shared<Transfer>();
  t->data = static_cast<char*>(data);
  t->bytes = bytes;
  t->tag = tag;
  t->recv = true;
  push(lanes_[static_cast<std::size_t>(peer)].recvs, t, peer);
  return t;
}

void TcpLanes::progress() {
  for (int peer = 0; peer < static_cast<int>(fds_.size()); ++peer)
    if (fds_[static_cast<std::size_t>(peer)] >= 0) progress(peer);
}

void TcpLanes::lose(int peer, const std::string& why, State state) {
  auto& lane = lanes_[static_cast<std::size_t>(peer)];
  // The peer learns at once (its transfers end, rather than wait for the deadline), and
  // nothing is written from or read into a caller's buffer after this.
  ::shutdown(fds_[static_cast<std::size_t>(peer)], SHUT_RDWR);
  for (auto* queue : {&lane.sends, &lane.recvs}) {
    for (auto& t : *queue) {
      t->state = state;
      t->why = why;
    }
    queue->clear();
  }
  lane.why = why;
  lane.state = state;
}

void TcpLanes::progress(int peer) {
  const int fd = fds_[static_cast<std::size_t>(peer)];
  auto& lane = lanes_[static_cast<std::size_t>(peer)];
  // Sends: the header and the bytes in one call while the kernel takes them.
  while (!lane.sends.empty()) {
    auto& t = *lane.sends.front();
    const Header header{t.tag, t.bytes};
    iovec iov[2];
    int count = 0;
    if (t.header_moved < sizeof(header))
      iov[count++] = {reinterpret_cast<char*>(const_cast<Header*>(&header)) + t.header_moved,
                      sizeof(header) - t.header_moved};
    if (t.moved < t.bytes) iov[count++] = {t.data + t.moved, t.bytes - t.moved};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    const auto n = count == 0 ? 0 : ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      return lose(peer, error_text(errno), State::kLost);
    }
    auto moved = static_cast<std::size_t>(n);
    const auto into_header = std::min(moved, sizeof(header) - t.header_moved);
    t.header_moved += into_header;
    t.moved += moved - into_header;
    if (t.header_moved < sizeof(header) || t.moved < t.bytes) break;  // the socket is full
    t.state = State::kDone;
    lane.sends.pop_front();
  }
  // Receives: the header first (checked), then the bytes straight into the
  // caller's buffer.
  while (!lane.recvs.empty()) {
    auto& t = *lane.recvs.front();
    if (t.header_moved < sizeof(Header)) {
      const auto n = ::recv(fd, t.header + t.header_moved, sizeof(Header) - t.header_moved, MSG_DONTWAIT);
      if (n == 0) return lose(peer, kClosed, State::kLost);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return lose(peer, error_text(errno), State::kLost);
      }
      t.header_moved += static_cast<std::size_t>(n);
      if (t.header_moved < sizeof(Header)) break;
      Header header{};
      std::memcpy(&header, t.header, sizeof(header));
      if (header.tag != t.tag || header.bytes != t.bytes) {
        // Out of step with the peer: nothing later on this lane can be trusted
        // either.
        t.why = header.tag != t.tag
                    ? "a message of another collective came"
                    : std::to_string(header.bytes) + " bytes came where " + std::to_string(t.bytes) + " were expected";
        auto first = lane.recvs.front();
        lane.recvs.pop_front();
        lose(peer, "an earlier collective went out of step with it", State::kBroken);
        first->state = State::kMismatch;
        return;
      }
    }
    if (t.moved < t.bytes) {
      const auto n = ::recv(fd, t.data + t.moved, t.bytes - t.moved, MSG_DONTWAIT);
      if (n == 0) return lose(peer, kClosed, State::kLost);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return lose(peer, error_text(errno), State::kLost);
      }
      t.moved += static_cast<std::size_t>(n);
      if (t.moved < t.bytes) break;
    }
    t.state = State::kDone;
    lane.recvs.pop_front();
  }
}

void TcpLanes::break_pending(const std::string& why) {
  for (int peer = 0; peer < static_cast<int>(fds_.size()); ++peer) {
    const auto& lane = lanes_[static_cast<std::size_t>(peer)];
    if (!lane.broken() && (!lane.sends.empty() || !lane.recvs.empty())) lose(peer, why, State::kBroken);
  }
}

void TcpLanes::abandon(const std::shared_ptr<Transfer>& transfer, int peer) {
  auto& lane = lanes_[static_cast<std::size_t>(peer)];
  auto& queue = transfer->recv ? lane.recvs : lane.sends;
  // A transfer not yet begun could leave, but those behind it were posted
  // expecting it first: simpler and as true to call the lane out of step.
  std::erase(queue, transfer);
  transfer->state = State::kBroken;
  transfer->why = "given up";
  if (!lane.broken()) lose(peer, "an earlier collective was given up part way", State::kBroken);
}

}  // namespace idist::detail
