#pragma once
// The rendezvous' rules, written once for both rendezvous: the built-in one (server.cpp applies
// them to what its TCP connections say) and the etcd one (etcd/coordinator.cpp, whose proposer
// applies them to the job's keys as it reads them, and writes what follows by compare-and-swap).
//
//   decide(state, event) -> (state', actions)
//
// Pure: no socket, no timer, no clock, no log. Its callers own the timers and turn their firing
// into events (LastCall, JoinTimeout, StopPassed), and carry out the actions (tell the members
// their part, stop them, send the verdict, log). As torch's dynamic_rendezvous.py maps a state
// to an action in _RendezvousJoinOp, and as the supervisor's policy.hpp decides from records;
// tests/unit/test_rules.cpp feeds it events, case by case, and reads what it decided.
//
// The rules: rounds of MIN..MAX nodes closed at MAX or at the last call after MIN; a node that
// asks to join while an elastic job runs with room re-forms it (not counted), or joins it live
// where every rank admits replacements (live recovery); the first failure
// ends the attempt on every node; the verdict waits for every member's ranks to be gone (a
// member that never stops is dropped); one restart budget; blame a root cause first, then the
// rank the named one says it lost; the verdict's words, the same on either rendezvous.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace idist::launchers::rendezvous::rules {

enum class Phase { gathering, running, ending, done };
// etcd keeps the phase as a word in the job's state.
std::string_view phase_name(Phase phase);
Phase phase_named(std::string_view name);  // gathering for a word it does not know

// A failure verdict's "ended_by": the restart budget was spent, or too few nodes were left.
inline constexpr std::string_view kEndedByRestarts = "restarts";
inline constexpr std::string_view kEndedByNodes = "nodes";

struct Limits {
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  // The built-in rendezvous needs its host in every round: node 0, whose port is rank 0's
  // store. On etcd any node can be node 0.
  bool needs_host = false;
  // Live recovery is offered (the built-in rendezvous, --recovery auto, its generation store
  // up); the world may shrink to min_world ranks.
  bool recovery = false;
  int min_world = 1;
  // A rank lost on a node still there may be replaced (a rank started in its place, which the
  // survivors admit live), spending the restart budget.
  bool replacements = false;
};

// A node that asks to be in the next round.
struct Candidate {
  std::string id;  // the caller's name for it, unique among the job's nodes
  std::string host;
  int nproc = 1;
  bool hosting = false;             // the built-in rendezvous' host: always node 0
  std::optional<int> wanted_rank;   // --node-rank
  int prev_rank = -1;               // its node rank in the last attempt it ran in
  // Which candidates a round prefers past MAX, and the last tie of the node ranks: the order
  // of joining on the built-in rendezvous; on etcd, which has none, its rank order.
  std::uint64_t order = 0;
  bool recovers = false;  // its idist-run offers live recovery (it may join a running attempt live)
};
std::string name_of(const Candidate& c);  // "node 1 (h)" once it ran, else "the node on h"
// Why a node cannot join a job of a fixed N that runs.
std::string already_full(int max_nodes);

struct Member {
  std::string id;
  std::string host;
  int nproc = 1;
  int base = 0;       // its first global rank
  bool over = false;  // its ranks of this attempt are gone
  bool gone = false;  // lost, or dropped
  bool capable = false;  // every rank of it opted in to live recovery (it said so: Capable)
  std::vector<int> extra = {};  // replacements started on it (live recovery), by their origins
  bool admits = false;  // and every running rank of it admits replacements (Capable::admits)
};
// Whether `rank` (a global rank, or a replacement's origin) runs on `m`.
bool holds(const Member& m, int rank);

// A failure some member reported, or a member lost, in the current attempt.
struct Failure {
  int node_rank = -1;  // of the member it is about
  int rank = -1;       // global; -1: the node itself was lost
  std::string how;     // "exited with code 3"; for a lost node, the whole sentence
  int exit_code = 1;
  bool root = false;   // crashed, killed by a signal nobody sent, or a lost node (policy.hpp's Blame)
  std::optional<int> lost_peer;  // it said it lost its connection to this rank
  bool recoverable = false;  // a loss its node's other ranks (all opted in) may re-form without
  bool replaceable = false;  // and they admit a replacement in its place (idist::Recovery's step)
};

struct Verdict {
  enum class Then { restart, success, failure };
  Then then = Then::failure;
  int attempt = 0;
  int next = 0;  // restart: the attempt that follows
  std::string cause;
  int exit_code = 1;
  int restarts_left = 0;
  bool counted = true;  // restart: spent from the budget (a re-form is not)
  int rank = -1;        // the global rank it blames; -1: none, or a node
  std::string_view ended_by;  // failure: kEndedByRestarts, kEndedByNodes, or empty
};

