// The etcd rendezvous' proposal (launchers/src/rendezvous/etcd/proposal.hpp): the job's keys,
// as a /v3/kv/range answer gives them, in; the rules' decision at that read, and the next value
// of the `state` key the proposer would write, out. No etcd: what a read decides is pure.
#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/etcd/client.hpp"
#include "rendezvous/etcd/ordered_puts.hpp"
#include "rendezvous/etcd/proposal.hpp"
#include "rendezvous/rules.hpp"

namespace rules = idist::launchers::rendezvous::rules;
namespace etcd = idist::launchers::etcd;
namespace etcd_rdzv = idist::launchers::etcd_rdzv;

namespace {

const std::string kPrefix = "/idist/rdzv/job/";

// A /v3/kv/range answer as etcd gives it: keys and values base64, revisions as strings.
struct Keys {
  etcd_rdzv::Json kvs = etcd_rdzv::Json::array();
  long long revision = 1;
  Keys& put(const std::string& key, const etcd_rdzv::Json& value) {
    kvs.push_back({{"key", etcd::base64(kPrefix + key)},
                   {"value", etcd::base64(value.dump())},
                   {"mod_revision", std::to_string(++revision)}});
    return *this;
  }
  Keys& node(const std::string& id, const std::string& host, int join, int nproc = 2) {
    return put("node/" + id, {{"host", host}, {"addr", "10.0.0." + host.substr(1)}, {"nproc", nproc}, {"join", join},
                              {"port", 29500}, {"store", 40000 + std::stoi(host.substr(1))}, {"store_for", 3}});
  }
  etcd_rdzv::Snapshot snapshot() const {
    return etcd_rdzv::snapshot_of({{"header", {{"revision", std::to_string(revision)}}}, {"kvs", kvs}}, kPrefix);
  }
};

// What the proposer would write after reading `keys`.
std::optional<etcd_rdzv::Json> proposal(const Keys& keys, const rules::Limits& limits) {
  const auto s = keys.snapshot();
  const auto step = etcd_rdzv::decide_read(s, {.last_call = false, .dead_after = "5s"}, rules::Reconsider{}, limits);
  return etcd_rdzv::next_state(s, step);
}

const rules::Limits kTwo{.min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .needs_host = false};
const etcd_rdzv::Json kRunning = {{"attempt", 3}, {"phase", "running"}, {"restarts_used", 0},
                                  {"members", {"h1-10-a", "h2-20-b"}}, {"nproc", 2}};

}  // namespace

TEST_CASE("etcd: two nodes asking for attempt 0 close its round: members by host, node 0's address") {
  Keys keys;
  keys.node("h2-20-b", "h2", 0, 3).node("h1-10-a", "h1", 0);
  const auto next = proposal(keys, kTwo);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "running");
  CHECK((*next)["members"] == etcd_rdzv::Json({"h1-10-a", "h2-20-b"}));
  CHECK((*next)["nproc"] == etcd_rdzv::Json({2, 3}));
  CHECK((*next)["zero"] == etcd_rdzv::Json({{"addr", "10.0.0.1"}, {"port", 29500}}));
  // One node alone: nothing to write yet (the proposer arms the last call only with MIN in).
  Keys alone;
  alone.node("h1-10-a", "h1", 0);
  CHECK_FALSE(proposal(alone, kTwo).has_value());
}

TEST_CASE("etcd: a failure report and every member over: the next attempt, counted, with the verdict's words") {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3);
  keys.put("a/3/fail/h2-20-b", {{"rank", 3}, {"how", "exited with code 3"}, {"exit_code", 3}, {"root", false}});
  keys.put("a/3/over/h1-10-a", etcd_rdzv::Json::object()).put("a/3/over/h2-20-b", etcd_rdzv::Json::object());
  const auto next = proposal(keys, kTwo);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "gathering");
  CHECK((*next)["attempt"] == 4);
  CHECK((*next)["restarts_used"] == 1);
  CHECK((*next)["prev"] == kRunning["members"]);
  const auto& v = (*next)["verdict"];
  CHECK(v["then"] == "restart");
  CHECK(v["cause"] == "rank 3 on node 1 (h2) exited with code 3");
  CHECK(v["restarts_left"] == 0);
  CHECK(v["rank"] == 3);
}

