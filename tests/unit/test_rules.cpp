// The rendezvous' rules (launchers/src/rendezvous/rules.hpp) case by case: events in, the next
// state and the actions out, with no socket and no etcd. Both rendezvous apply these rules (the
// built-in one per message, the etcd proposer per read of the job's keys), so this is where
// their decisions, and the verdict's words, are checked; test_proposal.cpp reads etcd's keys
// into them.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rules.hpp"

namespace rules = idist::launchers::rendezvous::rules;
using rules::Phase;

namespace {

// A rendezvous' state, moved from event to event, and the actions of the last one.
struct Rdzv {
  rules::Limits limits;
  rules::State state;
  std::vector<rules::Action> actions;

  explicit Rdzv(rules::Limits l) : limits(l) {}

  Rdzv& on(const rules::Event& e) {
    auto step = rules::decide(std::move(state), e, limits);
    state = std::move(step.state);
    actions = std::move(step.actions);
    return *this;
  }

  template <class A>
  std::optional<A> action() const {
    for (const auto& a : actions)
      if (const auto* x = std::get_if<A>(&a)) return *x;
    return std::nullopt;
  }
  std::vector<std::string> logs() const {
    std::vector<std::string> out;
    for (const auto& a : actions)
      if (const auto* l = std::get_if<rules::Log>(&a); l && !l->debug) out.push_back(l->line);
    return out;
  }
  rules::Verdict verdict() const {
    const auto a = action<rules::Announce>();
    REQUIRE(a.has_value());
    return a->verdict;
  }
};

rules::Candidate node(const std::string& id, const std::string& host, int nproc = 2) {
  rules::Candidate c;
  c.id = id;
  c.host = host;
  c.nproc = nproc;
  c.order = static_cast<std::uint64_t>(id[0]);
  return c;
}

rules::Candidate host_node(const std::string& id, const std::string& host, int nproc = 2) {
  auto c = node(id, host, nproc);
  c.hosting = true;
  return c;
}

rules::Fail fail(int node_rank, int rank, const std::string& how, int exit_code = 3, bool root = false) {
  rules::Failure f;
  f.node_rank = node_rank;
  f.rank = rank;
  f.how = how;
  f.exit_code = exit_code;
  f.root = root;
  return rules::Fail{f};
}

// A job of two nodes (2 ranks each) running attempt 0: a on node 0, b on node 1.
Rdzv running_two(rules::Limits limits) {
  limits.needs_host = true;
  Rdzv r(limits);
  r.on(rules::Join{host_node("a", "ha")}).on(rules::Join{node("b", "hb")});
  if (r.state.phase == Phase::gathering) r.on(rules::LastCall{0});
  REQUIRE(r.state.phase == Phase::running);
  return r;
}

}  // namespace

TEST_CASE("joins fill a round: at MAX it closes, node 0 first, each member's first rank") {
  Rdzv r({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = true});
  r.on(rules::Join{node("b", "hb", 3)});
  CHECK(r.state.phase == Phase::gathering);
  CHECK(r.action<rules::ArmLastCall>() == std::nullopt);
  r.on(rules::Join{host_node("a", "ha")});
  CHECK(r.state.phase == Phase::running);
  CHECK(r.action<rules::Assign>().has_value());
  REQUIRE(r.state.members.size() == 2);
  CHECK(r.state.members[0].id == "a");
  CHECK(r.state.members[1].id == "b");
  CHECK(r.state.members[1].base == 2);
  CHECK(r.state.waiting.empty());
  CHECK(r.logs() == std::vector<std::string>{"attempt 0: 2 nodes, world size 5"});
}

TEST_CASE("the built-in rendezvous waits for its host; etcd's does not") {
  Rdzv builtin({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = true});
  builtin.on(rules::Join{node("b", "hb")}).on(rules::Join{node("c", "hc")});
  CHECK(builtin.state.phase == Phase::gathering);
  Rdzv etcd({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = false});
  etcd.on(rules::Join{node("c", "hc")}).on(rules::Join{node("b", "hb")});
  CHECK(etcd.state.phase == Phase::running);
  CHECK(etcd.state.members[0].host == "hb");  // by host name
}

