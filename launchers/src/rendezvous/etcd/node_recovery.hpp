#pragma once
// A node's part in live recovery on the etcd rendezvous (docs/RECOVERY.md). No node hosts the
// job here, so each node's idist-run hosts its own ranks' generations store (it lives as long
// as its ranks, so their watch never loses its store); the proposer decides each generation in
// the state (proposal.hpp: `gen`), naming the store its world connects through, and every
// node writes it into its own store as it reads it. Losing any node, node 0 included, then
// loses only that node's store, which no survivor uses after the next generation.

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "idist/launchers/coordinator.hpp"
#include "ordered_puts.hpp"
#include "proposal.hpp"
#include "store_watch.hpp"

namespace idist::launchers::rendezvous {
class Generations;
}

namespace idist::launchers::etcd_rdzv {

class NodeRecovery {
 public:
  // Sends one request to etcd (`path`, `body`); `then` once it is answered, either way.
  using Call = std::function<void(const std::string& path, nlohmann::json body, std::function<void()> then)>;
  // `prefix`: the job's keys'; `token`: the job's secret, which its ranks present.
  NodeRecovery(boost::asio::io_context& io, std::string token, std::string prefix, Call call);
  // Once this node has its lease: what the others need to hold its store, and its ranks' count.
  void identify(const std::string& id, const std::string& addr, long long lease, int nproc);
  ~NodeRecovery();
  NodeRecovery(const NodeRecovery&) = delete;
  NodeRecovery& operator=(const NodeRecovery&) = delete;

  // A store for `attempt`, which this node runs (a restarted attempt's ranks count generations
  // from 0 again): its "addr:port" for the ranks. Where it cannot listen, "": live recovery is
  // off for the attempt, as the warning says.
  std::string open(int attempt, const std::string& addr);
  int port() const;
  // Into this node's record (node/ID): its store's port, and the attempt it is for.
  void describe(nlohmann::json& record) const;
  int attempt() const { return attempt_; }  // the one its store is for; -1: none yet
  // What this node says under the attempt's keys: its ranks lost so far (a/K/lost/ID), and
  // those whose program ended (a/K/ended/ID), each time the whole list.
  nlohmann::json lost(const LocalFailure& failure);
  nlohmann::json ended(int rank);
  // A replacement started here is ready to be admitted, as `why` says: what this node says
  // under a/K/admit/ID, each time the whole list.
  nlohmann::json admit(int origin, const std::string& why);
  // The job as read by this node, which runs `attempt` (its first rank `rank_base`): a
  // generation decided for it since the last call is written into the store and told to the
  // supervisor (`events.reformed`), as are the replacements granted here (`replace`) and those
  // nobody is left to admit (`members_ended`); the ranks that ended elsewhere are said in the
  // store too, for survivors waiting on them. Once this node's members of a generation joined it,
  // a/K/joined/ID says so, where replacements were granted (the proposer admits them then). And
  // the stores it holds: the proposer (`proposing`) every member's, the others the proposer's (as
  // the state names it). Whoever sees one close says why under gone/ID and revokes that node's
  // lease, which ends its keys and election place at once.
  void follow(const Snapshot& s, bool proposing, int attempt, int rank_base, const Coordinator::Events& events);
  // This node as the others watch it while it proposes ({id, addr, store, for, lease}), once
  // its store for `attempt` is open; null before.
  nlohmann::json watched_as(int attempt) const;
  // The attempt ends (or the job): nothing more is written, and no store held.
  void stand_down();

 private:
  boost::asio::io_context& io_;
  std::string token_;
  std::unique_ptr<rendezvous::Generations> generations_, previous_;
  int attempt_ = -1;
  nlohmann::json lost_ = nlohmann::json::array(), ended_ = nlohmann::json::array();
  std::vector<int> ended_said_;  // in the store already
  void watch(const Snapshot& s, bool proposing, int attempt);
  void gone(const std::string& id);
  std::string prefix_;
  Call call_;
  OrderedPuts joined_puts_{[this](const std::string& key, const nlohmann::json& value, std::function<void()> done) {
    call_("/v3/kv/put", {{"key", etcd::base64(key)}, {"value", etcd::base64(value.dump())}, {"lease", lease_}},
          std::move(done));
  }};
  std::string id_, addr_, lease_;
  int nproc_ = 1;
  StoreWatch watch_;
  std::map<std::string, std::string> leases_;  // of the nodes watched, by id
  std::vector<std::string> found_gone_;        // in this attempt
  int watched_attempt_ = -1;
  // Replacements: the admissions asked for, the grants told (a count of the state's list), the
  // last `unjoined` told, this node's members (its ranks and replacements), and the generation
  // whose joining a/K/joined/ID said last.
  nlohmann::json admits_ = nlohmann::json::array();
  std::size_t grants_told_ = 0;
  std::vector<int> unjoined_told_, local_, origins_said_;
  std::size_t own_ = 0;  // local_'s first ones that are no replacements
  std::uint64_t joined_said_ = 0, joined_since_ = 0;
  std::chrono::steady_clock::time_point joined_from_{};
  boost::asio::steady_timer joined_timer_;
  bool standing_down_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  void tell(const Snapshot& s, const Coordinator::Events& events);
  void say_joined();
};

}  // namespace idist::launchers::etcd_rdzv
