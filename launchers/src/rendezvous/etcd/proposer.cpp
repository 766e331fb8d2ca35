#include "proposer.hpp"

#include <spdlog/fmt/fmt.h>

#include "client.hpp"
#include "idist/common/duration.hpp"
#include "idist/common/flight_recorder.hpp"
#include "rendezvous/wire.hpp"

namespace idist::launchers::etcd_rdzv {

namespace {

using Clock = std::chrono::steady_clock;
using rendezvous::field;
using rules::Phase;

// How long the views of a job-wide stall report are waited for, and the least time between two
// reports (the built-in rendezvous' figure).
constexpr auto kGatherWait = std::chrono::seconds(2);

}  // namespace

Proposer::Proposer(boost::asio::io_context& io, const EtcdRendezvousOptions& options, std::string prefix, Io out)
    : options_(options),
      prefix_(std::move(prefix)),
      out_(std::move(out)),
      last_call_timer_(io),
      join_timer_(io),
      stop_timer_(io),
      gather_timer_(io) {}

void Proposer::cancel() {
  for (auto* t : {&last_call_timer_, &join_timer_, &stop_timer_, &gather_timer_}) t->cancel();
}

rules::Limits Proposer::limits() const {
  return rules::Limits{.min_nodes = options_.min_nodes,
                       .max_nodes = options_.max_nodes,
                       .max_restarts = options_.max_restarts,
                       .needs_host = false,
                       .recovery = options_.recovery,
                       .min_world = options_.min_world,
                       .replacements = options_.recovery};
}

// How long the verdict waits for a member to stop its ranks before it is dropped.
std::chrono::milliseconds Proposer::stop_limit() const { return options_.grace + std::chrono::seconds(5); }

void Proposer::propose(const Snapshot& s) {
  arm_phase_timers(s);
  const Phase phase = s.phase();
  rules::Event event = rules::Reconsider{};
  if (phase == Phase::gathering && join_timed_out_)
    event = rules::JoinTimeout{common::duration_text(options_.join_timeout), fmt::format(" (etcd at {})", out_.etcd)};
  else if (phase == Phase::ending && stop_passed_)
    event = rules::StopPassed{common::duration_text(stop_limit())};
  const ProposerView view{.last_call = last_call_for_ == s.attempt(), .dead_after = common::duration_text(options_.dead_after)};
  const auto step = decide_read(s, view, event, limits());
  for (const auto& action : step.actions)
    if (std::holds_alternative<rules::ArmLastCall>(action)) arm_last_call(s.attempt());
  auto next = next_state(s, step);
  // Live recovery: the others watch this node's store (store_watch.hpp), as the state names it.
  if (options_.recovery && step.state.phase == Phase::running && out_.self) {
    if (const auto me = out_.self(s.attempt()); !me.is_null() && s.state.value("proposer", Json()) != me) {
      if (!next) next = s.state;
      (*next)["proposer"] = me;
    }
  }
  if (!next) {
    if (phase == Phase::running) propose_stall_report(s);
    return;
  }
  for (const auto& action : step.actions)
    if (const auto* log = std::get_if<rules::Log>(&action); log && !log->debug) out_.info(log->line);
  if (const auto gen = next->value("gen", Json::object()); field<bool>(gen, "grow", false) && gen != s.state.value("gen", Json()))
    out_.info(fmt::format("generation {}: {} (live recovery)", field<std::uint64_t>(gen, "g", 0),
                          field<std::string>(gen, "line", "")));
  if (step.state.attempt == s.attempt()) return txn(s, *next);
  // The next attempt: the reports of the last one go.
  txn(s, *next, {delete_range(fmt::format("a/{}/", s.attempt()))});
}

// The rules' timers, armed as the job enters a phase: the round's join timeout, the members'
// time to stop their ranks.
void Proposer::arm_phase_timers(const Snapshot& s) {
  const int k = s.attempt();
  if (s.phase() == Phase::gathering && gathering_seen_ != k) {
    gathering_seen_ = k;
    join_timed_out_ = false;
    join_timer_.expires_after(options_.join_timeout);
    join_timer_.async_wait([this, k](auto ec) {
      if (ec || gathering_seen_ != k) return;
      join_timed_out_ = true;
      out_.read();
    });
  }
  if (s.phase() == Phase::ending && ending_seen_ != k) {
    ending_seen_ = k;
    stop_passed_ = false;
    stop_timer_.expires_after(stop_limit());
    stop_timer_.async_wait([this, k](auto ec) {
      if (ec || ending_seen_ != k) return;
      stop_passed_ = true;
      out_.read();
    });
  }
}

void Proposer::arm_last_call(int k) {
  if (last_call_armed_ == k) return;
  last_call_armed_ = k;
  last_call_timer_.expires_after(options_.last_call);
  last_call_timer_.async_wait([this, k](auto ec) {
    if (ec) return;
    last_call_for_ = k;
    out_.read();
  });
}

bool Proposer::clear_leftover(const Snapshot& s, const std::string& self) {
  const bool others = std::any_of(s.nodes.begin(), s.nodes.end(), [&](const auto& n) { return n.first != self; });
  if (s.phase() != Phase::done || others) return false;
  out_.info("clearing what a finished job with this id left in etcd");
  txn_ops(s, Json::array({Json{{"request_delete_range", {{"key", etcd::base64(prefix_ + "state")}}}}, delete_range("a/"),
                          delete_range("left/"), delete_range("gone/")}));
  return true;
}

// Job-wide stall reports, as the built-in rendezvous makes them (server.cpp): a node whose
// rank stalled asks (a/K/stalled/ID); the proposer puts a request in the state ("look"),
// every node answers with its ranks' views (a/K/views/ID), and once every live member has,
// or kGatherWait has passed, the report goes into the state for every node to print.
void Proposer::propose_stall_report(const Snapshot& s) {
  if (options_.stall_timeout.count() <= 0) return;
  const int k = s.attempt();
  if (stalls_attempt_ != k) {
    stalls_attempt_ = k;
    stalls_reported_.clear();
  }
  Json next = s.state;
  const auto look_id = field<std::uint64_t>(s.state.value("look", Json::object()), "id", 0);
  if (look_id == 0) {
    if (s.stalls.empty() || Clock::now() < next_gather_) return;
    const auto id = field<std::uint64_t>(s.state, "gathers", 0) + 1;
    next["gathers"] = id;
    next["look"] = Json{{"id", id}, {"attempt", k}};
    wait_for_views(id);
    return txn(s, next, {delete_range(fmt::format("a/{}/stalled/", k))});
  }
  if (gather_id_ != look_id) wait_for_views(look_id);  // asked by the proposer before this one
  std::vector<detail::RankView> views;
  std::vector<std::string> silent;
  const auto now_ns = common::recorder::now_ns();
  for (std::size_t r = 0; r < s.members().size(); ++r) {
    const auto v = s.views.find(s.member(r));
    if (v != s.views.end() && field<std::uint64_t>(v->second.body, "id", 0) == look_id) {
      if (!v->second.body.contains("ranks") || !detail::views_from_json(v->second.body["ranks"].dump(), now_ns, views))
        out_.info(fmt::format("{} sent views of its ranks that are not ours; its ranks are left out", member_name(s, r)));
    } else {
      silent.push_back(member_name(s, r));
    }
  }
  if (!silent.empty() && !gather_due_) return;
  const auto lines =
      detail::job_wide_report(std::move(views), now_ns, options_.stall_timeout, stalls_reported_, silent, kGatherWait);
  next.erase("look");
  if (lines) next["report"] = Json{{"id", look_id}, {"attempt", k}, {"lines", *lines}};
  next_gather_ = Clock::now() + kGatherWait;
  txn(s, next, {delete_range(fmt::format("a/{}/views/", k))});
}

void Proposer::wait_for_views(std::uint64_t id) {
  gather_id_ = id;
  gather_due_ = false;
  gather_timer_.expires_after(kGatherWait);
  gather_timer_.async_wait([this, id](auto ec) {
    if (ec || gather_id_ != id) return;
    gather_due_ = true;
    out_.read();
  });
}

Json Proposer::delete_range(const std::string& from) const {
  const std::string k = prefix_ + from;
  return Json{{"request_delete_range", {{"key", etcd::base64(k)}, {"range_end", etcd::base64(etcd::prefix_end(k))}}}};
}

// Proposes `next` as the state that follows `s`'s (with `more` operations, all or none);
// whether it wins is learnt by reading again.
void Proposer::txn(const Snapshot& s, const Json& next, std::vector<Json> more) {
  Json ops = Json::array({Json{{"request_put", {{"key", etcd::base64(prefix_ + "state")}, {"value", etcd::base64(next.dump())}}}}});
  for (auto& op : more) ops.push_back(std::move(op));
  txn_ops(s, std::move(ops));
}

void Proposer::txn_ops(const Snapshot& s, Json ops) {
  out_.txn(Json{{"compare", Json::array({Json{{"key", etcd::base64(prefix_ + "state")},
                                              {"target", "MOD"},
                                              {"mod_revision", std::to_string(s.state_revision)},
                                              {"result", "EQUAL"}}})},
                {"success", std::move(ops)}});
}

}  // namespace idist::launchers::etcd_rdzv