TEST_CASE("MIN:MAX: MIN joins arm the last call, which closes the round") {
  Rdzv r({.min_nodes = 1, .max_nodes = 3, .max_restarts = 0, .needs_host = true});
  r.on(rules::Join{host_node("a", "ha")});
  CHECK(r.action<rules::ArmLastCall>().has_value());
  CHECK(r.state.phase == Phase::gathering);
  r.on(rules::LastCall{7});  // another round's: nothing
  CHECK(r.state.phase == Phase::gathering);
  r.on(rules::LastCall{0});
  CHECK(r.state.phase == Phase::running);
  CHECK(r.state.members.size() == 1);
}

TEST_CASE("node ranks: node 0, --node-rank where said, then the last attempt's rank, host name, order") {
  Rdzv r({.min_nodes = 4, .max_nodes = 4, .max_restarts = 0, .needs_host = true});
  // node() orders them by their ids' first letter: b, c, d, e join in that order.
  auto c = node("c", "h9");
  c.prev_rank = 3;
  auto d = node("d", "h0");
  d.wanted_rank = 1;
  r.on(rules::Join{node("b", "h1")}).on(rules::Join{c}).on(rules::Join{d}).on(rules::Join{node("e", "h2")});
  CHECK(r.state.phase == Phase::gathering);  // MAX are in, but not node 0
  r.on(rules::Join{host_node("a", "ha")});
  REQUIRE(r.state.phase == Phase::running);
  std::vector<std::string> ids;
  for (const auto& m : r.state.members) ids.push_back(m.id);
  // Past MAX the last to join (e) waits for the next round.
  CHECK(ids == std::vector<std::string>{"a", "d", "c", "b"});
  REQUIRE(r.state.waiting.size() == 1);
  CHECK(r.state.waiting[0].id == "e");
}

TEST_CASE("a --node-rank taken or out of range is refused, and the round goes on") {
  Rdzv r({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = true});
  auto b = node("b", "hb");
  b.wanted_rank = 5;
  r.on(rules::Join{b});
  const auto refused = r.action<rules::Refuse>();
  REQUIRE(refused.has_value());
  CHECK(refused->why == "--node-rank 5 is not below --nnodes 2");
  CHECK(r.state.waiting.empty());
  auto c = node("c", "hc");
  c.wanted_rank = 0;
  r.on(rules::Join{host_node("a", "ha")}).on(rules::Join{c});
  REQUIRE(r.action<rules::Refuse>().has_value());
  CHECK(r.action<rules::Refuse>()->why == "node rank 0 is taken (by ha)");
  CHECK(r.state.phase == Phase::gathering);
}

TEST_CASE("a late joiner re-forms an elastic job with room, not counted") {
  auto r = running_two({.min_nodes = 1, .max_nodes = 3, .max_restarts = 0});
  r.on(rules::Join{node("c", "hc")});
  CHECK(r.state.phase == Phase::ending);
  CHECK(r.state.reform);
  REQUIRE(r.action<rules::EndAttempt>().has_value());
  CHECK(r.action<rules::EndAttempt>()->cause == "the node on hc joined");
  // A rank that fails because the re-form stopped its peers is not counted.
  r.on(fail(1, 2, "exited with code 1", 1));
  CHECK(r.state.failures.empty());
  r.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  const auto v = r.verdict();
  CHECK(v.then == rules::Verdict::Then::restart);
  CHECK_FALSE(v.counted);
  CHECK(v.cause == "the node on hc joined");
  CHECK(v.next == 1);
  CHECK(r.action<rules::Announce>()->to == std::vector<std::string>{"a", "b"});
  CHECK(r.state.phase == Phase::gathering);
  CHECK(r.state.attempt == 1);
  CHECK(r.state.restarts_used == 0);
  REQUIRE(r.state.waiting.size() == 1);
  CHECK(r.state.waiting[0].id == "c");
}

