#pragma once
// The store server rank 0 hosts at MASTER_ADDR:MASTER_PORT, on a thread of its own.

#include <memory>
#include <string>

namespace idist::detail {

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // the address rank 0 is reached at; bound, not all interfaces
  int port = 0;                    // 0: any free port (tests)
  std::string token;               // when set, a client that does not present it is refused
};

class TcpStoreServer {
 public:
  // Binds and starts serving; throws std::runtime_error naming host:port when it cannot bind.
  explicit TcpStoreServer(const StoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idist::detail
