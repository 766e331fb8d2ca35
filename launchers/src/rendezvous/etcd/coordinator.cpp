// The rendezvous on etcd. No process hosts it: the job's state lives in etcd, and one node,
// the proposer (whichever holds the key `proposer`, taken by a transaction that holds only
// while nobody has it), applies the rules of the built-in rendezvous (server.cpp) to it,
// proposing each next state by a transaction that holds only if the state is still the one it
// read (compare-and-swap on its mod_revision), so that a proposer that lost its place (a stale
// read, a successor already at work) cannot win. Losing any node therefore loses nothing but
// that node: its lease expires, etcd deletes its keys, and, were it the proposer, the others
// see its key go and race for it; one wins and goes on from the state as it stands.
//
// Keys, under PREFIX = --rdzv-conf prefix (default /idist/rdzv/) + the job's id + "/":
//   state                 {attempt, phase: gathering|running|ending|done, restarts_used,
//                          members: [ID...] (node rank = index), nproc: N or [N...],
//                          zero: {addr, port} (rank 0's store), cause, reform, verdict (the
//                          last one), prev: the last attempt's members, gathers, look, report}
//   proposer              (lease) the proposer's ID
//   node/ID               (lease) {host, addr, nproc, join, port}: alive, and asks to be in
//                          attempt `join` or later
//   a/K/fail/ID           (lease) a rank of attempt K failed on node ID first
//   a/K/over/ID           (lease) every rank of attempt K is gone on node ID {failure?}
//   a/K/stalled/ID        (lease) a rank of node ID stalled: a job-wide report is asked for
//   a/K/views/ID          (lease) node ID's ranks, for the report the state's `look` asks
//   left/ID               why node ID's idist-run left before the job's end
//
// What scales to a thousand nodes: a node that does not propose holds one watch, on
// [proposer, state] (side by side), and decides from the values the events carry, so a
// change costs each node one message and no read; it reads the state itself only once per
// node_timeout. The state names members by id alone (a node finds itself there), so that
// its copy to every node stays small. Only the proposer watches and reads the whole prefix.
// Each node's lease (TTL = node_timeout) is renewed at every heartbeat, on a kept connection.
// Attempt K's rank 0 runs on its node 0, whose address (the one it reaches etcd from, or
// --rdzv-conf local_addr) and port (reserved there for the attempt) the state names.

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "client.hpp"
#include "rendezvous/wire.hpp"
#include "stall_report.hpp"
#include "idist/common/duration.hpp"
#include "idist/common/hash.hpp"
#include "idist/common/host.hpp"
#include "idist/launchers/etcd_rendezvous.hpp"
#include "idist/launchers/ports.hpp"

namespace idist::launchers {
namespace {

namespace asio = boost::asio;
using etcd::base64;
using etcd::Json;
using etcd::unbase64;
using rendezvous::field;
using Clock = std::chrono::steady_clock;

// Where a local_addr came from, for the errors about it.
constexpr std::string_view kLocalAddr = "--rdzv-conf local_addr";
// How long finish() may take to say goodbye (its lease revoked, the keys cleaned up).
constexpr auto kFinishWait = std::chrono::seconds(2);
// How long the views of a job-wide stall report are waited for, and the least time between two
// reports (the built-in rendezvous' figure).
constexpr auto kGatherWait = std::chrono::seconds(2);

long long as_ll(const Json& j, const char* key, long long fallback = 0) {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  try {
    if (it->is_string()) return std::stoll(it->get<std::string>());
    if (it->is_number_integer()) return it->get<long long>();
  } catch (const std::exception&) {
  }
  return fallback;
}


struct NodeRecord {
  std::string id, host, addr;
  int nproc = 1;
  int join = -1;
  int port = 0;
};

struct Report {
  long long revision = 0;
  Json body;
};

// The job's keys as one read returned them.
struct Snapshot {
  long long revision = 0;
  long long state_revision = 0;  // 0: no state yet (attempt 0 gathers)
  Json state = Json{{"attempt", 0}, {"phase", "gathering"}, {"restarts_used", 0}};
  std::map<std::string, NodeRecord> nodes;
  std::map<std::string, Report> fails, overs, stalls, views;  // of the state's attempt
  std::map<std::string, std::string> left;

