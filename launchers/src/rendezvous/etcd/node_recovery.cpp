#include "node_recovery.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "client.hpp"
#include "idist/launchers/plan.hpp"
#include "rendezvous/generations.hpp"
#include "rendezvous/wire.hpp"

namespace idist::launchers::etcd_rdzv {

using rendezvous::field;

NodeRecovery::NodeRecovery(boost::asio::io_context& io, std::string token, std::string prefix, Call call)
    : io_(io),
      token_(std::move(token)),
      prefix_(std::move(prefix)),
      call_(std::move(call)),
      watch_(io, [this](const std::string& id) { gone(id); }) {}

NodeRecovery::~NodeRecovery() = default;

void NodeRecovery::identify(const std::string& id, const std::string& addr, long long lease, int nproc) {
  id_ = id;
  addr_ = addr;
  lease_ = std::to_string(lease);
  nproc_ = nproc;
}

void NodeRecovery::gone(const std::string& id) {
  const auto l = leases_.find(id);
  if (l == leases_.end()) return;
  const auto lease = l->second;
  leases_.erase(l);
  found_gone_.push_back(id);  // its record stays until its lease goes: not watched again
  spdlog::info("rendezvous (etcd): node {}'s idist-run is gone (its store closed): revoking its lease", id);
  const nlohmann::json why = fmt::format("its idist-run ended or was killed (its store closed; seen from {})",
                                         etcd_rdzv::host_of(id_));
  // Under this node's lease: the job's keys go with the last node's, and this one is no longer
  // needed once this node is gone too.
  const auto key = prefix_ + "gone/" + id;
  const nlohmann::json put{{"key", etcd::base64(key)}, {"value", etcd::base64(why.dump())}, {"lease", lease_}};
  call_("/v3/kv/put", put, [this, lease] { call_("/v3/lease/revoke", {{"ID", lease}}, [] {}); });
}

std::string NodeRecovery::open(int attempt, const std::string& addr) {
  // The last attempt's store stays open for one attempt more: a node that still holds it (its
  // read of the new attempt not yet in) must not take its closing for this process's end.
  previous_ = std::move(generations_);
  lost_ = nlohmann::json::array();
  ended_ = nlohmann::json::array();
  ended_said_.clear();
  attempt_ = attempt;
  try {
    // Every address: the other nodes' ranks connect here when this node's store is a
    // generation's; the job's token keeps strangers out.
    generations_ = std::make_unique<rendezvous::Generations>(
        io_, "0.0.0.0", attempt_token(token_, attempt), 0,
        [](std::uint64_t, const std::vector<int>&, const std::string&, bool) {});
  } catch (const std::exception& e) {
    spdlog::warn("rendezvous (etcd): live recovery is off for attempt {}: cannot start its store ({})", attempt,
                 e.what());
    return "";
  }
  return fmt::format("{}:{}", addr, port());
}

int NodeRecovery::port() const { return generations_ ? generations_->port() : 0; }

void NodeRecovery::describe(nlohmann::json& record) const {
  record["store"] = port();
  record["store_for"] = attempt_;
}

nlohmann::json NodeRecovery::lost(const LocalFailure& failure) {
  lost_.push_back(rendezvous::failure_json(failure));
  return lost_;
}

nlohmann::json NodeRecovery::ended(int rank) {
  ended_.push_back(rank);
  return ended_;
}

nlohmann::json NodeRecovery::watched_as(int attempt) const {
  if (attempt_ != attempt || port() <= 0) return nlohmann::json();
  return nlohmann::json{{"id", id_}, {"addr", addr_}, {"store", port()}, {"for", attempt}, {"lease", lease_}};
}

void NodeRecovery::watch(const Snapshot& s, bool proposing, int attempt) {
  const int k = s.attempt();
  const bool running = s.phase() == rules::Phase::running;
  if (watched_attempt_ != k || !running) {
    watch_.clear();  // a new attempt's stores are other ones
    leases_.clear();
    found_gone_.clear();
    watched_attempt_ = k;
  }
  if (!running || k != attempt) return;
  const auto token = attempt_token(token_, k);
  const auto hold = [&](const std::string& id, const std::string& addr, int port, const std::string& lease) {
    if (id == id_ || port <= 0 || lease.empty()) return;
    if (std::find(found_gone_.begin(), found_gone_.end(), id) != found_gone_.end()) return;
    leases_[id] = lease;
    watch_.watch(id, addr, port, token);
  };
  if (proposing) {
    for (std::size_t r = 0; r < s.members().size(); ++r)
      if (const auto n = s.nodes.find(s.member(r)); n != s.nodes.end() && n->second.store_for == k)
        hold(n->first, n->second.addr, n->second.store, n->second.lease);
    return;
  }
  const auto p = s.state.value("proposer", nlohmann::json::object());
  if (field<int>(p, "for", -1) == k)
    hold(field<std::string>(p, "id", ""), field<std::string>(p, "addr", ""), field<int>(p, "store", 0),
         field<std::string>(p, "lease", ""));
}

std::optional<NodeRecovery::Reformed> NodeRecovery::follow(const Snapshot& s, bool proposing, int attempt,
                                                           int rank_base) {
  if (!generations_ || s.attempt() < attempt) return std::nullopt;
  watch(s, proposing, attempt);
  if (s.attempt() > attempt || s.phase() != rules::Phase::running) {
    stand_down();
    return std::nullopt;
  }
  const auto& state = s.state;
  std::vector<int> local;
  for (int r = 0; r < nproc_; ++r) local.push_back(rank_base + r);
  try {
    for (int rank : field<std::vector<int>>(state, "ended", {}))
      if (std::find(ended_said_.begin(), ended_said_.end(), rank) == ended_said_.end()) {
        ended_said_.push_back(rank);
        generations_->ended(rank);
      }
    const auto gen = state.value("gen", nlohmann::json::object());
    const auto g = field<std::uint64_t>(gen, "g", 0);
    if (g <= generations_->generation()) return std::nullopt;
    const auto line = field<std::string>(gen, "line", "");
    generations_->publish(g, field<std::vector<int>>(gen, "members", {}), field<std::string>(gen, "store", ""), line,
                          local);
    return Reformed{g, line};
  } catch (const std::exception& e) {
    // The survivors wait in vain, and their IDIST_TIMEOUT ends it: say why now.
    spdlog::error("live recovery: cannot write the job's next generation into this node's store: {}", e.what());
    return std::nullopt;
  }
}

void NodeRecovery::stand_down() {
  if (generations_) generations_->stand_down();
  // Nodes leave as the job ends: their stores close, and that is no loss.
  watch_.clear();
  leases_.clear();
}

}  // namespace idist::launchers::etcd_rdzv
