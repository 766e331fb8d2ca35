#include "generations.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "idist/env_contract.hpp"
#include "idist_store/server.hpp"

namespace idist::launchers::rendezvous {

namespace {

// Losses this close together make one generation: a node's ranks killed together, a kill
// that takes a rank's child too. Short beside a step; the survivors already wait in reform().
constexpr auto kSettle = std::chrono::milliseconds(50);

}  // namespace

Generations::Generations(boost::asio::io_context& io, const std::string& host, const std::string& token, int world,
                         Announced announced)
    : store_(std::make_unique<idist::detail::TcpStoreServer>(
          idist::detail::StoreServerOptions{.host = host, .port = 0, .token = token})),
      settle_(io),
      announced_(std::move(announced)),
      members_(static_cast<std::size_t>(std::max(world, 0))) {
  std::iota(members_.begin(), members_.end(), 0);
}

Generations::~Generations() = default;

std::string Generations::listen_address() const { return store_->listen_address(); }

int Generations::port() const { return store_->port(); }

void Generations::lose(const std::vector<int>& ranks, std::string why) {
  if (standing_down_) return;
  leaving_.insert(leaving_.end(), ranks.begin(), ranks.end());
  why_.push_back(std::move(why));
  settle_.expires_after(kSettle);
  // A wait that completed is run even once this object is gone: the token says whether it is.
  settle_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](auto ec) {
    if (!ec && !alive.expired() && !standing_down_) announce();
  });
}

void Generations::ended(int rank) {
  leaving_.push_back(rank);
  try {
    store_->set(env::ended_key(rank), {});
  } catch (const std::exception&) {
    // The survivors wait until IDIST_TIMEOUT instead.
  }
}

bool Generations::all_joined() {
  if (generation_ == 0) return true;
  std::vector<std::string> keys;
  for (int m : members_) keys.push_back(env::joined_key(generation_, m));
  const auto joined = store_->check(keys);
  return std::find(joined.begin(), joined.end(), false) == joined.end();
}

std::string Generations::unrecovered() {
  if (pending()) return fmt::format("{}, and the job ended before it could re-form without it", fmt::join(why_, ", "));
  try {
    if (all_joined()) return "";
  } catch (const std::exception& e) {
    spdlog::warn("live recovery: cannot tell whether the ranks re-formed ({})", e.what());
  }
  return fmt::format("{}, and a rank of generation {} ended without re-forming (its program did not call "
                     "idist::reform()): the loss stands",
                     last_line_, generation_);
}

void Generations::stand_down() {
  standing_down_ = true;
  settle_.cancel();
}

void Generations::announce() {
  if (why_.empty()) return;  // a wait re-armed after its last one completed: announced already
  std::vector<int> members;
  for (int m : members_)
    if (std::find(leaving_.begin(), leaving_.end(), m) == leaving_.end()) members.push_back(m);
  if (members.empty()) return;
  ++generation_;
  try {
    const auto text = fmt::format("members={}", fmt::join(members, ","));
    store_->set(env::generation_key(generation_), {text.begin(), text.end()});
  } catch (const std::exception& e) {
    // The survivors wait in vain, and their IDIST_TIMEOUT ends it: say why now.
    spdlog::error("live recovery: cannot announce generation {}: {}", generation_, e.what());
    return;
  }
  const auto line = fmt::format("{}; world {} -> {}", fmt::join(why_, ", "), members_.size(), members.size());
  spdlog::info("generation {}: ranks {} go on as a world of {} ({})", generation_, fmt::join(members, ", "),
               members.size(), line);
  last_line_ = fmt::format("{}", fmt::join(why_, ", "));
  why_.clear();
  leaving_.clear();
  members_ = std::move(members);
  if (announced_) announced_(generation_, members_, line);
}

}  // namespace idist::launchers::rendezvous