TEST_CASE("a late joiner of a fixed-N job that runs is refused") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(rules::Join{node("c", "hc")});
  REQUIRE(r.action<rules::Refuse>().has_value());
  CHECK(r.action<rules::Refuse>()->why == "the job already has its 2 nodes");
  CHECK(r.state.phase == Phase::running);
  CHECK(r.state.waiting.empty());
}

TEST_CASE("a failure report ends the attempt; with a restart left, every node restarts, counted") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 2});
  r.on(fail(1, 3, "exited with code 3"));
  CHECK(r.state.phase == Phase::ending);
  CHECK(r.action<rules::EndAttempt>()->cause == "rank 3 on node 1 (hb) exited with code 3");
  CHECK(r.logs() == std::vector<std::string>{"attempt 0: rank 3 on node 1 (hb) exited with code 3; stopping every node"});
  r.on(rules::Over{1, std::nullopt});
  CHECK(r.action<rules::Announce>() == std::nullopt);  // node 0 still stops its ranks
  r.on(rules::Over{0, std::nullopt});
  const auto v = r.verdict();
  CHECK(v.then == rules::Verdict::Then::restart);
  CHECK(v.counted);
  CHECK(v.restarts_left == 1);
  CHECK(v.rank == 3);
  CHECK(r.logs() == std::vector<std::string>{"attempt 0 ended (rank 3 on node 1 (hb) exited with code 3): attempt 1 on "
                                             "every node, 1 restart left"});
}

TEST_CASE("every member over without a failure: success") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  CHECK(r.state.phase == Phase::done);
  CHECK(r.verdict().then == rules::Verdict::Then::success);
}

TEST_CASE("restart budget spent: the job fails, ended by restarts, naming the first failure") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(fail(0, 1, "exited with code 3")).on(fail(1, 2, "exited with code 1", 1));
  r.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  const auto v = r.verdict();
  CHECK(v.then == rules::Verdict::Then::failure);
  CHECK(v.cause == "rank 1 on node 0 (ha) exited with code 3");
  CHECK(v.exit_code == 3);
  CHECK(v.ended_by == rules::kEndedByRestarts);
  CHECK(r.logs() == std::vector<std::string>{"the job failed: rank 1 on node 0 (ha) exited with code 3"});
}

TEST_CASE("blame: a root cause before an exit, then the rank the one named says it lost") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  auto survivor = fail(0, 0, "exited with code 1", 1);
  survivor.failure.lost_peer = 3;
  r.on(survivor).on(fail(1, 3, "was killed by SIGKILL", 137, true));
  r.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  CHECK(r.verdict().cause == "rank 3 on node 1 (hb) was killed by SIGKILL");
  CHECK(r.verdict().rank == 3);

  auto chain = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  auto first = fail(0, 1, "exited with code 1", 1);
  first.failure.lost_peer = 2;
  chain.on(first).on(fail(1, 2, "exited with code 7", 7));
  chain.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  CHECK(chain.verdict().cause == "rank 2 on node 1 (hb) exited with code 7");
  CHECK(chain.verdict().exit_code == 7);
}

TEST_CASE("a member's over replaces what its fail said, in its place") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(fail(1, 3, "exited with code 1", 1)).on(fail(0, 0, "exited with code 1", 1));
  rules::Failure final_word;
  final_word.rank = 2;
  final_word.how = "exited with code 9";
  final_word.exit_code = 9;
  r.on(rules::Over{1, final_word}).on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().cause == "rank 2 on node 1 (hb) exited with code 9");
}

TEST_CASE("a silent member is a root failure; a fixed-N job without it ends, too few nodes") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 3});
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) stopped answering (no heartbeat for 5s)", .prev_rank = 1, .nodes_left = 1});
  CHECK(r.state.phase == Phase::ending);
  CHECK(r.action<rules::EndAttempt>()->cause == "node 1 (hb) stopped answering (no heartbeat for 5s)");
  r.on(rules::Over{0, std::nullopt});
  const auto v = r.verdict();
  CHECK(v.then == rules::Verdict::Then::failure);
  CHECK(v.cause == "node 1 (hb) stopped answering (no heartbeat for 5s); 1 node left, the job needs 2");
  CHECK(v.ended_by == rules::kEndedByNodes);
  CHECK(v.rank == -1);
}