struct State {
  Phase phase = Phase::gathering;
  int attempt = 0;
  int restarts_used = 0;
  std::vector<Member> members;      // this attempt's, by node rank (none while gathering)
  std::vector<Candidate> waiting;   // ask to be in the next round: not members
  std::vector<Failure> failures;    // this attempt's, in the order they came
  std::vector<std::string> departures;  // members lost while the attempt ended, for the verdict
  std::string cause;                // why this attempt ends; empty while it does not
  bool reform = false;              // it ends for a node that joined, not for a failure
  bool last_call = false;           // this round's last call has passed
  std::optional<Verdict> verdict;   // the last one given
  std::vector<int> lost_ranks;      // global ranks this attempt re-formed without (live recovery)
  std::vector<int> ended_ranks;     // and those whose program ended (exit 0) while others ran
  std::vector<Failure> recovered;   // the losses behind them: a later failure may still be of one
  std::vector<int> admitted = {};   // replacements (Member::extra) a generation has had as members
};
std::string failure_text(const State& state, const Failure& f);  // "rank 3 on node 1 (h) exited with code 3"
// Live recovery: where every rank of the generation `members` that joined it ended (or its
// node is over), the replacements that never joined (granted, or admitted and not connected):
// nobody is left to admit them. Empty while a member runs. `joined`: whether an origin joined
// any generation.
std::vector<int> unjoined_after_members_ended(const State& state, const std::vector<int>& members,
                                              const std::function<bool(int)>& joined);
// The member with this id, or nullptr.
const Member* member_of(const State& state, const std::string& id);
int node_rank_of(const State& state, const std::string& id);  // -1: not a member

// --- what happens ---------------------------------------------------------------------------
struct Reconsider {};  // nothing new: what the state itself calls for (etcd's proposer, at a read)
struct Join {
  Candidate node;
};
struct Fail {
  Failure failure;  // its node_rank: the member that said it
};
struct Over {
  int node_rank = -1;
  std::optional<Failure> failure;  // its final word on its first failure: replaces what it said
};
// A node's connection or lease is gone. `text` says so, naming it; `nodes_left`: the job's nodes
// still there (the built-in rendezvous' count; it decides a loss between attempts).
struct Lost {
  std::string id;
  std::string text;
  int prev_rank = -1;
  int nodes_left = 0;
};
struct LastCall {
  int attempt = 0;
};
// The round waited join_timeout (`after`, in words); `suffix` ends the verdict's cause.
struct JoinTimeout {
  std::string after;
  std::string suffix;
};
// The members still stopping their ranks `limit` (in words) after the attempt ended are dropped.
struct StopPassed {
  std::string limit;
};
struct HostLeft {  // node 0's idist-run leaves before the job's end; `why`: its outcome, if said
  std::string why;
};
struct Capable {  // every rank of this member opted in to live recovery
  int node_rank = -1;
  bool admits = false;  // and every running one admits replacements at a step boundary
};
struct Ended {  // a rank's program ended (exit 0) while others run: no member of what follows
  int rank = -1;
};
struct Generation {  // live recovery: a generation of these members (origins) was announced
  std::vector<int> members;
};
using Event = std::variant<Reconsider, Join, Fail, Over, Lost, LastCall, JoinTimeout, StopPassed, HostLeft, Capable,
                           Ended, Generation>;

// --- what follows ---------------------------------------------------------------------------
struct Assign {};       // the round closed: the state's members are the attempt's; tell each its part
struct ArmLastCall {};  // MIN wait: close the round at the last call (unless armed already)
struct EndAttempt {     // stop every member's ranks; the verdict waits for them (arm the stop timer)
  std::string cause;
};
struct Drop {  // a member that never said its ranks stopped: out of the job
  std::string id;
  std::string why;  // "did not report its ranks stopped within 5.5s of attempt 0's end"
};
struct Refuse {  // a node that asked to join and cannot
  std::string id;
  std::string why;
};
struct Announce {  // the verdict: a restart's goes `to` the ended attempt's members still there; the end's, to every node
  Verdict verdict;
  std::vector<std::string> to;
};
struct Log {
  std::string line;
  bool debug = false;
};
// Live recovery: the survivors go on without `lost` (global ranks), in place; `why` names the
// loss ("rank 3 on node 1 (h) was killed by SIGKILL"). The attempt goes on.
// Replacements asked for go with it: `origin` starts on node `node_rank` in `lost`'s place, or
// -1 where the budget is spent.
struct Replacement {
  int node_rank = -1;
  int lost = -1;
  int origin = -1;
};
struct ReformInPlace {
  std::vector<int> lost;
  std::string why;
  std::vector<Replacement> replace;
};
// Live recovery: node `id` joins the running attempt as member `node_rank`, its ranks numbered
// `origins` (after the job's ranks and every replacement), admitted live as replacements are.
struct JoinLive {
  std::string id;
  int node_rank = -1;
  std::vector<int> origins;
};
using Action = std::variant<Assign, ArmLastCall, EndAttempt, Drop, Refuse, Announce, Log, ReformInPlace, JoinLive>;

struct Step {
  State state;
  std::vector<Action> actions;
};

// Takes the state by value (move it in: a job of 10,000 nodes is not copied at every message).
Step decide(State state, const Event& event, const Limits& limits);

}  // namespace idist::launchers::rendezvous::rules
