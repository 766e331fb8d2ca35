#include "store_watch.hpp"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <array>
#include <vector>

#include "idist_store/server.hpp"

namespace idist::launchers::etcd_rdzv {

namespace asio = boost::asio;

namespace {
// The store's answer to a hello it takes: a frame of one byte, OK (lib/src/store/wire.hpp).
constexpr char kOk = static_cast<char>(0x80);
}  // namespace

struct StoreWatch::Held {
  Held(asio::io_context& io, asio::ip::tcp::endpoint at) : socket(io), endpoint(at) {}
  asio::ip::tcp::socket socket;
  asio::ip::tcp::endpoint endpoint;
  std::vector<char> hello;
  std::array<char, 64> buffer{};
  std::array<char, 5> first{};  // the answer to the hello: its length, then OK where it was taken
  std::size_t seen = 0;
};

StoreWatch::StoreWatch(asio::io_context& io, std::function<void(const std::string&)> gone)
    : io_(io), gone_(std::move(gone)) {}

StoreWatch::~StoreWatch() { clear(); }

void StoreWatch::clear() {
  for (auto& [key, held] : held_) {
    boost::system::error_code ignored;
    held->socket.close(ignored);
  }
  held_.clear();
}

void StoreWatch::watch(const std::string& id, const std::string& addr, int port, const std::string& token) {
  const auto key = fmt::format("{}@{}:{}", id, addr, port);
  if (held_.count(key) > 0 || port <= 0) return;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(addr, ec);
  if (ec) return;  // a host name: not watched (its lease decides)
  auto held = std::make_shared<Held>(io_, asio::ip::tcp::endpoint(address, static_cast<unsigned short>(port)));
  held->hello = idist::detail::hello_frame(token);
  held_[key] = held;
  connect(id, key, held, false);
}

// A store not watched (refused at the first try: a firewall's REJECT is no death; unreachable;
// its hello refused) stays in held_, closed, so that the reads that follow do not try again.
void StoreWatch::unwatched(const std::shared_ptr<Held>& held) {
  boost::system::error_code ignored;
  held->socket.close(ignored);
}

// `confirming`: the connection it held ended. A close alone is not proof (a middlebox's reset
// of an idle flow), so it tries once more: refused where the store listened means the process
// is gone; taken again, it watches on.
void StoreWatch::connect(const std::string& id, const std::string& key, const std::shared_ptr<Held>& held,
                         bool confirming) {
  std::weak_ptr<Held> weak = held;
  held->seen = 0;
  boost::system::error_code ec;
  if (held->socket.open(held->endpoint.protocol(), ec)) return unwatched(held);
  ::fcntl(held->socket.native_handle(), F_SETFD, FD_CLOEXEC);  // not into the ranks started later
  held->socket.async_connect(held->endpoint, [this, id, key, weak, confirming](auto ec) {
    auto h = weak.lock();
    if (!h) return;  // cleared meanwhile
    if (ec == asio::error::connection_refused && confirming) return found_gone(id, key);
    if (ec) return unwatched(h);
    asio::async_write(h->socket, asio::buffer(h->hello), [this, id, key, weak, confirming](auto ec, std::size_t) {
      auto h = weak.lock();
      if (!h) return;
      if (ec) return confirming ? found_gone(id, key) : unwatched(h);
      read(id, key, weak, confirming);
    });
  });
}

void StoreWatch::found_gone(const std::string& id, const std::string& key) {
  held_.erase(key);
  gone_(id);
}

// Reads until the connection ends: nothing comes after the hello's answer, so its end is the
// store's (the process's) end, unless the hello was refused (BUSY, a wrong token).
// Confirming, a connection ended before its hello was answered is the end too: the listening
// port can outlive the process for a moment (a child holding it), and nobody answers there.
void StoreWatch::read(const std::string& id, const std::string& key, std::weak_ptr<Held> weak, bool confirming) {
  auto h = weak.lock();
  if (!h) return;
  h->socket.async_read_some(asio::buffer(h->buffer), [this, id, key, weak, confirming](auto ec, std::size_t n) {
    auto h = weak.lock();
    if (!h) return;
    const bool taken = h->seen >= h->first.size() && h->first[4] == kOk;
    if (ec && !taken) return confirming ? found_gone(id, key) : unwatched(h);
    if (ec) {
      boost::system::error_code ignored;
      h->socket.close(ignored);
      return connect(id, key, h, true);
    }
    for (std::size_t i = 0; i < n && h->seen < h->first.size(); ++i) h->first[h->seen++] = h->buffer[i];
    if (h->seen >= h->first.size() && h->first[4] != kOk) return unwatched(h);
    // From here a kill -9 of that node is seen at once, not at its lease's end (-v; a test waits for it).
    if (!taken && h->seen >= h->first.size()) spdlog::debug("store watch: watching node {}'s store ({})", id, key);
    read(id, key, weak, h->seen < h->first.size() && confirming);
  });
}

}  // namespace idist::launchers::etcd_rdzv