// Live recovery: two nodes of 2 ranks each that both said their ranks opted in.
Rdzv recovering_two(int min_world = 1) {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = true, .recovery = true,
                        .min_world = min_world});
  r.on(rules::Capable{0}).on(rules::Capable{1});
  return r;
}

rules::Fail lost_rank(int node_rank, int rank) {
  auto f = fail(node_rank, rank, "was killed by SIGKILL", 137, true);
  f.failure.recoverable = true;
  return f;
}

TEST_CASE("live recovery: a rank lost where every member opted in re-forms in place; the job still succeeds") {
  auto r = recovering_two();
  r.on(lost_rank(1, 3));
  CHECK(r.state.phase == Phase::running);
  CHECK(r.action<rules::EndAttempt>() == std::nullopt);
  REQUIRE(r.action<rules::ReformInPlace>().has_value());
  CHECK(r.action<rules::ReformInPlace>()->lost == std::vector<int>{3});
  CHECK(r.action<rules::ReformInPlace>()->why == "rank 3 on node 1 (hb) was killed by SIGKILL");
  CHECK(r.logs() == std::vector<std::string>{"attempt 0: rank 3 on node 1 (hb) was killed by SIGKILL; the other 3 "
                                             "ranks go on without it (live recovery)"});
  r.on(lost_rank(0, 0));  // rank 0 too: its node hosts the store, not its rank
  CHECK(r.action<rules::ReformInPlace>()->lost == std::vector<int>{0});
  r.on(rules::Over{1, std::nullopt}).on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().then == rules::Verdict::Then::success);
}

TEST_CASE("live recovery: ranks whose program ended are not counted among those that go on (--min-world)") {
  auto r = recovering_two(3);
  r.on(rules::Ended{1});
  r.on(lost_rank(1, 3));
  CHECK(r.state.phase == Phase::ending);
  CHECK(r.logs().front() == "live recovery: rank 3 on node 1 (hb) was killed by SIGKILL; 2 ranks would be left, "
                            "fewer than --min-world 3: the attempt ends");
  auto all = recovering_two();  // every other rank ended: nobody would go on, so the loss stands
  for (int k : {0, 1, 2}) all.on(rules::Ended{k});
  all.on(lost_rank(1, 3));
  CHECK(all.action<rules::ReformInPlace>() == std::nullopt);
}

TEST_CASE("live recovery: a member whose every rank was lost says the loss again when it is over: no failure") {
  auto r = recovering_two();
  r.on(lost_rank(1, 2)).on(lost_rank(1, 3));
  auto last_word = lost_rank(1, 3).failure;
  r.on(rules::Over{1, last_word});
  CHECK(r.state.phase == Phase::running);
  CHECK(r.action<rules::EndAttempt>() == std::nullopt);
  r.on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().then == rules::Verdict::Then::success);
}