  int attempt() const { return field<int>(state, "attempt", 0); }
  // Node rank r's local ranks: one number for all, or one per node.
  int nproc(std::size_t r) const {
    const auto it = state.find("nproc");
    if (it == state.end()) return 1;
    if (it->is_array()) return r < it->size() && (*it)[r].is_number_integer() ? (*it)[r].get<int>() : 1;
    return it->is_number_integer() ? it->get<int>() : 1;
  }
  std::string phase() const { return field<std::string>(state, "phase", "gathering"); }
  const Json& members() const {
    static const Json none = Json::array();
    const auto it = state.find("members");
    return it != state.end() && it->is_array() ? *it : none;
  }
};

struct Failure {
  long long revision = LLONG_MAX;  // a lost node comes after every report
  std::string text;
  int exit_code = 1;
  bool root = false;
  int rank = -1;
};


std::string member_id(const Json& members, std::size_t r) {
  return r < members.size() && members[r].is_string() ? members[r].get<std::string>() : std::string();
}

// A node's id is HOST-PID-RANDOM (node_id()): its host, for messages.
std::string host_of(const std::string& id) {
  const auto b = id.rfind('-');
  const auto a = b == std::string::npos || b == 0 ? std::string::npos : id.rfind('-', b - 1);
  return a == std::string::npos ? id : id.substr(0, a);
}

Json failure_json(const LocalFailure& f) {
  Json j{{"rank", f.rank}, {"how", f.how}, {"exit_code", f.exit_code}, {"root", f.root_cause}};
  if (f.lost_peer) j["lost_peer"] = *f.lost_peer;
  return j;
}

std::string node_id() {
  std::random_device random;
  return fmt::format("{}-{}-{:08x}", common::host_name("localhost"), ::getpid(), random());
}

}  // namespace

struct EtcdRendezvous::State : std::enable_shared_from_this<EtcdRendezvous::State> {
  EtcdRendezvousOptions options;
  std::vector<etcd::Endpoint> endpoints;
  std::shared_ptr<asio::ssl::context> tls;
  std::string prefix;
  std::string id = node_id();
  std::string host = common::host_name("localhost");
  asio::io_context* io = nullptr;
  Events events;
  std::shared_ptr<etcd::Client> client;
  long long lease = 0;
  std::chrono::seconds lease_ttl{2};
  Clock::time_point renewed = Clock::now();
  Clock::time_point last_tick = Clock::now();  // of the heartbeat loop: a gap past the lease is a freeze
  bool renewing = false;
  EtcdAssignment assignment;
  bool assigned = false;
  int join_attempt = -1;  // in our record: the attempt we ask to be in; -1: none
  int over_attempt = -1;  // the attempt whose verdict `verdict` waits for
  std::unique_ptr<PortReservation> port;
  bool local_addr_given = false;  // --rdzv-conf local_addr (else the address towards etcd, found once it answers)
  std::function<void(const std::optional<RemoteVerdict>&)> joined;
  std::function<void(const RemoteVerdict&)> verdict;
  std::optional<RemoteVerdict> early_verdict;
  int ended_attempt = -1;
  bool finished = false;
  bool final_verdict = false;
  bool gave_up = false;
  bool first_read = true;
  bool reading = false;
  bool proposer = false;  // holds the proposer's key: it proposes the next state (propose())
  long long proposer_since = 0;  // the revision at which the proposer of this node's time took its place
  bool campaigning = false;
  bool watching_all = false;
  long long seen_revision = 0;  // of the newest snapshot decided on: an older one is stale
  long long beats = 0;
  // Job-wide stall reports: the newest request answered (state "look") and report shown.
  std::uint64_t look_answered = 0, report_seen = 0;
  // The proposer's side of them: the request it made, when its answers are due, the next
  // one's earliest time, and what was reported (each collective once per attempt).
  std::uint64_t gather_id = 0;
  bool gather_due = false;
  Clock::time_point next_gather{};
  detail::CallKeys stalls_reported;
  int stalls_attempt = -1;
  bool dirty = false;
  int last_call_for = -1;      // the attempt whose last call has passed
  int last_call_armed = -1;
  int gathering_seen = -1;     // since when this node has seen attempt K gather (its join timeout)
  bool join_timed_out = false;
  int ending_seen = -1;        // since when attempt K ends (dropping members that never stop)
  bool stop_passed = false;
  std::unique_ptr<asio::steady_timer> beat_timer, last_call_timer, join_timer, stop_timer, finish_timer, gather_timer;

  std::string key(const std::string& rest) const { return prefix + rest; }
  std::string tried() const { return etcd::endpoints_text(endpoints); }

  template <class... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) {
    spdlog::info("rendezvous (etcd): {}", fmt::format(format, std::forward<Args>(args)...));
  }

  // `deadline`: node_timeout unless given.
  void call(const std::string& path, Json body, std::function<void(const std::string&, const Json&)> reply,
            std::optional<std::chrono::milliseconds> deadline = std::nullopt) {
    if (!client) return;
    std::weak_ptr<State> weak = shared_from_this();
    client->call(path, std::move(body), deadline.value_or(options.dead_after),
                 [weak, reply = std::move(reply)](const std::string& error, const Json& j) {
                   if (auto self = weak.lock(); self && self->client) reply(error, j);
                 });
  }

  Json put_op(const std::string& k, const Json& value) const {
    return Json{{"request_put", {{"key", base64(k)}, {"value", base64(value.dump())}, {"lease", std::to_string(lease)}}}};
  }

  // A leased put (the proposer learns of it through its watch; nobody else needs to).
  void put(const std::string& k, const Json& value, std::function<void()> then = nullptr) {
    call("/v3/kv/put", put_op(k, value)["request_put"], [this, then](const std::string& error, const Json&) {
      if (finished && then) return then();
      if (!error.empty()) return give_up("lost etcd: " + error);
      if (then) then();
    });
  }

  // The compare of a transaction that holds while nobody proposes (the proposer's key absent).
  Json nobody_proposes() const {
    return Json::array({Json{{"key", base64(key("proposer"))}, {"target", "CREATE"}, {"create_revision", "0"}, {"result", "EQUAL"}}});
  }

  // The lease, then one transaction: this node's record put, the proposer's place taken if it
  // is free, and the state read, all at one revision, from which the watch starts.
  void start() {
    const long long ttl = std::max<long long>(2, (options.dead_after.count() + 999) / 1000);
    call("/v3/lease/grant", Json{{"TTL", std::to_string(ttl)}}, [this, ttl](const std::string& error, const Json& j) {
      if (!error.empty()) return give_up(fmt::format("cannot start the rendezvous on etcd: {}", error));
      lease = as_ll(j, "ID");
      lease_ttl = std::chrono::seconds(ttl);
      renewed = Clock::now();
      if (options.local_addr.empty()) options.local_addr = client->local_address();
      const Json read_state{{"request_range", {{"key", base64(key("state"))}}}};
      const Json read_proposer{{"request_range", {{"key", base64(key("proposer"))}}}};
      Json body{{"compare", nobody_proposes()},
                {"success", Json::array({record_op(), put_op(key("proposer"), Json(id)), read_state})},
                {"failure", Json::array({record_op(), read_state, read_proposer})}};
      call("/v3/kv/txn", body, [this](const std::string& error, const Json& j) {
        if (finished) return;
        if (!error.empty()) return give_up(fmt::format("cannot start the rendezvous on etcd: {}", error));
        const long long revision = j.contains("header") ? as_ll(j["header"], "revision") : 0;
        proposer = field<bool>(j, "succeeded", false);
        Snapshot s;
        s.revision = revision;
        for (const auto& r : j.value("responses", Json::array())) {
          if (!r.contains("response_range")) continue;
          const auto& kvs = r["response_range"].value("kvs", Json::array());
          if (kvs.empty()) continue;
          const std::string k = unbase64(field<std::string>(kvs[0], "key", ""));
          if (k == key("proposer")) proposer_since = as_ll(kvs[0], "create_revision");
          if (k == key("state")) fill_state(s, unbase64(field<std::string>(kvs[0], "value", "")), as_ll(kvs[0], "mod_revision"));
        }
        if (proposer) proposer_since = revision;
        last_tick = Clock::now();
        beat();
        if (proposer) return take_office(revision);
        // The state and the proposer's key, which sit side by side: one watch, with values, so
        // that a change costs each node one message and no read.
        client->watch(key("proposer"), key("state") + std::string(1, '\0'), revision + 1, on_narrow_events());
        decide(s);
      });
    });
  }