TEST_CASE("etcd: a failure report while a member still stops its ranks: the attempt ends, the verdict waits") {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3);
  keys.put("a/3/fail/h1-10-a", {{"rank", 0}, {"how", "was killed by SIGSEGV"}, {"exit_code", 139}, {"root", true}});
  const auto next = proposal(keys, kTwo);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
  CHECK((*next)["cause"] == "rank 0 on node 0 (h1) was killed by SIGSEGV");
  CHECK((*next)["reform"] == false);
}

TEST_CASE("etcd: a member whose lease expired, or that said why it left, is named; too few nodes end the job") {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).put("a/3/over/h1-10-a", etcd_rdzv::Json::object());
  auto next = proposal(keys, {.min_nodes = 2, .max_nodes = 2, .max_restarts = 3, .needs_host = false});
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "done");
  CHECK((*next)["verdict"]["cause"] ==
        "node 1 (h2) was lost: its etcd lease expired (no heartbeat for 5s); 1 node left, the job needs 2");
  CHECK((*next)["verdict"]["ended_by"] == "nodes");
  keys.put("left/h2-20-b", "interrupted by SIGTERM");
  next = proposal(keys, {.min_nodes = 2, .max_nodes = 2, .max_restarts = 3, .needs_host = false});
  CHECK((*next)["verdict"]["cause"] == "node 1 (h2) left the job: interrupted by SIGTERM; 1 node left, the job needs 2");
}

TEST_CASE("etcd: every member over without a failure: success") {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3);
  keys.put("a/3/over/h1-10-a", etcd_rdzv::Json::object()).put("a/3/over/h2-20-b", etcd_rdzv::Json::object());
  const auto next = proposal(keys, kTwo);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "done");
  CHECK((*next)["verdict"]["then"] == "success");
}

TEST_CASE("etcd: a node asking to join an elastic job with room re-forms it") {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3).node("h3-30-c", "h3", 4);
  const auto next = proposal(keys, {.min_nodes = 1, .max_nodes = 3, .max_restarts = 0, .needs_host = false});
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
  CHECK((*next)["reform"] == true);
  CHECK((*next)["cause"] == "the node on h3 joined");
  // A fixed N: it waits; nothing changes.
  CHECK_FALSE(proposal(keys, kTwo).has_value());
}

// --- live recovery on etcd ----------------------------------------------------------------------

namespace {

const rules::Limits kRecovering{.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = false,
                                .recovery = true, .min_world = 1};

// Both members of kRunning opted in, and are there.
Keys recovering() {
  Keys keys;
  keys.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3);
  keys.put("a/3/capable/h1-10-a", etcd_rdzv::Json::object()).put("a/3/capable/h2-20-b", etcd_rdzv::Json::object());
  return keys;
}

const etcd_rdzv::Json kRank3Killed = {{"rank", 3}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                      {"recoverable", true}};

}  // namespace

TEST_CASE("etcd recovery: a rank its node reports lost: a generation without it, through node 0's store") {
  auto keys = recovering();
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({kRank3Killed}));
  const auto next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "running");
  CHECK((*next)["gen"] == etcd_rdzv::Json({{"g", 1},
                                           {"members", {0, 1, 2}},
                                           {"store", "10.0.0.1:40001"},
                                           {"line", "rank 3 on node 1 (h2) was killed by SIGKILL; world 4 -> 3"},
                                           {"last_loss", 1}}));
  CHECK((*next)["lost_ranks"] == etcd_rdzv::Json({3}));
  CHECK((*next)["recovered"][0]["node_rank"] == 1);
  // Read again with that state: the loss is no failure, and nothing more is written.
  keys.put("state", *next);
  CHECK_FALSE(proposal(keys, kRecovering).has_value());
  // Its node's ranks then all gone ("over" saying the recovered loss): still none; every member
  // over: success.
  keys.put("a/3/over/h2-20-b", {{"failure", kRank3Killed}});
  CHECK_FALSE(proposal(keys, kRecovering).has_value());
  keys.put("a/3/over/h1-10-a", etcd_rdzv::Json::object());
  const auto end = proposal(keys, kRecovering);
  REQUIRE(end.has_value());
  CHECK((*end)["verdict"]["then"] == "success");
}