TEST_CASE("live recovery: a rank lost on a node still there is replaced while the budget lasts, its node taking it") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 2, .needs_host = true, .recovery = true,
                        .min_world = 1, .replacements = true});
  r.on(rules::Capable{0}).on(rules::Capable{1});
  const auto replaceable = [](int node_rank, int rank) {
    auto f = lost_rank(node_rank, rank);
    f.failure.replaceable = true;
    return f;
  };
  r.on(replaceable(1, 3));
  const auto replaced = [&] { return r.action<rules::ReformInPlace>()->replace; };
  REQUIRE(replaced().size() == 1);
  CHECK(replaced()[0].node_rank == 1);
  CHECK(replaced()[0].lost == 3);
  CHECK(replaced()[0].origin == 4);  // after the attempt's 4 ranks
  CHECK(r.state.restarts_used == 1);
  CHECK(r.logs().back() == "live recovery: rank 4 starts on node 1 (hb) in rank 3's place (1 of --max-restarts 2)");
  r.on(replaceable(1, 4));  // lost before it joined: another in its place
  REQUIRE(replaced().size() == 1);
  CHECK(replaced()[0].lost == 4);
  CHECK(replaced()[0].origin == 5);
  r.on(replaceable(0, 0));  // the budget is spent: the world shrinks, and node 0 hears so
  CHECK(r.action<rules::ReformInPlace>()->lost == std::vector<int>{0});
  REQUIRE(replaced().size() == 1);
  CHECK(replaced()[0].origin == -1);
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost", .prev_rank = 1, .nodes_left = 1});
  CHECK(r.action<rules::ReformInPlace>()->lost == std::vector<int>{2, 5});  // its replacement goes with it
  CHECK(replaced().empty());
  r.on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().then == rules::Verdict::Then::success);

  auto waits = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .needs_host = true, .recovery = true,
                            .min_world = 1, .replacements = true});
  waits.on(rules::Capable{0}).on(rules::Capable{1}).on(replaceable(1, 3));
  const auto never = [](int) { return false; };
  // Rank 4 starts in 3's place; while a member of the generation {0, 1, 2} runs, it may be admitted.
  CHECK(rules::unjoined_after_members_ended(waits.state, {0, 1, 2}, never).empty());
  waits.on(rules::Ended{0}).on(rules::Ended{1}).on(rules::Ended{2});
  CHECK(rules::unjoined_after_members_ended(waits.state, {0, 1, 2}, never) == std::vector<int>{4});
  // Admitted (a member) but never connected: nobody is left to connect with it either.
  CHECK(rules::unjoined_after_members_ended(waits.state, {0, 1, 2, 4}, never) == std::vector<int>{4});
  CHECK(rules::unjoined_after_members_ended(waits.state, {0, 1, 2, 4}, [](int) { return true; }).empty());
  // A member lost (not re-formed without yet) is no member that could admit it.
  CHECK(rules::unjoined_after_members_ended(waits.state, {0, 1, 2, 3}, never) == std::vector<int>{4});

  // A replacement not admitted yet is nobody who goes on: rank 2's loss, after the others ended,
  // is the attempt's failure; and its own loss is none.
  auto alone = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .needs_host = true, .recovery = true,
                            .min_world = 1, .replacements = true});
  alone.on(rules::Capable{0}).on(rules::Capable{1}).on(replaceable(1, 3));
  alone.on(rules::Ended{0}).on(rules::Ended{1}).on(rules::Over{0, std::nullopt});
  alone.on(replaceable(1, 4));  // killed while it starts: no failure
  CHECK(alone.state.phase == Phase::running);
  CHECK(alone.state.failures.empty());
  alone.on(lost_rank(1, 2));
  CHECK(alone.state.phase == Phase::ending);
  auto admitted = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .needs_host = true,
                               .recovery = true, .min_world = 1, .replacements = true});
  admitted.on(rules::Capable{0}).on(rules::Capable{1}).on(replaceable(1, 3));
  admitted.on(rules::Generation{{0, 1, 2}}).on(rules::Generation{{0, 1, 2, 4}});
  CHECK(admitted.state.admitted == std::vector<int>{4});
  admitted.on(lost_rank(1, 2));  // rank 4 goes on: a member now
  CHECK(admitted.state.phase == Phase::running);
  CHECK(admitted.action<rules::ReformInPlace>()->lost == std::vector<int>{2});

  auto etcd = recovering_two();  // no replacements offered (etcd), or a rank whose node's others do not admit one
  auto f = lost_rank(1, 3);
  f.failure.replaceable = true;
  etcd.on(f);
  CHECK(etcd.action<rules::ReformInPlace>()->replace.empty());
}

