#pragma once
// What init() builds: the contract it read, the store (served by rank 0), and the world group;
// and what reform() builds again after a loss (runtime_reform.cpp).
// The library's one piece of global mutable state is the default Runtime (runtime.cpp).

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"
#include "idist/idist.hpp"
#include "generation_watch.hpp"
#include "heartbeat.hpp"
#include "process_group.hpp"
#include "store/store.hpp"
#include "idist_store/server.hpp"

namespace idist::detail {

// What a Group handle points to. Members have `group`; the others only know the ranks.
struct GroupState {
  std::vector<int> ranks;      // global ranks, in group-rank order
  int rank = -1;               // this rank's group rank, -1 outside
  ProcessGroup* group = nullptr;
  std::uint64_t runtime_id = 0;  // groups die with the runtime that made them
  std::string description;     // "group [0, 2]"
  int id = -1;                 // the n-th new_group call, counted alike on every rank
};

// The door between the public Group handle and its state.
struct GroupAccess {
  static const GroupState* state(const Group& g) { return g.state_.get(); }
  static Group make(std::shared_ptr<const GroupState> s) { return Group(std::move(s)); }
};

class Runtime {
 public:
  // Joins the rendezvous and connects the world group; throws idist::Error (op "init").
  Runtime(const env::Contract& contract, const InitOptions& options);
  ~Runtime();

  const env::Contract& contract() const { return contract_; }
  ProcessGroup& world() {
    if (!world_) [[unlikely]] {  // a replacement's join is asked for here, off every call's path
      if (pending_join_.load(std::memory_order_acquire)) join_when_ready();
      if (!world_)
        throw Error(ErrorSite{contract_.rank, contract_.world_size, "", backend_},
                    "no world to call on: the last reform(), or this replacement's join, failed (its error said why)");
    }
    return *world_;
  }
  Store& store() { return *store_; }
  // The backend the program chose, also before a replacement joined (no world yet).
  std::string_view backend_name() { return pending_join_.load() ? std::string_view(backend_) : world().backend_name(); }
  bool joins_later() const { return pending_join_.load(); }
  // A replacement's join (runtime_reform.cpp): init() returns at once, with the place of the
  // rank it replaces, so that its program sets up (data, model) while the job trains on; its
  // first use of the world joins, and idist-run admits it only then (it beats from there).
  void join_when_ready();
  std::uint64_t id() const { return id_; }

  // new_group(): a collective over the world (every rank calls it with the same list).
  std::shared_ptr<const GroupState> new_group(const std::vector<int>& ranks);

  // c10d's monitored_barrier: rank 0 of the group collects every member's arrival in the
  // store, with a deadline, and names the members that did not come; every member raises the
  // same TimeoutError. `state` null for the world.
  void monitored_barrier(const GroupState* state, std::chrono::milliseconds timeout);

  // Says in the store that this rank leaves (with leaving_words()), leaves its groups, so
  // that a peer still waiting for it in a collective fails now, naming it, then waits
  // (bounded) until every rank has reached finalize, so rank 0 does not take the store away
  // from a rank that still needs it. Throws Error when a peer was left inside a collective
  // this rank never called (the ranks ran different numbers of steps).
  void finalize();

  // idist::reform() (runtime_reform.cpp): the survivors of a lost rank go on as a new world;
  // `admitting`: idist::admit_replacements(), at a step boundary, where nobody is lost.
  ReformResult reform(bool admitting);
  // A replacement's admission is announced, not yet taken (replacement_waiting()).
  bool replacement_waiting() const { return growth_at_.load() > generation_.load(); }
  // This generation's groups were aborted (peer_lost()): a loss seen here or announced.
  bool peer_lost() const { return aborted_generation_.load() == generation_.load(); }
  bool is_replacement() const { return joining_.load(); }
  void replacement_caught_up() { joining_ = false; }
  const std::optional<ReformResult>& replacement_joined() const { return joined_as_; }

  // idist::mark_step(): counted, so that a rank that leaves says how far it got.
  void mark_step() { steps_.fetch_add(1, std::memory_order_relaxed); }

