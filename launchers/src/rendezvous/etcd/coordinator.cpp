// The rendezvous on etcd. No process hosts it: the job's state lives in etcd, and one node,
// the proposer (the first candidate of an election held as etcd's own, election.hpp), applies
// the rules of both rendezvous (rendezvous/rules.hpp) to it, proposing each next state by a
// transaction that holds only if the state is still the one it read (compare-and-swap on its
// mod_revision), so that a proposer that lost its place (a stale read, a successor already at
// work) cannot win. Losing any node therefore loses nothing but that node: its lease expires,
// etcd deletes its keys, and, were it the proposer, the next candidate in line, and it alone,
// sees its key go and goes on from the state as it stands.
//
// The keys, under PREFIX = --rdzv-conf prefix (default /idist/rdzv/) + the job's id + "/", are
// listed in proposal.hpp, which reads them into the rules' state (rendezvous/rules.hpp).
//
// What scales to a thousand nodes: a node that does not propose watches the state, and decides
// from the values the events carry, so a change costs each node one message and no read, and
// its predecessor's candidate key, which wakes it alone; it reads the state itself only once
// per node_timeout. The state names members by id alone (a node finds itself there), so that
// its copy to every node stays small. Only the proposer watches and reads the whole prefix.
// Each node's lease (TTL = node_timeout) is renewed at every heartbeat, on a kept connection.
// Attempt K's rank 0 runs on its node 0, whose address (the one it reaches etcd from, or
// --rdzv-conf local_addr) and port (reserved there for the attempt) the state names.

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "client.hpp"
#include "election.hpp"
#include "node_recovery.hpp"
#include "ordered_puts.hpp"
#include "proposal.hpp"
#include "proposer.hpp"
#include "rendezvous/wire.hpp"
#include "stall/stall_report.hpp"
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
using etcd_rdzv::as_ll;
using etcd_rdzv::Snapshot;
namespace rules = rendezvous::rules;
using rules::Phase;
using Clock = std::chrono::steady_clock;

