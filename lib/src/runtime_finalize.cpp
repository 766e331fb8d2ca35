// finalize(), and what the ranks say as they leave (runtime.hpp). In rank 0's store:
//   finalized/<rank>       "<world collectives begun>\t<note>": the rank has left, and how far
//                          it got ("called finalize() after 6 steps")
//   abandoned/<rank>       a peer left waiting in a collective <rank> never began:
//                          "<its rank>\t<its call>"; <rank>'s finalize() raises on it
//   abandoned_read/<rank>  <rank> has read it (rank 0, hosting the store, waits for that)
// Without a store (MPI's own world) the mpi backend carries the same (mpi/departures.hpp).
#include <spdlog/fmt/fmt.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include "common/duration.hpp"
#include "store/tcp_store.hpp"
#include "log.hpp"
#include "runtime.hpp"
#include "store_keys.hpp"

namespace idist::detail {
using namespace store_keys;

namespace {

// wait_for_the_others(): live recovery announced a new generation while this rank left.
struct LostWhileLeaving : std::exception {};

constexpr const char* kUneven = "the ranks ran different numbers of steps (uneven data? see idist::join)";

std::mutex note_mu;
std::string default_note() { return "left the group (its program ended without finalize())"; }
std::string& leaving_note() {
  static std::string note = default_note();
  return note;
}
std::atomic<bool> in_finalize{false};
std::string left_waiting;  // left_behind(), under note_mu

struct Note {
  std::uint64_t calls = 0;
  std::string text;
};

Note parse_note(const std::vector<char>& value) {
  const std::string s(value.begin(), value.end());
  const auto tab = s.find('\t');
  if (tab == std::string::npos) return {0, s};
  return {std::strtoull(s.c_str(), nullptr, 10), s.substr(tab + 1)};
}

std::string key(const char* what, int rank) { return fmt::format("{}{}/{}", kWorldPrefix, what, rank); }

// finalize()'s line where a peer was left waiting: `abandoned` is "<its rank>\t<its call>".
[[noreturn]] void raise_left_behind(const ErrorSite& site, const std::string& abandoned, const std::string& note) {
  const auto tab = abandoned.find('\t');
  throw Error(site, fmt::format("rank {} was left waiting for this rank in {}, which this rank never called: it {}; {}",
                                abandoned.substr(0, tab), abandoned.substr(tab + 1), note, kUneven));
}

}  // namespace

std::string departure_note() {
  std::lock_guard lock(note_mu);
  return leaving_note();
}

void left_behind(const std::string& what) {
  std::lock_guard lock(note_mu);
  left_waiting = what;
}

bool finalizing() { return in_finalize.load(std::memory_order_relaxed); }

std::string Runtime::leaving_words() const {
  const auto steps = steps_.load(std::memory_order_relaxed);
  if (steps > 0) return fmt::format("called finalize() after {} step{}", steps, steps == 1 ? "" : "s");
  const auto calls = world_ ? world_->calls() : world_calls_;
  return fmt::format("called finalize() after {} collective{}", calls, calls == 1 ? "" : "s");
}

std::string Runtime::those_that_left(Store& store, const std::vector<int>& members, std::vector<bool>& present) const {
  std::vector<std::string> left;
  for (std::size_t g = 0; g < present.size(); ++g) {
    if (present[g] || !store.check({key("finalized", members[g])})[0]) continue;
    left.push_back(fmt::format("rank {} {}", members[g], parse_note(store.get(key("finalized", members[g]))).text));
    present[g] = true;
  }
  return left.empty() ? std::string() : fmt::format("{}: {}", fmt::join(left, ", "), kUneven);
}

std::vector<bool> Runtime::finalized_among(Store& store, const std::vector<int>& members) const {
  std::vector<std::string> keys;
  for (int r : members) keys.push_back(key("finalized", r));
  return check_all(store, keys);
}

std::string Runtime::explain_departure(const std::vector<int>& members, int me, int member, bool world,
                                       std::string_view op, std::uint64_t number) {
  std::vector<int> candidates;
  for (std::size_t g = 0; g < members.size(); ++g)
    if (static_cast<int>(g) != me && (member < 0 || static_cast<int>(g) == member)) candidates.push_back(members[g]);
  std::vector<std::string> keys;
  for (int r : candidates) keys.push_back(key("finalized", r));
  // Briefly: a rank that left through finalize() left rank 0's store up (rank 0 waits there
  // for everyone); one that died may have been rank 0, and then there is no note to find.
  auto store = probe(std::chrono::milliseconds(300));
  const auto present = check_all(*store, keys);
  std::vector<std::string> left;
  std::vector<int> leavers;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) continue;
    const auto note = parse_note(store->get(keys[i]));
    // On the world, a leaver that began this very call has sent its part: another is to blame
    // (where the transport cannot tell which peer it lost, as gloo's closed sockets).
    if (world && note.calls > number) continue;
    left.push_back(fmt::format("rank {} {}", candidates[i], note.text));
    leavers.push_back(candidates[i]);
  }
  if (left.empty()) return "";
  tell_leavers(*store, leavers, fmt::format("{} #{}", op, number));
  return fmt::format("{} while this rank waits for it in {} #{}: {}", fmt::join(left, ", "), op, number, kUneven);
}

