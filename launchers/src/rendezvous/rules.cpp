#include "rules.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <array>
#include <limits>
#include <tuple>
#include <unordered_set>

namespace idist::launchers::rendezvous::rules {

namespace {

constexpr std::array<std::string_view, 4> kPhaseNames = {"gathering", "running", "ending", "done"};

std::string plural(int n, std::string_view word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

// One decision: the state it changes and the actions it says, in order.
class Decision {
 public:
  Decision(State state, const Limits& limits) : s_(std::move(state)), limits_(limits) {}

  Step take() && { return Step{std::move(s_), std::move(out_)}; }

  void on(const Reconsider&) { reconsider(); }
  void on(const Join& e) { join(e.node); }
  void on(const Fail& e) {
    if (!ended_or_running() || !valid(e.failure.node_rank)) return;
    if (unadmitted(e.failure.rank)) return lose_unadmitted(e.failure);
    if (e.failure.recoverable && reform_in_place(e.failure, {e.failure.rank})) return;
    record(e.failure);
  }
  void on(const Generation& e) {
    for (const auto& m : s_.members)
      for (int k : m.extra)
        if (has(e.members, k) && !has(s_.admitted, k)) s_.admitted.push_back(k);
  }
  void on(const Capable& e) {
    if (!ended_or_running() || !valid(e.node_rank)) return;
    auto& m = s_.members[static_cast<std::size_t>(e.node_rank)];
    m.capable = true;
    m.admits = m.admits || e.admits;
  }
  void on(const Ended& e) {
    if (ended_or_running() && std::find(s_.ended_ranks.begin(), s_.ended_ranks.end(), e.rank) == s_.ended_ranks.end())
      s_.ended_ranks.push_back(e.rank);
  }
  void on(const Over& e) { over(e); }
  void on(const Lost& e) { lost(e); }
  void on(const LastCall& e) {
    if (s_.phase != Phase::gathering || e.attempt != s_.attempt) return;
    s_.last_call = true;
    maybe_close_round();
  }
  void on(const JoinTimeout& e) { join_timed_out(e); }
  void on(const StopPassed& e) { stop_passed(e); }
  void on(const HostLeft& e) {
    if (s_.phase == Phase::done) return;
    // Node 0 leaves before the job's end (interrupted, timed out, a rank it could not start):
    // the others hear it as the job's failure, not as silence.
    conclude_failure(e.why.empty()
                         ? "node 0's idist-run left the job (interrupted, timed out, or it could not start its ranks)"
                         : "node 0's idist-run left the job: " + e.why,
                     1, -1, {});
  }

 private:
  template <class... Args>
  void log(fmt::format_string<Args...> format, Args&&... args) {
    out_.push_back(Log{fmt::format(format, std::forward<Args>(args)...)});
  }

  bool ended_or_running() const { return s_.phase == Phase::running || s_.phase == Phase::ending; }
  bool valid(int node_rank) const { return node_rank >= 0 && node_rank < static_cast<int>(s_.members.size()); }
  int live_members() const {
    return static_cast<int>(std::count_if(s_.members.begin(), s_.members.end(), [](const Member& m) { return !m.gone; }));
  }
  bool outstanding() const {
    return std::any_of(s_.members.begin(), s_.members.end(), [](const Member& m) { return !m.over && !m.gone; });
  }
  std::string member_name(int r) const {
    return fmt::format("node {} ({})", r, s_.members[static_cast<std::size_t>(r)].host);
  }
  void unwait(const std::string& id) {
    std::erase_if(s_.waiting, [&](const Candidate& c) { return c.id == id; });
  }
  void refuse(const std::string& id, std::string why) {
    unwait(id);
    out_.push_back(Refuse{id, std::move(why)});
  }

  // What the state itself calls for: etcd's proposer reads the job's keys into a state (its
  // members' reports, who is still there) and asks this at every read.
  void reconsider() {
    if (s_.phase == Phase::gathering) return maybe_close_round();
    if (s_.phase == Phase::ending) return maybe_decide();
    if (s_.phase != Phase::running) return;
    if (!s_.reform && !s_.failures.empty()) return end_for(s_.failures.front());
    maybe_decide();
    if (s_.phase != Phase::running || s_.waiting.empty() || !has_room()) return;
    const auto c = s_.waiting.front();
    c.recovers && joins_live() ? join_live(c) : reform(name_of(c));
  }

  // An elastic job (MIN:MAX) with fewer than MAX members re-forms for a node that asks to join,
  // as torchrun's does (or, with live recovery, takes it in live: join_live).
  bool has_room() const { return limits_.max_nodes > limits_.min_nodes && live_members() < limits_.max_nodes; }

  void join(const Candidate& c) {
    if (s_.phase == Phase::done) return out_.push_back(Refuse{c.id, "the job is over"});
    if (node_rank_of(s_, c.id) >= 0) return;  // in this attempt already: nothing to join
    const auto known = std::find_if(s_.waiting.begin(), s_.waiting.end(), [&](const Candidate& w) { return w.id == c.id; });
    if (known != s_.waiting.end()) {
      *known = c;
    } else {
      s_.waiting.push_back(c);
    }
    if (c.wanted_rank && *c.wanted_rank >= limits_.max_nodes)
      return refuse(c.id, fmt::format("--node-rank {} is not below --nnodes {}", *c.wanted_rank, limits_.max_nodes));
    if (s_.phase == Phase::gathering) return maybe_close_round();
    // Running: a node that arrives now joins the next attempt, at once where there is room (or
    // this one, live).
    if (s_.phase != Phase::running) return;
    if (has_room()) return c.recovers && joins_live() ? join_live(c) : reform(name_of(c));
    if (limits_.max_nodes == limits_.min_nodes) refuse(c.id, already_full(limits_.max_nodes));
  }

  // Live recovery: a node joins the running attempt in place of a re-form where the world can
  // admit ranks live (recovery and replacements offered, nothing failed or ended, every
  // member's ranks opted in and admit replacements).
  bool joins_live() const {
    if (!limits_.recovery || !limits_.replacements || s_.reform || !s_.failures.empty() || !s_.ended_ranks.empty())
      return false;
    return std::all_of(s_.members.begin(), s_.members.end(),
                       [](const Member& m) { return m.gone || m.over || (m.capable && m.admits); });
  }

  // Its ranks are replacements in all but the lost rank: numbered after the job's ranks and
  // every replacement (kept as its Member::extra, its nproc 0), admitted together once they are
  // all ready, taking the job's state from the running ranks. Not counted against --max-restarts. It is
  // taken as capable and admitting: its ranks are started as replacements, which opt in.
  void join_live(const Candidate& c) {
    int origin = 0;
    for (const auto& m : s_.members) origin += m.nproc + static_cast<int>(m.extra.size());
    Member joined{.id = c.id, .host = c.host, .nproc = 0, .base = origin, .capable = true, .admits = true};
    for (int i = 0; i < c.nproc; ++i) joined.extra.push_back(origin + i);
    const int r = static_cast<int>(s_.members.size());
    s_.members.push_back(joined);
    unwait(c.id);
    log("node {} ({}) joins attempt {} live as ranks {} to {}: the running ranks admit them at a step boundary "
        "(live recovery)", r, c.host, s_.attempt, origin, origin + c.nproc - 1);
    out_.push_back(JoinLive{c.id, r, s_.members.back().extra});
  }

  void reform(const std::string& name) {
    log("{} asks to join: ending attempt {} so that the job re-forms with it", name, s_.attempt);
    s_.cause = name + " joined";
    s_.reform = true;
    end_attempt();
  }

  void over(const Over& e) {
    if (!ended_or_running() || !valid(e.node_rank)) return;
    s_.members[static_cast<std::size_t>(e.node_rank)].over = true;
    // The member's final word on which of its ranks failed first (its supervisor weighs ranks
    // that failed together): it replaces what its "fail" said, in its place, so that the
    // order of the members' first reports stays the order blame() reads.
    // A member whose ranks were all lost says so as its final word, after, or on etcd at the same
    // read as, the loss the others re-formed without: recovered, no failure.
    const bool recovered = e.failure && std::find(s_.lost_ranks.begin(), s_.lost_ranks.end(), e.failure->rank) !=
                                            s_.lost_ranks.end();
    if (e.failure && !recovered) {
      Failure f = *e.failure;
      f.node_rank = e.node_rank;
      const auto mine = std::find_if(s_.failures.begin(), s_.failures.end(),
                                     [&](const Failure& x) { return x.node_rank == e.node_rank; });
      if (mine != s_.failures.end()) {
        *mine = std::move(f);
      } else {
        record(std::move(f));
      }
    }
    maybe_decide();
  }

  // A failure: the first ends the attempt on every node. Those that come while it ends may
  // still be the cause (a node reports what its ranks did before it heard the end), which
  // blame() weighs; they cost no more of the budget than the first.
  void record(Failure f) {
    // A re-form stops every member's ranks, and a rank whose peers stop first fails before its
    // own idist-run hears the end: a consequence of the re-form. None of it counts, neither as
    // the attempt's failure nor against --max-restarts.
    if (s_.reform) {
      out_.push_back(Log{fmt::format("attempt {} re-forms: not counting {}", s_.attempt, failure_text(s_, f)), true});
      return;
    }
    s_.failures.push_back(std::move(f));
    if (s_.phase == Phase::running) end_for(s_.failures.back());
  }

  void end_for(const Failure& f) {
    s_.cause = failure_text(s_, f);
    log("attempt {}: {}; stopping every node", s_.attempt, s_.cause);
    end_attempt();
  }

  void end_attempt() {
    s_.phase = Phase::ending;
    out_.push_back(EndAttempt{s_.cause});
    maybe_decide();
  }

  void lost(const Lost& e) {
    if (s_.phase == Phase::done) return;
    unwait(e.id);
    const int r = node_rank_of(s_, e.id);
    if (r < 0) {
      if (s_.phase != Phase::gathering) return;
      // A node of the job (it ran in an attempt) lost while the next attempt gathers.
      if (e.prev_rank >= 0) return lost_between_attempts(e);
      return log("before the job started, {}", e.text);
    }
    auto& m = s_.members[static_cast<std::size_t>(r)];
    if (m.gone) return;
    m.gone = true;
    // A member whose ranks were done, or lost after the attempt had ended anyway: not a
    // failure, but one node fewer for the next attempt, named should that end the job.
    if (m.over || s_.phase != Phase::running) {
      s_.departures.push_back(e.text);
      return maybe_decide();
    }
    const Failure f{.node_rank = r, .rank = -1, .how = e.text, .exit_code = 1, .root = true, .lost_peer = {},
                    .recoverable = true};
    std::vector<int> ranks;
    for (int k : ranks_of(m))
      if (std::find(s_.lost_ranks.begin(), s_.lost_ranks.end(), k) == s_.lost_ranks.end()) ranks.push_back(k);
    if (ranks.empty()) {  // its ranks were all lost, and re-formed without already
      s_.departures.push_back(e.text);
      return maybe_decide();
    }
    if ((r != 0 || !limits_.needs_host) && reform_in_place(f, ranks)) return maybe_decide();
    record(f);
    maybe_decide();
  }

  // After a restart verdict the members join again; one that is lost instead would leave the
  // round waiting join_timeout for it. The job goes on while MIN nodes remain (with a fixed N:
  // only if another node already waits in its place), else it ends now on every node.
  void lost_between_attempts(const Lost& e) {
    if (e.nodes_left >= limits_.min_nodes) {
      log("before attempt {} could start, {}; {} nodes remain", s_.attempt, e.text, e.nodes_left);
      return maybe_close_round();
    }
    conclude_failure(fmt::format("before attempt {} could start, {}; {} left, the job needs {}", s_.attempt, e.text,
                                 plural(e.nodes_left, "node"), limits_.min_nodes),
                     1, -1, kEndedByNodes);
  }

  // Live recovery: the survivors of `f` (which loses `ranks`) go on in place, where recovery is
  // offered, the attempt runs and did not end, every live member's ranks opted in, and the
  // world stays at least --min-world. On the built-in rendezvous node 0 hosts the generations'
  // store: its loss is never survived, nor is it asked here (its ranks' loss is, like any
  // other's); on etcd every node hosts its own ranks' store, and node 0 is one like the others.
  bool reform_in_place(const Failure& f, const std::vector<int>& ranks) {
    if (!limits_.recovery || s_.phase != Phase::running || s_.reform || !f.root || ranks.empty()) return false;
    const auto in = [](const std::vector<int>& v, int k) { return std::find(v.begin(), v.end(), k) != v.end(); };
    const auto gone = [&](int k) { return in(s_.lost_ranks, k) || in(ranks, k) || in(s_.ended_ranks, k); };
    // Who goes on: the ranks of members still running (not over: those ended their program)
    // that are neither lost already nor lost now, nor ended.
    int left = 0;
    for (const auto& m : s_.members) {
      if (m.gone) continue;
      if (!m.capable) return false;
      if (m.over) continue;
      for (int k : ranks_of(m)) left += gone(k) || unadmitted(k) ? 0 : 1;
    }
    for (int k : ranks)
      if (std::find(s_.lost_ranks.begin(), s_.lost_ranks.end(), k) != s_.lost_ranks.end()) return false;
    const auto why = failure_text(s_, f);
    if (left == 0) return false;  // nobody would go on: the loss is the attempt's failure
    if (left < limits_.min_world) {
      log("live recovery: {}; {} would be left, fewer than --min-world {}: the attempt ends", why,
          plural(left, "rank"), limits_.min_world);
      return false;
    }
    s_.lost_ranks.insert(s_.lost_ranks.end(), ranks.begin(), ranks.end());
    s_.recovered.push_back(f);
    log("attempt {}: {}; the other {} go on without it (live recovery)", s_.attempt, why, plural(left, "rank"));
    out_.push_back(ReformInPlace{ranks, why, replacements(f)});
    return true;
  }

  // A rank lost on a node still there, whose other ranks admit one, is replaced while the
  // restart budget lasts (each spends one, as a restart would): its origin follows the
  // attempt's ranks and the replacements before it, so that every node's are the job's own.
  // Its node hears either way (origin -1: none), and waits for the answer before it is over.
  std::vector<Replacement> replacements(const Failure& f) {
    if (!limits_.replacements || !f.replaceable || f.rank < 0 || !valid(f.node_rank)) return {};
    auto& m = s_.members[static_cast<std::size_t>(f.node_rank)];
    if (m.gone || s_.restarts_used >= limits_.max_restarts) return {Replacement{f.node_rank, f.rank, -1}};
    int origin = 0;
    for (const auto& other : s_.members) origin += other.nproc + static_cast<int>(other.extra.size());
    ++s_.restarts_used;
    m.extra.push_back(origin);
    log("live recovery: rank {} starts on node {} ({}) in rank {}'s place ({} of --max-restarts {})", origin,
        f.node_rank, m.host, f.rank, s_.restarts_used, limits_.max_restarts);
    return {Replacement{f.node_rank, f.rank, origin}};
  }

  static bool has(const std::vector<int>& v, int k) { return std::find(v.begin(), v.end(), k) != v.end(); }

  // A replacement no generation has had yet: it holds none of the job's work, so its loss is no
  // failure and nobody re-forms without it; another may start in its place.
  bool unadmitted(int rank) const {
    return std::any_of(s_.members.begin(), s_.members.end(), [&](const Member& m) { return has(m.extra, rank); }) &&
           !has(s_.admitted, rank);
  }
  void lose_unadmitted(const Failure& f) {
    if (has(s_.lost_ranks, f.rank)) return;
    s_.lost_ranks.push_back(f.rank);
    if (s_.phase == Phase::running && !s_.reform)
      out_.push_back(ReformInPlace{{f.rank}, failure_text(s_, f), replacements(f)});
  }

  static std::vector<int> ranks_of(const Member& m) {
    std::vector<int> out;
    for (int k = m.base; k < m.base + m.nproc; ++k) out.push_back(k);
    out.insert(out.end(), m.extra.begin(), m.extra.end());
    return out;
  }

  // --- rounds -------------------------------------------------------------------------------

  void maybe_close_round() {
    if (s_.phase != Phase::gathering) return;
    const int n = static_cast<int>(s_.waiting.size());
    if (n >= limits_.max_nodes || (n >= limits_.min_nodes && s_.last_call)) return close_round();
    if (n >= limits_.min_nodes) out_.push_back(ArmLastCall{});
  }

  void close_round();
  void place(std::vector<Candidate> in);

  void join_timed_out(const JoinTimeout& e) {
    if (s_.phase != Phase::gathering) return;
    const auto in = s_.waiting;
    if (static_cast<int>(in.size()) >= limits_.min_nodes) {
      close_round();
      if (s_.phase != Phase::gathering) return;
      // Enough nodes, but not node 0, whose rank 0 the job needs.
      return conclude_failure(fmt::format("the rendezvous timed out after {}: {} nodes joined, but not node 0 (the "
                                          "rendezvous' host)",
                                          e.after, in.size()),
                              1, -1, {});
    }
    std::vector<std::string> hosts;
    std::vector<bool> ranked(static_cast<std::size_t>(std::max(limits_.max_nodes, 1)));
    for (const auto& c : in) {
      hosts.push_back(c.host);
      if (c.wanted_rank && *c.wanted_rank < limits_.max_nodes) ranked[static_cast<std::size_t>(*c.wanted_rank)] = true;
      if (c.hosting) ranked[0] = true;
    }
    std::string missing;
    if (limits_.min_nodes == limits_.max_nodes) {
      std::vector<int> absent;
      for (int r = 0; r < limits_.max_nodes; ++r)
        if (!ranked[static_cast<std::size_t>(r)]) absent.push_back(r);
      // Only meaningful when every node present said its rank (the static form).
      if (static_cast<int>(absent.size()) == limits_.max_nodes - static_cast<int>(in.size()))
        missing = fmt::format("; node{} {} never joined", absent.size() == 1 ? "" : "s", fmt::join(absent, ", "));
    }
    conclude_failure(fmt::format("the rendezvous timed out after {}: {} of {} nodes joined ({}){}{}", e.after, in.size(),
                                 limits_.min_nodes, hosts.empty() ? "none" : fmt::format("{}", fmt::join(hosts, ", ")),
                                 missing, e.suffix),
                     1, -1, {});
  }

  // --- the verdict --------------------------------------------------------------------------

  // The verdict waits for every member's "over", but not for ever: a member that still
  // heartbeats yet never finishes stopping its ranks (a console it cannot drain, a process it
  // cannot reap) would hold every node. Past its --grace and a margin it is dropped, named.
  void stop_passed(const StopPassed& e) {
    if (s_.phase != Phase::ending) return;
    for (std::size_t r = 0; r < s_.members.size(); ++r) {
      auto& m = s_.members[r];
      if (m.gone || m.over) continue;
      m.gone = true;
      auto why = fmt::format("did not report its ranks stopped within {} of attempt {}'s end", e.limit, s_.attempt);
      const auto name = member_name(static_cast<int>(r));
      log("{} {}: dropped from the job", name, why);
      s_.departures.push_back(fmt::format("{} {}", name, why));
      out_.push_back(Drop{m.id, std::move(why)});
    }
    maybe_decide();
  }

  void maybe_decide();
  const Failure* blame() const;

  void next_attempt(bool counted, std::string cause, int rank) {
    if (counted) ++s_.restarts_used;
    const int left = limits_.max_restarts - s_.restarts_used;
    log("attempt {} ended ({}): attempt {} on every node{}", s_.attempt, cause, s_.attempt + 1,
        counted ? fmt::format(", {} left", plural(left, "restart")) : std::string(" (a re-form, not counted)"));
    Verdict v{.then = Verdict::Then::restart, .attempt = s_.attempt, .next = s_.attempt + 1, .cause = std::move(cause),
              .exit_code = 1, .restarts_left = left, .counted = counted, .rank = rank, .ended_by = {}};
    Announce a{v, {}};
    for (const auto& m : s_.members)
      if (!m.gone) a.to.push_back(m.id);
    out_.push_back(std::move(a));
    // Members join again; a node that waited is in the next round already.
    s_ = State{.phase = Phase::gathering,
               .attempt = s_.attempt + 1,
               .restarts_used = s_.restarts_used,
               .members = {},
               .waiting = std::move(s_.waiting),
               .failures = {},
               .departures = {},
               .cause = {},
               .reform = false,
               .last_call = false,
               .verdict = std::move(v),
               .lost_ranks = {},
               .ended_ranks = {},
               .recovered = {}};
  }

  void conclude(Verdict v) {
    s_.phase = Phase::done;
    v.attempt = s_.attempt;
    if (v.then == Verdict::Then::failure) log("the job failed: {}", v.cause);
    s_.verdict = v;
    out_.push_back(Announce{std::move(v), {}});
  }
  void conclude_failure(std::string cause, int exit_code, int rank, std::string_view ended_by) {
    conclude(Verdict{.then = Verdict::Then::failure, .attempt = 0, .next = 0, .cause = std::move(cause),
                     .exit_code = exit_code, .restarts_left = 0, .counted = true, .rank = rank, .ended_by = ended_by});
  }

  State s_;
  const Limits& limits_;
  std::vector<Action> out_;
};

void Decision::close_round() {
  auto in = s_.waiting;
  if (limits_.needs_host && std::none_of(in.begin(), in.end(), [](const Candidate& c) { return c.hosting; }))
    return;  // node 0 (rank 0's port) is not in yet
  std::stable_sort(in.begin(), in.end(), [](const Candidate& a, const Candidate& b) { return a.order < b.order; });
  // Up to MAX: node 0, the nodes with a rank of their own, then in their order.
  std::stable_partition(in.begin(), in.end(), [](const Candidate& c) { return c.hosting || c.wanted_rank; });
  std::stable_partition(in.begin(), in.end(), [](const Candidate& c) { return c.hosting; });
  if (static_cast<int>(in.size()) > limits_.max_nodes) in.resize(static_cast<std::size_t>(limits_.max_nodes));
  place(std::move(in));
}

// The round's candidates (at most MAX) get their node ranks: node 0 and --node-rank where
// said, the others by their last rank, host name and order, so ranks stay while membership does.
void Decision::place(std::vector<Candidate> in) {
  const int count = static_cast<int>(in.size());
  std::vector<const Candidate*> by_rank(static_cast<std::size_t>(count));
  std::vector<const Candidate*> rest;
  for (const auto& c : in) {
    const int want = c.hosting ? 0 : c.wanted_rank.value_or(-1);
    if (want >= count) {
      refuse(c.id, fmt::format("--node-rank {} is not below the {} nodes of this attempt", want, count));
      return maybe_close_round();
    }
    if (want >= 0 && by_rank[static_cast<std::size_t>(want)]) {
      refuse(c.id, fmt::format("node rank {} is taken (by {})", want, by_rank[static_cast<std::size_t>(want)]->host));
      return maybe_close_round();
    }
    if (want >= 0) {
      by_rank[static_cast<std::size_t>(want)] = &c;
    } else {
      rest.push_back(&c);
    }
  }
  std::stable_sort(rest.begin(), rest.end(), [](const Candidate* a, const Candidate* b) {
    const int ra = a->prev_rank >= 0 ? a->prev_rank : std::numeric_limits<int>::max();
    const int rb = b->prev_rank >= 0 ? b->prev_rank : std::numeric_limits<int>::max();
    return std::tie(ra, a->host, a->order) < std::tie(rb, b->host, b->order);
  });
  auto next = rest.begin();
  for (auto& slot : by_rank)
    if (!slot) slot = *next++;
  s_.members.clear();
  std::unordered_set<std::string> in_round;
  int base = 0;
  for (const auto* c : by_rank) {
    s_.members.push_back(Member{.id = c->id, .host = c->host, .nproc = c->nproc, .base = base, .over = false, .gone = false});
    base += c->nproc;
    in_round.insert(c->id);
  }
  std::erase_if(s_.waiting, [&](const Candidate& c) { return in_round.count(c.id) > 0; });
  s_.phase = Phase::running;
  s_.failures.clear();
  s_.departures.clear();
  s_.cause.clear();
  s_.reform = false;
  s_.last_call = false;
  s_.lost_ranks.clear();
  s_.ended_ranks.clear();
  s_.recovered.clear();
  out_.push_back(Assign{});
  log("attempt {}: {}, world size {}", s_.attempt, plural(count, "node"), base);
}

void Decision::maybe_decide() {
  if (!ended_or_running() || outstanding()) return;
  const bool failure = !s_.reform && !s_.failures.empty();
  if (s_.phase == Phase::running && !failure) {
    Verdict success;
    success.then = Verdict::Then::success;
    return conclude(std::move(success));
  }
  const int live = live_members() + static_cast<int>(s_.waiting.size());
  if (!failure && live >= limits_.min_nodes) return next_attempt(false, s_.cause, -1);  // a re-form: not counted
  std::string cause = s_.cause;
  int exit_code = 1, rank = -1;
  if (failure) {
    const Failure* pick = blame();
    cause = failure_text(s_, *pick);
    exit_code = pick->exit_code;
    rank = pick->rank;
  } else {
    cause = s_.departures.empty() ? std::string("a node left while the job re-formed")
                                  : fmt::format("while the job re-formed, {}", fmt::join(s_.departures, "; "));
  }
  if (s_.restarts_used < limits_.max_restarts && live >= limits_.min_nodes) return next_attempt(true, cause, rank);
  if (live < limits_.min_nodes) {
    if (failure && !s_.departures.empty()) cause += fmt::format("; {}", fmt::join(s_.departures, "; "));
    cause += fmt::format("; {} left, the job needs {}", plural(live, "node"), limits_.min_nodes);
  } else if (live < static_cast<int>(s_.members.size())) {
    // Enough nodes remain, but going on without the lost one is a new attempt, which the
    // budget must pay for: say so, or the end looks like a failure the job could have survived.
    cause += fmt::format("; no restart left (--max-restarts {}): going on without a lost node spends a restart",
                         limits_.max_restarts);
  }
  conclude_failure(std::move(cause), exit_code, rank, live < limits_.min_nodes ? kEndedByNodes : kEndedByRestarts);
}

// Which failure the job names, as the supervisor blames its own ranks (supervise/policy.hpp): a
// root cause (a crash, a kill nobody sent, a lost node) before a non-zero exit, which may be
// a survivor's answer to it; among equals the first that came; then, while the one named
// says it lost its connection to a rank that failed too, that rank.
const Failure* Decision::blame() const {
  const auto& fs = s_.failures;
  auto pick = std::find_if(fs.begin(), fs.end(), [](const Failure& f) { return f.root; });
  if (pick == fs.end()) pick = fs.begin();
  const Failure* named = &*pick;
  // The rank the named one lost: among the failures, else among the losses re-formed without
  // (a survivor that did not re-form fails of one of them).
  const auto cause_of = [&](const std::vector<Failure>& among, int peer) -> const Failure* {
    const auto it = std::find_if(among.begin(), among.end(), [&](const Failure& f) {
      if (f.rank == peer) return true;
      if (f.rank >= 0 || f.node_rank < 0 || f.node_rank >= static_cast<int>(s_.members.size())) return false;
      const auto& m = s_.members[static_cast<std::size_t>(f.node_rank)];
      return holds(m, peer);
    });
    return it == among.end() ? nullptr : &*it;
  };
  std::vector<const Failure*> visited;
  while (named->lost_peer && std::find(visited.begin(), visited.end(), named) == visited.end()) {
    visited.push_back(named);
    const Failure* next = cause_of(fs, *named->lost_peer);
    if (next == nullptr) next = cause_of(s_.recovered, *named->lost_peer);
    if (next == nullptr || std::find(visited.begin(), visited.end(), next) != visited.end()) break;
    named = next;
  }
  return named;
}

}  // namespace

std::string_view phase_name(Phase phase) { return kPhaseNames[static_cast<std::size_t>(phase)]; }

Phase phase_named(std::string_view name) {
  for (std::size_t i = 0; i < kPhaseNames.size(); ++i)
    if (kPhaseNames[i] == name) return static_cast<Phase>(i);
  return Phase::gathering;
}

std::string name_of(const Candidate& c) {
  return c.prev_rank >= 0 ? fmt::format("node {} ({})", c.prev_rank, c.host) : fmt::format("the node on {}", c.host);
}

bool holds(const Member& m, int rank) {
  return (rank >= m.base && rank < m.base + m.nproc) || std::find(m.extra.begin(), m.extra.end(), rank) != m.extra.end();
}

std::string already_full(int max_nodes) { return fmt::format("the job already has its {} nodes", max_nodes); }

std::string failure_text(const State& state, const Failure& f) {
  if (f.rank < 0) return f.how;
  const bool known = f.node_rank >= 0 && f.node_rank < static_cast<int>(state.members.size());
  const std::string host = known ? state.members[static_cast<std::size_t>(f.node_rank)].host : std::string("?");
  return fmt::format("rank {} on node {} ({}) {}", f.rank, f.node_rank, host, f.how);
}

std::vector<int> unjoined_after_members_ended(const State& state, const std::vector<int>& members,
                                              const std::function<bool(int)>& joined) {
  const auto in = [](const std::vector<int>& v, int k) { return std::find(v.begin(), v.end(), k) != v.end(); };
  int world0 = 0;
  for (const auto& m : state.members) world0 += m.nproc;
  std::vector<int> unjoined;
  for (int k : members) {
    if (in(state.ended_ranks, k) || in(state.lost_ranks, k)) continue;
    if (k >= world0 && !joined(k)) {
      unjoined.push_back(k);
      continue;
    }
    const auto m = std::find_if(state.members.begin(), state.members.end(), [&](const Member& m) { return holds(m, k); });
    if (m == state.members.end() || !(m->over || m->gone)) return {};
  }
  for (const auto& m : state.members)
    for (int k : m.extra)
      if (!in(members, k) && !in(state.lost_ranks, k)) unjoined.push_back(k);
  return unjoined;
}

const Member* member_of(const State& state, const std::string& id) {
  const auto it = std::find_if(state.members.begin(), state.members.end(), [&](const Member& m) { return m.id == id; });
  return it == state.members.end() ? nullptr : &*it;
}

int node_rank_of(const State& state, const std::string& id) {
  const auto* m = member_of(state, id);
  return m ? static_cast<int>(m - state.members.data()) : -1;
}

Step decide(State state, const Event& event, const Limits& limits) {
  Decision d(std::move(state), limits);
  std::visit([&](const auto& e) { d.on(e); }, event);
  return std::move(d).take();
}

}  // namespace idist::launchers::rendezvous::rules
