#pragma once
// The etcd rendezvous' keys as the rules see them: a read
// of the job's prefix becomes a Snapshot, a Snapshot becomes the rules' State (who is a member,
// who said "over", who failed first, who is lost, who waits), and the rules' Step becomes the
// next value of the `state` key. No I/O: what the proposer decides is tested without etcd.
//
// Keys, under PREFIX = --rdzv-conf prefix (default /idist/rdzv/) + the job's id + "/":
//   state                 {attempt, phase: gathering|running|ending|done, restarts_used,
//                          members: [ID...] (node rank = index), nproc: N or [N...],
//                          zero: {addr, port} (rank 0's store), cause, reform, verdict (the
//                          last one), prev: the last attempt's members, gathers, look, report;
//                          live recovery: gen {g, members, store, line, last_loss, grow} (the
//                          generation the survivors go on as; last_loss: the newest one a loss
//                          made; grow: it only admits replacements), lost_ranks, recovered (the losses behind
//                          them: not failures at the next read), ended (ranks whose program
//                          ended while others ran), proposer {id, addr, store, for, lease}:
//                          the node the others watch; replacements: grants [{node, lost,
//                          origin}] (origin -1: refused), extra {ID: [origin...]} (started on
//                          node ID), admitted [origin...] (a generation had them), live {ID: g}
//                          (node ID joined the attempt live after generation g), unjoined
//                          [origin...] (every member ended before they joined: stop them);
//                          a generation that only admits them has `grow`}
//   election/LEASE        (lease) a candidate to propose, valued its node's ID: the one created
//                          first proposes (election.hpp)
//   election_last         (lease) the candidate key queued last: the next one's predecessor
//   node/ID               (lease) {host, addr, nproc, join, port, store, store_for, lease, recovery}:
//                          alive, and asks to be in attempt `join` or later; `store`: its
//                          generations store's port, for attempt `store_for`; `lease`: its id
//   gone/ID               (lease of the node that saw it) why node ID was found gone (its store
//                          closed: store_watch.hpp)
//   a/K/fail/ID           (lease) a rank of attempt K failed on node ID first
//   a/K/over/ID           (lease) every rank of attempt K is gone on node ID {failure?}
//   a/K/lost/ID           (lease) [failure...]: ranks of node ID lost, which its other ranks
//                          (all opted in) may re-form without (live recovery)
//   a/K/capable/ID        (lease) {admits}: every rank of node ID opted in to live recovery (and
//                          admits replacements)
//   a/K/ended/ID          (lease) [rank...]: ranks of node ID whose program ended (exit 0)
//   a/K/admit/ID          (lease) [{origin, why}...]: replacements of node ID ready to be admitted
//   a/K/joined/ID         (lease) {g, origins}: node ID's members of generation g all joined it;
//                          origins: its replacements that joined one
//   a/K/stalled/ID        (lease) a rank of node ID stalled: a job-wide report is asked for
//   a/K/views/ID          (lease) node ID's ranks, for the report the state's `look` asks
//   left/ID               why node ID's idist-run left before the job's end

#include <climits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "idist/launchers/etcd_rendezvous.hpp"
#include "rendezvous/rules.hpp"

namespace idist::launchers::etcd_rdzv {

using Json = nlohmann::json;
namespace rules = rendezvous::rules;

long long as_ll(const Json& j, const char* key, long long fallback = 0);

// A node's id is HOST-PID-RANDOM: its host, for messages.
std::string host_of(const std::string& id);

struct NodeRecord {
  std::string id, host, addr;
  int nproc = 1;
  int join = -1;  // the attempt it asks to be in (or a later one); -1: none
  int port = 0;
  int store = 0;  // its generations store's port (live recovery); 0: none
  int store_for = -1;  // the attempt that store is for
  std::string lease;   // its etcd lease's id
  bool recovery = false;  // it offers live recovery (it may join a running attempt live)
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
  std::map<std::string, Report> fails, overs, stalls, views, losts, capables, endeds, admits,
      joineds;  // of the state's attempt
  std::map<std::string, std::string> left, gone;

  int attempt() const;
  rules::Phase phase() const;
  int nproc(std::size_t r) const;  // node rank r's local ranks: one number for all, or one per node
  const Json& members() const;
  std::string member(std::size_t r) const;  // node rank r's id, or ""
};

// A /v3/kv/range answer over the job's `prefix`.
Snapshot snapshot_of(const Json& range, const std::string& prefix);

// What the proposer knows beside the keys: its timers, and the words it needs.
struct ProposerView {
  bool last_call = false;  // the round's last call has passed
  std::string dead_after;  // node_timeout, in words (a lost member's sentence)
};

// Node rank r's name and why it is gone: "node 1 (h) left the job: ..." or its lease expired.
std::string member_name(const Snapshot& s, std::size_t r);
std::string lost_text(const Snapshot& s, std::size_t r, const std::string& dead_after);

// This node's part in the attempt the state runs, as node rank `r`; -1: none.
int node_rank_of(const Snapshot& s, const std::string& id);
Assignment assignment_of(const Snapshot& s, std::size_t r);

rules::State rules_state(const Snapshot& s, const ProposerView& view);

// What the rules decide at a read of the job: `event` (Reconsider, or a timer's), after, where
// live recovery is offered, each loss the read holds, weighed on its own as the built-in
// rendezvous hears them: ranks a node reported lost (Fail), members gone (Lost). None is
// weighed where another failure ends the attempt anyway.
rules::Step decide_read(const Snapshot& s, const ProposerView& view, const rules::Event& event,
                        const rules::Limits& limits);

// The next value of the `state` key after `step` (a successor of `s`'s), or none when the
// rules changed nothing that is kept there. `zero`: node 0's record, for rank 0's address.
std::optional<Json> next_state(const Snapshot& s, const rules::Step& step);

}  // namespace idist::launchers::etcd_rdzv