  // This node proposes from now on: it watches the whole job and reads it at every change.
  void take_office(long long revision) {
    proposer = true;
    if (!watching_all) {
      watching_all = true;
      client->watch(prefix, etcd::prefix_end(prefix), revision + 1, on_events());
    }
    read();
  }

  etcd::Client::OnEvents on_events() {
    std::weak_ptr<State> weak = shared_from_this();
    return [weak](const std::vector<etcd::Client::Event>&) {
      if (auto self = weak.lock()) self->read();
    };
  }

  // A node that does not propose: the state as each event carries it; the proposer's key gone
  // (its node lost, or finished): a race for its place, which one node wins.
  etcd::Client::OnEvents on_narrow_events() {
    std::weak_ptr<State> weak = shared_from_this();
    return [weak](const std::vector<etcd::Client::Event>& events) {
      auto self = weak.lock();
      if (!self || self->finished) return;
      for (const auto& e : events) {
        if (self->proposer) return self->read();
        if (e.key == self->key("proposer") && e.deleted) {
          self->campaign();
        } else if (e.key == self->key("state") && !e.deleted) {
          Snapshot s;
          s.revision = e.mod_revision;
          self->fill_state(s, e.value, e.mod_revision);
          self->decide(s);
        }
      }
    };
  }

  void campaign() {
    if (campaigning || proposer || finished || lease == 0) return;
    campaigning = true;
    Json body{{"compare", nobody_proposes()}, {"success", Json::array({put_op(key("proposer"), Json(id))})}};
    call("/v3/kv/txn", body, [this](const std::string& error, const Json& j) {
      campaigning = false;
      if (finished) return;
      if (!error.empty()) return give_up("lost etcd: " + error);
      if (!field<bool>(j, "succeeded", false)) return;  // another node won: its put comes by the watch
      const long long revision = j.contains("header") ? as_ll(j["header"], "revision") : 0;
      proposer_since = revision;
      info("this node proposes the job's next states now (the node that did is gone)");
      take_office(revision);
    });
  }

  void fill_state(Snapshot& s, const std::string& text, long long revision) const {
    Json value = Json::parse(text, nullptr, false);
    if (!value.is_object()) return;
    s.state = std::move(value);
    s.state_revision = revision;
  }

  // This node's record: alive (its lease), and in which attempt it asks to be.
  Json record() const {
    return Json{{"host", host},
                {"addr", options.local_addr.empty() ? host : options.local_addr},
                {"nproc", options.nproc},
                {"join", join_attempt},
                {"port", port ? port->port() : 0}};
  }
  Json record_op() const { return put_op(key("node/" + id), record()); }

  void put_record() {
    if (lease == 0 || finished) return;
    put(key("node/" + id), record());
  }