// Where a local_addr came from, for the errors about it.
constexpr std::string_view kLocalAddr = "--rdzv-conf local_addr";
// How long finish() may take to say goodbye (its lease revoked, the keys cleaned up).
constexpr auto kFinishWait = std::chrono::seconds(2);

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
  // A renewal on its way: I/O in flight, in any standing (beat() waits for its answer rather
  // than send another), hence no standing of its own.
  bool renewing = false;
  Assignment assignment;
  // Whether this node has had its part in an attempt: a fact of its past that still counts once
  // it read the verdict or gave up (keys_gone, deliver), hence not one of the standings.
  bool assigned = false;
  int join_attempt = -1;  // in our record: the attempt we ask to be in; -1: none
  int over_attempt = -1;  // the attempt whose verdict `verdict` waits for
  std::unique_ptr<PortReservation> port;
  bool local_addr_given = false;  // --rdzv-conf local_addr (else the address towards etcd, found once it answers)
  std::function<void(const std::optional<RemoteVerdict>&)> joined;
  std::function<void(const RemoteVerdict&)> verdict;
  std::optional<RemoteVerdict> early_verdict;
  int ended_attempt = -1;
  // Where this node stands in the job, only ever forward: it has not yet decided on any read
  // of the job (the one at which a proposer clears what a finished job left), it takes part
  // (joins, runs, waits for verdicts), it has read the job's final verdict, it gave up on the
  // rendezvous (etcd lost, its lease gone, the job's keys gone), or it has finished (finish(),
  // detach(): nothing is done after).
  enum class Standing { starting, taking_part, verdict_read, gave_up, finished };
  Standing standing = Standing::starting;
  bool finished() const { return standing == Standing::finished; }
  // Reads of the job: none on its way, one, or one and another asked for meanwhile (made when
  // the first is answered). I/O in flight, in any standing.
  enum class Reading { idle, once, again };
  Reading reading = Reading::idle;
  long long proposer_since = 0;  // the create revision of the proposer's candidate key, as first read
  bool since_read = false;  // proposer_since read, not only bounded by this node's own place
  long long seen_revision = 0;  // of the newest snapshot decided on: an older one is stale
  long long beats = 0;
  // Job-wide stall reports: the newest request answered (state "look") and report shown.
  std::uint64_t look_answered = 0, report_seen = 0;
  std::unique_ptr<asio::steady_timer> beat_timer, finish_timer;
  // This node's place in the proposer election (after `client`: gone before it).
  std::unique_ptr<etcd_rdzv::Election> election;
  int state_watch = -1;  // the state's watch, until this node proposes (it then watches the whole job)
  // Set once this node is the first candidate: it proposes the job's next states from then on.
  std::unique_ptr<etcd_rdzv::Proposer> office;
  std::unique_ptr<etcd_rdzv::NodeRecovery> recovery;  // --recovery auto: this node's ranks' store

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
      if (finished() && then) return then();
      if (!error.empty()) return give_up("lost etcd: " + error);
      if (then) then();
    });
  }

  // Live recovery's word under a/K/KIND/ID, the body from this node's part in it, in order.
  etcd_rdzv::OrderedPuts said{[this](const auto& k, const auto& v, auto done) { put(k, v, std::move(done)); }};
  void say(int attempt, const char* kind, const std::function<Json(etcd_rdzv::NodeRecovery&)>& body) {
    if (lease != 0 && !finished() && recovery) said.put(key(fmt::format("a/{}/{}/{}", attempt, kind, id)), body(*recovery));
  }

  // The lease, then one transaction: this node's record put, its candidate key put, and the
  // state read, at one revision, from which the state's watch starts; then its place in the
  // election, read (election.hpp).
  void start() {
    const long long ttl = std::max<long long>(2, (options.dead_after.count() + 999) / 1000);
    call("/v3/lease/grant", Json{{"TTL", std::to_string(ttl)}}, [this, ttl](const std::string& error, const Json& j) {
      if (!error.empty()) return give_up(fmt::format("cannot start the rendezvous on etcd: {}", error));
      lease = as_ll(j, "ID");
      lease_ttl = std::chrono::seconds(ttl);
      renewed = Clock::now();
      if (options.local_addr.empty()) options.local_addr = client->local_address();
      if (recovery) recovery->identify(id, advertised(), lease, options.nproc);
      election = make_election();
      const Json also = Json::array({record_op(), Json{{"request_range", {{"key", base64(key("state"))}}}}});
      call("/v3/kv/txn", election->campaign(lease, id, also), [this](const std::string& error, const Json& j) {
        if (finished()) return;
        if (!error.empty()) return give_up(fmt::format("cannot start the rendezvous on etcd: {}", error));
        const long long revision = j.contains("header") ? as_ll(j["header"], "revision") : 0;
        Snapshot s;
        s.revision = revision;
        for (const auto& r : j.value("responses", Json::array())) {
          if (!r.contains("response_range")) continue;
          for (const auto& kv : r["response_range"].value("kvs", Json::array()))
            if (unbase64(field<std::string>(kv, "key", "")) == key("state"))
              fill_state(s, unbase64(field<std::string>(kv, "value", "")), as_ll(kv, "mod_revision"));
        }
        last_tick = Clock::now();
        beat();
        // Its place in the queue, from this answer (its predecessor named there) or else a read
        // of the queue: the state waits for it, which says from when on a finished job's state
        // is this one's (proposer_since).
        election->begin(j, [this, s](const etcd_rdzv::Place& place) {
          // Unread (0): its own place bounds it, until a finished job's state makes it matter.
          proposer_since = place.leader_since > 0 ? place.leader_since : election->own_revision();
          since_read = place.leader_since > 0;
          if (office || standing >= Standing::gave_up) return;  // the first in line: take_office() ran
          // The state, with values, so that a change costs each node one message and no read.
          state_watch = client->watch(key("state"), "", s.revision + 1, on_state_events());
          decide(s);
        });
      });
    });
  }

  std::unique_ptr<etcd_rdzv::Election> make_election() {
    etcd_rdzv::Election::Io io{
        .call = [this](const std::string& path, Json body, etcd_rdzv::Election::Reply reply) {
          call(path, std::move(body), std::move(reply));
        },
        .watch = [this](const std::string& k, long long from, std::function<void(bool)> on_event) {
          if (!client) return -1;
          return client->watch(k, "", from, [on_event](const std::vector<etcd::Client::Event>& events) {
            for (const auto& e : events) on_event(e.deleted);
          });
        },
        .unwatch = [this](int w) {
          if (client) client->unwatch(w);
        },
        .elected = [this](long long revision, bool waited) {
          if (standing >= Standing::gave_up) return;
          if (waited) info("this node proposes the job's next states now (the node that did is gone)");
          take_office(revision);
        },
        .absent = [this] { election_absent(); },
        .failed = [this](const std::string& error) {
          // The lease gone: said as what it is (frozen, or heartbeats lost), as the renewal would.
          if (error.find("lease not found") != std::string::npos) return give_up(lease_lost_text());
          give_up("lost etcd: " + error);
        }};
    return std::make_unique<etcd_rdzv::Election>(prefix, std::move(io));
  }

  // This node's candidate key is gone, its lease perhaps not: the job's keys deleted (a read
  // says so now) or its lease lost (the renewal says so). Meanwhile it queues again, last.
  void election_absent() {
    if (standing >= Standing::gave_up) return;
    read();
    election->rejoin(lease, id);
  }

  // This node proposes from now on: it watches the whole job and reads it at every change.
  void take_office(long long revision) {
    if (office) return read();
    etcd_rdzv::Proposer::Io out{
        .txn = [this](Json body) {
          call("/v3/kv/txn", std::move(body), [this](const std::string& error, const Json&) {
            if (finished()) return;
            if (!error.empty()) return give_up("lost etcd: " + error);
            read();
          });
        },
        .read = [this] { read(); },
        .info = [this](const std::string& line) { info("{}", line); },
        .etcd = tried(),
        .self = [this](int attempt) { return recovery ? recovery->watched_as(attempt) : Json(); }};
    office = std::make_unique<etcd_rdzv::Proposer>(*io, options, prefix, std::move(out));
    // The whole job's watch sees the state too.
    if (state_watch >= 0) client->unwatch(std::exchange(state_watch, -1));
    client->watch(prefix, etcd::prefix_end(prefix), revision + 1, on_events());
    read();
  }

  etcd::Client::OnEvents on_events() {
    std::weak_ptr<State> weak = shared_from_this();
    return [weak](const std::vector<etcd::Client::Event>&) {
      if (auto self = weak.lock()) self->read();
    };
  }

  // A node that does not propose: the state as each event carries it.
  etcd::Client::OnEvents on_state_events() {
    std::weak_ptr<State> weak = shared_from_this();
    return [weak](const std::vector<etcd::Client::Event>& events) {
      auto self = weak.lock();
      if (!self || self->finished()) return;
      for (const auto& e : events) {
        if (self->office) return self->read();
        if (e.deleted) continue;
        Snapshot s;
        s.revision = e.mod_revision;
        self->fill_state(s, e.value, e.mod_revision);
        self->decide(s);
      }
    };
  }

  void fill_state(Snapshot& s, const std::string& text, long long revision) const {
    Json value = Json::parse(text, nullptr, false);
    if (!value.is_object()) return;
    s.state = std::move(value);
    s.state_revision = revision;
  }

  // This node's record: alive (its lease), and in which attempt it asks to be.
  Json record() const {
    Json r{{"host", host},
           {"addr", advertised()},
           {"nproc", options.nproc},
           {"join", join_attempt},
           {"port", port ? port->port() : 0},
           {"lease", std::to_string(lease)}};
    if (recovery) recovery->describe(r);
    return r;
  }
  Json record_op() const { return put_op(key("node/" + id), record()); }

  void put_record() {
    if (lease == 0 || finished()) return;
    put(key("node/" + id), record());
  }

  // The lease renewed at every heartbeat, and this node's silence towards etcd checked. The
  // proposer reads the job at every heartbeat (its timers' decisions need no event); the others
  // read the state once per node_timeout, in case their watch went quiet without breaking
  // (a member cut off from the others is found by the renewal, which then moves the watch).
  void beat() {
    if (finished()) return;
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
        if (finished()) return;
        if (!error.empty()) return;  // the next beat() decides whether the silence is too long
        const Json& r = j.contains("result") ? j["result"] : j;
        if (as_ll(r, "TTL") <= 0) return give_up(lease_lost_text());
        renewed = Clock::now();
      }, std::max(left, options.heartbeat));
    }
    const auto every = std::max<long long>(1, options.dead_after / std::max(options.heartbeat, std::chrono::milliseconds(1)));
    if (office || ++beats % every == 0) read();
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
    if (finished() || lease == 0) return;
    if (reading != Reading::idle) {
      reading = Reading::again;
      return;
    }
    reading = Reading::once;
    Json range = office ? Json{{"key", base64(prefix)}, {"range_end", base64(etcd::prefix_end(prefix))}}
                          : Json{{"key", base64(key("state"))}};
    call("/v3/kv/range", range, [this](const std::string& error, const Json& j) {
      const bool again = std::exchange(reading, Reading::idle) == Reading::again;
      if (finished()) return;
      if (!error.empty()) return give_up("lost etcd: " + error);
      decide(etcd_rdzv::snapshot_of(j, prefix));
      if (again) read();
    });
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
    if (standing >= Standing::gave_up) return;
    // A read answered after a newer event (or the other way round): the newer one stands.
    if (s.revision < seen_revision) return;
    seen_revision = s.revision;
    if (keys_gone(s)) return;
    const int k = s.attempt();
    const Phase phase = s.phase();
    // A job that ended before this proposer took its place and left its state behind: the
    // proposer clears it (below); until then it is nobody's verdict.
    if (!office && phase == Phase::done && s.state_revision > 0 && s.state_revision < proposer_since) {
      // Only bounded by this node's own place: the first candidate's, read once, says; then
      // the state read again (a newer one may have come meanwhile, and been put off as well).
      if (!std::exchange(since_read, true) && election)
        election->leader_since([this](long long since) {
          if (since > 0) proposer_since = since;
          read();
        });
      return;
    }
    if (standing == Standing::starting) {
      standing = Standing::taking_part;
      if (office && office->clear_leftover(s, id)) return;
    }
    if (phase == Phase::done) {
      standing = Standing::verdict_read;
      if (recovery) recovery->stand_down();
      return deliver(rendezvous::verdict_of(s.state["verdict"]));
    }
    if (joined && on_joining_side(s)) return;
    // Our attempt ended elsewhere: stop the ranks.
    if (assigned && over_attempt < assignment.attempt && ended_attempt < assignment.attempt &&
        (k > assignment.attempt || (k == assignment.attempt && phase == Phase::ending))) {
      ended_attempt = assignment.attempt;
      const std::string cause = k == assignment.attempt ? field<std::string>(s.state, "cause", "another node failed")
                                                        : field<std::string>(s.state["verdict"], "cause", "the job moved on");
      if (events.end_attempt) events.end_attempt(cause);
    }
    stall_side(s);
    recovery_side(s);
    // Our attempt's verdict: the job has moved on to a later attempt.
    if (verdict && k > over_attempt) {
      RemoteVerdict v = rendezvous::verdict_of(s.state.contains("verdict") ? s.state["verdict"] : Json::object());
      v.then = RemoteVerdict::Then::restart;
      v.next_attempt = k;
      std::exchange(verdict, nullptr)(v);
    }
    if (office) office->propose(s);
  }

  // This node waits to be assigned: whether the state assigns it, or asks it to join a later
  // attempt. True when it is told it cannot join.
  bool on_joining_side(const Snapshot& s) {
    const int k = s.attempt();
    const Phase phase = s.phase();
    const int my_rank = etcd_rdzv::node_rank_of(s, id);
    // Assigned: the attempt this node asked for (or a later one) runs with it, or it joined the
    // running one live.
    const bool live = my_rank >= 0 && s.state.value("live", Json::object()).contains(id);
    if ((phase == Phase::running || phase == Phase::ending) && (k >= join_attempt || live) && my_rank >= 0) {
      assignment = etcd_rdzv::assignment_of(s, static_cast<std::size_t>(my_rank));
      if (recovery) {  // a store for this attempt (its ranks' token), whose port the record tells
        assignment.recovery_store = recovery->open(assignment.attempt, advertised());
        put_record();
      }
      assigned = true;
      std::exchange(joined, nullptr)(std::nullopt);
    } else if (phase == Phase::gathering && join_attempt < k) {
      join_attempt = k;
      put_record();
    } else if (phase != Phase::gathering && join_attempt <= k && my_rank < 0) {
      if (options.min_nodes == options.max_nodes) {
        RemoteVerdict v;
        v.cause = fmt::format("{} (it runs attempt {})", rules::already_full(options.max_nodes), k);
        std::exchange(joined, nullptr)(v);
        return true;
      }
      join_attempt = k + 1;  // the next attempt; our record makes this one re-form if there is room
      put_record();
    }
    return false;
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

  // Live recovery (node_recovery.hpp): the generation the proposer decided for this node's
  // attempt, to its supervisor; the stores this node holds, to find a killed node at once.
  void recovery_side(const Snapshot& s) {
    if (recovery && assigned) recovery->follow(s, office != nullptr, assignment.attempt, assignment.rank_base, events);
  }

  std::string advertised() const { return options.local_addr.empty() ? host : options.local_addr; }

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
    if (standing >= Standing::gave_up) return;
    standing = Standing::gave_up;
    beat_timer->cancel();
    if (election) election->stop();
    RemoteVerdict v;
    v.cause = why;
    if (joined) return std::exchange(joined, nullptr)(v);
    if (verdict) return std::exchange(verdict, nullptr)(v);
    if (!early_verdict) early_verdict = v;
    if (events.lost) events.lost(why);
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

const Assignment& EtcdRendezvous::assignment() const { return state_->assignment; }

void EtcdRendezvous::start(boost::asio::io_context& io, Events events) {
  auto& s = *state_;
  s.io = &io;
  s.events = std::move(events);
  for (auto* t : {&s.beat_timer, &s.finish_timer}) *t = std::make_unique<asio::steady_timer>(io);
  if (s.options.recovery) {
    std::weak_ptr<State> weak = state_;
    s.recovery = std::make_unique<etcd_rdzv::NodeRecovery>(
        io, s.options.token, s.prefix, [weak](const std::string& path, Json body, std::function<void()> then) {
          if (auto self = weak.lock(); self && self->standing < State::Standing::gave_up)
            self->call(path, std::move(body), [then](const std::string&, const Json&) { then(); });
        });
  }
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
  if (s.lease == 0 || s.finished()) return;
  // A loss its other ranks may re-form without: one key holds them all, said in order.
  if (failure.recoverable && s.recovery) return s.say(attempt, "lost", [&](auto& r) { return r.lost(failure); });
  s.put(s.key(fmt::format("a/{}/fail/{}", attempt, s.id)), rendezvous::failure_json(failure));
}

void EtcdRendezvous::over(int attempt, const std::optional<LocalFailure>& failure,
                          std::function<void(const RemoteVerdict&)> verdict) {
  auto& s = *state_;
  if (s.early_verdict) return verdict(*std::exchange(s.early_verdict, std::nullopt));
  s.verdict = std::move(verdict);
  s.over_attempt = attempt;
  Json body = Json::object();
  if (failure) body["failure"] = rendezvous::failure_json(*failure);
  s.put(s.key(fmt::format("a/{}/over/{}", attempt, s.id)), body);
}

void EtcdRendezvous::stalled(int attempt) {
  auto& s = *state_;
  if (s.lease == 0 || s.finished() || !s.assigned || attempt != s.assignment.attempt || s.options.stall_timeout.count() <= 0)
    return;
  s.put(s.key(fmt::format("a/{}/stalled/{}", attempt, s.id)), Json::object());
}

void EtcdRendezvous::capable(int attempt, bool admits) {
  state_->say(attempt, "capable", [admits](auto&) { return Json{{"admits", admits}}; });
}
void EtcdRendezvous::ended(int attempt, int rank) {
  state_->say(attempt, "ended", [&](auto& r) { return r.ended(rank); });
}
void EtcdRendezvous::admit(int attempt, int origin, const std::string& why) {
  state_->say(attempt, "admit", [&](auto& r) { return r.admit(origin, why); });
}
bool EtcdRendezvous::grants_replacements() const { return state_->options.recovery; }

void EtcdRendezvous::finish(const std::string& outcome, std::function<void()> done) {
  auto& s = *state_;
  const State::Standing was = std::exchange(s.standing, State::Standing::finished);
  const bool final_verdict = was == State::Standing::verdict_read;
  s.beat_timer->cancel();
  if (s.office) s.office->cancel();
  if (s.election) s.election->stop();  // its key goes with the lease: the next in line wakes
  auto once = std::make_shared<std::function<void()>>(std::move(done));
  auto call = [once] {
    if (auto f = std::exchange(*once, nullptr)) f();
  };
  s.finish_timer->expires_after(kFinishWait);
  s.finish_timer->async_wait([call](auto ec) {
    if (!ec) call();
  });
  // Lost etcd (or our lease): a goodbye would only wait out kFinishWait for an answer.
  if (s.lease == 0 || was == State::Standing::gave_up) return call();
  // Our keys go with our lease; the last node out takes the job's prefix with it.
  auto cleanup = [&s, call, final_verdict] {
    s.call("/v3/lease/revoke", Json{{"ID", std::to_string(s.lease)}}, [&s, call, final_verdict](const std::string&, const Json&) {
      if (!final_verdict) return call();
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
  if (final_verdict) return cleanup();
  // Leaving before the job's verdict: the others name why, rather than a lease that expired.
  s.call("/v3/kv/put", Json{{"key", base64(s.key("left/" + s.id))}, {"value", base64(Json(outcome).dump())}},
         [cleanup](const std::string&, const Json&) { cleanup(); });
}

void EtcdRendezvous::detach() {
  auto& s = *state_;
  s.standing = State::Standing::finished;
  if (s.election) s.election->stop();
  if (s.client) s.client->close();
  s.client.reset();
  for (auto* t : {&s.beat_timer, &s.finish_timer}) t->reset();
  s.office.reset();
  s.recovery.reset();
}

}  // namespace idist::launchers
