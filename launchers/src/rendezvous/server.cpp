#include "server.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "idist/common/duration.hpp"
#include "idist/common/flight_recorder.hpp"
#include "stall_report.hpp"

namespace idist::launchers::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;

// How long the host waits, after the final verdict, for every agent to hang up.
constexpr auto kDrainGrace = std::chrono::seconds(5);

struct Node {
  std::shared_ptr<Connection> connection;
  bool joined = false;  // has presented the token: one of the job's agents
  bool ready = false;   // asks to be in the next round (its "join" came, no assignment yet)
  std::string host;
  int nproc = 1;
  std::optional<int> wanted_rank;  // --node-rank
  bool hosting = false;
  int master_port = 0;
  std::uint64_t order = 0;  // of joining, for ties
  Clock::time_point connected_at = Clock::now();
  Clock::time_point last_seen = connected_at;
  std::chrono::milliseconds grace{-1};  // its --grace (from its join); negative: not said
  std::string left_why;                 // its "leave": why its idist-run ends before the job does
  std::string dropped_why;              // set: dropped for not reporting its ranks stopped in time
  bool member = false;  // of the current attempt
  int node_rank = -1;   // in the current attempt, then the previous one
  bool over = false;    // its ranks of the current attempt are gone
  bool gone = false;
  bool silent = false;  // dropped for missing heartbeats
  bool refused = false;  // its refusal is counted already (a wrong identity)

  std::string name() const {
    return node_rank >= 0 ? fmt::format("node {} ({})", node_rank, host) : fmt::format("the node on {}", host);
  }
};
using NodePtr = std::shared_ptr<Node>;

enum class Phase { gathering, running, ending, done };

// A failure some node reported (or a node lost) in the current attempt.
struct Failure {
  NodePtr node;
  int rank = -1;          // global; -1: the node itself was lost
  std::string how;        // "exited with code 3"; for a lost node, the whole sentence
  int exit_code = 1;
  bool root = false;      // killed by a signal nobody sent, crashed, or a lost node (supervise/policy.hpp's Blame)
  std::optional<int> lost_peer;  // it said it lost its connection to this rank

  std::string text() const { return rank < 0 ? how : fmt::format("rank {} on {} {}", rank, node->name(), how); }
  // Whether the failure is `peer`'s own: its rank, or a lost node that ran it.
  bool of_rank(int peer, int base) const {
    return rank == peer || (rank < 0 && peer >= base && peer < base + node->nproc);
  }
};