TEST_CASE("etcd recovery: node 0 lost whole (its store closed, or its lease): node 1's ranks go on through its store") {
  auto keys = recovering();
  keys.kvs.erase(keys.kvs.begin() + 1);  // node/h1-10-a: its lease revoked
  keys.put("gone/h1-10-a", "its idist-run ended or was killed (its store closed; seen from h2)");
  auto next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({2, 3}));
  CHECK((*next)["gen"]["store"] == "10.0.0.2:40002");
  CHECK((*next)["gen"]["line"] ==
        "node 0 (h1) was lost: its idist-run ended or was killed (its store closed; seen from h2); world 4 -> 2");
  keys.put("state", *next);
  CHECK_FALSE(proposal(keys, kRecovering).has_value());
  keys.put("a/3/over/h2-20-b", etcd_rdzv::Json::object());
  next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["verdict"]["then"] == "success");
}

TEST_CASE("etcd recovery: a member whose only ranks were lost says so in its over at the same read: recovered") {
  auto keys = recovering();
  const etcd_rdzv::Json rank2 = {{"rank", 2}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({rank2, kRank3Killed}));
  keys.put("a/3/over/h2-20-b", {{"failure", rank2}});
  const auto next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "running");
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 1}));
  CHECK((*next)["gen"]["store"] == "10.0.0.1:40001");
  CHECK((*next)["lost_ranks"] == etcd_rdzv::Json({2, 3}));
}

TEST_CASE("etcd recovery: a rank lost and a node gone at the same read (its capable key gone with it): one generation") {
  Keys keys;
  keys.put("state", {{"attempt", 3}, {"phase", "running"}, {"restarts_used", 0},
                     {"members", {"h1-10-a", "h2-20-b", "h3-30-c"}}, {"nproc", {1, 2, 2}}});
  keys.node("h1-10-a", "h1", 3, 1).node("h2-20-b", "h2", 3);  // h3's lease revoked: its keys are gone
  keys.put("a/3/capable/h1-10-a", etcd_rdzv::Json::object()).put("a/3/capable/h2-20-b", etcd_rdzv::Json::object());
  const etcd_rdzv::Json rank0 = {{"rank", 0}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h1-10-a", etcd_rdzv::Json::array({rank0})).put("a/3/over/h1-10-a", {{"failure", rank0}});
  keys.put("gone/h3-30-c", "its idist-run ended or was killed");
  const auto next = proposal(keys, {.min_nodes = 3, .max_nodes = 3, .max_restarts = 0, .needs_host = false,
                                    .recovery = true, .min_world = 1});
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "running");
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({1, 2}));
  CHECK((*next)["gen"]["store"] == "10.0.0.2:40002");
  CHECK((*next)["gen"]["line"] == "node 2 (h3) was lost: its idist-run ended or was killed, rank 0 on node 0 (h1) was "
                                  "killed by SIGKILL; world 5 -> 2");
}

TEST_CASE("etcd recovery: a rank that fails after a loss its node re-formed without is the failure, not hidden") {
  auto keys = recovering();
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({kRank3Killed}));
  auto next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  keys.put("state", *next);  // re-formed without rank 3
  // Rank 2 then exits 1; its node's "over" names rank 3, the loss, as its first failure.
  keys.put("a/3/fail/h2-20-b", {{"rank", 2}, {"how", "exited with code 1"}, {"exit_code", 1}, {"root", false}});
  keys.put("a/3/over/h2-20-b", {{"failure", kRank3Killed}});
  next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
  CHECK((*next)["cause"] == "rank 2 on node 1 (h2) exited with code 1");
}

TEST_CASE("etcd recovery: refused where a member did not opt in, below --min-world, or without recovery") {
  auto keys = recovering();
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({kRank3Killed}));
  auto limits = kRecovering;
  limits.min_world = 4;
  auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
  CHECK((*next)["cause"] == "rank 3 on node 1 (h2) was killed by SIGKILL");
  CHECK_FALSE(next->contains("gen"));
  limits.recovery = false;
  next = proposal(keys, limits);
  // Without recovery the loss is reported as a plain failure, which a lost key alone is not.
  CHECK_FALSE(next.has_value());
  Keys partial;
  partial.put("state", kRunning).node("h1-10-a", "h1", 3).node("h2-20-b", "h2", 3);
  partial.put("a/3/capable/h2-20-b", etcd_rdzv::Json::object());
  partial.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({kRank3Killed}));
  next = proposal(partial, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
}

