#pragma once
// Live recovery (docs/RECOVERY.md): a thread of the rank's own waits in idist-run's generation
// store for the generation after its current one. A rank sees a lost peer in its collective
// when the peer's connection ends (a kill); a peer that went silent instead (a node cut off,
// a whole node frozen) never ends it, and the rank would wait out IDIST_TIMEOUT. idist-run
// finds such a node by its silence and announces a generation without it: this watch then
// aborts the current generation's groups, so that the rank's collective raises PeerLostError
// and it re-forms with the others. The store wakes the wait: nothing is polled. It also hears
// of a replacement waiting to join (Runtime::replacement_waiting).

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "store/tcp_store.hpp"

namespace idist::detail {

class GenerationWatch {
 public:
  struct Calls {
    std::function<std::uint64_t()> current;           // the rank's generation now
    std::function<void(std::uint64_t)> superseded;    // (g): g + 1 announced while the rank is in g
    std::function<void(std::uint64_t)> replacement;   // (n): n admits a replacement, nobody lost
  };
  // The calls come on the watch's thread. A generation that admits a replacement (env_contract's
  // ";grow") aborts nothing: the rank goes on, and the watch waits for the one after it.
  // Connects at once (throws where idist-run's store does not answer).
  GenerationWatch(const TcpStoreOptions& store, Calls calls);
  ~GenerationWatch();
  GenerationWatch(const GenerationWatch&) = delete;
  GenerationWatch& operator=(const GenerationWatch&) = delete;

 private:
  void run();

  std::unique_ptr<TcpStore> store_;
  Calls calls_;
  std::atomic<bool> stop_ = false;
  pid_t owner_;  // the process whose thread watches (a child forked without exec has none)
  std::unique_ptr<std::thread> thread_;
};

}  // namespace idist::detail