TEST_CASE("live recovery: a node lost goes with its ranks; node 0's loss, a member not capable, --min-world end it") {
  auto r = recovering_two();
  r.on(lost_rank(1, 2));
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost: its idist-run ended or was killed", .prev_rank = 1, .nodes_left = 1});
  CHECK(r.state.phase == Phase::running);
  CHECK(r.action<rules::ReformInPlace>()->lost == std::vector<int>{3});  // rank 2 was re-formed without already
  r.on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().then == rules::Verdict::Then::success);

  auto zero = recovering_two();
  zero.on(rules::Lost{.id = "a", .text = "node 0 (ha) was lost", .prev_rank = 0, .nodes_left = 1});
  CHECK(zero.state.phase == Phase::ending);
  CHECK(zero.action<rules::ReformInPlace>() == std::nullopt);

  auto unready = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .needs_host = true, .recovery = true});
  unready.on(rules::Capable{1});  // node 0's ranks never said they opted in
  unready.on(lost_rank(1, 3));
  CHECK(unready.state.phase == Phase::ending);
  CHECK(unready.action<rules::EndAttempt>()->cause == "rank 3 on node 1 (hb) was killed by SIGKILL");

  auto few = recovering_two(3);
  few.on(lost_rank(1, 3));
  CHECK(few.state.phase == Phase::running);
  few.on(lost_rank(1, 2));
  CHECK(few.state.phase == Phase::ending);
  CHECK(few.logs().front() == "live recovery: rank 2 on node 1 (hb) was killed by SIGKILL; 2 ranks would be left, "
                              "fewer than --min-world 3: the attempt ends");

  auto late = recovering_two();  // node 0's ranks are done: nobody would go on without node 1
  late.on(rules::Over{0, std::nullopt});
  late.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost", .prev_rank = 1, .nodes_left = 1});
  CHECK(late.action<rules::ReformInPlace>() == std::nullopt);
  CHECK(late.verdict().then == rules::Verdict::Then::failure);

  auto own = recovering_two();  // a non-zero exit is the program's verdict, not a loss
  own.on(fail(1, 3, "exited with code 3"));
  CHECK(own.state.phase == Phase::ending);
}

TEST_CASE("live recovery: a survivor that fails of a loss re-formed without names that loss, as blame follows it") {
  auto r = recovering_two();
  r.on(lost_rank(1, 3));
  auto survivor = fail(0, 1, "exited with code 1", 1);
  survivor.failure.lost_peer = 3;  // "connection to rank 3 lost": it did not re-form
  r.on(survivor);
  CHECK(r.state.phase == Phase::ending);
  r.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  CHECK(r.verdict().cause == "rank 3 on node 1 (hb) was killed by SIGKILL");
  CHECK(r.verdict().rank == 3);
}

TEST_CASE("a member that leaves after its ranks are done is a departure, named if the job ends for it") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(fail(0, 0, "exited with code 3"));
  r.on(rules::Over{1, std::nullopt});
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) left the job: interrupted", .prev_rank = 1, .nodes_left = 1});
  r.on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().cause ==
        "rank 0 on node 0 (ha) exited with code 3; node 1 (hb) left the job: interrupted; 1 node left, the job needs 2");
}

TEST_CASE("MIN:MAX with no restart left: going on without a lost node spends one, and says so") {
  auto r = running_two({.min_nodes = 1, .max_nodes = 2, .max_restarts = 0});
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost: its idist-run ended or was killed", .prev_rank = 1, .nodes_left = 1});
  r.on(rules::Over{0, std::nullopt});
  CHECK(r.verdict().cause ==
        "node 1 (hb) was lost: its idist-run ended or was killed; no restart left (--max-restarts 0): going on without "
        "a lost node spends a restart");
  CHECK(r.verdict().ended_by == rules::kEndedByRestarts);
}

TEST_CASE("a member that never stops is dropped once its time is up, named") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  r.on(fail(0, 0, "exited with code 3")).on(rules::Over{0, std::nullopt});
  r.on(rules::StopPassed{"5.5s"});
  REQUIRE(r.action<rules::Drop>().has_value());
  CHECK(r.action<rules::Drop>()->id == "b");
  CHECK(r.action<rules::Drop>()->why == "did not report its ranks stopped within 5.5s of attempt 0's end");
  CHECK(r.verdict().cause ==
        "rank 0 on node 0 (ha) exited with code 3; node 1 (hb) did not report its ranks stopped within 5.5s of attempt "
        "0's end; 1 node left, the job needs 2");
}

