// Live recovery's re-form (docs/RECOVERY.md): the survivors of a lost rank go on as a new world
// in the same processes. The first survivor to see the loss aborts every group of the
// generation (the cascade), so that no survivor waits on it; each then waits in reform() for
// idist-run's word on who goes on (supervise/recovery.hpp writes "members=..." under
// env::generation_key(g) in the store it hosts), and they connect a new world there (on etcd:
// in the store the word names), under
// generation_prefix(g): nothing of an earlier generation, nor rank 0's store, is needed again.
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "common/duration.hpp"
#include "common/wait.hpp"
#include "log.hpp"
#include "recorder.hpp"
#include "runtime.hpp"
#include "store/prefix_store.hpp"
#include "store/tcp_store.hpp"
#include "store_keys.hpp"

namespace idist::detail {
using namespace store_keys;

namespace {

// A rank that idist-run left out of the generation (it froze and was given up, then ran on):
// its peers have gone on without it, so nothing it computes may count. One line, then exit
// 75 (EX_TEMPFAIL) without returning into the program or running its destructors, which
// could block on connections the others closed.
[[noreturn]] void fenced_out(const ErrorSite& site, std::uint64_t generation) {
  std::cout.flush();
  std::fflush(nullptr);
  log().error("[idist rank {}/{}] reform: fenced out: the job went on without this rank (generation {}); it was "
              "given up as lost (frozen or too slow), so it exits now (75) and its work does not count",
              site.rank, site.world_size, generation);
  log().flush();
  ::_exit(75);
}

struct GenerationWord {
  std::vector<int> members;
  std::string store_host;  // empty: idist-run's own store (IDIST_RECOVERY_STORE)
  int store_port = 0;
};

GenerationWord parse_word(const std::vector<char>& value, std::uint64_t g) {
  std::string text(value.begin(), value.end());
  const auto unreadable = [&] {
    return std::runtime_error(fmt::format("idist-run's word on generation {} is unreadable: {}", g, text));
  };
  if (text.ends_with(env::kGrowTag)) text.resize(text.size() - env::kGrowTag.size());
  GenerationWord word;
  if (const auto at = text.find(env::kStoreTag); at != std::string::npos) {
    const auto address = text.substr(at + env::kStoreTag.size());
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) throw unreadable();
    word.store_host = address.substr(0, colon);
    word.store_port = std::stoi(address.substr(colon + 1));
    text.resize(at);
  }
  constexpr std::string_view kTag = "members=";
  if (text.rfind(kTag, 0) != 0) throw unreadable();
  auto& members = word.members;
  for (std::size_t at = kTag.size(); at < text.size();) {
    const auto end = std::min(text.find(',', at), text.size());
    members.push_back(std::stoi(text.substr(at, end - at)));
    at = end + 1;
  }
  return word;
}

}  // namespace

void Runtime::abort_generation(std::uint64_t generation, const std::string& why) {
  auto seen = aborted_generation_.load();
  if (seen == generation || !aborted_generation_.compare_exchange_strong(seen, generation)) return;
  std::lock_guard lock(groups_mu_);
  // Late: reform() has moved on (generation_ is set before the old groups go and the new ones
  // come, under this lock), and the groups here are the next generation's.
  if (generation_.load() != generation) return;
  for (auto& g : groups_) g->abort(why);
  if (world_) world_->abort(why);
}

Runtime::Groups Runtime::take_groups() {
  Groups taken;
  std::lock_guard lock(groups_mu_);
  taken.groups = std::move(groups_);
  groups_.clear();
  taken.world = std::move(world_);
  return taken;
}

void Runtime::drop_groups() {
  // The old generation's connections go without finalize(): its peers are gone or going.
  // Destroyed outside groups_mu_: a group's end waits for its async calls, whose thread may be
  // the one in abort_generation, waiting for the lock.
  take_groups();
}

Store& Runtime::generation_store() {
  if (!generation_store_)
    generation_store_ = std::make_shared<TcpStore>(
        TcpStoreOptions{contract_.recovery_host, contract_.recovery_port, contract_.job_token, contract_.timeout});
  return *generation_store_;
}