TEST_CASE("etcd recovery: ranks whose program ended are said in the state, and no member of what follows") {
  auto keys = recovering();
  keys.put("a/3/ended/h1-10-a", etcd_rdzv::Json::array({1}));
  auto next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["ended"] == etcd_rdzv::Json({1}));
  keys.put("state", *next);
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({kRank3Killed}));
  next = proposal(keys, kRecovering);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 2}));
  // A new attempt's state keeps nothing of the last one's generations.
  Keys round;
  round.put("state", {{"attempt", 4}, {"phase", "gathering"}, {"restarts_used", 1}});
  round.node("h1-10-a", "h1", 4).node("h2-20-b", "h2", 4);
  const auto fresh = proposal(round, kRecovering);
  REQUIRE(fresh.has_value());
  CHECK_FALSE(fresh->contains("gen"));
  CHECK_FALSE(fresh->contains("lost_ranks"));
}

namespace {

rules::Limits replacing() {
  auto limits = kRecovering;
  limits.max_restarts = 2;
  limits.replacements = true;
  return limits;
}

etcd_rdzv::Json replaceable(etcd_rdzv::Json failure) {
  failure["replaceable"] = true;
  return failure;
}

// kRank3Killed, replaceable, read and decided: generation 1 of ranks 0-2, rank 4 granted on node 1.
Keys replaced() {
  auto keys = recovering();
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({replaceable(kRank3Killed)}));
  keys.put("state", *proposal(keys, replacing()));
  return keys;
}

}  // namespace

TEST_CASE("etcd recovery: a replaceable loss is granted a replacement, admitted alone once every member's node joined") {
  const auto limits = replacing();
  auto keys = recovering();
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({replaceable(kRank3Killed)}));
  auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 1, 2}));
  CHECK((*next)["grants"] == etcd_rdzv::Json::array({{{"node", "h2-20-b"}, {"lost", 3}, {"origin", 4}}}));
  CHECK((*next)["extra"] == etcd_rdzv::Json({{"h2-20-b", {4}}}));
  CHECK((*next)["restarts_used"] == 1);
  keys.put("state", *next);
  CHECK_FALSE(proposal(keys, limits).has_value());
  // Ready, but admitted only once every member's node said its ranks joined generation 1.
  keys.put("a/3/admit/h2-20-b", etcd_rdzv::Json::array({{{"origin", 4}, {"why", "rank 4 started in rank 3's place"}}}));
  CHECK_FALSE(proposal(keys, limits).has_value());
  keys.put("a/3/joined/h1-10-a", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  CHECK_FALSE(proposal(keys, limits).has_value());
  keys.put("a/3/joined/h2-20-b", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"] == etcd_rdzv::Json({{"g", 2},
                                           {"members", {0, 1, 2, 4}},
                                           {"store", "10.0.0.1:40001"},
                                           {"grow", true},
                                           {"line", "rank 4 started in rank 3's place; world 3 -> 4"},
                                           {"last_loss", 1}}));
  CHECK((*next)["admitted"] == etcd_rdzv::Json({4}));
  keys.put("state", *next);
  CHECK_FALSE(proposal(keys, limits).has_value());
  // A loss before rank 4 joined: the others re-form without it (mid-step), and admit it anew
  // once they took that generation.
  const etcd_rdzv::Json rank1 = {{"rank", 1}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h1-10-a", etcd_rdzv::Json::array({rank1}));
  next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["g"] == 3);
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 2}));
  CHECK((*next)["gen"]["line"] == "rank 1 on node 0 (h1) was killed by SIGKILL; world 4 -> 2");
  keys.put("state", *next);
  keys.put("a/3/joined/h1-10-a", {{"g", 3}, {"origins", etcd_rdzv::Json::array()}});
  keys.put("a/3/joined/h2-20-b", {{"g", 3}, {"origins", etcd_rdzv::Json::array()}});
  next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 2, 4}));
  CHECK((*next)["gen"]["grow"] == true);
}

