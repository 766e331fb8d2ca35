#include "store/tcp_store.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/duration.hpp"
#include "idist/common/addresses.hpp"
#include "store/wire.hpp"

namespace idist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// The server would refuse more; saying so here names the caller's mistake without a round trip.
void check_key_count(std::size_t n) {
  if (n > wire::kMaxKeys)
    throw std::invalid_argument("store wait/check: " + std::to_string(n) + " keys in one request, at most " +
                                std::to_string(wire::kMaxKeys));
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  const auto deadline = Clock::now() + options_.timeout;
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  // A store that made room by dropping a stranger's connection (at its connection limit, or
  // out of descriptors) answers BUSY and hangs up: the stranger may have been us, our hello
  // still on its way, so try again, as while rank 0 is not up yet, until the deadline, and
  // then say what the store said. A store that can make no room, every connection it holds
  // being the job's own, answers ERROR with its cause: no wait would change it, so say so now.
  auto backoff = std::chrono::milliseconds(10);
  int turned_away = 0;
  for (;;) {
    connect(deadline);
    const auto reply = request(wire::Writer(static_cast<std::uint8_t>(wire::Op::hello)).bytes(options_.token).frame(),
                               deadline, "hello");
    const auto code = static_cast<std::uint8_t>(reply.at(0));
    if (code == static_cast<std::uint8_t>(wire::Reply::ok)) return;
    wire::Reader in(reply);
    in.code();
    const auto why = in.bytes();
    if (code != static_cast<std::uint8_t>(wire::Reply::busy)) {
      close_fd();
      if (!why || why->empty() || *why == wire::kWrongToken)
        throw std::runtime_error("the store at " + where +
                                 " refused this rank: wrong IDIST_JOB_TOKEN (is another job using this port?)");
      throw std::runtime_error("could not join the store at " + where + ": " + std::string(*why) +
                               " (rank 0's log says more)");
    }
    close_fd();
    ++turned_away;
    if (Clock::now() + backoff >= deadline)
      throw TimeoutFailure("could not join the store at " + where + " within " + duration_text(options_.timeout) +
                           ": it turned this rank away " + std::to_string(turned_away) + " time(s): " +
                           std::string(why.value_or("it is at its connection limit")) + " (rank 0's log says more)");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

void TcpStore::interrupt() {
  interrupted_ = true;
  // The request in flight (which holds mu_) sees its connection end; it closes the descriptor.
  // Under fd_mu_, so that the number shut down is never one closed and reused meanwhile.
  std::lock_guard lock(fd_mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void TcpStore::close_fd() {
  std::lock_guard lock(fd_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::connect(Clock::time_point deadline) {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  std::string last_error = "no attempt";
  // Rank 0 may come up after us: retry refused connections until the deadline. Start at 1 ms
  // and stay under 50 ms: at launch, ranks routinely beat rank 0's store by a few ms, and a
  // long sleep then is most of the job's start-up (docs/BENCHMARKS.md).
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    const auto tried = common::try_addresses(
        options_.host, std::to_string(options_.port), SOCK_STREAM, [&](const addrinfo& ai, std::string& why) {
          // Bounded per attempt so that a silently dropped SYN does not eat the whole budget.
          const int fd = common::connect_within(ai, std::min(deadline, Clock::now() + std::chrono::seconds(5)), why);
          if (fd < 0) return false;
          fd_ = fd;
          return true;
        });
    if (!tried.ok) last_error = tried.resolved ? tried.error : "cannot resolve host: " + tried.error;
    if (fd_ >= 0) return;
    if (Clock::now() + backoff >= deadline)
      throw TimeoutFailure("could not reach the store at " + where + " within " + duration_text(options_.timeout) +
                           " (" + last_error + "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }
}

std::string TcpStore::request(std::vector<char> frame, Clock::time_point deadline, const std::string& what) {
  // The time this request was given (a wait's own timeout, or the store's), for the message.
  const auto given = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  std::lock_guard lock(mu_);
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  if (interrupted_) throw std::runtime_error("the connection to the store at " + where + " was given up");
  if (fd_ < 0) throw std::runtime_error("the connection to the store at " + where + " was lost earlier");
  auto fail = [&](const std::string& why) -> std::runtime_error {
    // The reply stream is now out of step with our requests: never reuse this connection.
    close_fd();
    return std::runtime_error("store " + what + " at " + where + ": " + why);
  };
  auto timed_out = [&] {
    close_fd();
    return TimeoutFailure(detail::timed_out("store " + what + " at " + where, given));
  };

  std::size_t sent = 0;
  while (sent < frame.size()) {
    const auto n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!common::wait_fd(fd_, POLLOUT, deadline)) throw timed_out();
    } else {
      throw fail(std::strerror(errno));
    }
  }

  auto recv_exact = [&](char* out, std::size_t size) {
    std::size_t got = 0;
    while (got < size) {
      const auto n = ::recv(fd_, out + got, size - got, 0);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
      } else if (n == 0) {
        throw fail("the store closed the connection (did rank 0 exit?)");
      } else if (errno == EAGAIN || errno == EINTR) {
        if (!common::wait_fd(fd_, POLLIN, deadline)) throw timed_out();
      } else {
        throw fail(std::strerror(errno));
      }
    }
  };
  char header[4];
  recv_exact(header, 4);
  const auto length = wire::read_u32(header);
  if (length == 0 || length > wire::kMaxFrame) throw fail("malformed reply");
  std::string payload(length, '\0');
  recv_exact(payload.data(), length);
  return payload;
}

std::string TcpStore::call(std::vector<char> frame, Clock::time_point deadline, const std::string& what) {
  if (frame.size() - 4 > wire::kMaxFrame)
    throw std::invalid_argument("store " + what + ": " + std::to_string(frame.size() - 4) +
                                " bytes in one request, at most " + std::to_string(wire::kMaxFrame));
  auto payload = request(std::move(frame), deadline, what);
  if (static_cast<std::uint8_t>(payload.at(0)) == static_cast<std::uint8_t>(wire::Reply::error)) {
    wire::Reader in(payload);
    in.code();
    const auto why = in.bytes();
    throw std::runtime_error("store " + what + " at " + options_.host + ":" + std::to_string(options_.port) +
                             " refused: " + std::string(why.value_or("no reason given")));
  }
  return payload;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  call(wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes(key).bytes({value.data(), value.size()}).frame(),
          Clock::now() + options_.timeout, "set '" + key + "'");
}

std::vector<char> TcpStore::get(const std::string& key) {
  const auto payload = call(wire::Writer(static_cast<std::uint8_t>(wire::Op::get)).bytes(key).frame(),
                               Clock::now() + options_.timeout, "get '" + key + "'");
  wire::Reader in(payload);
  in.code();
  auto value = in.bytes();
  if (!value) throw std::runtime_error("store get '" + key + "': malformed reply");
  return {value->begin(), value->end()};
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  const auto payload = call(wire::Writer(static_cast<std::uint8_t>(wire::Op::add)).bytes(key).i64(delta).frame(),
                               Clock::now() + options_.timeout, "add '" + key + "'");
  wire::Reader in(payload);
  in.code();
  auto value = in.i64();
  if (!value) throw std::runtime_error("store add '" + key + "': malformed reply");
  return *value;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  check_key_count(keys.size());
  wire::Writer out(static_cast<std::uint8_t>(wire::Op::wait));
  out.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) out.bytes(k);
  call(out.frame(), Clock::now() + timeout,
          "wait for " + std::to_string(keys.size()) + " key(s)" + (keys.empty() ? "" : " ('" + keys.front() + "', ...)"));
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  check_key_count(keys.size());
  wire::Writer out(static_cast<std::uint8_t>(wire::Op::check));
  out.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) out.bytes(k);
  const auto payload = call(out.frame(), Clock::now() + options_.timeout, "check " + std::to_string(keys.size()) + " key(s)");
  wire::Reader in(payload);
  in.code();
  auto present = in.bytes();
  if (!present || present->size() != keys.size()) throw std::runtime_error("store check: malformed reply");
  std::vector<bool> out_flags;
  for (char c : *present) out_flags.push_back(c == '1');
  return out_flags;
}

}  // namespace idist::detail