std::vector<int> Runtime::next_generation_members(const ErrorSite& site, Clock::time_point deadline) {
  generation_store();
  auto next = generation_ + 1;
  // idist-run's word, or that a peer's program ended (exit 0: uneven steps, which no re-form
  // mends); that one is given a moment, since a loss may come with it.
  std::vector<std::string> keys{env::generation_key(next)};
  for (int origin : origins_) keys.push_back(env::ended_key(origin));
  std::optional<Clock::time_point> ended_seen;
  int ended = -1;
  const bool word = poll_until(
      [&]() -> bool {
        const auto present = generation_store_->check(keys);
        if (present[0]) return true;
        for (std::size_t i = 1; i < present.size() && ended < 0; ++i)
          if (present[i] && origins_[i - 1] != origins_[static_cast<std::size_t>(contract_.rank)])
            ended = static_cast<int>(i - 1);
        if (ended >= 0 && !ended_seen) ended_seen = Clock::now();
        return ended_seen && Clock::now() - *ended_seen > std::chrono::milliseconds(500);
      },
      deadline, kStorePolicy);
  if (word && !generation_store_->check({env::generation_key(next)})[0])
    throw Error(site, fmt::format("rank {} ended its program (exit 0) while this rank waited for it: the ranks ran "
                                  "different numbers of steps, which a re-form cannot mend (give every rank the same "
                                  "number of batches: idist::auto_dataloader, or idist::join)",
                                  ended));
  if (!word)
    throw TimeoutError(site, fmt::format("idist-run did not re-form the job within {} (IDIST_TIMEOUT): no rank of "
                                         "it was lost, or idist-run ran with --recovery off",
                                         duration_text(contract_.timeout)));
  // A slow survivor may find more than one generation formed since its own: the newest counts.
  while (generation_store_->check({env::generation_key(next + 1)})[0]) ++next;
  auto said = parse_word(generation_store_->get(env::generation_key(next)), next);
  std::lock_guard lock(connect_mu_);
  generation_ = next;
  connect_host_ = said.store_host.empty() ? contract_.recovery_host : said.store_host;
  connect_port_ = said.store_host.empty() ? contract_.recovery_port : said.store_port;
  return std::move(said.members);
}

void Runtime::adopt_generation(const std::vector<int>& members, int me) {
  // Where each member runs is learnt again at the generation's join (connect_generation): a
  // replacement knows nothing of the world it joins, and may run on any node.
  hosts_.clear();
  origins_ = members;
  contract_.rank = me;
  contract_.world_size = static_cast<int>(members.size());
}

void Runtime::place_on_hosts() {
  auto& c = contract_;
  const auto me = static_cast<std::size_t>(c.rank);
  c.local_rank = static_cast<int>(std::count(hosts_.begin(), hosts_.begin() + c.rank, hosts_[me]));
  c.local_world_size = static_cast<int>(std::count(hosts_.begin(), hosts_.end(), hosts_[me]));
}

bool Runtime::loss_after(std::uint64_t g) {
  generation_store();
  // A generation that only admits a replacement (";grow") supersedes nothing: the ranks that
  // connected go on, and admit it later together; idist-run announces one at a time.
  for (auto next = g + 1; generation_store_->check({env::generation_key(next)})[0]; ++next) {
    const auto word = generation_store_->get(env::generation_key(next));
    if (!std::string_view(word.data(), word.size()).ends_with(env::kGrowTag)) return true;
  }
  return false;
}

