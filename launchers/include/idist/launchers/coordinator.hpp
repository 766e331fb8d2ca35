#pragma once
// The rendezvous interface: how the attempts of a job spread over several nodes are decided
// together. The supervisor sees only this; the built-in rendezvous (rendezvous.hpp's
// NodeAgent, node 0 hosting) is its first implementation, and another store (etcd) plugs in
// behind the same calls.
//
// Its contract, call by call: join() before each attempt's ranks start (the answer says the
// attempt's number, or that the job ended first); failed() as soon as a local rank fails;
// over() once every local rank of the attempt is gone, answered by the job's verdict, the
// same on every node; finish() when the job is over here. Events come back the other way:
// another node ended the attempt, the rendezvous is lost, a job-wide stall report.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace idist::launchers {

// A rank of this node that failed first here.
struct LocalFailure {
  int rank = 0;
  std::string how;    // "exited with code 3"
  int exit_code = 1;  // idist-run's code for it
  bool root_cause = false;       // crashed or killed by a signal nobody sent, not a non-zero exit
  std::optional<int> lost_peer;  // the rank it said it lost its connection to
  bool recoverable = false;      // a loss this node's other ranks (all opted in) can re-form without
  bool replaceable = false;      // and they admit a rank started in its place (will_admit_replacements)
};

// What the job does after an attempt every node has ended.
struct RemoteVerdict {
  enum class Then { restart, success, failure };
  Then then = Then::failure;
  int next_attempt = 0;  // restart
  std::string cause;     // restart, failure: "rank 3 on node 1 (hostb) exited with code 3"
  int exit_code = 1;     // failure: the job's exit code, the same on every node
  int restarts_left = 0;
  bool counted = true;  // restart: it spent one from the budget (false: a re-form of an elastic job)
  int rank = -1;  // the global rank the cause names; -1: none, or a node that was lost
  // failure: what ended the job rather than another attempt, for the verdict's line (a job
  // with restarts left that ends for want of nodes must not read as out of restarts).
  enum class End { other, restarts_spent, too_few_nodes };
  End ended_by = End::other;
};

// What the rendezvous gave this node for its current attempt, whichever rendezvous it is.
struct Assignment {
  int attempt = 0;
  int node_rank = 0;
  int nnodes = 1;
  int world_size = 1;
  int rank_base = 0;        // the global rank of this node's local rank 0
  std::string master_addr;  // rank 0's host; empty: the plan's (the built-in rendezvous' endpoint)
  int master_port = 0;
  std::string recovery_store;  // host:port of the job's generation store; empty: no live recovery
  // This node joins the attempt live (rules::JoinLive): its ranks, started as replacements, wait
  // to be admitted after this generation; -1: it starts with the attempt.
  long long joins_after = -1;
};

// How the attempts of a job spread over nodes are decided together (rendezvous.hpp). The
// supervisor calls it on its event loop, and every callback comes back on that loop.
class Coordinator {
 public:
  struct Events {
    std::function<void(const std::string& cause)> end_attempt;  // another node ended it: stop the ranks
    std::function<void(const std::string& why)> lost;           // no rendezvous any more: stop, fail
    // A job-wide stall report: this node's ranks as the report needs them (JSON text,
    // stall_report.hpp); then the report's lines, the same on every node.
    std::function<std::string()> views;
    std::function<void(const std::vector<std::string>& lines)> report;
    // Live recovery: the job went on as `generation` of `members` (origins), as `line` says
    // ("rank 3 on node 1 (h) was killed by SIGKILL; world 4 -> 3").
    std::function<void(std::uint64_t generation, const std::string& line, const std::vector<int>& members)> reformed;
    // The rendezvous granted a replacement here: `origin` starts in `lost`'s place, to join
    // a generation after `after`.
    std::function<void(int lost, int origin, std::uint64_t after)> replace;
    // Every member of the current generation ended: the replacements `unjoined` (origins),
    // which never joined, never will.
    std::function<void(const std::vector<int>& unjoined)> members_ended;
    // The job-wide straggler comparison (compares_stragglers()): lines to say, the same on every
    // node, and the ranks named and not yet back under the threshold (rank -> excess).
    std::function<void(const std::vector<std::string>& lines, const std::map<int, double>& named)> stragglers;
  };
  virtual ~Coordinator() = default;
  virtual void start(boost::asio::io_context& io, Events events) = 0;
  // Once the nodes are in: `joined` with nullopt; or with the job's end, when it ended (or
  // cannot start, or the rendezvous is gone) before this node's ranks could start. The
  // attempt then starting is attempt(): a node that joins a running job starts at its count.
  virtual void join(int attempt, std::function<void(const std::optional<RemoteVerdict>& ended)> joined) = 0;
  virtual int attempt() const = 0;
  // This node's part in the attempt join() started (node rank, world size, rank 0's address);
  // a coordinator that assigns nothing (a test's) answers a job of one node.
  virtual const Assignment& assignment() const {
    static const Assignment none;
    return none;
  }
  virtual void failed(int attempt, const LocalFailure& failure) = 0;
  // Every local rank of the attempt is gone; `verdict` once every node's are.
  virtual void over(int attempt, const std::optional<LocalFailure>& failure,
                    std::function<void(const RemoteVerdict&)> verdict) = 0;
  // The job is over here, with `outcome` (JobResult::outcome: why, when this node leaves
  // before the job's verdict); `done` once this process may exit (node 0 hosts the
  // rendezvous until every node has its verdict).
  virtual void finish(const std::string& outcome, std::function<void()> done) = 0;
  // Some local rank stalled (a local stall report was made): ask for a job-wide one, which
  // comes back through Events::report. Nothing where there is nobody to ask.
  virtual void stalled(int /*attempt*/) {}
  // Live recovery (where the assignment has a recovery_store): every rank of this node opted
  // in (said again with `admits` once every running one admits replacements); and a rank of it
  // ended its program (exit 0) while others run.
  virtual void capable(int /*attempt*/, bool /*admits*/) {}
  virtual void ended(int /*attempt*/, int /*rank*/) {}
  // Whether a loss reported as replaceable is answered by Events::replace (both rendezvous do,
  // where live recovery is on).
  virtual bool grants_replacements() const { return false; }
  // A replacement started here (Events::replace) is ready to be admitted, as `why` says.
  virtual void admit(int /*attempt*/, int /*origin*/, const std::string& /*why*/) {}
  // Whether the rendezvous compares every node's ranks for straggler reports (the built-in one
  // does): then each node shares its ranks' work counters (JSON text, stall/straggler.hpp's
  // samples_to_json), several times a second while they run, and hears Events::stragglers;
  // elsewhere each node compares its own ranks.
  virtual bool compares_stragglers() const { return false; }
  virtual void share_work(int /*attempt*/, const std::string& /*samples*/, double /*threshold*/) {}
  // The event loop is about to go: let go of everything bound to it.
  virtual void detach() = 0;
};

struct RendezvousOptions;      // rendezvous.hpp
struct EtcdRendezvousOptions;  // etcd_rendezvous.hpp

// This node's part of the job's rendezvous, the one factory of both: on etcd when `etcd` is
// given (its fields that both share are taken from `options`), else the built-in one. Throws
// std::invalid_argument for options that cannot work (naming them), std::runtime_error when
// node 0 cannot listen at the endpoint.
std::shared_ptr<Coordinator> make_coordinator(const RendezvousOptions& options, const EtcdRendezvousOptions* etcd);

}  // namespace idist::launchers