TEST_CASE("etcd recovery: a replacement lost before any generation had it: another in its place, nobody re-forms") {
  const auto limits = replacing();
  auto keys = replaced();
  const etcd_rdzv::Json rank4 = {{"rank", 4}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h2-20-b", etcd_rdzv::Json::array({replaceable(kRank3Killed), replaceable(rank4)}));
  auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["g"] == 1);  // nobody re-forms
  CHECK((*next)["grants"][1] == etcd_rdzv::Json({{"node", "h2-20-b"}, {"lost", 4}, {"origin", 5}}));
  CHECK((*next)["extra"] == etcd_rdzv::Json({{"h2-20-b", {4, 5}}}));
  CHECK((*next)["restarts_used"] == 2);
  // The budget spent: the next one is refused (origin -1), which its node waits to hear.
  keys.put("state", *next);
  const etcd_rdzv::Json rank5 = {{"rank", 5}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h2-20-b",
           etcd_rdzv::Json::array({replaceable(kRank3Killed), replaceable(rank4), replaceable(rank5)}));
  next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["grants"][2] == etcd_rdzv::Json({{"node", "h2-20-b"}, {"lost", 5}, {"origin", -1}}));
  CHECK((*next)["gen"]["g"] == 1);
}

TEST_CASE("etcd recovery: every member ended before a replacement joined: it is named unjoined, to be stopped") {
  const auto limits = replacing();
  auto keys = replaced();
  keys.put("a/3/ended/h1-10-a", etcd_rdzv::Json({0, 1}));
  CHECK_FALSE(proposal(keys, limits).value_or(etcd_rdzv::Json::object()).contains("unjoined"));
  keys.put("a/3/ended/h2-20-b", etcd_rdzv::Json({2}));
  const auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["unjoined"] == etcd_rdzv::Json({4}));
  // And a replacement ready then is not admitted: the ranks are finishing.
  CHECK((*next)["gen"]["g"] == 1);
}

TEST_CASE("etcd recovery: a node lost whole after its replacement joined: the world re-forms without it, replacement too") {
  const auto limits = replacing();
  auto keys = replaced();
  keys.put("a/3/admit/h2-20-b", etcd_rdzv::Json::array({{{"origin", 4}, {"why", "rank 4 started in rank 3's place"}}}));
  keys.put("a/3/joined/h1-10-a", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  keys.put("a/3/joined/h2-20-b", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  keys.put("state", *proposal(keys, limits));
  keys.put("a/3/joined/h2-20-b", {{"g", 2}, {"origins", {4}}});
  keys.kvs.erase(keys.kvs.begin() + 2);  // node/h2-20-b: its lease revoked
  keys.put("gone/h2-20-b", "its idist-run ended or was killed (its store closed; seen from h1)");
  const auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["g"] == 3);
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 1}));
  CHECK((*next)["gen"]["last_loss"] == 3);
}

TEST_CASE("etcd recovery: a replacement admitted but not joined is not counted: a loss that leaves nobody else fails") {
  auto limits = replacing();
  limits.min_world = 3;
  auto keys = replaced();
  keys.put("a/3/admit/h2-20-b", etcd_rdzv::Json::array({{{"origin", 4}, {"why", "rank 4 started in rank 3's place"}}}));
  keys.put("a/3/joined/h1-10-a", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  keys.put("a/3/joined/h2-20-b", {{"g", 1}, {"origins", etcd_rdzv::Json::array()}});
  keys.put("state", *proposal(keys, limits));
  // Generation 2 admits rank 4, which has not joined it: a loss now leaves 0 and 2 (not 4),
  // fewer than --min-world 3, so the attempt ends rather than writing a world of 2.
  const etcd_rdzv::Json rank1 = {{"rank", 1}, {"how", "was killed by SIGKILL"}, {"exit_code", 137}, {"root", true},
                                 {"recoverable", true}};
  keys.put("a/3/lost/h1-10-a", etcd_rdzv::Json::array({rank1}));
  const auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "ending");
  CHECK((*next)["gen"]["g"] == 2);
}

