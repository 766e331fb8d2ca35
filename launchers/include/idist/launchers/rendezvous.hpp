#pragma once
// The job-wide rendezvous of node agents (the idist-run on each node), for jobs without a
// scheduler that spread over several nodes: `--rdzv-endpoint HOST:PORT --rdzv-id ID --nnodes
// N|MIN:MAX`, or the static form `--nnodes N --node-rank R --master-addr A`.
//
// One agent hosts it (RendezvousServer): the one that can listen at the endpoint, i.e. the
// first agent started on the endpoint's host (node 0). Every agent, the host's own included,
// connects to it (NodeAgent) and keeps that connection for the whole job:
//  - Attempts. Attempt k starts once the nodes are in (all N; or MIN, then a last call for
//    more up to MAX). Each node gets its node rank, the world size and its first global rank,
//    and rank 0's store port, picked by node 0 afresh for each attempt; the ranks' job token
//    is the job's with the attempt appended, so a rank of attempt k can never reach the store
//    of attempt k+1 (and a torch rank finds a fresh port). A failure anywhere (a rank that
//    fails, an agent that vanishes) ends attempt k on every node: each stops its ranks and says
//    so, then all get one verdict: restart (attempt k+1, IDIST_RESTART_COUNT=k+1 everywhere),
//    success, or failure. --max-restarts is one budget for the job, kept here. A node that has
//    not said its ranks are gone within its --grace plus a margin of the attempt's end is
//    dropped, so that the verdict never waits for ever.
//  - Node ranks. The hosting agent is node 0; a node's --node-rank is kept; the others are
//    ranked by their rank in the previous attempt (stable ranks while membership stays), then
//    by host name, then by the order they joined in.
//  - Silence. Agents and rendezvous send heartbeats every `heartbeat`; an agent silent for
//    `dead_after` (a frozen agent, a cut link) is dropped and ends the attempt, checked at that
//    deadline, not at the next heartbeat. An agent that loses the rendezvous stops its ranks
//    and exits, naming it: the rendezvous host is a single point of failure (README).
//  - Elastic (MIN < MAX): a round closes at MAX nodes, or at MIN after `last_call`; a node that
//    arrives while the job runs makes it re-form at once, or joins live where every running rank
//    admits replacements (live recovery; rules::JoinLive) (not counted as a restart, nor is any
//    failure the re-form causes), and a lost node is left out of the next attempt if MIN remain;
//    with fewer (or a fixed N), a node lost between attempts ends the job at once.
//  - Cost: one join and one assignment per node per attempt, whatever the job's size.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/supervisor.hpp"

namespace idist::launchers {

struct RendezvousOptions {
  std::string host;  // the endpoint, as every node names it (also the ranks' MASTER_ADDR)
  int port = 0;
  std::string token;  // the job's secret: only agents presenting it take part
  int min_nodes = 1;
  int max_nodes = 1;
  std::optional<int> node_rank;  // static: this node's rank
  int nproc = 1;                 // ranks on this node
  int max_restarts = 0;          // the job's budget (the host's counts)
  bool may_host = true;          // false: a static node other than 0, which must find node 0's
  std::chrono::milliseconds last_call{2000};
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds dead_after{5000};
  std::chrono::milliseconds join_timeout{300000};  // for a round to fill; and for node 0 to listen
  std::chrono::milliseconds grace{5000};           // --grace: how long stopping this node's ranks may take
  std::chrono::milliseconds stall_timeout{0};      // --stall-timeout: node 0's, for job-wide stall reports
  // Live recovery (--recovery auto; node 0's say): node 0 hosts the generations' store, and a
  // lost rank or node other than node 0 is re-formed without while --min-world ranks remain.
  bool recovery = false;
  int min_world = 1;
};

// The agent side (and, on node 0, the host). Construct before supervise(): it decides at once
// whether it hosts (it binds the endpoint, so that two agents on one host cannot both host).
class NodeAgent final : public Coordinator {
 public:
  // Throws std::runtime_error when it must host (a static node 0) and cannot listen.
  explicit NodeAgent(RendezvousOptions options);
  ~NodeAgent() override;
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  bool hosting() const;
  const Assignment& assignment() const override;

  void start(boost::asio::io_context& io, Events events) override;
  void join(int attempt, std::function<void(const std::optional<RemoteVerdict>& ended)> joined) override;
  int attempt() const override { return assignment().attempt; }
  void failed(int attempt, const LocalFailure& failure) override;
  void over(int attempt, const std::optional<LocalFailure>& failure,
            std::function<void(const RemoteVerdict&)> verdict) override;
  void stalled(int attempt) override;
  void capable(int attempt, bool admits) override;
  void ended(int attempt, int rank) override;
  void admit(int attempt, int origin, const std::string& why) override;
  bool grants_replacements() const override { return true; }
  bool compares_stragglers() const override;  // node 0's rendezvous said so in its assignment
  void share_work(int attempt, const std::string& samples, double threshold) override;
  void finish(const std::string& outcome, std::function<void()> done) override;
  void detach() override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The agent's options for a plan with a rendezvous (plan.rendezvous set): this node's ranks,
// the job's restart budget, how long a round may take to fill, this node's --grace.
RendezvousOptions rendezvous_options(const LaunchPlan& plan, int max_restarts, std::chrono::milliseconds join_timeout,
                                     std::chrono::milliseconds grace = std::chrono::seconds(5));

// The assignment into the plan, before attempt_of makes the attempt's processes.
inline void apply_assignment(LaunchPlan& plan, const Assignment& a) {
  apply_assignment(plan, a.attempt, a.node_rank, a.nnodes, a.world_size, a.rank_base, a.master_port);
  if (!a.master_addr.empty()) plan.job.master_addr = a.master_addr;
}

}  // namespace idist::launchers