  // The lease renewed at every heartbeat, and this node's silence towards etcd checked. The
  // proposer reads the job at every heartbeat (its timers' decisions need no event); the others
  // read the state once per node_timeout, in case their watch went quiet without breaking
  // (a member cut off from the others is found by the renewal, which then moves the watch).
  void beat() {
    if (finished) return;
    // The loop itself stood still past the lease (SIGSTOP, a suspended machine): this node's
    // own doing, not etcd's, whatever etcd did meanwhile.
    const auto now = Clock::now();
    if (const auto gap = now - std::exchange(last_tick, now); gap > lease_ttl) return give_up(frozen_text(gap));
    // Silent for node_timeout: lost, unless a renewal is still on its way (for a heartbeat
    // more at most). etcd may well have kept the lease (an election in progress holds
    // renewals, and a new leader extends every lease): its answer says whether it did.
    if (Clock::now() - renewed > options.dead_after && !renewing)
      return give_up(fmt::format("lost etcd: this node's lease was not renewed for {} (tried {})",
                                 common::duration_text(options.dead_after), tried()));
    if (!renewing) {
      renewing = true;
      // Its answer is waited for until a heartbeat past node_timeout since the last renewal.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(renewed + options.dead_after +
                                                                              options.heartbeat - Clock::now());
      call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}, [this](const std::string& error, const Json& j) {
        renewing = false;
        if (finished) return;
        if (!error.empty()) return;  // the next beat() decides whether the silence is too long
        const Json& r = j.contains("result") ? j["result"] : j;
        if (as_ll(r, "TTL") <= 0) return give_up(lease_lost_text());
        renewed = Clock::now();
      }, std::max(left, options.heartbeat));
    }
    const auto every = std::max<long long>(1, options.dead_after / std::max(options.heartbeat, std::chrono::milliseconds(1)));
    if (proposer || ++beats % every == 0) read();
    beat_timer->expires_after(options.heartbeat);
    beat_timer->async_wait([this](auto ec) {
      if (!ec) beat();
    });
  }

  std::string frozen_text(Clock::duration gap) const {
    return fmt::format("this node was frozen for {} (its idist-run did not run), past its etcd lease of {}s",
                       common::measured_duration_text(gap), lease_ttl.count());
  }

  // etcd answered that this node's lease is gone: frozen past it, heartbeats that did not reach
  // etcd for as long, or neither, when it went while renewed in time (revoked, etcd's data lost).
  std::string lease_lost_text() const {
    const auto now = Clock::now();
    if (now - last_tick > lease_ttl) return frozen_text(now - last_tick);
    if (now - renewed >= lease_ttl)
      return fmt::format("lost etcd: this node's lease expired (no heartbeat reached etcd for {})",
                         common::measured_duration_text(now - renewed));
    return fmt::format("this node's etcd lease is gone though it was renewed {} ago (revoked, or etcd's data wiped)",
                       common::measured_duration_text(now - renewed));
  }

  // What this node needs of etcd, read again: the proposer, the whole job; the others, the
  // state alone, which is all their side needs (a thousand nodes reading a thousand keys at
  // every change would cost a million).
  void read() {
    if (finished || lease == 0) return;
    if (reading) {
      dirty = true;
      return;
    }
    reading = true;
    Json range = proposer ? Json{{"key", base64(prefix)}, {"range_end", base64(etcd::prefix_end(prefix))}}
                          : Json{{"key", base64(key("state"))}};
    call("/v3/kv/range", range, [this](const std::string& error, const Json& j) {
      reading = false;
      if (finished) return;
      if (!error.empty()) return give_up("lost etcd: " + error);
      decide(snapshot_of(j));
      if (std::exchange(dirty, false)) read();
    });
  }

  Snapshot snapshot_of(const Json& j) const {
    Snapshot s;
    if (j.contains("header")) s.revision = as_ll(j["header"], "revision");
    std::map<std::string, std::vector<std::pair<std::string, Report>>> reports;  // by kind: attempt/ID
    if (j.contains("kvs") && j["kvs"].is_array())
      for (const auto& kv : j["kvs"]) {
        const std::string k = unbase64(field<std::string>(kv, "key", ""));
        if (k.rfind(prefix, 0) != 0) continue;
        const std::string rest = k.substr(prefix.size());
        Json value = Json::parse(unbase64(field<std::string>(kv, "value", "")), nullptr, false);
        const long long revision = as_ll(kv, "mod_revision");
        if (rest == "state" && value.is_object()) {
          s.state = value;
          s.state_revision = revision;
        } else if (rest.rfind("node/", 0) == 0 && value.is_object()) {
          NodeRecord n{.id = rest.substr(5),
                       .host = field<std::string>(value, "host", "?"),
                       .addr = field<std::string>(value, "addr", ""),
                       .nproc = std::max(1, field<int>(value, "nproc", 1)),
                       .join = field<int>(value, "join", -1),
                       .port = field<int>(value, "port", 0)};
          s.nodes[n.id] = n;
        } else if (rest.rfind("left/", 0) == 0) {
          s.left[rest.substr(5)] = value.is_string() ? value.get<std::string>() : std::string("?");
        } else if (rest.rfind("a/", 0) == 0) {
          // a/K/fail/ID, a/K/over/ID
          const auto slash = rest.find('/', 2);
          const auto slash2 = slash == std::string::npos ? slash : rest.find('/', slash + 1);
          if (slash2 == std::string::npos) continue;
          const std::string attempt = rest.substr(2, slash - 2);
          const std::string kind = rest.substr(slash + 1, slash2 - slash - 1);
          reports[kind].emplace_back(attempt + "/" + rest.substr(slash2 + 1), Report{revision, value});
        }
      }
    const std::string mine = std::to_string(s.attempt()) + "/";
    for (auto [kind, into] : {std::pair{"fail", &s.fails}, {"over", &s.overs}, {"stalled", &s.stalls}, {"views", &s.views}})
      for (auto& [k, r] : reports[kind])
        if (k.rfind(mine, 0) == 0) (*into)[k.substr(mine.size())] = r;
    return s;
  }

  // --- this node's side: what the state means for its supervisor ------------------------------

  // No state, read back from an etcd that answers, once this node had its part in it: the
  // job's keys were deleted (or etcd went back to older data), not lost to a heartbeat.
  bool keys_gone(const Snapshot& s) {
    if (!assigned || s.state_revision != 0) return false;
    give_up(fmt::format("the job's keys are gone from etcd (deleted or compacted): no state under {}", prefix));
    return true;
  }

  void decide(const Snapshot& s) {
    if (finished || gave_up) return;
    // A read answered after a newer event (or the other way round): the newer one stands.
    if (s.revision < seen_revision) return;
    seen_revision = s.revision;
    if (keys_gone(s)) return;
    const int k = s.attempt();
    const std::string phase = s.phase();
    // A job that ended before this proposer took its place and left its state behind: the
    // proposer clears it (below); until then it is nobody's verdict.
    if (!proposer && phase == "done" && s.state_revision > 0 && s.state_revision < proposer_since) return;
    if (std::exchange(first_read, false) && proposer) {
      // A job with this id ended before (and its last node did not clean up): start afresh,
      // unless some node of it is still there. Only at this node's first read: later, a done
      // state with nobody else left is this job's own end, not a leftover.
      const bool others = std::any_of(s.nodes.begin(), s.nodes.end(), [&](const auto& n) { return n.first != id; });
      if (phase == "done" && !others) {
        info("clearing what a finished job with this id left in etcd");
        Json ops = Json::array({Json{{"request_delete_range", {{"key", base64(key("state"))}}}},
                                Json{{"request_delete_range", {{"key", base64(key("a/"))}, {"range_end", base64(etcd::prefix_end(key("a/")))}}}},
                                Json{{"request_delete_range", {{"key", base64(key("left/"))}, {"range_end", base64(etcd::prefix_end(key("left/")))}}}}});
        txn_ops(s, ops);
        return;
      }
    }
    if (phase == "done") {
      final_verdict = true;
      return deliver(rendezvous::verdict_of(s.state["verdict"]));
    }
    const Json& members = s.members();
    int my_rank = -1;
    for (std::size_t r = 0; r < members.size() && my_rank < 0; ++r)
      if (member_id(members, r) == id) my_rank = static_cast<int>(r);
    // Assigned: the attempt this node asked for (or a later one) runs with it.
    if (joined && (phase == "running" || phase == "ending") && k >= join_attempt && my_rank >= 0) {
      int base = 0, world = 0;
      for (std::size_t r = 0; r < members.size(); ++r) {
        if (static_cast<int>(r) < my_rank) base += s.nproc(r);
        world += s.nproc(r);
      }
      const auto zero = s.state.value("zero", Json::object());
      assignment = EtcdAssignment{.attempt = k,
                                  .node_rank = my_rank,
                                  .nnodes = static_cast<int>(members.size()),
                                  .world_size = world,
                                  .rank_base = base,
                                  .master_addr = field<std::string>(zero, "addr", host_of(member_id(members, 0))),
                                  .master_port = field<int>(zero, "port", 0)};
      assigned = true;
      join_timer->cancel();
      std::exchange(joined, nullptr)(std::nullopt);
    } else if (joined) {
      if (phase == "gathering" && join_attempt < k) {
        join_attempt = k;
        put_record();
      } else if (phase != "gathering" && join_attempt <= k && my_rank < 0) {
        if (options.min_nodes == options.max_nodes) {
          RemoteVerdict v;
          v.cause = fmt::format("the job already has its {} nodes (it runs attempt {})", options.max_nodes, k);
          return std::exchange(joined, nullptr)(v);
        }
        join_attempt = k + 1;  // the next attempt; our record makes this one re-form if there is room
        put_record();
      }
    }
    // Our attempt ended elsewhere: stop the ranks.
    if (assigned && over_attempt < assignment.attempt && ended_attempt < assignment.attempt &&
        (k > assignment.attempt || (k == assignment.attempt && phase == "ending"))) {
      ended_attempt = assignment.attempt;
      const std::string cause = k == assignment.attempt ? field<std::string>(s.state, "cause", "another node failed")
                                                        : field<std::string>(s.state["verdict"], "cause", "the job moved on");
      if (events.end_attempt) events.end_attempt(cause);
    }
    stall_side(s);
    // Our attempt's verdict: the job has moved on to a later attempt.
    if (verdict && k > over_attempt) {
      RemoteVerdict v = rendezvous::verdict_of(s.state.contains("verdict") ? s.state["verdict"] : Json::object());
      v.then = RemoteVerdict::Then::restart;
      v.next_attempt = k;
      std::exchange(verdict, nullptr)(v);
    }
    if (proposer) propose(s);
  }

  // A job-wide stall report asked for (state "look"): this node's ranks, as they are now. One
  // made (state "report"): shown, if it is about this node's attempt.
  void stall_side(const Snapshot& s) {
    const int k = s.attempt();
    const auto look = s.state.value("look", Json::object());
    const auto look_id = field<std::uint64_t>(look, "id", 0);
    if (assigned && look_id > look_answered && field<int>(look, "attempt", -1) == assignment.attempt && k == assignment.attempt) {
      look_answered = look_id;
      put(key(fmt::format("a/{}/views/{}", k, id)),
          Json{{"id", look_id}, {"ranks", Json::parse(events.views ? events.views() : std::string("[]"), nullptr, false)}});
    }
    const auto report = s.state.value("report", Json::object());
    const auto report_id = field<std::uint64_t>(report, "id", 0);
    if (report_id > report_seen) {
      report_seen = report_id;
      if (assigned && field<int>(report, "attempt", -1) == assignment.attempt && events.report)
        events.report(field<std::vector<std::string>>(report, "lines", {}));
    }
  }

  void deliver(const RemoteVerdict& v) {
    if (verdict) return std::exchange(verdict, nullptr)(v);
    if (joined) {
      RemoteVerdict ended = v;
      if (v.then == RemoteVerdict::Then::success) {
        ended.then = RemoteVerdict::Then::failure;
        ended.cause = "the job ended (it succeeded) before this node could join it";
        ended.exit_code = 1;
      }
      return std::exchange(joined, nullptr)(ended);
    }
    if (early_verdict) return;
    early_verdict = v;
    if (v.then == RemoteVerdict::Then::failure && assigned && events.end_attempt) events.end_attempt(v.cause);
  }

  void give_up(const std::string& why) {
    if (finished || gave_up) return;
    gave_up = true;
    beat_timer->cancel();
    RemoteVerdict v;
    v.cause = why;
    if (joined) return std::exchange(joined, nullptr)(v);
    if (verdict) return std::exchange(verdict, nullptr)(v);
    if (!early_verdict) early_verdict = v;
    if (events.lost) events.lost(why);
  }

  // --- the job's side: the next state, proposed by every node, won by one ---------------------

  std::string name(const Json& members, std::size_t r) const {
    return fmt::format("node {} ({})", r, host_of(member_id(members, r)));
  }

  // Failures of the running attempt, in the order they were written: reports first, then
  // members that vanished without saying their ranks were gone.
  std::vector<Failure> failures_of(const Snapshot& s) const {
    std::vector<Failure> out;
    const Json& members = s.members();
    for (std::size_t r = 0; r < members.size(); ++r) {
      const std::string mid = member_id(members, r);
      const Json* report = nullptr;
      long long revision = LLONG_MAX;
      if (const auto o = s.overs.find(mid); o != s.overs.end() && o->second.body.contains("failure")) {
        report = &o->second.body["failure"];
        revision = o->second.revision;
        if (const auto f = s.fails.find(mid); f != s.fails.end()) revision = f->second.revision;
      } else if (const auto f = s.fails.find(mid); f != s.fails.end()) {
        report = &f->second.body;
        revision = f->second.revision;
      }
      if (report) {
        out.push_back(Failure{.revision = revision,
                              .text = fmt::format("rank {} on {} {}", field<int>(*report, "rank", -1), name(members, r),
                                                  field<std::string>(*report, "how", "failed")),
                              .exit_code = field<int>(*report, "exit_code", 1),
                              .root = field<bool>(*report, "root", false),
                              .rank = field<int>(*report, "rank", -1)});
      } else if (!s.nodes.count(mid) && !s.overs.count(mid)) {
        out.push_back(Failure{.text = lost_text(s, members, r), .exit_code = 1, .root = true});
      }
    }
    std::stable_sort(out.begin(), out.end(), [](const Failure& a, const Failure& b) { return a.revision < b.revision; });
    return out;
  }

  std::string lost_text(const Snapshot& s, const Json& members, std::size_t r) const {
    const std::string mid = member_id(members, r);
    if (const auto l = s.left.find(mid); l != s.left.end()) return fmt::format("{} left the job: {}", name(members, r), l->second);
    return fmt::format("{} was lost: its etcd lease expired (no heartbeat for {})", name(members, r),
                       common::duration_text(options.dead_after));
  }

  std::vector<const NodeRecord*> waiting(const Snapshot& s, int from) const {
    std::set<std::string> in;
    for (const auto& m : s.members()) in.insert(m.is_string() ? m.get<std::string>() : std::string());
    std::vector<const NodeRecord*> out;
    for (const auto& [nid, n] : s.nodes)
      if (n.join >= from && !in.count(nid) && n.join >= 0) out.push_back(&n);
    return out;
  }

  void propose(const Snapshot& s) {
    const int k = s.attempt();
    const std::string phase = s.phase();
    Json next = s.state;
    if (phase == "gathering") {
      if (gathering_seen != k) {
        gathering_seen = k;
        join_timed_out = false;
        join_timer->expires_after(options.join_timeout);
        join_timer->async_wait([this, k](auto ec) {
          if (ec || gathering_seen != k) return;
          join_timed_out = true;
          read();
        });
      }
      auto ready = waiting(s, k);
      const int n = static_cast<int>(ready.size());
      const bool close = n >= options.max_nodes || (n >= options.min_nodes && last_call_for == k);
      if (!close) {
        if (n >= options.min_nodes && last_call_armed != k) {
          last_call_armed = k;
          last_call_timer->expires_after(options.last_call);
          last_call_timer->async_wait([this, k](auto ec) {
            if (ec) return;
            last_call_for = k;
            read();
          });
        }
        if (!join_timed_out) return;
        std::vector<std::string> hosts;
        for (const auto* r : ready) hosts.push_back(r->host);
        next["phase"] = "done";
        next["verdict"] = Json{{"then", "failure"},
                               {"cause", fmt::format("the rendezvous timed out after {}: {} of {} nodes joined ({}) "
                                                     "(etcd at {})",
                                                     common::duration_text(options.join_timeout), n, options.min_nodes,
                                                     hosts.empty() ? "none" : fmt::format("{}", fmt::join(hosts, ", ")),
                                                     tried())},
                               {"exit_code", 1}};
        txn(s, next);
        return;
      }
      // Stable ranks while membership stays: last attempt's rank, then host name, then id.
      std::map<std::string, int> prev;  // the last attempt's members (ids), by node rank
      for (const auto& m : s.state.value("prev", Json::array()))
        if (m.is_string()) prev.emplace(m.get<std::string>(), static_cast<int>(prev.size()));
      auto rank_of = [&](const NodeRecord* r) {
        const auto it = prev.find(r->id);
        return it == prev.end() ? INT_MAX : it->second;
      };
      std::stable_sort(ready.begin(), ready.end(), [&](const NodeRecord* a, const NodeRecord* b) {
        return std::make_tuple(rank_of(a), a->host, a->id) < std::make_tuple(rank_of(b), b->host, b->id);
      });
      if (static_cast<int>(ready.size()) > options.max_nodes) ready.resize(static_cast<std::size_t>(options.max_nodes));
      // Every node receives this state: ids only (a node finds its rank there), each node's
      // nproc once if they are all the same, and node 0's address for MASTER_ADDR.
      Json members = Json::array();
      Json nprocs = Json::array();
      int world = 0;
      bool same = true;
      for (const auto* m : ready) {
        members.push_back(m->id);
        nprocs.push_back(m->nproc);
        world += m->nproc;
        same = same && m->nproc == ready.front()->nproc;
      }
      next["phase"] = "running";
      next["members"] = members;
      next["nproc"] = same ? Json(ready.empty() ? 1 : ready.front()->nproc) : nprocs;
      next["zero"] = ready.empty() ? Json::object() : Json{{"addr", ready.front()->addr}, {"port", ready.front()->port}};
      next.erase("prev");
      next.erase("cause");
      next["reform"] = false;
      if (txn(s, next)) info("attempt {}: {} node{}, world size {}", k, members.size(), members.size() == 1 ? "" : "s", world);
      return;
    }
    const Json& members = s.members();
    auto live = [&](std::size_t r) { return s.nodes.count(member_id(members, r)) > 0; };
    auto over = [&](std::size_t r) { return s.overs.count(member_id(members, r)) > 0; };
    const auto failures = failures_of(s);
    if (phase == "running") {
      if (!failures.empty()) {
        next["phase"] = "ending";
        next["cause"] = failures.front().text;
        next["reform"] = false;
        if (txn(s, next)) info("attempt {}: {}; stopping every node", k, failures.front().text);
        return;
      }
      bool all_over = true;
      int alive = 0;
      for (std::size_t r = 0; r < members.size(); ++r) {
        all_over = all_over && over(r);
        alive += live(r) ? 1 : 0;
      }
      if (all_over) {
        next["phase"] = "done";
        next["verdict"] = Json{{"then", "success"}};
        return txn(s, next), void();
      }
      if (propose_stall_report(s, next)) return;
      const auto arrivals = waiting(s, k);
      if (options.max_nodes > options.min_nodes && alive < options.max_nodes && !arrivals.empty()) {
        next["phase"] = "ending";
        next["cause"] = fmt::format("the node on {} joined", arrivals.front()->host);
        next["reform"] = true;
        if (txn(s, next)) info("the node on {} asks to join: ending attempt {} so that the job re-forms with it", arrivals.front()->host, k);
      }
      return;
    }
    // ending: the verdict, once every member's ranks are gone (or the member is).
    if (ending_seen != k) {
      ending_seen = k;
      stop_passed = false;
      stop_timer->expires_after(options.grace + std::chrono::seconds(5));
      stop_timer->async_wait([this, k](auto ec) {
        if (ec || ending_seen != k) return;
        stop_passed = true;
        read();
      });
    }
    std::vector<std::string> departures;
    int alive = 0;
    for (std::size_t r = 0; r < members.size(); ++r) {
      if (!over(r) && live(r) && !stop_passed) return;  // still stopping its ranks
      if (!live(r) || (!over(r) && stop_passed)) {
        if (!over(r) && live(r))
          departures.push_back(fmt::format("{} did not report its ranks stopped within {} of attempt {}'s end",
                                           name(members, r), common::duration_text(options.grace + std::chrono::seconds(5)), k));
        else if (!live(r) && over(r))
          departures.push_back(lost_text(s, members, r));
        continue;
      }
      ++alive;
    }
    const int live_count = alive + static_cast<int>(waiting(s, k).size());
    const bool reform = field<bool>(s.state, "reform", false);
    const bool failure = !reform && !failures.empty();
    int restarts_used = field<int>(s.state, "restarts_used", 0);
    std::string cause = field<std::string>(s.state, "cause", "");
    int exit_code = 1, rank = -1;
    bool counted = false;
    bool restart = false;
    if (!failure && live_count >= options.min_nodes) {
      restart = true;
    } else {
      if (!failure) {
        cause = departures.empty() ? std::string("a node left while the job re-formed")
                                   : fmt::format("while the job re-formed, {}", fmt::join(departures, "; "));
      } else {
        auto pick = std::find_if(failures.begin(), failures.end(), [](const Failure& f) { return f.root; });
        if (pick == failures.end()) pick = failures.begin();
        cause = pick->text;
        exit_code = pick->exit_code;
        rank = pick->rank;
      }
      if (restarts_used < options.max_restarts && live_count >= options.min_nodes) {
        restart = true;
        counted = true;
      }
    }
    if (restart) {
      if (counted) ++restarts_used;
      const int left = options.max_restarts - restarts_used;
      next = Json{{"attempt", k + 1},
                  {"phase", "gathering"},
                  {"restarts_used", restarts_used},
                  {"prev", s.members()},
                  {"gathers", field<std::uint64_t>(s.state, "gathers", 0)},
                  {"verdict",
                   {{"then", "restart"}, {"attempt", k}, {"next", k + 1}, {"cause", cause}, {"restarts_left", left},
                    {"counted", counted}, {"rank", rank}}}};
      const Json drop{{"request_delete_range",
                       {{"key", base64(key(fmt::format("a/{}/", k)))},
                        {"range_end", base64(etcd::prefix_end(key(fmt::format("a/{}/", k))))}}}};
      if (txn(s, next, {drop}))
        info("attempt {} ended ({}): attempt {} on every node{}", k, cause, k + 1,
             counted ? fmt::format(", {} restart{} left", left, left == 1 ? "" : "s") : std::string(" (a re-form, not counted)"));
      return;
    }
    if (live_count < options.min_nodes) {
      if (failure && !departures.empty()) cause += fmt::format("; {}", fmt::join(departures, "; "));
      cause += fmt::format("; {} node{} left, the job needs {}", live_count, live_count == 1 ? "" : "s", options.min_nodes);
    } else if (live_count < static_cast<int>(members.size())) {
      cause += fmt::format("; no restart left (--max-restarts {}): going on without a lost node spends a restart",
                           options.max_restarts);
    }
    next["phase"] = "done";
    next["verdict"] = Json{{"then", "failure"}, {"cause", cause}, {"exit_code", exit_code}, {"rank", rank},
                           {"ended_by", std::string(live_count < options.min_nodes ? rendezvous::kEndedByNodes
                                                                                   : rendezvous::kEndedByRestarts)}};
    if (txn(s, next)) info("the job failed: {}", cause);
  }

  // Job-wide stall reports, as the built-in rendezvous makes them (server.cpp): a node whose
  // rank stalled asks (a/K/stalled/ID); the proposer puts a request in the state ("look"),
  // every node answers with its ranks' views (a/K/views/ID), and once every live member has,
  // or kGatherWait has passed, the report goes into the state for every node to print.
  // Returns true when it proposed a state.
  bool propose_stall_report(const Snapshot& s, Json next) {
    if (options.stall_timeout.count() <= 0) return false;
    const int k = s.attempt();
    if (stalls_attempt != k) {
      stalls_attempt = k;
      stalls_reported.clear();
    }
    const auto range = [&](const char* kind) {
      const std::string from = key(fmt::format("a/{}/{}/", k, kind));
      return Json{{"request_delete_range", {{"key", base64(from)}, {"range_end", base64(etcd::prefix_end(from))}}}};
    };
    const auto look_id = field<std::uint64_t>(s.state.value("look", Json::object()), "id", 0);
    if (look_id == 0) {
      if (s.stalls.empty() || Clock::now() < next_gather) return false;
      const auto id = field<std::uint64_t>(s.state, "gathers", 0) + 1;
      next["gathers"] = id;
      next["look"] = Json{{"id", id}, {"attempt", k}};
      wait_for_views(id);
      txn(s, next, {range("stalled")});
      return true;
    }
    if (gather_id != look_id) wait_for_views(look_id);  // asked by the proposer before this one
    const Json& members = s.members();
    std::vector<detail::RankView> views;
    std::vector<std::string> silent;
    const auto now_ns = common::recorder::now_ns();
    for (std::size_t r = 0; r < members.size(); ++r) {
      const std::string mid = member_id(members, r);
      const auto v = s.views.find(mid);
      if (v != s.views.end() && field<std::uint64_t>(v->second.body, "id", 0) == look_id) {
        if (!v->second.body.contains("ranks") || !detail::views_from_json(v->second.body["ranks"].dump(), now_ns, views))
          info("{} sent views of its ranks that are not ours; its ranks are left out", name(members, r));
      } else {
        silent.push_back(name(members, r));
      }
    }
    if (!silent.empty() && !gather_due) return false;
    const auto lines = detail::job_wide_report(std::move(views), now_ns, options.stall_timeout, stalls_reported, silent,
                                               kGatherWait);
    next.erase("look");
    if (lines) next["report"] = Json{{"id", look_id}, {"attempt", k}, {"lines", *lines}};
    next_gather = Clock::now() + kGatherWait;
    txn(s, next, {range("views")});
    return true;
  }

  void wait_for_views(std::uint64_t id) {
    gather_id = id;
    gather_due = false;
    gather_timer->expires_after(kGatherWait);
    gather_timer->async_wait([this, id](auto ec) {
      if (ec || gather_id != id) return;
      gather_due = true;
      read();
    });
  }

  // Proposes `next` as the state that follows `s`'s (with `more` operations, all or none).
  // Returns true once sent (whether it wins is learnt by reading again).
  bool txn(const Snapshot& s, const Json& next, std::vector<Json> more = {}) {
    Json ops = Json::array({Json{{"request_put", {{"key", base64(key("state"))}, {"value", base64(next.dump())}}}}});
    for (auto& op : more) ops.push_back(std::move(op));
    return txn_ops(s, std::move(ops));
  }
  bool txn_ops(const Snapshot& s, Json ops) {
    Json body{{"compare", Json::array({Json{{"key", base64(key("state"))},
                                            {"target", "MOD"},
                                            {"mod_revision", std::to_string(s.state_revision)},
                                            {"result", "EQUAL"}}})},
              {"success", std::move(ops)}};
    call("/v3/kv/txn", body, [this](const std::string& error, const Json&) {
      if (finished) return;
      if (!error.empty()) return give_up("lost etcd: " + error);
      read();
    });
    return true;
  }
};

