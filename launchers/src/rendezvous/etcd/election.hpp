#pragma once
// Who proposes the job's next states (proposer.hpp): an election as etcd's own
// `concurrency.Election` holds one. Each node puts a candidate key, election/LEASE, under its
// lease; the order in which etcd created those keys (their create revision) is the queue. The
// first candidate proposes; every other one watches only its predecessor's key (the one created
// last before its own) and looks again when that key is deleted. Why not a race for one key:
// when the proposer went, every node woke and sent a transaction that all but one lost; here
// only the next in line wakes, whatever the number of nodes. A candidate whose predecessor left
// while others stay before it simply waits on the one before that. Unlike etcd's, a node learns
// its predecessor in its first transaction, from election_last (the key queued last, renamed
// there), and reads the queue (every candidate: etcd sorts before it limits) only where that
// does not say, or after a predecessor went.
//
// Where a node stands (place_of) is a pure function of the candidates as a read returned them,
// tested without etcd (tests/unit/test_election.cpp); Election does the reads and the watch.

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace idist::launchers::etcd_rdzv {

using Json = nlohmann::json;

struct Candidate {
  std::string key;
  long long create_revision = 0;
};

struct Place {
  enum class Role {
    leader,   // no candidate before it: it proposes
    waiting,  // `predecessor` first: it waits for that key's delete
    absent,   // its own key is not there (its lease lost, or the job's keys deleted)
  };
  Role role = Role::absent;
  std::string predecessor;
  long long leader_since = 0;  // the lowest create revision read: the leader's, when the read holds it
};

// Where `own` stands among `candidates` (in any order). etcd gives every transaction its own
// revision and each candidate key is created by a transaction of its own, so two candidates
// never share a create revision; the key breaks such a tie anyway, so that one list never
// makes two leaders.
Place place_of(std::vector<Candidate> candidates, const std::string& own);

// The candidates under `election_prefix` in a /v3/kv/range answer, or in every range of a
// /v3/kv/txn answer (each key once).
std::vector<Candidate> candidates_of(const Json& answer, const std::string& election_prefix);

class Election {
 public:
  using Reply = std::function<void(const std::string& error, const Json& body)>;
  struct Io {
    // No reply may come once the Election is gone (the node's call() drops them).
    std::function<void(const std::string& path, Json body, Reply reply)> call;
    // Watch `key` from a revision: its events' keys and whether each was a delete.
    std::function<int(const std::string& key, long long from, std::function<void(bool deleted)> on_event)> watch;
    std::function<void(int id)> unwatch;
    // This node proposes from now on, as read at `revision`; `waited`: after a predecessor left.
    std::function<void(long long revision, bool waited)> elected;
    std::function<void()> absent;                  // its candidate key is gone
    std::function<void(const std::string& error)> failed;  // etcd did not answer a read
  };
  // `prefix`: the job's (ending in '/').
  Election(const std::string& prefix, Io io);
  ~Election();
  Election(const Election&) = delete;
  Election& operator=(const Election&) = delete;

  // The node's first transaction (`also`: its other ops, in either branch): its candidate key
  // (value `id`, under `lease`) put, its predecessor read; or, its key there already (a retry),
  // that key read, for its create revision. No range over the candidates: see begin().
  Json campaign(long long lease, const std::string& id, const Json& also);
  // That transaction's answer: its predecessor watched from its creation or, where none is
  // named, the queue read; then `placed` with the place taken (after elected() or absent(), if
  // either), the wait begun. leader_since is 0 but where the queue was read.
  using Placed = std::function<void(const Place& place)>;
  void begin(const Json& answer, Placed placed);
  // The first candidate's create revision, read (a range over every candidate: when needed).
  void leader_since(std::function<void(long long)> then);
  long long own_revision() const { return own_revision_; }
  // The candidate key put again, as the last in line (after absent()).
  void rejoin(long long lease, const std::string& id);
  void stop();  // no more watching, nor any callback

  bool leading() const { return stage_ == Stage::leading; }

 private:
  // One stage at a time; `stopped` ends them all (the node finished or gave up).
  enum class Stage { queued, waiting, checking, leading, absent, stopped };
  Json put_op(long long lease, const std::string& id) const;
  Json place_read(long long up_to) const;
  Json first_read() const;
  void locate(Placed placed);
  void settle(const Place& place, long long revision);
  void check_again();

  std::string prefix_;  // election/ under the job's prefix
  std::string last_;    // election_last: the key of the candidate that queued last (under its lease)
  std::string own_;
  long long own_revision_ = 0;
  Io io_;
  Stage stage_ = Stage::queued;
  int watch_ = -1;
};

}  // namespace idist::launchers::etcd_rdzv
