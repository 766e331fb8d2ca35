#include "common/cpus_shared.hpp"

#include "idist/common/host.hpp"

namespace idist::detail {
namespace {

std::atomic<std::uint32_t> word{0};

}  // namespace

void follow_cpus_shared(const env::Contract& contract, int ranks_here) {
  // Once a join counted them, its count alone: LOCAL_WORLD_SIZE may be an earlier generation's,
  // or unset (it then reads as the whole world's size).
  const int here = ranks_here > 0 ? ranks_here : contract.local_world_size;
  const bool yes = contract.cpus_shared == "1" || (contract.cpus_shared == "auto" && here > common::host_cores());
  word.store(yes ? 1 : 0, std::memory_order_relaxed);
}

const std::atomic<std::uint32_t>& cpus_shared_word() { return word; }

}  // namespace idist::detail