bool Runtime::connect_generation() {
  // A connection of this generation's own, which the watcher below can cut: a member that died
  // before it connected (a second loss) would otherwise hold every other in the connect until
  // IDIST_TIMEOUT. The watcher asks idist-run's store, on the connection reform() waited on,
  // whether a newer generation replaced this one.
  auto connection = std::make_shared<TcpStore>(
      TcpStoreOptions{connect_host_, connect_port_, contract_.job_token, contract_.timeout});
  store_ = std::make_unique<PrefixStore>(connection, generation_prefix(generation_));
  std::atomic<bool> superseded = false;
  std::jthread watcher([&](std::stop_token stop) {
    while (!stop.stop_requested()) {
      try {
        if (loss_after(generation_)) {
          superseded = true;
          connection->interrupt();
          return;
        }
      } catch (const std::exception&) {
        return;  // idist-run is gone: the connect ends on its own
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  try {
    // As at init: each member says where it runs and what it agreed to, so the new world
    // learns its hosts (shared memory among a host's ranks) and refuses a replacement
    // started with other settings.
    join(Clock::now() + contract_.timeout, agreed_settings(contract_, backend_, recovery_));
    place_on_hosts();
    connect_world(&superseded);
  } catch (const std::exception&) {
    watcher.request_stop();
    watcher.join();
    // A member that died after it published its address fails the connect before idist-run
    // has announced what follows (it waits out its settle): a moment for that word.
    if (superseded || poll_until([&]() -> bool { return loss_after(generation_); },
                                 Clock::now() + std::chrono::seconds(2), kStorePolicy))
      return false;
    throw;
  }
  watcher.request_stop();
  watcher.join();
  // Cut just after it connected: this generation's store connection is gone, so it goes too.
  // Asked once more, as the watcher looks only every 20 ms: a replacement that went on into a
  // generation a loss had just replaced would say it joined one that no longer has it, and be
  // fenced out at its re-form instead of waiting to be admitted again.
  bool replaced = superseded;
  try {
    replaced = replaced || loss_after(generation_);
  } catch (const std::exception&) {
    // idist-run is gone: the world's first collective says so
  }
  if (replaced) {
    drop_groups();
    return false;
  }
  return true;
}

void Runtime::watch_generations() {
  if (!recovery_ || contract_.recovery_host.empty()) return;
  generation_watch_ = std::make_unique<GenerationWatch>(
      TcpStoreOptions{contract_.recovery_host, contract_.recovery_port, contract_.job_token, contract_.timeout},
      GenerationWatch::Calls{
          .current = [this] { return generation_.load(); },
          .superseded =
              [this](std::uint64_t g) { abort_generation(g, "idist-run formed the next generation without a rank"); },
          .replacement = [this](std::uint64_t g) { growth_at_ = std::max(growth_at_.load(), g); }});
}

void Runtime::join_when_ready() {
  std::lock_guard lock(pending_mu_);
  if (!pending_join_) return;
  const ErrorSite site{contract_.rank, contract_.world_size, "join_running", backend_};
  // idist-run admits a replacement once it beats: from now, its program set up, so that the
  // running ranks wait at its admission for its connect and catch-up, not for its setup.
  heartbeat_ = std::make_unique<Heartbeat>(launcher_segment());
  try {
    join_running(site);
  } catch (...) {
    // No world, and no beat that says it is ready: later calls say the join failed.
    heartbeat_.reset();
    pending_join_ = false;
    throw;
  }
  rendezvous_ = true;
  watch_generations();
  pending_join_ = false;
}

void Runtime::join_running(const ErrorSite& site) {
  generation_ = contract_.replacement_after;
  const int origin = contract_.replacement_origin;
  // Admitted at the running ranks' next step boundary, which may be far off (a program that
  // admits none leaves it here until idist-run stops it at the job's end).
  const auto deadline = Clock::now() + std::chrono::hours(24 * 365);
  // Its connect too, which the running ranks come to only at that boundary (a day: the
  // backends' waits take no more); IDIST_TIMEOUT again once it is in.
  const auto timeout = contract_.timeout;
  contract_.timeout = std::max<std::chrono::milliseconds>(timeout, std::chrono::hours(24));
  struct Restore {
    std::chrono::milliseconds& at;
    std::chrono::milliseconds was;
    ~Restore() { at = was; }
  } restore{contract_.timeout, timeout};
  raised_at(site, [&] {
    for (;;) {
      const auto members = next_generation_members(site, deadline);
      const auto me = std::find(members.begin(), members.end(), origin);
      // A generation formed without it (another loss before it was admitted): the next one.
      if (me == members.end()) continue;
      adopt_generation(members, static_cast<int>(me - members.begin()));
      if (connect_generation()) break;
    }
  });
  generation_store_->set(env::joined_key(generation_, origin), {});
  joined_as_ = ReformResult{generation_, -1, contract_.rank, contract_.world_size, {}, {contract_.rank}};
  joining_ = true;
}

ReformResult Runtime::reform(bool admitting) {
  join_when_ready();  // a replacement that has not joined yet: nothing to re-form before that
  ErrorSite site{contract_.rank, contract_.world_size, "reform", backend_};
  if (!recovery_)
    throw Error(site, "init() was not asked for live recovery: set InitOptions::recovery = true");
  if (contract_.recovery_host.empty())
    throw Error(site, "no idist-run offers live recovery here (IDIST_RECOVERY_STORE is unset): start the program with "
                      "idist-run -n N (spawn mode on one host), without --recovery off");
  const int old_rank = contract_.rank;
  const auto before = origins_;
  const auto origin = origins_[static_cast<std::size_t>(old_rank)];
  return raised_at(site, [&] {
    // Admitting a replacement at a step boundary the ranks agreed on: nobody is lost, and a peer
    // may still be in the step's last collective, so the old groups stay, unaborted, until the
    // new world is connected (every member left the step by then). After a loss (one announced
    // meanwhile too), the cascade ends them here and on every peer.
    admitting = admitting && !loss_after(generation_);
    if (!admitting) abort_generation(generation_, "this rank re-forms");
    Groups held;
    do {
      const auto members = next_generation_members(site, Clock::now() + contract_.timeout);
      const auto me = std::find(members.begin(), members.end(), origin);
      if (me == members.end()) fenced_out(site, generation_);
      if (admitting && !held.world) {
        held = take_groups();
      } else {
        drop_groups();
      }
      groups_made_ = 0;
      monitored_barriers_.clear();
      // Handles of the old generation's groups are refused from now on, and the flight
      // recorder numbers this generation's calls afresh.
      id_ = next_runtime_id();
      aborted_generation_ = ~std::uint64_t{0};
      adopt_generation(members, static_cast<int>(me - members.begin()));
      site = ErrorSite{contract_.rank, contract_.world_size, "reform", backend_};
    } while (!connect_generation());
    generation_store_->set(env::joined_key(generation_, origin), {});
    std::vector<int> lost, joined;
    for (std::size_t r = 0; r < before.size(); ++r)
      if (std::find(origins_.begin(), origins_.end(), before[r]) == origins_.end()) lost.push_back(static_cast<int>(r));
    for (std::size_t r = 0; r < origins_.size(); ++r)
      if (std::find(before.begin(), before.end(), origins_[r]) == before.end()) joined.push_back(static_cast<int>(r));
    return ReformResult{generation_,          old_rank,        contract_.rank,
                        contract_.world_size, std::move(lost), std::move(joined)};
  });
}

}  // namespace idist::detail

namespace idist {

ReformResult reform() { return detail::runtime("reform").reform(false); }
ReformResult admit_replacements() { return detail::runtime("admit_replacements").reform(true); }
void will_admit_replacements(bool admits) {
  if (auto* segment = detail::launcher_segment())
    segment->admits_pid.store(admits ? static_cast<std::int32_t>(::getpid()) : 0, std::memory_order_release);
}
bool replacement_waiting() {
  const auto* r = detail::runtime_if_initialized();
  return r != nullptr && r->replacement_waiting();
}
bool peer_lost() {
  const auto* r = detail::runtime_if_initialized();
  return r != nullptr && r->peer_lost();
}
bool is_replacement() {
  const auto* r = detail::runtime_if_initialized();
  return r != nullptr && r->is_replacement();
}
ReformResult replacement_joined() {
  auto& rt = detail::runtime("replacement_joined");
  rt.join_when_ready();
  const auto& joined = rt.replacement_joined();
  if (!joined)
    throw Error(ErrorSite{get_rank(), get_world_size(), "replacement_joined", backend()},
                "this rank is no replacement (idist-run did not start it in a lost rank's place)");
  return *joined;
}
void replacement_caught_up() {
  if (auto* r = detail::runtime_if_initialized()) r->replacement_caught_up();
}

}  // namespace idist
