#include "store_watch.hpp"

#include <spdlog/fmt/fmt.h>

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
  explicit Held(asio::io_context& io) : socket(io) {}
  asio::ip::tcp::socket socket;
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

void StoreWatch::gone(const std::string& id, const std::string& key) {
  if (held_.erase(key) > 0) gone_(id);
}

void StoreWatch::watch(const std::string& id, const std::string& addr, int port, const std::string& token) {
  const auto key = fmt::format("{}@{}:{}", id, addr, port);
  if (held_.count(key) > 0 || port <= 0) return;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(addr, ec);
  if (ec) return;  // a host name: not watched (its lease decides)
  auto held = std::make_shared<Held>(io_);
  held->hello = idist::detail::hello_frame(token);
  held_[key] = held;
  std::weak_ptr<Held> weak = held;
  held->socket.async_connect({address, static_cast<unsigned short>(port)}, [this, id, key, weak](auto ec) {
    auto h = weak.lock();
    if (!h) return;  // cleared meanwhile
    if (ec == asio::error::connection_refused) return gone(id, key);
    if (ec) return drop(key, h);
    asio::async_write(h->socket, asio::buffer(h->hello), [this, id, key, weak](auto ec, std::size_t) {
      auto h = weak.lock();
      if (!h) return;
      if (ec) return drop(key, h);
      read(id, key, weak);
    });
  });
}

void StoreWatch::drop(const std::string& key, const std::shared_ptr<Held>& held) {
  if (const auto it = held_.find(key); it != held_.end() && it->second == held) held_.erase(it);
}

// Reads until the connection ends: nothing comes after the hello's answer, so its end is the
// store's (the process's) end, unless the hello was refused (BUSY, a wrong token).
void StoreWatch::read(const std::string& id, const std::string& key, std::weak_ptr<Held> weak) {
  auto h = weak.lock();
  if (!h) return;
  h->socket.async_read_some(asio::buffer(h->buffer), [this, id, key, weak](auto ec, std::size_t n) {
    auto h = weak.lock();
    if (!h) return;
    const bool taken = h->seen >= h->first.size() && h->first[4] == kOk;
    if (ec) return taken ? gone(id, key) : drop(key, h);
    for (std::size_t i = 0; i < n && h->seen < h->first.size(); ++i) h->first[h->seen++] = h->buffer[i];
    if (h->seen >= h->first.size() && h->first[4] != kOk) return drop(key, h);
    read(id, key, weak);
  });
}

}  // namespace idist::launchers::etcd_rdzv