void Runtime::tell_leavers(Store& store, const std::vector<int>& leavers, const std::string& call) const {
  if (leavers.empty()) return;
  // Each leaver waits in its finalize() for its own key: it, too, must not end with exit 0.
  const auto mine = fmt::format("{}\t{}", contract_.rank, call);
  for (int r : leavers) store.set(key("abandoned", r), std::vector<char>(mine.begin(), mine.end()));
  if (contract_.rank == 0) {
    // This rank hosts the store and is about to raise: the leaver reads its key first, and
    // the others left waiting with us, who notice at about the same moment, read the notes.
    try {
      store.wait({key("abandoned_read", leavers.front())}, std::chrono::seconds(2));
    } catch (const std::exception&) {
      // It had its moment.
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

std::string Runtime::wait_for_the_others() {
  const auto mine = key("abandoned", contract_.rank);
  if (contract_.rank != 0 && generation_ == 0) {
    // Set only where a peer was left waiting: otherwise the wait ends when rank 0 closes the
    // store, everyone having come (or, failing that, after the timeout). After a re-form the
    // store is idist-run's, which no rank closes: every rank watches as rank 0 does.
    const auto text = store_->get(mine);
    return std::string(text.begin(), text.end());
  }
  const auto keys = numbered_keys(std::string(kWorldPrefix) + "finalized/", contract_.world_size);
  std::string text;
  // Live recovery: a rank lost while the others leave never finalizes, and idist-run announces
  // the next generation instead; this rank's work is then not the whole job's, so say so now
  // rather than after IDIST_TIMEOUT.
  std::unique_ptr<Store> recovery;
  if (recovery_ && !contract_.recovery_host.empty())
    recovery = std::make_unique<TcpStore>(
        TcpStoreOptions{contract_.recovery_host, contract_.recovery_port, contract_.job_token, contract_.timeout});
  auto next = generation_ + 1;
  const bool all = poll_until(
      [&] {
        if (recovery && recovery->check({env::generation_key(next)})[0]) {
          const auto word = recovery->get(env::generation_key(next));
          // A replacement waiting to join is no loss: the job ends before it is admitted.
          if (!std::string_view(word.data(), word.size()).ends_with(env::kGrowTag)) throw LostWhileLeaving();
          ++next;
        }
        if (store_->check({mine})[0]) {
          const auto value = store_->get(mine);
          text.assign(value.begin(), value.end());
          return true;
        }
        return count_missing(check_all(*store_, keys)) == 0;
      },
      Clock::now() + contract_.timeout, kStorePolicy);
  if (!all) throw TimeoutFailure(fmt::format("not every rank reached finalize() within {}", duration_text(contract_.timeout)));
  return text;
}

void Runtime::finalize() {
  const auto note = leaving_words();
  {
    std::lock_guard lock(note_mu);
    leaving_note() = note;
  }
  in_finalize = true;
  // A later init() starts a new life: its groups' ends at exit are exits again.
  struct Done {
    ~Done() {
      in_finalize = false;
      std::lock_guard lock(note_mu);
      leaving_note() = default_note();
    }
  } done;
  const ErrorSite site{contract_.rank, contract_.world_size, "finalize", backend_};
  if (world_) world_calls_ = world_->calls();
  if (!rendezvous_) {
    // No store (MPI's own world, or a world of one): the backend tells its peers that this
    // rank leaves and waits for theirs (mpi/departures.hpp), saying who it left waiting.
    drop_groups();
    std::string abandoned;
    {
      std::lock_guard lock(note_mu);
      abandoned = std::exchange(left_waiting, std::string());
    }
    if (!abandoned.empty()) raise_left_behind(site, abandoned, note);
    return;
  }
  try {
    const auto value = fmt::format("{}\t{}", world_calls_, note);
    store_->set(key("finalized", contract_.rank), std::vector<char>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    detail::log().warn("[idist rank {}/{}] finalize: the store does not answer ({}); tearing down anyway", contract_.rank,
                       contract_.world_size, e.what());
    return;
  }
  // Our groups go first, on every rank: a peer still waiting for this rank in a collective
  // then fails now, naming it (the note above), rather than at its timeout; and a backend's
  // teardown may need its peers (nccl's), who are tearing down too.
  drop_groups();
  std::string abandoned;
  try {
    abandoned = wait_for_the_others();
  } catch (const LostWhileLeaving&) {
    throw Error(site, "a rank was lost while the ranks finalized, so this rank's results are not the whole job's: "
                      "idist-run re-formed the job (generation " + std::to_string(generation_ + 1) +
                      "), but finalize() cannot; redo the work or restart (--max-restarts)");
  } catch (const TimeoutFailure& e) {
    // finalize() must not hang; a peer that never arrived is worth a warning.
    detail::log().warn("[idist rank {}/{}] finalize: {}; leaving anyway", contract_.rank, contract_.world_size, e.what());
  } catch (const std::exception&) {
    // Rank 0 closed the store: everyone came.
  }
  if (abandoned.empty()) return;
  try {
    store_->set(key("abandoned_read", contract_.rank), {});
  } catch (const std::exception&) {
    // It is raising already.
  }
  // Hosting the store: the others left waiting get a moment to read this rank's note.
  if (contract_.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  raise_left_behind(site, abandoned, note);
}

}  // namespace idist::detail
