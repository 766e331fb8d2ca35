#pragma once
// The store server rank 0 hosts at MASTER_ADDR:MASTER_PORT, on a thread of its own; idist-run
// hosts one too, for live recovery's generations (launchers/src/supervise/recovery.hpp).
//
// Any host that can reach the port can connect, so the server assumes nothing of a client:
// every client must present the job token first (when the job has one); frames, keys per
// request, the store's total size and the number of connections are bounded; a client that
// stalls mid-message is dropped after a while and never holds up the others (each connection
// is served asynchronously on the one io thread).

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace idist::detail {

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // the address rank 0 is reached at; bound, not all interfaces
  int port = 0;                    // 0: any free port (tests)
  std::string token;               // when set, a client that does not present it is refused
  // Listen on the wildcard address of host's family rather than on host only: for a rank 0
  // reached at an address it does not have (NAT, a floating alias). IDIST_STORE_BIND_ALL.
  bool bind_all = false;
  std::size_t max_connections = 16384;        // beyond this, new connections are closed at once
  std::size_t max_keys = 1u << 20;            // keys the store holds at most
  std::size_t max_bytes = std::size_t{1} << 30;  // key and value bytes the store holds at most
  // A connection must present its hello this soon after connecting, and a frame once begun
  // must arrive in full this soon: otherwise the connection is dropped.
  std::chrono::milliseconds hello_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds frame_timeout = std::chrono::seconds(30);
};

// The first frame a client sends (HELLO token), for a process that holds a connection only to
// learn when the store's host is gone (etcd's rendezvous watching the nodes' idist-run).
std::vector<char> hello_frame(std::string_view token);

class TcpStoreServer {
 public:
  // Binds and starts serving; throws std::runtime_error naming host:port when it cannot bind.
  explicit TcpStoreServer(const StoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  // Stores `value` at `key` as a client's set would, waking the clients that wait for it:
  // for the process that hosts the store (idist-run announcing a generation). Throws
  // std::runtime_error when the store is full.
  void set(const std::string& key, std::vector<char> value);
  // Which of `keys` the store holds now, for the process that hosts it.
  std::vector<bool> check(const std::vector<std::string>& keys);
  // The address the server listens on (tests check that it is not the wildcard).
  std::string listen_address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idist::detail