std::string etcd_first_endpoint(const std::string& endpoints) { return etcd::parse_endpoints(endpoints).front().text(); }

EtcdRendezvous::EtcdRendezvous(EtcdRendezvousOptions options) : state_(std::make_shared<State>()) {
  auto& s = *state_;
  s.options = std::move(options);
  s.local_addr_given = !s.options.local_addr.empty();
  try {
    s.endpoints = etcd::parse_endpoints(s.options.endpoints);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--rdzv-endpoint: {}", e.what()));
  }
  const auto& o = s.options;
  try {
    if (o.https || s.endpoints.front().https || !o.cacert.empty() || !o.cert.empty() || !o.key.empty())
      s.tls = etcd::tls_context(o.cacert, o.cert, o.key);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--rdzv-conf: {}", e.what()));
  }
  if (s.options.job_id.empty()) s.options.job_id = fmt::format("{:016x}", common::fnv1a(s.options.token));
  s.prefix = s.options.prefix + s.options.job_id + "/";
  // A local_addr this host cannot bind is said now, naming it, not at the first attempt as
  // rank 0's port that could not be reserved.
  if (s.local_addr_given) PortReservation(s.options.local_addr, kLocalAddr);
}

EtcdRendezvous::~EtcdRendezvous() {
  if (state_->client) state_->client->close();
}

