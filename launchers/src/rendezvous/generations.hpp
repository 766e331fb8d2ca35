#pragma once
// The store a job's generations are announced in (docs/RECOVERY.md), hosted by idist-run: on
// one node by the supervisor's LiveRecovery, over several by node 0's rendezvous. Not rank 0's
// store, so that losing rank 0 costs nothing more. Losses that come within a short settle make
// one generation, written as "members=0,2,3" (generation-0 ranks) under env::generation_key(g),
// which the survivors wait for in idist::reform() and connect their new world under.

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace idist::detail {
class TcpStoreServer;
}

namespace idist::launchers::rendezvous {

class Generations {
 public:
  // At each announcement: the generation, its members, a line that says what changed ("rank 1
  // was killed by SIGKILL; world 4 -> 3"), and whether it went on from a loss (false: it only
  // admits replacements).
  using Announced = std::function<void(std::uint64_t generation, const std::vector<int>& members,
                                       const std::string& line, bool loss)>;

  // Generation g was taken: every member said it joined, `seconds` after the first loss (or the
  // admission) it holds was said here. Not called for one a newer generation came before.
  using Taken = std::function<void(std::uint64_t generation, double seconds)>;

  // A store at `host` (port 0: any) for a world of `world` ranks whose clients present `token`.
  // Throws std::runtime_error where it cannot listen.
  Generations(boost::asio::io_context& io, const std::string& host, const std::string& token, int world,
              Announced announced);
  ~Generations();
  Generations(const Generations&) = delete;
  Generations& operator=(const Generations&) = delete;

  void on_taken(Taken taken) { taken_ = std::move(taken); }
  std::string listen_address() const;
  int port() const;
  // `ranks` are lost, as `why` says: announced once the settle passes, with those lost meanwhile.
  void lose(const std::vector<int>& ranks, std::string why);
  // `origin`, a replacement (a rank started in a lost one's place), is ready to join, as `why`
  // says: announced once the settle passes, as ";grow" where nobody was lost meanwhile (the
  // members admit it at a step boundary). Only once every member joined the last generation (a
  // rank re-forming takes the newest, and must not find an admission where the others are in
  // the generation before it); and a loss announced first puts it back until that is joined.
  void admit(int origin, std::string why);
  // Over several nodes on etcd, each node's idist-run hosts a store for its own ranks, and the
  // rendezvous decides each generation (etcd/proposal.hpp): written here as decided, naming
  // `store`, the one its world connects through. `local`: this node's ranks, the members whose
  // joining this store sees. `last_loss`: the newest generation a loss made, up to `generation`;
  // those after it only admit replacements (";grow"). A node whose read skipped generations
  // writes each key up to it as a loss, so that a rank waiting on one is superseded.
  void publish(std::uint64_t generation, const std::vector<int>& members, const std::string& store,
               const std::string& line, const std::vector<int>& local, std::uint64_t last_loss);
  // Whether every one of `ranks` that is a member of the current generation said it joined it.
  // Throws where the store cannot tell.
  bool joined_current(const std::vector<int>& ranks);
  // Whether `origin` joined any generation (env::joined_key).
  bool joined(int origin);
  // `rank` ended its program (exit 0) while others run: said in the store, so that a survivor
  // waiting in reform() for it raises at once (uneven steps are not a loss), and it is no
  // member of what follows. No replacement is admitted from then on: the ranks are finishing.
  void ended(int rank);
  std::uint64_t generation() const { return generation_; }
  const std::vector<int>& members() const { return members_; }  // the current generation's
  // Losses are waiting for the settle (admissions are not losses).
  bool pending() const { return !why_.empty(); }
  // Every member of the last generation a loss made said it joined (env::joined_key); true
  // before any. A generation that only admits a replacement recovers nothing: the job may end
  // before its members take it.
  // Throws where the store cannot tell.
  bool all_joined();
  // At the attempt's end: "" where every loss was recovered from; else why not, as the cause of
  // the attempt's failure: a loss never announced (every survivor ended first), or a member of
  // the last generation that ended without joining it (its program did not call reform()).
  std::string unrecovered();
  // For --status: "" before any generation; else the current one, and where one is being
  // taken, how long since it was called for and how many of its members joined.
  std::string status();
  // The attempt is being stopped: nothing more is announced.
  void stand_down();

 private:
  void announce();
  void settle();
  void admit_queued();
  void time_taken();
  // How many members of the current generation said they joined it; none where the store
  // cannot tell.
  std::optional<std::size_t> members_joined();

  std::unique_ptr<idist::detail::TcpStoreServer> store_;
  boost::asio::steady_timer settle_;
  Announced announced_;
  std::uint64_t generation_ = 0;
  std::vector<int> members_;  // the current generation's
  std::vector<int> leaving_;  // lost or ended since it was announced
  // Replacements (origin, what to say): to announce; ready, held until every member joined
  // the last generation; announced in the last one that only admits, maybe not joined yet.
  std::vector<std::pair<int, std::string>> joining_, queued_, in_flight_;
  boost::asio::steady_timer admit_timer_;
  std::uint64_t recovered_generation_ = 0;  // the last generation a loss made
  std::vector<int> recovered_members_;      // and its members
  std::set<int> joined_;          // origins seen in a generation (joined() asks the store once)
  std::vector<std::string> why_;  // the losses not announced yet
  // Since when the losses or admissions not announced yet wait, and the announced generation
  // being timed (0: none) with its own start.
  std::chrono::steady_clock::time_point since_{}, timing_since_{};
  std::uint64_t timing_ = 0;
  boost::asio::steady_timer taken_timer_;
  Taken taken_;
  std::string last_line_;         // what the last generation went on without
  bool standing_down_ = false;
  // A rank ended its program: the job's ranks are finishing, and admit no replacement.
  bool ending_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace idist::launchers::rendezvous
