#include "server.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "idist/common/duration.hpp"
#include "idist/common/flight_recorder.hpp"
#include "idist/launchers/plan.hpp"
#include "generations.hpp"
#include "rules.hpp"
#include "job_stragglers.hpp"
#include "stall/stall_report.hpp"
#include "strangers.hpp"

// The rules (rules.hpp) decide; this file keeps the sockets, the wire and the timers: it turns
// messages, closed connections and timers into the rules' events, and their actions into
// messages.

namespace idist::launchers::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using rules::Phase;

// How long the host waits, after the final verdict, for every agent to hang up.
constexpr auto kDrainGrace = std::chrono::seconds(5);

struct Node {
  std::shared_ptr<Connection> connection;
  std::string id;       // the rules' name for it: its number, in the order of connecting
  bool joined = false;  // has presented the token: one of the job's agents
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
  int node_rank = -1;   // in the current attempt, then the previous one
  bool gone = false;
  bool silent = false;  // dropped for missing heartbeats
  bool refused = false;  // its refusal is counted already (a wrong identity)

  std::string name() const {
    return node_rank >= 0 ? fmt::format("node {} ({})", node_rank, host) : fmt::format("the node on {}", host);
  }
};
using NodePtr = std::shared_ptr<Node>;

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options)
      : io(io),
        acceptor(std::move(acceptor)),
        options(std::move(options)),
        limits{.min_nodes = this->options.min_nodes,
               .max_nodes = this->options.max_nodes,
               .max_restarts = this->options.max_restarts,
               .needs_host = true,
               .recovery = false,
               .min_world = this->options.min_world} {}

  asio::io_context& io;
  tcp::acceptor acceptor;
  ServerOptions options;
  rules::Limits limits;
  rules::State state;
  // Events that come while the rules' actions are carried out (a send that closes a
  // connection) wait for them, in order.
  std::deque<rules::Event> pending;
  bool applying = false;
  std::vector<NodePtr> nodes;  // every connection that has not gone
  std::unordered_map<std::string, NodePtr> by_id;
  std::uint64_t connections = 0;
  int agents = 0;  // joined and not gone
  std::uint64_t joins = 0;
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
  Strangers strangers{io, options.quiet};
  std::uint64_t gathers = 0;
  Clock::time_point next_gather{};              // every node asks at once: one gather answers all
  launchers::detail::CallKeys stalls_reported;  // this attempt's, job-wide
  asio::steady_timer gather_timer{io};
  // Live recovery: the current attempt's generations' store (options.recovery), and the
  // replacements its nodes were last told to stop (members_ended).
  std::unique_ptr<Generations> generations;
  JobStragglers stragglers;
  std::vector<int> told_unjoined;

  template <class... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) {
    if (!options.quiet) spdlog::info("rendezvous: {}", fmt::format(format, std::forward<Args>(args)...));
  }

  Phase phase() const { return state.phase; }

  // A member of the current attempt (its node rank is its place among the rules' members).
  bool is_member(const Node& n) const {
    const auto r = static_cast<std::size_t>(n.node_rank);
    return n.node_rank >= 0 && r < state.members.size() && state.members[r].id == n.id;
  }

  // The job's nodes of the current attempt that are still there.
  std::vector<NodePtr> live_members() const {
    std::vector<NodePtr> out;
    for (const auto& m : state.members)
      if (!m.gone)
        if (const auto it = by_id.find(m.id); it != by_id.end()) out.push_back(it->second);
    return out;
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
    node->id = std::to_string(connections++);
    nodes.push_back(node);
    by_id[node->id] = node;
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
    if (type == "capable") {
      if (of_this_attempt(*node, m)) apply(rules::Capable{node->node_rank, field<bool>(m, "admits", false)});
      return;
    }
    if (type == "ended") {
      if (!of_this_attempt(*node, m)) return;
      apply(rules::Ended{field<int>(m, "rank", -1)});
      if (generations) generations->ended(field<int>(m, "rank", -1));
      return;
    }
    if (type == "admit") {
      if (of_this_attempt(*node, m) && generations)
        generations->admit(field<int>(m, "origin", -1), field<std::string>(m, "why", ""));
      return;
    }
    if (type == "stalled") return on_stalled(m);
    if (type == "views") return on_views(node, m);
    if (type == "work") return on_work(node, m);
    refuse(node, "an unknown message '" + type + "'");
  }

  // --- job-wide stall reports ------------------------------------------------------------------

  static constexpr auto kGatherWait = std::chrono::seconds(2);

  void on_stalled(const Json& m) {
    if (phase() != Phase::running || field<int>(m, "attempt", -1) != state.attempt || gather) return;
    if (Clock::now() < next_gather || options.stall_timeout.count() <= 0) return;
    gather = Gather{.id = ++gathers, .attempt = state.attempt, .views = {}, .waiting = {}};
    for (const auto& n : live_members()) {
      gather->waiting.push_back(n);
      n->connection->send(Json{{"t", "look"}, {"attempt", state.attempt}, {"id", gather->id}});
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
    if (phase() != Phase::running || g.attempt != state.attempt) return;
    std::vector<std::string> silent;
    for (const auto& n : g.waiting) silent.push_back(n->name());
    const auto lines = launchers::detail::job_wide_report(std::move(g.views), common::recorder::now_ns(),
                                                          options.stall_timeout, stalls_reported, silent, kGatherWait);
    if (!lines) return;
    for (const auto& n : live_members())
      n->connection->send(Json{{"t", "report"}, {"attempt", state.attempt}, {"lines", *lines}});
  }

  // --- job-wide straggler reports (job_stragglers.hpp) -----------------------------------------

  void on_work(const NodePtr& node, const Json& m) {
    if (phase() != Phase::running || !of_this_attempt(*node, m) || !m.contains("ranks")) return;
    auto samples = launchers::detail::samples_from_json(m["ranks"].dump());
    if (!samples) return;
    std::set<int> running;  // members whose ranks still run: the others' counters no longer move
    for (std::size_t r = 0; r < state.members.size(); ++r)
      if (!state.members[r].gone && !state.members[r].over) running.insert(static_cast<int>(r));
    const auto said = stragglers.heard(state.attempt, node->node_rank, field<double>(m, "threshold", 0.1),
                                       std::move(*samples), running);
    if (!said) return;
    for (const auto& n : live_members())
      n->connection->send(Json{{"t", "straggler"}, {"attempt", state.attempt}, {"lines", said->lines}, {"named", said->named}});
  }

  void refuse(const NodePtr& node, const std::string& why) {
    node->connection->send(Json{{"t", "error"}, {"message", why}});
    node->connection->close_after_sends();
  }

  void on_join(const NodePtr& node, const Json& m) {
    if (field<std::string>(m, "token", "") != options.token) {
      node->refused = true;
      note_refused(node, "wrong or missing job identity (--rdzv-id / IDIST_JOB_TOKEN)");
      strangers.other_job(node->connection->address());
      return refuse(node, "wrong or missing job identity: pass the same --rdzv-id (or IDIST_JOB_TOKEN) on every node");
    }
    node->host = field<std::string>(m, "host", node->connection->peer());
    node->nproc = std::max(1, field<int>(m, "nproc", 1));
    if (m.contains("node_rank") && m["node_rank"].is_number_integer()) node->wanted_rank = m["node_rank"].get<int>();
    node->hosting = field<bool>(m, "hosting", false);
    node->master_port = field<int>(m, "master_port", 0);
    if (const auto grace = field<long long>(m, "grace_ms", -1); grace >= 0) node->grace = std::chrono::milliseconds(grace);
    if (!node->joined) {
      node->joined = true;
      node->order = joins++;
      ++agents;
    }
    apply(rules::Join{rules::Candidate{.id = node->id,
                                       .host = node->host,
                                       .nproc = node->nproc,
                                       .hosting = node->hosting,
                                       .wanted_rank = node->wanted_rank,
                                       .prev_rank = node->node_rank,
                                       .order = node->order,
                                       .recovers = field<bool>(m, "recovery", false)}});
  }

  bool of_this_attempt(const Node& node, const Json& m) const {
    return is_member(node) && field<int>(m, "attempt", -1) == state.attempt;
  }

  void on_fail(const NodePtr& node, const Json& m) {
    if (of_this_attempt(*node, m)) apply(rules::Fail{failure_of(m, node->node_rank)});
  }

  void on_over(const NodePtr& node, const Json& m) {
    if (!of_this_attempt(*node, m)) return;
    rules::Over over{.node_rank = node->node_rank, .failure = {}};
    if (const auto f = m.find("failure"); f != m.end() && f->is_object()) over.failure = failure_of(*f, node->node_rank);
    // The last member's ranks are gone: a loss the job went on from must have been recovered
    // from, or it is the attempt's failure, as without live recovery.
    if (generations && phase() == Phase::running && !over.failure && last_outstanding(node->node_rank))
      if (auto why = generations->unrecovered(); !why.empty())
        apply(rules::Fail{rules::Failure{.node_rank = node->node_rank, .rank = -1, .how = std::move(why),
                                         .exit_code = 1, .root = true, .lost_peer = {}, .recoverable = false}});
    apply(over);
  }

  // Live recovery: replacements nobody is left to admit are stopped by their nodes, so that
  // the verdict does not wait for them. Looked at after every event (once it changes).
  void maybe_members_ended() {
    if (!generations || phase() != Phase::running) return;
    auto unjoined = rules::unjoined_after_members_ended(state, generations->members(),
                                                        [this](int k) { return generations->joined(k); });
    if (unjoined.empty() || unjoined == told_unjoined) return;
    told_unjoined = unjoined;
    for (const auto& n : live_members())
      n->connection->send(Json{{"t", "members_ended"}, {"attempt", state.attempt}, {"unjoined", unjoined}});
  }

  bool last_outstanding(int node_rank) const {
    for (std::size_t r = 0; r < state.members.size(); ++r)
      if (static_cast<int>(r) != node_rank && !state.members[r].over && !state.members[r].gone) return false;
    return true;
  }

  // --- the rules' events in, their actions out ------------------------------------------------

  void apply(rules::Event event) {
    pending.push_back(std::move(event));
    if (applying) return;
    applying = true;
    while (!pending.empty()) {
      auto step = rules::decide(std::move(state), pending.front(), limits);
      pending.pop_front();
      state = std::move(step.state);
      for (const auto& action : step.actions) std::visit([this](const auto& a) { act(a); }, action);
    }
    applying = false;
    maybe_members_ended();
  }

  NodePtr node_of(const std::string& id) const {
    const auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : it->second;
  }

  void act(const rules::Assign&) {
    const auto& members = state.members;
    int world = 0;
    for (const auto& m : members) world += m.nproc;
    const auto zero = node_of(members.front().id);
    const int master_port = zero ? zero->master_port : 0;
    host_generations(world);
    for (std::size_t r = 0; r < members.size(); ++r) {
      const auto n = node_of(members[r].id);
      if (!n) continue;
      n->node_rank = static_cast<int>(r);
      n->connection->send(assign_message(r, world, master_port));
    }
    stalls_reported.clear();
    last_call_timer.cancel();
    last_call_armed = false;
    join_timer.cancel();
  }

  // Member r's part in the attempt: its node rank, its first rank, rank 0's port, and the
  // generations' store where live recovery is on.
  Json assign_message(std::size_t r, int world, int master_port) const {
    Json assign{{"t", "assign"},
                {"attempt", state.attempt},
                {"node_rank", r},
                {"nnodes", state.members.size()},
                {"world_size", world},
                {"rank_base", state.members[r].base},
                {"master_port", master_port},
                {"stragglers", true}};  // it compares every node's ranks: share them ("work")
    if (generations) assign["recovery_port"] = generations->port();
    return assign;
  }

  // A node that joins the running attempt live: told its part as a round's member is, and
  // after which generation its ranks, started as replacements, wait to be admitted.
  void act(const rules::JoinLive& j) {
    const auto n = node_of(j.id);
    const auto zero = node_of(state.members.front().id);
    if (!n || !generations) return;
    n->node_rank = j.node_rank;
    // Its ranks' RANK is their origin: a world that holds it (the runtime takes its own from the
    // generation that admits them).
    auto assign = assign_message(static_cast<std::size_t>(j.node_rank), j.origins.back() + 1,
                                 zero ? zero->master_port : 0);
    assign["joins_after"] = generations->generation();
    n->connection->send(assign);
  }

  // A generations' store for the attempt that starts, at the rendezvous' own address (which
  // every node reaches), its clients presenting the ranks' token; its port, or 0 where live
  // recovery is off (not asked, or the store cannot listen: then a loss ends the attempt).
  int host_generations(int world) {
    generations.reset();
    told_unjoined.clear();
    limits.recovery = false;
    limits.replacements = false;
    if (!options.recovery) return 0;
    boost::system::error_code ec;
    const auto here = acceptor.local_endpoint(ec);
    try {
      if (ec) throw std::runtime_error(ec.message());
      generations = std::make_unique<Generations>(
          io, here.address().to_string(), attempt_token(options.token, state.attempt), world,
          [this, attempt = state.attempt](std::uint64_t g, const std::vector<int>& members, const std::string& line,
                                          bool) {
            if (state.attempt != attempt || phase() != Phase::running) return;
            apply(rules::Generation{members});
            for (const auto& n : live_members())
              n->connection->send(Json{
                  {"t", "reformed"}, {"attempt", attempt}, {"generation", g}, {"line", line}, {"members", members}});
          });
      generations->on_taken([](std::uint64_t g, double seconds) {
        spdlog::info("rendezvous: generation {}: every member joined it, {} after it was called for", g,
                     common::measured_duration_text(std::chrono::duration<double>(seconds)));
      });
    } catch (const std::exception& e) {
      spdlog::warn("rendezvous: live recovery is off for attempt {}: cannot start its store ({})", state.attempt,
                   e.what());
      return 0;
    }
    limits.recovery = true;
    limits.replacements = true;
    return generations->port();
  }

  void act(const rules::ReformInPlace& r) {
    if (!generations) return;
    generations->lose(r.lost, r.why);
    // Started now, it waits (at its first collective) for the first generation after the
    // current one that has it (origin -1: none, which its node waits to hear before it is over).
    for (const auto& k : r.replace)
      if (const auto n = node_of(state.members[static_cast<std::size_t>(k.node_rank)].id))
        n->connection->send(Json{{"t", "replace"},
                                 {"attempt", state.attempt},
                                 {"lost", k.lost},
                                 {"origin", k.origin},
                                 {"after", generations->generation()}});
  }

  void act(const rules::ArmLastCall&) {
    if (last_call_armed) return;
    last_call_armed = true;
    last_call_timer.expires_after(options.last_call);
    last_call_timer.async_wait([weak = weak_from_this(), round = state.attempt](auto ec) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->last_call_armed = false;
      self->apply(rules::LastCall{round});
    });
  }

  void act(const rules::EndAttempt& e) {
    if (generations) generations->stand_down();
    if (phase() != Phase::ending) return;  // decided at once: nobody left to stop
    std::chrono::milliseconds grace{0};
    for (const auto& m : state.members) {
      const auto n = node_of(m.id);
      if (m.gone || m.over || !n) continue;
      n->connection->send(Json{{"t", "end"}, {"attempt", state.attempt}, {"cause", e.cause}});
      grace = std::max(grace, n->grace.count() >= 0 ? n->grace : options.grace);
    }
    arm_stop_timer(grace + options.stop_margin);
  }

  void act(const rules::Drop& d) {
    const auto n = node_of(d.id);
    if (!n) return;
    n->dropped_why = d.why;
    // Its close (once the error is sent) lets it go.
    refuse(n, fmt::format("this node {}; dropped from the job", d.why));
  }

  void act(const rules::Refuse& r) {
    if (const auto n = node_of(r.id)) refuse(n, r.why);
  }

  void act(const rules::Announce& a) {
    Json verdict = verdict_json(a.verdict);
    verdict["t"] = "verdict";
    if (a.verdict.then == rules::Verdict::Then::restart) {
      for (const auto& id : a.to)
        if (const auto n = node_of(id); n && !n->gone) n->connection->send(verdict);
      return arm_join_timer();
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

  void act(const rules::Log& l) {
    if (options.quiet) return;
    if (l.debug) return spdlog::debug("rendezvous: {}", l.line);
    spdlog::info("rendezvous: {}", l.line);
  }

  // The verdict waits for every member's "over", but not for ever: past the members' --grace
  // and a margin, the rules drop those still stopping.
  void arm_stop_timer(std::chrono::milliseconds limit) {
    stop_timer.expires_after(limit);
    stop_timer.async_wait([weak = weak_from_this(), round = state.attempt, limit](auto ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase() != Phase::ending || self->state.attempt != round) return;
      self->apply(rules::StopPassed{common::duration_text(limit)});
    });
  }

  void arm_join_timer() {
    join_timer.expires_after(options.join_timeout);
    join_timer.async_wait([weak = weak_from_this(), round = state.attempt](auto ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase() != Phase::gathering || self->state.attempt != round) return;
      self->apply(rules::JoinTimeout{common::duration_text(self->options.join_timeout), self->strangers.other_job_text()});
    });
  }

  void note_refused(const NodePtr& node, const std::string& why) {
    strangers.refused(node->connection->peer(), node->connection->address(), why);
  }

  void on_close(const NodePtr& node, const std::string& why) {
    // Something that spoke another protocol (or nothing but garbage): worth counting.
    if (!node->joined && !node->refused && why != "the other side closed the connection")
      note_refused(node, why + " (not an idist-run of this job)");
    node->gone = true;
    std::erase(nodes, node);
    by_id.erase(node->id);
    if (node->joined) --agents;
    if (phase() == Phase::done) return check_drained();
    if (!node->joined) return;
    apply(rules::Lost{.id = node->id, .text = lost_text(node, why), .prev_rank = node->node_rank, .nodes_left = agents});
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

  void check_drained() {
    if (phase() != Phase::done || !drained || agents > 0) return;
    finish_drain();
  }

  // Nothing of the rendezvous is left waiting on the event loop: node 0 may exit.
  void stop() {
    state.phase = Phase::done;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    heartbeat_timer.cancel();
    silence_timer.cancel();
    stop_timer.cancel();
    last_call_timer.cancel();
    join_timer.cancel();
    drain_timer.cancel();
    strangers.flush();
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
    apply(rules::HostLeft{why});
    drained = std::move(done);
    drain_timer.expires_after(kDrainGrace);
    drain_timer.async_wait([weak = weak_from_this()](auto ec) {
      if (auto self = weak.lock(); self && !ec && self->drained) self->finish_drain();
    });
    check_drained();
  }
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