Failure failure_from(const NodePtr& node, const Json& m) {
  Failure f;
  f.node = node;
  f.rank = field<int>(m, "rank", -1);
  f.how = field<std::string>(m, "how", "failed");
  f.exit_code = field<int>(m, "exit_code", 1);
  f.root = field<bool>(m, "root", false);
  if (m.contains("lost_peer") && m["lost_peer"].is_number_integer()) f.lost_peer = m["lost_peer"].get<int>();
  return f;
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options)
      : io(io), acceptor(std::move(acceptor)), options(std::move(options)) {}

  asio::io_context& io;
  tcp::acceptor acceptor;
  ServerOptions options;
  std::vector<NodePtr> nodes;  // every connection that has not gone
  std::vector<NodePtr> members;
  // Counted as they change, so that no join or close walks every node (10,000 agents).
  int ready_count = 0;   // ready, not gone, not a member
  int agents = 0;        // joined and not gone
  int outstanding = 0;   // members neither over nor gone
  Phase phase = Phase::gathering;
  int attempt = 0;
  int restarts_used = 0;
  std::uint64_t joins = 0;
  // Why the current attempt ends: its failures, in the order they came, or a re-form (a node
  // waits to join: `cause` alone). `cause` is the first word, sent to the nodes to stop them.
  std::optional<std::string> cause;
  bool reform = false;  // the attempt ends for a node that joined, not for a failure
  std::vector<Failure> failures;
  std::vector<std::string> departures;  // members lost once the attempt was ending, for the verdict
  int exit_code = 1;
  bool failure = false;
  std::vector<int> bases;  // each node rank's first global rank, this attempt
  asio::steady_timer heartbeat_timer{io};
  asio::steady_timer silence_timer{io};
  asio::steady_timer stop_timer{io};
  asio::steady_timer last_call_timer{io};
  asio::steady_timer join_timer{io};
  asio::steady_timer drain_timer{io};
  bool last_call_armed = false;
  std::function<void()> drained;
  // A job-wide stall report being gathered: the views of every member's ranks, until each has
  // answered or kGatherWait has passed.
  struct Gather {
    std::uint64_t id = 0;
    int attempt = 0;
    std::vector<launchers::detail::RankView> views;
    std::vector<NodePtr> waiting;
  };
  std::optional<Gather> gather;
  // Strangers refused (another protocol, another job's idist-run, silence). A flood of them
  // must not flood the log: the first is logged at once, the rest in one line a second with
  // their count, addresses and reasons (a few named, the rest counted).
  static constexpr std::size_t kNamed = 3;
  struct Refused {
    std::size_t count = 0;
    std::vector<std::string> addresses;  // the first kNamed distinct
    std::vector<std::pair<std::string, std::size_t>> reasons;  // the first kNamed distinct, counted
    std::size_t other_reasons = 0;
  };
  Refused refused;
  Clock::time_point refused_logged{};
  bool refused_timer_armed = false;
  asio::steady_timer refused_timer{io};
  // Refusals for another job identity, by address: a node started with a mistyped --rdzv-id is
  // what "node 1 never joined" usually means, and the join timeout's message says so.
  std::map<std::string, int> other_job;
  int other_job_unnamed = 0;  // beyond the addresses remembered
  std::uint64_t gathers = 0;
  Clock::time_point next_gather{};              // every node asks at once: one gather answers all
  launchers::detail::CallKeys stalls_reported;  // this attempt's, job-wide
  asio::steady_timer gather_timer{io};

  template <class... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) {
    if (!options.quiet) spdlog::info("rendezvous: {}", fmt::format(format, std::forward<Args>(args)...));
  }

  void start() {
    accept();
    arm_join_timer();
    beat();
    watch();
  }

  void accept() {
    acceptor.async_accept([self = shared_from_this()](auto ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) self->welcome(std::move(socket));
      self->accept();
    });
  }

  void welcome(tcp::socket socket) {
    auto node = std::make_shared<Node>();
    node->connection = std::make_shared<Connection>(std::move(socket));
    nodes.push_back(node);
    std::weak_ptr<Impl> weak = shared_from_this();
    node->connection->start(
        [weak, node](const Json& m) {
          if (auto self = weak.lock()) self->on_message(node, m);
        },
        [weak, node](const std::string& why) {
          if (auto self = weak.lock()) self->on_close(node, why);
        });
  }

  // --- messages -------------------------------------------------------------------------------

  void on_message(const NodePtr& node, const Json& m) {
    node->last_seen = Clock::now();
    const auto type = m["t"].get<std::string>();
    if (type == "hb") return;  // before the check: one may cross a restart verdict on the wire
    if (!node->joined && type != "join") return refuse(node, "join first");
    if (type == "join") return on_join(node, m);
    if (type == "fail") return on_fail(node, m);
    if (type == "over") return on_over(node, m);
    if (type == "leave") {
      node->left_why = field<std::string>(m, "why", "");
      return;
    }
    if (type == "stalled") return on_stalled(m);
    if (type == "views") return on_views(node, m);
    refuse(node, "an unknown message '" + type + "'");
  }

  // --- job-wide stall reports ------------------------------------------------------------------

  static constexpr auto kGatherWait = std::chrono::seconds(2);

  void on_stalled(const Json& m) {
    if (phase != Phase::running || field<int>(m, "attempt", -1) != attempt || gather) return;
    if (Clock::now() < next_gather || options.stall_timeout.count() <= 0) return;
    gather = Gather{.id = ++gathers, .attempt = attempt, .views = {}, .waiting = {}};
    for (const auto& n : members)
      if (!n->gone) {
        gather->waiting.push_back(n);
        n->connection->send(Json{{"t", "look"}, {"attempt", attempt}, {"id", gather->id}});
      }
    gather_timer.expires_after(kGatherWait);
    gather_timer.async_wait([weak = std::weak_ptr<Impl>(shared_from_this()), id = gather->id](auto ec) {
      auto self = weak.lock();
      if (!ec && self && self->gather && self->gather->id == id) self->finish_gather();
    });
  }

  void on_views(const NodePtr& node, const Json& m) {
    if (!gather || field<std::uint64_t>(m, "id", 0) != gather->id) return;
    auto& waiting = gather->waiting;
    const auto it = std::find(waiting.begin(), waiting.end(), node);
    if (it == waiting.end()) return;
    waiting.erase(it);
    if (!m.contains("ranks") ||
        !launchers::detail::views_from_json(m["ranks"].dump(), common::recorder::now_ns(), gather->views))
      info("{} sent views of its ranks that are not ours; its ranks are left out", node->name());
    if (waiting.empty()) finish_gather();
  }

  void finish_gather() {
    gather_timer.cancel();
    auto g = std::move(*gather);
    gather.reset();
    next_gather = Clock::now() + kGatherWait;
    if (phase != Phase::running || g.attempt != attempt) return;
    std::vector<std::string> silent;
    for (const auto& n : g.waiting) silent.push_back(n->name());
    const auto lines = launchers::detail::job_wide_report(std::move(g.views), common::recorder::now_ns(),
                                                          options.stall_timeout, stalls_reported, silent, kGatherWait);
    if (!lines) return;
    for (const auto& n : members)
      if (!n->gone) n->connection->send(Json{{"t", "report"}, {"attempt", attempt}, {"lines", *lines}});
  }

  void refuse(const NodePtr& node, const std::string& why) {
    node->connection->send(Json{{"t", "error"}, {"message", why}});
    node->connection->close_after_sends();
  }

  void on_join(const NodePtr& node, const Json& m) {
    if (field<std::string>(m, "token", "") != options.token) {
      node->refused = true;
      note_refused(node, "wrong or missing job identity (--rdzv-id / IDIST_JOB_TOKEN)");
      const auto& address = node->connection->address();
      if (other_job.count(address) || other_job.size() < 64) {
        ++other_job[address];
      } else {
        ++other_job_unnamed;
      }
      return refuse(node, "wrong or missing job identity: pass the same --rdzv-id (or IDIST_JOB_TOKEN) on every node");
    }
    if (phase == Phase::done) return refuse(node, "the job is over");
    node->host = field<std::string>(m, "host", node->connection->peer());
    node->nproc = std::max(1, field<int>(m, "nproc", 1));
    if (m.contains("node_rank") && m["node_rank"].is_number_integer()) node->wanted_rank = m["node_rank"].get<int>();
    node->hosting = field<bool>(m, "hosting", false);
    node->master_port = field<int>(m, "master_port", 0);
    if (const auto grace = field<long long>(m, "grace_ms", -1); grace >= 0) node->grace = std::chrono::milliseconds(grace);
    if (node->member) return;  // already in this attempt: nothing to join
    node->over = false;
    if (!node->joined) {
      node->joined = true;
      node->order = joins++;
      ++agents;
    }
    set_ready(node, true);
    if (node->wanted_rank && *node->wanted_rank >= options.max_nodes)
      return refuse(node, fmt::format("--node-rank {} is not below --nnodes {}", *node->wanted_rank, options.max_nodes));
    if (phase == Phase::gathering) return maybe_close_round();
    // The job is running: a node that arrives now joins the next attempt. With room for it
    // (MIN:MAX) the job re-forms at once, as torchrun's does.
    if (options.max_nodes > options.min_nodes && live_members() < options.max_nodes && phase == Phase::running) {
      info("{} asks to join: ending attempt {} so that the job re-forms with it", node->name(), attempt);
      cause = node->name() + " joined";
      reform = true;
      return end_attempt();
    }
    if (options.max_nodes == options.min_nodes && phase == Phase::running)
      return refuse(node, fmt::format("the job already has its {} nodes", options.max_nodes));
  }

  void on_fail(const NodePtr& node, const Json& m) {
    if (!node->member || field<int>(m, "attempt", -1) != attempt) return;
    if (phase != Phase::running && phase != Phase::ending) return;
    record(failure_from(node, m));
  }

  void on_over(const NodePtr& node, const Json& m) {
    if (!node->member || field<int>(m, "attempt", -1) != attempt) return;
    if (phase != Phase::running && phase != Phase::ending) return;
    if (!node->over) --outstanding;
    node->over = true;
    // The node's final word on which of its ranks failed first (its supervisor weighs ranks
    // that failed together): it replaces what its "fail" said, in its place, so that the
    // order of the nodes' first reports stays the order blame() reads.
    if (const auto f = m.find("failure"); f != m.end() && f->is_object()) {
      const auto mine = std::find_if(failures.begin(), failures.end(), [&](const Failure& x) { return x.node == node; });
      if (mine != failures.end()) {
        *mine = failure_from(node, *f);
      } else {
        record(failure_from(node, *f));
      }
    }
    maybe_decide();
  }

  // A failure: the first ends the attempt on every node. Those that come while it ends may
  // still be the cause (a node reports what its ranks did before it heard the end), which
  // blame() weighs; they cost no more of the budget than the first.
  void record(Failure f) {
    // A re-form stops every member's ranks, and a rank whose peers stop first fails before
    // its own idist-run reads `end`: a consequence of the re-form, reported as a failure. None
    // of it counts, neither as the attempt's failure nor against --max-restarts.
    if (reform) {
      if (!options.quiet)
        spdlog::debug("rendezvous: attempt {} re-forms: not counting {}", attempt, f.text());
      return;
    }
    failure = true;
    failures.push_back(std::move(f));
    if (phase != Phase::running) return;
    cause = failures.back().text();
    exit_code = failures.back().exit_code;
    info("attempt {}: {}; stopping every node", attempt, *cause);
    end_attempt();
  }

  // Which failure the job names, as the supervisor blames its own ranks (supervise/policy.hpp): a
  // root cause (a crash, a kill nobody sent, a lost node) before a non-zero exit, which may be
  // a survivor's answer to it; among equals the first that came; then, while the one named
  // says it lost its connection to a rank that failed too, that rank.
  void blame() {
    if (failures.empty()) return;
    auto pick = std::find_if(failures.begin(), failures.end(), [](const Failure& f) { return f.root; });
    if (pick == failures.end()) pick = failures.begin();
    std::vector<bool> visited(failures.size());
    for (;;) {
      visited[static_cast<std::size_t>(pick - failures.begin())] = true;
      if (!pick->lost_peer) break;
      const int peer = *pick->lost_peer;
      const auto cause_of = std::find_if(failures.begin(), failures.end(), [&](const Failure& f) {
        const auto r = static_cast<std::size_t>(f.node->node_rank);
        return f.node->node_rank >= 0 && r < bases.size() && f.of_rank(peer, bases[r]);
      });
      if (cause_of == failures.end() || visited[static_cast<std::size_t>(cause_of - failures.begin())]) break;
      pick = cause_of;
    }
    cause = pick->text();
    exit_code = pick->exit_code;
    blamed_rank = pick->rank;
  }

  // --- refused strangers ----------------------------------------------------------------------

  void note_refused(const NodePtr& node, const std::string& why) {
    if (options.quiet) return;
    const auto now = Clock::now();
    if (!refused_timer_armed && now - refused_logged >= std::chrono::seconds(1)) {
      refused_logged = now;
      spdlog::warn("rendezvous: refused a connection from {}: {}", node->connection->peer(), why);
      return;
    }
    ++refused.count;
    const auto& address = node->connection->address();
    auto& addresses = refused.addresses;
    if (addresses.size() < kNamed && std::find(addresses.begin(), addresses.end(), address) == addresses.end())
      addresses.push_back(address);
    auto& reasons = refused.reasons;
    const auto reason = std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == why; });
    if (reason != refused.reasons.end()) {
      ++reason->second;
    } else if (reasons.size() < kNamed) {
      reasons.emplace_back(why, 1);
    } else {
      ++refused.other_reasons;
    }
    if (refused_timer_armed) return;
    refused_timer_armed = true;
    refused_timer.expires_at(refused_logged + std::chrono::seconds(1));
    refused_timer.async_wait([weak = weak_from_this()](auto ec) {
      if (auto self = weak.lock(); self && !ec) self->log_refused();
    });
  }

  // The refusals counted since the last line, in one line.
  void log_refused() {
    refused_timer_armed = false;
    if (refused.count == 0) return;
    auto r = std::exchange(refused, Refused{});
    refused_logged = Clock::now();
    std::vector<std::string> reasons;
    const bool one_reason = r.reasons.size() == 1 && r.other_reasons == 0;
    for (const auto& [why, n] : r.reasons) reasons.push_back(one_reason ? why : fmt::format("{} (x{})", why, n));
    if (r.other_reasons > 0) reasons.push_back(fmt::format("other reasons (x{})", r.other_reasons));
    spdlog::warn("rendezvous: refused {} connection{} from {}{} in the last second: {}", r.count,
                 r.count == 1 ? "" : "s", fmt::join(r.addresses, ", "), r.addresses.size() < kNamed ? "" : " and others",
                 fmt::join(reasons, "; "));
  }

  // "; refused 1 connection from 10.0.0.2 with another job id (--rdzv-id)", or nothing.
  std::string other_job_text() const {
    if (other_job.empty()) return "";
    int count = other_job_unnamed;
    std::vector<std::string> addresses;
    for (const auto& [address, n] : other_job) {
      count += n;
      addresses.push_back(address);
    }
    return fmt::format("; refused {} connection{} from {}{} with another job id (--rdzv-id)", count,
                       count == 1 ? "" : "s", fmt::join(addresses, ", "), other_job_unnamed > 0 ? " and others" : "");
  }

  void on_close(const NodePtr& node, const std::string& why) {
    // Something that spoke another protocol (or nothing but garbage): worth counting.
    if (!node->joined && !node->refused && why != "the other side closed the connection")
      note_refused(node, why + " (not an idist-run of this job)");
    node->gone = true;
    std::erase(nodes, node);
    if (node->joined) --agents;
    if (node->ready && !node->member) --ready_count;
    if (node->member && !node->over) --outstanding;
    if (phase == Phase::done) return check_drained();
    if (!node->member) {
      if (!node->joined || phase != Phase::gathering) return;
      // A node of the job (it ran in an attempt) lost while the next attempt gathers.
      if (node->node_rank >= 0) return lost_between_attempts(node, why);
      return info("{} left before the job started: {}", node->name(), lost_text(node, why));
    }
    // A node whose ranks were done, or lost after the attempt had ended anyway: not a failure,
    // but one node fewer for the next attempt, named should that end the job.
    if (node->over || phase != Phase::running) {
      departures.push_back(lost_text(node, why));
      return maybe_decide();
    }
    Failure f;
    f.node = node;
    f.root = true;
    f.how = lost_text(node, why);
    record(std::move(f));
    maybe_decide();
  }

  // Why a node's connection closed, as a sentence naming it.
  std::string lost_text(const NodePtr& node, const std::string& why) const {
    if (node->silent)
      return fmt::format("{} stopped answering (no heartbeat for {})", node->name(), common::duration_text(options.dead_after));
    if (!node->dropped_why.empty()) return fmt::format("{} {}", node->name(), node->dropped_why);
    if (!node->left_why.empty()) return fmt::format("{} left the job: {}", node->name(), node->left_why);
    return fmt::format("{} was lost: its idist-run {}", node->name(),
                       why == "the other side closed the connection" ? "ended or was killed" : why);
  }

  // After a restart verdict the members join again; one that is lost instead would leave the
  // round waiting join_timeout for it. The job goes on while MIN nodes remain (with a fixed N:
  // only if another node already waits in its place), else it ends now on every node.
  void lost_between_attempts(const NodePtr& node, const std::string& why) {
    const std::string text = lost_text(node, why);
    if (agents >= options.min_nodes) {
      info("before attempt {} could start, {}; {} nodes remain", attempt, text, agents);
      return maybe_close_round();
    }
    cause = fmt::format("before attempt {} could start, {}; {} node{} left, the job needs {}", attempt, text, agents,
                        agents == 1 ? "" : "s", options.min_nodes);
    exit_code = 1;
    blamed_rank = -1;
    ended_by = kEndedByNodes;
    conclude(false);
  }

  // --- rounds ---------------------------------------------------------------------------------

  int live_members() const {
    return static_cast<int>(std::count_if(members.begin(), members.end(), [](const NodePtr& n) { return !n->gone; }));
  }

  int waiting_count() const { return ready_count; }

  void set_ready(const NodePtr& n, bool ready) {
    if (n->ready == ready || n->gone) return;
    n->ready = ready;
    if (!n->member) ready_count += ready ? 1 : -1;
  }

  std::vector<NodePtr> waiting() const {
    std::vector<NodePtr> out;
    for (const auto& n : nodes)
      if (n->ready && !n->gone && !n->member) out.push_back(n);
    std::sort(out.begin(), out.end(), [](const NodePtr& a, const NodePtr& b) { return a.get()->order < b.get()->order; });
    return out;
  }

  void arm_join_timer() {
    join_timer.expires_after(options.join_timeout);
    join_timer.async_wait([weak = weak_from_this(), round = attempt](auto ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase != Phase::gathering || self->attempt != round) return;
      self->round_timed_out();
    });
  }

  void round_timed_out() {
    const auto in = waiting();
    if (static_cast<int>(in.size()) >= options.min_nodes) {
      close_round();
      if (phase != Phase::gathering) return;
      // Enough nodes, but not node 0, whose rank 0 the job needs.
      cause = fmt::format("the rendezvous timed out after {}: {} nodes joined, but not node 0 (the rendezvous' host)",
                          common::duration_text(options.join_timeout), in.size());
      exit_code = 1;
      return conclude(false);
    }
    std::vector<std::string> hosts;
    std::vector<bool> ranked(static_cast<std::size_t>(options.max_nodes));
    for (const auto& n : in) {
      hosts.push_back(n->host);
      if (n->wanted_rank) ranked[static_cast<std::size_t>(*n->wanted_rank)] = true;
      if (n->hosting) ranked[0] = true;
    }
    std::string missing;
    if (options.min_nodes == options.max_nodes) {
      std::vector<int> absent;
      for (int r = 0; r < options.max_nodes; ++r)
        if (!ranked[static_cast<std::size_t>(r)]) absent.push_back(r);
      // Only meaningful when every node present said its rank (the static form).
      if (static_cast<int>(absent.size()) == options.max_nodes - static_cast<int>(in.size()))
        missing = fmt::format("; node{} {} never joined", absent.size() == 1 ? "" : "s", fmt::join(absent, ", "));
    }
    cause = fmt::format("the rendezvous timed out after {}: {} of {} nodes joined ({}){}{}",
                        common::duration_text(options.join_timeout), in.size(), options.min_nodes,
                        hosts.empty() ? "none" : fmt::format("{}", fmt::join(hosts, ", ")), missing,
                        other_job_text());
    exit_code = 1;
    conclude(false);
  }

  void maybe_close_round() {
    if (phase != Phase::gathering) return;
    const int n = waiting_count();
    if (n >= options.max_nodes) return close_round();
    if (n < options.min_nodes || last_call_armed) return;
    last_call_armed = true;
    last_call_timer.expires_after(options.last_call);
    last_call_timer.async_wait([weak = weak_from_this(), round = attempt](auto ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase != Phase::gathering || self->attempt != round) return;
      self->last_call_armed = false;
      if (self->waiting_count() >= self->options.min_nodes) self->close_round();
    });
  }

  void close_round() {
    auto in = waiting();
    const auto host = std::find_if(in.begin(), in.end(), [](const NodePtr& n) { return n->hosting; });
    if (host == in.end()) return;  // node 0 (rank 0's port) is not in yet
    // Up to MAX: node 0, the nodes with a rank of their own, then by joining order.
    std::stable_partition(in.begin(), in.end(), [](const NodePtr& n) { return n->hosting || n->wanted_rank; });
    std::stable_partition(in.begin(), in.end(), [](const NodePtr& n) { return n->hosting; });
    if (static_cast<int>(in.size()) > options.max_nodes) in.resize(static_cast<std::size_t>(options.max_nodes));
    const int count = static_cast<int>(in.size());
    std::vector<NodePtr> by_rank(static_cast<std::size_t>(count));
    std::vector<NodePtr> rest;
    for (const auto& n : in) {
      const int want = n->hosting ? 0 : n->wanted_rank.value_or(-1);
      if (want >= count) return refuse_and_retry(n, fmt::format("--node-rank {} is not below the {} nodes of this attempt", want, count));
      if (want >= 0 && by_rank[static_cast<std::size_t>(want)])
        return refuse_and_retry(n, fmt::format("node rank {} is taken (by {})", want, by_rank[static_cast<std::size_t>(want)]->host));
      if (want >= 0) {
        by_rank[static_cast<std::size_t>(want)] = n;
      } else {
        rest.push_back(n);
      }
    }
    // Stable ranks while membership stays: last attempt's rank first, then host name, then order.
    std::stable_sort(rest.begin(), rest.end(), [](const NodePtr& a, const NodePtr& b) {
      const int ra = a->node_rank >= 0 ? a->node_rank : std::numeric_limits<int>::max();
      const int rb = b->node_rank >= 0 ? b->node_rank : std::numeric_limits<int>::max();
      return std::tie(ra, a->host, a->order) < std::tie(rb, b->host, b->order);
    });
    auto next = rest.begin();
    for (auto& slot : by_rank)
      if (!slot) slot = *next++;
    int world = 0;
    for (const auto& n : by_rank) world += n->nproc;
    for (const auto& n : by_rank) set_ready(n, false);
    members = by_rank;
    outstanding = count;
    bases.clear();
    int base = 0;
    const int master_port = by_rank[0]->master_port;
    for (int r = 0; r < count; ++r) {
      auto& n = *by_rank[static_cast<std::size_t>(r)];
      n.member = true;
      n.over = false;
      n.node_rank = r;
      n.connection->send(Json{{"t", "assign"},
                              {"attempt", attempt},
                              {"node_rank", r},
                              {"nnodes", count},
                              {"world_size", world},
                              {"rank_base", base},
                              {"master_port", master_port}});
      bases.push_back(base);
      base += n.nproc;
    }
    phase = Phase::running;
    stalls_reported.clear();
    failure = false;
    reform = false;
    failures.clear();
    departures.clear();
    cause.reset();
    exit_code = 1;
    blamed_rank = -1;
    last_call_timer.cancel();
    last_call_armed = false;
    join_timer.cancel();
    info("attempt {}: {} node{}, world size {}", attempt, count, count == 1 ? "" : "s", world);
  }

  void refuse_and_retry(const NodePtr& n, const std::string& why) {
    refuse(n, why);
    set_ready(n, false);  // out of waiting(); its close completes the job of removing it
    maybe_close_round();
  }

  void end_attempt() {
    phase = Phase::ending;
    std::chrono::milliseconds grace{0};
    for (const auto& n : members) {
      if (n->gone || n->over) continue;
      n->connection->send(Json{{"t", "end"}, {"attempt", attempt}, {"cause", *cause}});
      grace = std::max(grace, n->grace.count() >= 0 ? n->grace : options.grace);
    }
    arm_stop_timer(grace + options.stop_margin);
    maybe_decide();
  }

  // The verdict waits for every member's "over", but not for ever: a member that still
  // heartbeats yet never finishes stopping its ranks (a console it cannot drain, a process it
  // cannot reap) would hold every node. Past its --grace and a margin it is dropped, named.
  void arm_stop_timer(std::chrono::milliseconds limit) {
    stop_timer.expires_after(limit);
    stop_timer.async_wait([weak = weak_from_this(), round = attempt, limit](auto ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase != Phase::ending || self->attempt != round) return;
      for (const auto& n : std::vector<NodePtr>(self->members)) {
        if (n->gone || n->over || !n->dropped_why.empty()) continue;
        n->dropped_why = fmt::format("did not report its ranks stopped within {} of attempt {}'s end",
                                     common::duration_text(limit), round);
        self->info("{} {}: dropped from the job", n->name(), n->dropped_why);
        // Its close (once the error is sent) counts it out and lets the verdict come.
        self->refuse(n, fmt::format("this node {}; dropped from the job", n->dropped_why));
      }
    });
  }

  void maybe_decide() {
    if (phase != Phase::running && phase != Phase::ending) return;
    if (outstanding > 0) return;
    if (phase == Phase::running && !failure) return conclude(true);
    stop_timer.cancel();
    const int live = live_members() + waiting_count();
    if (!failure && live >= options.min_nodes) return next_attempt(false);  // a re-form: not counted
    if (!failure) {
      cause = departures.empty() ? std::string("a node left while the job re-formed")
                                 : fmt::format("while the job re-formed, {}", fmt::join(departures, "; "));
      exit_code = 1;
    }
    blame();
    if (restarts_used < options.max_restarts && live >= options.min_nodes) return next_attempt(true);
    ended_by = live < options.min_nodes ? kEndedByNodes : kEndedByRestarts;
    if (live < options.min_nodes) {
      if (failure && !departures.empty()) *cause += fmt::format("; {}", fmt::join(departures, "; "));
      *cause += fmt::format("; {} node{} left, the job needs {}", live, live == 1 ? "" : "s", options.min_nodes);
    } else if (live < static_cast<int>(members.size())) {
      // Enough nodes remain, but going on without the lost one is a new attempt, which the
      // budget must pay for: say so, or the end looks like a failure the job could have survived.
      *cause += fmt::format("; no restart left (--max-restarts {}): going on without a lost node spends a restart",
                            options.max_restarts);
    }
    conclude(false);
  }

  void next_attempt(bool counted) {
    if (counted) ++restarts_used;
    const int left = options.max_restarts - restarts_used;
    info("attempt {} ended ({}): attempt {} on every node{}", attempt, *cause, attempt + 1,
         counted ? fmt::format(", {} restart{} left", left, left == 1 ? "" : "s") : std::string(" (a re-form, not counted)"));
    Json verdict{{"t", "verdict"}, {"attempt", attempt}, {"then", "restart"}, {"next", attempt + 1},
                 {"cause", *cause}, {"restarts_left", left}, {"counted", counted}, {"rank", blamed_rank}};
    // Members join again (their "join" re-enters them); a node that waited is in already.
    for (const auto& n : members) {
      n->member = false;
      n->ready = false;
      if (!n->gone) n->connection->send(verdict);
    }
    members.clear();
    outstanding = 0;
    ++attempt;
    phase = Phase::gathering;
    arm_join_timer();
  }

  void conclude(bool success) {
    phase = Phase::done;
    Json verdict{{"t", "verdict"}, {"attempt", attempt}, {"then", success ? "success" : "failure"}};
    if (!success) {
      verdict["cause"] = *cause;
      verdict["exit_code"] = exit_code;
      verdict["rank"] = blamed_rank;
      if (!ended_by.empty()) verdict["ended_by"] = std::string(ended_by);
      info("the job failed: {}", *cause);
    }
    for (const auto& n : nodes)
      if (n->joined && !n->gone) n->connection->send(verdict);
    boost::system::error_code ignored;
    acceptor.close(ignored);
    join_timer.cancel();
    last_call_timer.cancel();
    stop_timer.cancel();
    check_drained();
  }

  void check_drained() {
    if (phase != Phase::done || !drained || agents > 0) return;
    finish_drain();
  }

  // Nothing of the rendezvous is left waiting on the event loop: node 0 may exit.
  void stop() {
    phase = Phase::done;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    heartbeat_timer.cancel();
    silence_timer.cancel();
    stop_timer.cancel();
    last_call_timer.cancel();
    join_timer.cancel();
    drain_timer.cancel();
    if (refused.count > 0) log_refused();  // the count its timer would have logged
    refused_timer.cancel();
    for (const auto& n : std::vector<NodePtr>(nodes)) n->connection->close("the job is over");
  }

  void finish_drain() {
    auto done = std::move(drained);
    drained = nullptr;
    stop();
    if (done) done();
  }

  // Heartbeats out.
  void beat() {
    for (const auto& n : nodes)
      if (n->joined && !n->gone) n->connection->send(Json{{"t", "hb"}});
    heartbeat_timer.expires_after(options.heartbeat);
    heartbeat_timer.async_wait([weak = weak_from_this()](auto ec) {
      if (auto self = weak.lock(); self && !ec) self->beat();
    });
  }

  // Silence in, checked at each connection's own deadline rather than once per heartbeat, so
  // that a node silent for dead_after is dropped then, not up to a heartbeat later: one timer,
  // at the earliest deadline. A message only moves a deadline later, and a new connection's
  // first deadline is at least min(dead_after, handshake) away, so the timer is never late for
  // anyone; with every node beating it fires about once per dead_after - heartbeat.
  // Connections that never join (a port scanner, a stuck client) are closed after `handshake`.
  void watch() {
    const auto now = Clock::now();
    auto next = now + std::min(options.dead_after, options.handshake);
    for (const auto& n : std::vector<NodePtr>(nodes)) {
      if (n->gone) continue;
      if (!n->joined) {
        const auto deadline = n->connected_at + options.handshake;
        if (now >= deadline) {
          n->connection->close(fmt::format("it did not join within {}", common::duration_text(options.handshake)));
          continue;
        }
        next = std::min(next, deadline);
        continue;
      }
      const auto deadline = n->last_seen + options.dead_after;
      if (now >= deadline) {
        n->silent = true;
        n->connection->close("silent");
        continue;
      }
      next = std::min(next, deadline);
    }
    silence_timer.expires_at(next);
    silence_timer.async_wait([weak = weak_from_this()](auto ec) {
      if (auto self = weak.lock(); self && !ec) self->watch();
    });
  }

  void when_drained(const std::string& why, std::function<void()> done) {
    // Node 0 leaves before the job's end (interrupted, timed out, a rank it could not start):
    // the others hear it as the job's failure, not as silence.
    if (phase != Phase::done) {
      cause = why.empty() ? "node 0's idist-run left the job (interrupted, timed out, or it could not start its ranks)"
                          : "node 0's idist-run left the job: " + why;
      exit_code = 1;
      conclude(false);
    }
    drained = std::move(done);
    drain_timer.expires_after(kDrainGrace);
    drain_timer.async_wait([weak = weak_from_this()](auto ec) {
      if (auto self = weak.lock(); self && !ec && self->drained) self->finish_drain();
    });
    check_drained();
  }

  int blamed_rank = -1;  // the global rank the verdict names, -1 for none or a node
  std::string_view ended_by;  // a failure after an attempt: kEndedByRestarts or kEndedByNodes
};

Server::Server(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(acceptor), std::move(options))) {}

Server::~Server() {
  impl_->drained = nullptr;
  impl_->stop();
}

void Server::start() { impl_->start(); }

void Server::when_drained(const std::string& why, std::function<void()> done) {
  impl_->when_drained(why, std::move(done));
}

}  // namespace idist::launchers::rendezvous
