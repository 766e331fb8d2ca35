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
      watch_(io, [this](const std::string& id) { gone(id); }),
      joined_timer_(io) {}

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
  admits_ = nlohmann::json::array();
  grants_told_ = 0;
  unjoined_told_.clear();
  joined_said_ = 0;
  origins_said_.clear();
  standing_down_ = false;
  joined_timer_.cancel();
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
  record["recovery"] = true;  // it may join a running attempt live
}

nlohmann::json NodeRecovery::lost(const LocalFailure& failure) {
  lost_.push_back(rendezvous::failure_json(failure));
  return lost_;
}

nlohmann::json NodeRecovery::ended(int rank) {
  ended_.push_back(rank);
  return ended_;
}

nlohmann::json NodeRecovery::admit(int origin, const std::string& why) {
  admits_.push_back(nlohmann::json{{"origin", origin}, {"why", why}});
  return admits_;
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

void NodeRecovery::follow(const Snapshot& s, bool proposing, int attempt, int rank_base,
                          const Coordinator::Events& events) {
  if (!generations_ || s.attempt() < attempt) return;
  watch(s, proposing, attempt);
  if (s.attempt() > attempt || s.phase() != rules::Phase::running) return stand_down();
  const auto& state = s.state;
  // Its ranks, then its replacements (a node that joined live has only those).
  const auto extra = field<std::vector<int>>(state.value("extra", nlohmann::json::object()), id_.c_str(), {});
  const bool live = std::find(extra.begin(), extra.end(), rank_base) != extra.end();
  local_.clear();
  for (int r = 0; r < (live ? 0 : nproc_); ++r) local_.push_back(rank_base + r);
  own_ = local_.size();
  local_.insert(local_.end(), extra.begin(), extra.end());
  std::uint64_t reformed = 0;
  try {
    for (int rank : field<std::vector<int>>(state, "ended", {}))
      if (std::find(ended_said_.begin(), ended_said_.end(), rank) == ended_said_.end()) {
        ended_said_.push_back(rank);
        generations_->ended(rank);
      }
    const auto gen = state.value("gen", nlohmann::json::object());
    const auto g = field<std::uint64_t>(gen, "g", 0);
    if (g > generations_->generation()) {
      generations_->publish(g, field<std::vector<int>>(gen, "members", {}), field<std::string>(gen, "store", ""),
                            field<std::string>(gen, "line", ""), local_, field<std::uint64_t>(gen, "last_loss", g));
      reformed = g;
    }
  } catch (const std::exception& e) {
    // The survivors wait in vain, and their IDIST_TIMEOUT ends it: say why now.
    spdlog::error("live recovery: cannot write the job's next generation into this node's store: {}", e.what());
    return;
  }
  const auto gen = state.value("gen", nlohmann::json::object());
  if (reformed > 0 && events.reformed)
    events.reformed(reformed, field<std::string>(gen, "line", ""), field<std::vector<int>>(gen, "members", {}));
  tell(s, events);
}

// The replacements granted here since the last read, and those nobody is left to admit.
void NodeRecovery::tell(const Snapshot& s, const Coordinator::Events& events) {
  const auto grants = s.state.value("grants", nlohmann::json::array());
  for (; grants_told_ < grants.size(); ++grants_told_) {
    const auto& k = grants[grants_told_];
    if (field<std::string>(k, "node", "") == id_ && events.replace)
      events.replace(field<int>(k, "lost", -1), field<int>(k, "origin", -1), generations_->generation());
  }
  const auto unjoined = field<std::vector<int>>(s.state, "unjoined", {});
  if (!unjoined.empty() && unjoined != unjoined_told_ && events.members_ended) events.members_ended(unjoined);
  unjoined_told_ = unjoined;
  if (s.state.contains("extra")) say_joined();
}

// a/K/joined/ID: the newest generation whose members here all joined it (the proposer admits
// replacements only then), and the replacements here that joined one (a loss from then on
// re-forms with them), each said as soon as it is so: a loss in between would leave out a
// replacement that joined, and fence it.
void NodeRecovery::say_joined() {
  const auto g = generations_ ? generations_->generation() : 0;
  if (g == 0) return;
  joined_timer_.cancel();
  bool all = false;
  std::vector<int> origins;
  try {
    all = generations_->joined_current(local_);
    for (auto k = local_.begin() + static_cast<std::ptrdiff_t>(own_); k < local_.end(); ++k)  // its replacements
      if (generations_->joined(*k)) origins.push_back(*k);
  } catch (const std::exception&) {
    return;  // the store is gone with the attempt
  }
  if ((all && g > joined_said_) || origins != origins_said_) {
    if (all) joined_said_ = g;
    origins_said_ = origins;
    const auto key = fmt::format("{}a/{}/joined/{}", prefix_, attempt_, id_);
    const nlohmann::json value{{"g", joined_said_}, {"origins", origins}};
    joined_puts_.put(key, value);  // in order: an older value landing last would leave a replacement out
  }
  if (all) return;
  // A re-form takes tenths of a second: closely until then, then as the built-in store looks.
  if (joined_since_ != g) {
    joined_since_ = g;
    joined_from_ = std::chrono::steady_clock::now();
  }
  const bool early = std::chrono::steady_clock::now() - joined_from_ < std::chrono::seconds(1);
  joined_timer_.expires_after(std::chrono::milliseconds(early ? 10 : 100));
  joined_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_), attempt = attempt_](auto ec) {
    if (!ec && !alive.expired() && attempt == attempt_ && !standing_down_) say_joined();
  });
}

void NodeRecovery::stand_down() {
  if (generations_) generations_->stand_down();
  standing_down_ = true;
  joined_timer_.cancel();
  // Nodes leave as the job ends: their stores close, and that is no loss.
  watch_.clear();
  leases_.clear();
}

}  // namespace idist::launchers::etcd_rdzv