const EtcdAssignment& EtcdRendezvous::assignment() const { return state_->assignment; }

void EtcdRendezvous::start(boost::asio::io_context& io, Events events) {
  auto& s = *state_;
  s.io = &io;
  s.events = std::move(events);
  for (auto* t : {&s.beat_timer, &s.last_call_timer, &s.join_timer, &s.stop_timer, &s.finish_timer, &s.gather_timer})
    *t = std::make_unique<asio::steady_timer>(io);
  s.client = std::make_shared<etcd::Client>(
      io, etcd::ClientOptions{.endpoints = s.endpoints,
                              .user = s.options.user,
                              .password = s.options.password,
                              .try_timeout = std::clamp(s.options.heartbeat, std::chrono::milliseconds(300),
                                                        std::chrono::milliseconds(2000)),
                              .tls = s.tls});
  s.info("job {} on etcd at {}, under {}", s.options.job_id, s.tried(), s.prefix);
  s.start();
}

void EtcdRendezvous::join(int attempt, std::function<void(const std::optional<RemoteVerdict>&)> joined) {
  auto& s = *state_;
  if (s.early_verdict && s.early_verdict->then == RemoteVerdict::Then::failure) return joined(s.early_verdict);
  s.early_verdict.reset();
  s.joined = std::move(joined);
  s.join_attempt = std::max(attempt, s.join_attempt);
  // Rank 0's store gets a fresh port for every attempt, taken while the last one is held.
  try {
    auto fresh = s.local_addr_given ? std::make_unique<PortReservation>(s.options.local_addr, kLocalAddr)
                                    : std::make_unique<PortReservation>("0.0.0.0");
    s.port = std::move(fresh);
  } catch (const std::exception& e) {
    RemoteVerdict v;
    v.cause = fmt::format("cannot reserve a port for rank 0's store: {}", e.what());
    return std::exchange(s.joined, nullptr)(v);
  }
  s.put_record();
}