TEST_CASE("a member lost between attempts ends a fixed-N job at once; MIN:MAX goes on") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 1});
  r.on(fail(0, 0, "exited with code 3")).on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  REQUIRE(r.state.phase == Phase::gathering);
  r.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost: its idist-run ended or was killed", .prev_rank = 1, .nodes_left = 1});
  CHECK(r.verdict().cause ==
        "before attempt 1 could start, node 1 (hb) was lost: its idist-run ended or was killed; 1 node left, the job "
        "needs 2");
  CHECK(r.state.phase == Phase::done);

  auto elastic = running_two({.min_nodes = 1, .max_nodes = 2, .max_restarts = 1});
  elastic.on(fail(0, 0, "exited with code 3")).on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt});
  elastic.on(rules::Lost{.id = "b", .text = "node 1 (hb) was lost", .prev_rank = 1, .nodes_left = 1});
  CHECK(elastic.state.phase == Phase::gathering);
  CHECK(elastic.logs() == std::vector<std::string>{"before attempt 1 could start, node 1 (hb) was lost; 1 nodes remain"});
}

TEST_CASE("a round that times out names who joined and, for a fixed N, who never did") {
  Rdzv r({.min_nodes = 3, .max_nodes = 3, .max_restarts = 0, .needs_host = true});
  auto b = node("b", "hb");
  b.wanted_rank = 1;
  r.on(rules::Join{host_node("a", "ha")}).on(rules::Join{b});
  r.on(rules::JoinTimeout{"5m", "; refused 1 connection from 10.0.0.2 with another job id (--rdzv-id)"});
  CHECK(r.verdict().cause ==
        "the rendezvous timed out after 5m: 2 of 3 nodes joined (ha, hb); node 2 never joined; refused 1 connection "
        "from 10.0.0.2 with another job id (--rdzv-id)");

  Rdzv no_host({.min_nodes = 1, .max_nodes = 2, .max_restarts = 0, .needs_host = true});
  no_host.on(rules::Join{node("b", "hb")}).on(rules::JoinTimeout{"2s", ""});
  CHECK(no_host.verdict().cause ==
        "the rendezvous timed out after 2s: 1 nodes joined, but not node 0 (the rendezvous' host)");
}

TEST_CASE("node 0 leaving before the end fails the job with its words") {
  auto r = running_two({.min_nodes = 2, .max_nodes = 2, .max_restarts = 3});
  r.on(rules::HostLeft{"interrupted by SIGTERM"});
  CHECK(r.verdict().cause == "node 0's idist-run left the job: interrupted by SIGTERM");
  CHECK(r.verdict().then == rules::Verdict::Then::failure);
  r.on(rules::Join{node("c", "hc")});
  CHECK(r.action<rules::Refuse>()->why == "the job is over");
}

// The etcd proposer does not see events one by one: it reads the job's keys into a state (the
// members' reports, who is still there) and asks what follows. One read can carry everything.
TEST_CASE("etcd's reads: a state with its failures and every member over goes straight to the verdict") {
  rules::Limits limits{.min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .needs_host = false};
  rules::State s;
  s.phase = Phase::running;
  s.attempt = 4;
  s.members = {{.id = "ha-1-0", .host = "ha", .nproc = 2, .base = 0, .over = true, .gone = false},
               {.id = "hb-1-0", .host = "hb", .nproc = 2, .base = 2, .over = true, .gone = false}};
  rules::Failure f;
  f.node_rank = 1;
  f.rank = 2;
  f.how = "exited with code 5";
  f.exit_code = 5;
  s.failures = {f};
  auto step = rules::decide(s, rules::Reconsider{}, limits);
  CHECK(step.state.phase == Phase::gathering);
  CHECK(step.state.attempt == 5);
  CHECK(step.state.restarts_used == 1);
  REQUIRE(step.state.verdict.has_value());
  CHECK(step.state.verdict->cause == "rank 2 on node 1 (hb) exited with code 5");

  // The same read with a member still stopping: the attempt ends, the verdict waits.
  s.members[0].over = false;
  step = rules::decide(s, rules::Reconsider{}, limits);
  CHECK(step.state.phase == Phase::ending);
  CHECK(step.state.cause == "rank 2 on node 1 (hb) exited with code 5");
  // Read again later, stored as ending: nothing new until the member is over.
  step = rules::decide(step.state, rules::Reconsider{}, limits);
  CHECK(step.state.phase == Phase::ending);
  CHECK(step.actions.empty());
}