 private:
  // Every rank announces itself before the backend connects, so that ranks which never come
  // are named (with their node) rather than surfacing as the backend's anonymous timeout. It
  // also brings `settings` (agreed_settings) to rank 0, which refuses the job where they differ.
  void join(std::chrono::steady_clock::time_point deadline, const std::string& settings);

  // IDIST_INTRANODE=shm refused where shared memory would carry nothing of the world: under
  // another backend than gloo, or where no two ranks share a host. (What carries a gloo world
  // is make_backend's choice: make_carrier, backends/carriers.hpp.)
  void check_intranode(const std::string& backend, const ErrorSite& site) const;
  // The hosts of `ranks` (world ranks), numbered afresh from 0 in their order.
  std::vector<int> hosts_of(const std::vector<int>& ranks) const;

  // The backend's own world (MPI) replaces the contract's topology, after checking they agree.
  void adopt(const Layout& layout, const ErrorSite& site);
  // After a collective of a group timed out: every member that timed out says so in the store,
  // with the call it was in; those that do not within a moment are the ones that never
  // arrived, and those in another call at that number made calls that do not match.
  std::string who_did_not_arrive(const std::string& prefix, const std::vector<int>& members, int me,
                                 std::string_view call, std::uint64_t number);
  // After a peer was lost in a collective: the members (`member`, or any but `me` when -1)
  // that said in the store that they left, as one line, or "" when none did. Tells the leaver
  // it left this rank behind (the "abandoned" key its finalize() watches).
  std::string explain_departure(const std::vector<int>& members, int me, int member, bool world, std::string_view op,
                                std::uint64_t number);
  // After a timeout: the members not `present` that left through finalize(), named with what
  // they did, as one line part ("" when none did); they are marked present.
  std::string those_that_left(Store& store, const std::vector<int>& members, std::vector<bool>& present) const;
  // Writes each leaver's "abandoned" key (this rank was left waiting in `call`), so that its
  // finalize() raises too.
  void tell_leavers(Store& store, const std::vector<int>& leavers, const std::string& call) const;
  // Which members said in the store that they left (finalize()): they will not come.
  std::vector<bool> finalized_among(Store& store, const std::vector<int>& members) const;
  // "called finalize() after 6 steps" (mark_step), else after how many collectives.
  std::string leaving_words() const;
  // finalize()'s wait, after leaving: what a peer left behind wrote ("" when none did).
  std::string wait_for_the_others();
  ProcessGroupOptions group_options(int rank, int size, std::string description, std::string prefix,
                                    std::vector<int> members);
  // The world group over store_, as the contract and hosts_ say now (init, and each re-form;
  // `superseded`: BackendInit's).
  void connect_world(const std::atomic<bool>* superseded = nullptr);
  // Live recovery: every group of this generation ends its waits (Backend::abort), here and on
  // the peers that wait on this rank. Once per generation: `generation` is the one the caller's
  // group belongs to.
  void abort_generation(std::uint64_t generation, const std::string& why);
  // reform()'s parts: idist-run's word on who goes on (world ranks of generation 0, in the new
  // order), and this rank's new place taken from it.
  std::vector<int> next_generation_members(const ErrorSite& site, std::chrono::steady_clock::time_point deadline);
  void adopt_generation(const std::vector<int>& members, int me);
  // LOCAL_RANK and LOCAL_WORLD_SIZE as hosts_ says, once a generation's join learnt it.
  void place_on_hosts();
  // init() of a replacement (IDIST_REPLACEMENT): the running job's first generation after the
  // one it started in that has it, in place of the rendezvous at MASTER_ADDR.
  void join_running(const ErrorSite& site);
  // The watch of idist-run's generations, from init (GenerationWatch).
  void watch_generations();
  // Connects the generation adopted last, on a store connection of its own; false where a
  // newer generation was announced meanwhile (the connect gave up on it), true once connected.
  bool connect_generation();
  // idist-run announced a generation after `g` that a loss made (not one that only admits).
  bool loss_after(std::uint64_t g);
  // The groups and the world, taken away from the cascade; destroyed with it, groups first.
  struct Groups {
    std::unique_ptr<ProcessGroup> world;
    std::vector<std::unique_ptr<ProcessGroup>> groups;
  };
  Groups take_groups();
  // Takes them away, then destroys them.
  void drop_groups();
  // idist-run's store of generations (IDIST_RECOVERY_STORE), connected at the first use.
  Store& generation_store();
  // A fresh connection to the store, for a moment: the main one may be busy or timed out.
  std::unique_ptr<Store> probe(std::chrono::milliseconds patience = std::chrono::seconds(2)) const;