void EtcdRendezvous::failed(int attempt, const LocalFailure& failure) {
  auto& s = *state_;
  if (s.lease == 0 || s.finished) return;
  s.put(s.key(fmt::format("a/{}/fail/{}", attempt, s.id)), failure_json(failure));
}

void EtcdRendezvous::over(int attempt, const std::optional<LocalFailure>& failure,
                          std::function<void(const RemoteVerdict&)> verdict) {
  auto& s = *state_;
  if (s.early_verdict) return verdict(*std::exchange(s.early_verdict, std::nullopt));
  s.verdict = std::move(verdict);
  s.over_attempt = attempt;
  Json body = Json::object();
  if (failure) body["failure"] = failure_json(*failure);
  s.put(s.key(fmt::format("a/{}/over/{}", attempt, s.id)), body);
}

void EtcdRendezvous::stalled(int attempt) {
  auto& s = *state_;
  if (s.lease == 0 || s.finished || !s.assigned || attempt != s.assignment.attempt || s.options.stall_timeout.count() <= 0)
    return;
  s.put(s.key(fmt::format("a/{}/stalled/{}", attempt, s.id)), Json::object());
}

void EtcdRendezvous::finish(const std::string& outcome, std::function<void()> done) {
  auto& s = *state_;
  s.finished = true;
  for (auto* t : {&s.beat_timer, &s.last_call_timer, &s.join_timer, &s.stop_timer, &s.gather_timer}) (*t)->cancel();
  auto once = std::make_shared<std::function<void()>>(std::move(done));
  auto call = [once] {
    if (auto f = std::exchange(*once, nullptr)) f();
  };
  s.finish_timer->expires_after(kFinishWait);
  s.finish_timer->async_wait([call](auto ec) {
    if (!ec) call();
  });
  // Lost etcd (or our lease): a goodbye would only wait out kFinishWait for an answer.
  if (s.lease == 0 || s.gave_up) return call();
  // Our keys go with our lease; the last node out takes the job's prefix with it.
  auto cleanup = [&s, call] {
    s.call("/v3/lease/revoke", Json{{"ID", std::to_string(s.lease)}}, [&s, call](const std::string&, const Json&) {
      if (!s.final_verdict) return call();
      const std::string nodes = s.key("node/");
      s.call("/v3/kv/range", Json{{"key", base64(nodes)}, {"range_end", base64(etcd::prefix_end(nodes))}, {"count_only", true}},
             [&s, call](const std::string& error, const Json& j) {
               if (!error.empty() || as_ll(j, "count") > 0) return call();
               s.call("/v3/kv/deleterange",
                      Json{{"key", base64(s.prefix)}, {"range_end", base64(etcd::prefix_end(s.prefix))}},
                      [call](const std::string&, const Json&) { call(); });
             });
    });
  };
  if (s.final_verdict) return cleanup();
  // Leaving before the job's verdict: the others name why, rather than a lease that expired.
  s.call("/v3/kv/put", Json{{"key", base64(s.key("left/" + s.id))}, {"value", base64(Json(outcome).dump())}},
         [cleanup](const std::string&, const Json&) { cleanup(); });
}

void EtcdRendezvous::detach() {
  auto& s = *state_;
  s.finished = true;
  if (s.client) s.client->close();
  s.client.reset();
  for (auto* t : {&s.beat_timer, &s.last_call_timer, &s.join_timer, &s.stop_timer, &s.finish_timer, &s.gather_timer}) t->reset();
}

}  // namespace idist::launchers