TEST_CASE("etcd's reads: a running elastic job with a node waiting and room re-forms") {
  rules::Limits limits{.min_nodes = 1, .max_nodes = 3, .max_restarts = 0, .needs_host = false};
  rules::State s;
  s.phase = Phase::running;
  s.members = {{.id = "ha-1-0", .host = "ha", .nproc = 1, .base = 0, .over = false, .gone = false}};
  s.waiting = {node("hc-2-0", "hc")};
  const auto step = rules::decide(s, rules::Reconsider{}, limits);
  CHECK(step.state.phase == Phase::ending);
  CHECK(step.state.reform);
  CHECK(step.state.cause == "the node on hc joined");
}

TEST_CASE("phases by name, as etcd stores them") {
  for (const auto p : {Phase::gathering, Phase::running, Phase::ending, Phase::done})
    CHECK(rules::phase_named(rules::phase_name(p)) == p);
  CHECK(rules::phase_named("nonsense") == Phase::gathering);
}

TEST_CASE("live recovery: a node joins an elastic job live where every member's ranks admit replacements") {
  const rules::Limits limits{.min_nodes = 2, .max_nodes = 3, .max_restarts = 0, .needs_host = true, .recovery = true,
                             .min_world = 1, .replacements = true};
  const auto recovering = [](rules::Candidate c) {
    c.recovers = true;
    return rules::Join{c};
  };
  // Opted in, but not admitting replacements yet: the job re-forms with it, as without recovery.
  auto r = running_two(limits);
  r.on(rules::Capable{0, true}).on(rules::Capable{1, false});
  r.on(recovering(node("c", "hc")));
  CHECK(r.state.phase == Phase::ending);
  CHECK(r.state.reform);
  // Nor does a node whose idist-run offers no live recovery (--recovery off) join live.
  auto off = running_two(limits);
  off.on(rules::Capable{0, true}).on(rules::Capable{1, true});
  off.on(rules::Join{node("c", "hc")});
  CHECK(off.state.reform);

  auto live = running_two(limits);
  live.on(rules::Capable{0, true}).on(rules::Capable{1}).on(rules::Capable{1, true});
  live.on(recovering(node("c", "hc", 3)));
  CHECK(live.state.phase == Phase::running);
  CHECK_FALSE(live.state.reform);
  const auto joined = live.action<rules::JoinLive>();
  REQUIRE(joined.has_value());
  CHECK(joined->id == "c");
  CHECK(joined->node_rank == 2);
  CHECK(joined->origins == std::vector<int>{4, 5, 6});  // after the job's 4 ranks
  REQUIRE(live.state.members.size() == 3);
  CHECK(live.state.members[2].nproc == 0);
  CHECK(live.state.waiting.empty());
  CHECK(live.state.restarts_used == 0);  // not counted
  // Not admitted yet: its ranks' loss is none, and they are not counted among those that go on.
  live.on(lost_rank(2, 5));
  CHECK(live.state.phase == Phase::running);
  CHECK(live.state.failures.empty());
  // Admitted: a member like any; every member over: success.
  live.on(rules::Generation{{0, 1, 2, 3, 4, 6}});
  CHECK(live.state.admitted == std::vector<int>{4, 6});
  live.on(rules::Over{0, std::nullopt}).on(rules::Over{1, std::nullopt}).on(rules::Over{2, std::nullopt});
  CHECK(live.verdict().then == rules::Verdict::Then::success);

  // A rank that ended, or a failure being weighed: the ranks are finishing, so it re-forms.
  auto ended = running_two(limits);
  ended.on(rules::Capable{0, true}).on(rules::Capable{1, true}).on(rules::Ended{3});
  ended.on(recovering(node("c", "hc")));
  CHECK(ended.state.reform);
}