TEST_CASE("etcd recovery: a node joins an elastic job live where every member's ranks admit replacements") {
  auto limits = replacing();
  limits.max_nodes = 3;
  const auto admitting = [](Keys keys) {
    keys.put("a/3/capable/h1-10-a", {{"admits", true}}).put("a/3/capable/h2-20-b", {{"admits", true}});
    return keys;
  };
  auto keys = admitting(recovering());
  keys.put("node/h3-30-c", {{"host", "h3"}, {"addr", "10.0.0.3"}, {"nproc", 2}, {"join", 4}, {"port", 29500},
                            {"store", 40003}, {"store_for", 3}, {"recovery", true}});
  auto next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["phase"] == "running");
  CHECK((*next)["members"] == etcd_rdzv::Json({"h1-10-a", "h2-20-b", "h3-30-c"}));
  CHECK((*next)["nproc"] == etcd_rdzv::Json({2, 2, 0}));
  CHECK((*next)["extra"] == etcd_rdzv::Json({{"h3-30-c", {4, 5}}}));
  CHECK((*next)["live"] == etcd_rdzv::Json({{"h3-30-c", 0}}));
  keys.put("state", *next);
  const auto a = etcd_rdzv::assignment_of(keys.snapshot(), 2);
  CHECK(a.rank_base == 4);
  CHECK(a.joins_after == 0);
  CHECK(etcd_rdzv::assignment_of(keys.snapshot(), 1).joins_after == -1);
  // Its ranks ready: admitted together (not one by one as its puts come) in generation 1,
  // through node 0's store.
  keys.put("a/3/admit/h3-30-c", etcd_rdzv::Json::array({{{"origin", 4}, {"why", "rank 4 joined with node 2"}}}));
  CHECK_FALSE(proposal(keys, limits).has_value());
  keys.put("a/3/admit/h3-30-c", etcd_rdzv::Json::array({{{"origin", 4}, {"why", "rank 4 joined with node 2"}},
                                                        {{"origin", 5}, {"why", "rank 5 joined with node 2"}}}));
  next = proposal(keys, limits);
  REQUIRE(next.has_value());
  CHECK((*next)["gen"]["g"] == 1);
  CHECK((*next)["gen"]["members"] == etcd_rdzv::Json({0, 1, 2, 3, 4, 5}));
  CHECK((*next)["gen"]["grow"] == true);
  CHECK((*next)["gen"]["store"] == "10.0.0.1:40001");
  CHECK((*next)["admitted"] == etcd_rdzv::Json({4, 5}));
  // Taken as capable from its join, as the rules take it: a loss meanwhile re-forms in place.
  keys.put("state", *next);
  const auto st = etcd_rdzv::rules_state(keys.snapshot(), {.last_call = false, .dead_after = "5s"});
  CHECK(st.members[2].capable);
  CHECK(st.members[2].admits);

  // A node whose idist-run offers no recovery, or members that do not admit: it re-forms.
  auto off = admitting(recovering());
  off.put("node/h3-30-c", {{"host", "h3"}, {"addr", "10.0.0.3"}, {"nproc", 2}, {"join", 4}});
  CHECK((*proposal(off, limits))["phase"] == "ending");
  auto plain = recovering();
  plain.put("node/h3-30-c", {{"host", "h3"}, {"addr", "10.0.0.3"}, {"nproc", 2}, {"join", 4}, {"recovery", true}});
  CHECK((*proposal(plain, limits))["phase"] == "ending");
}

TEST_CASE("etcd: a node's words under one key go one put at a time, the newest next") {
  struct Sent {
    std::string key;
    etcd_rdzv::Json value;
    std::function<void()> done;
  };
  std::vector<Sent> sent;
  etcd_rdzv::OrderedPuts puts([&](const std::string& k, const etcd_rdzv::Json& v, std::function<void()> done) {
    sent.push_back({k, v, std::move(done)});
  });
  puts.put("a/0/admit/n", {4});
  puts.put("a/0/admit/n", {4, 5});  // waits for the first: both in flight could land in either order
  puts.put("a/0/lost/n", {1});      // another key goes at once
  puts.put("a/0/admit/n", {4, 5, 6});  // replaces the one waiting
  REQUIRE(sent.size() == 2);
  CHECK(sent[0].value == etcd_rdzv::Json({4}));
  CHECK(sent[1].key == "a/0/lost/n");
  auto first = std::move(sent[0].done);
  first();
  REQUIRE(sent.size() == 3);
  CHECK(sent[2].value == etcd_rdzv::Json({4, 5, 6}));
  auto last = std::move(sent[2].done);
  last();
  CHECK(sent.size() == 3);
}