  env::Contract contract_;
  std::uint64_t id_;
  // InitOptions::recovery: beats from init (a replacement's: from its join) to the end.
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::unique_ptr<Store> store_;
  std::unique_ptr<ProcessGroup> world_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;  // destroyed before the world
  // Live recovery's cascade walks groups_ and world_ from whichever thread saw a loss: their
  // changes and that walk hold this (never while a group is destroyed: see reform()).
  std::mutex groups_mu_;
  int groups_made_ = 0;
  std::map<std::string, std::uint64_t> monitored_barriers_;  // per group prefix, in call order
  bool rendezvous_ = false;  // joined through the TCP store, so finalize() meets there too
  std::string backend_;     // the backend the program chose, which errors name
  std::vector<int> hosts_;  // hosts_[rank]: which host each rank runs on (join()); empty under MPI
  std::atomic<std::uint64_t> steps_{0};  // mark_step()
  std::uint64_t world_calls_ = 0;         // the world's collectives, kept as it is torn down
  // Live recovery (runtime_reform.cpp).
  bool recovery_ = false;             // InitOptions::recovery
  std::atomic<std::uint64_t> generation_ = 0;  // 0 until the first re-form; probe() reads it anywhere
  std::vector<int> origins_;          // origins_[rank]: that rank's rank in generation 0
  std::shared_ptr<Store> generation_store_;  // idist-run's (IDIST_RECOVERY_STORE), from the first re-form
  // Where the current generation's world connects: idist-run's store above, or on etcd the one
  // its word names (";store=H:P", another node's idist-run: the word is mirrored on every node).
  // Written with generation_ under connect_mu_, which probe() takes on any thread.
  std::string connect_host_;
  int connect_port_ = 0;
  mutable std::mutex connect_mu_;
  std::atomic<std::uint64_t> aborted_generation_{~std::uint64_t{0}};
  std::unique_ptr<GenerationWatch> generation_watch_;  // from init, where idist-run offers recovery
  std::atomic<std::uint64_t> growth_at_{0};  // the last generation announced that admits a replacement
  std::atomic<bool> joining_{false};         // a replacement without the job's state yet
  std::atomic<bool> pending_join_{false};    // a replacement that has not asked to join yet
  std::mutex pending_mu_;
  std::optional<ReformResult> joined_as_;     // a replacement: the world it joined
};

// Runs `f`, raising what it throws as the API's errors at `site` (read as it throws): an
// idist::Error as it is, a TimeoutFailure as TimeoutError, anything else as Error.
template <class F>
decltype(auto) raised_at(const ErrorSite& site, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const TimeoutFailure& e) {
    throw TimeoutError(site, e.what());
  } catch (const std::exception& e) {
    throw Error(site, e.what());
  }
}

// The settings every rank must agree on, compared at each join (init, and each generation's):
// "NAME=VALUE" lines.
std::string agreed_settings(const env::Contract& c, const std::string& backend, bool recovery);
// Live recovery carries traffic between hosts over gloo's TCP (UCX cannot abort): sets
// IDIST_INTERHOST so, or throws where the user asked for UCX by name.
void recovery_carriers(env::Contract& c, const ErrorSite& site);

// A number for each runtime, and each generation of one (reform()): groups die with it, and
// the flight recorder numbers calls afresh under it.
std::uint64_t next_runtime_id();

// The default runtime; throws idist::Error naming `op` when init() has not run.
Runtime& runtime(std::string_view op);
// nullptr before init().
Runtime* runtime_if_initialized();

}  // namespace idist::detail
