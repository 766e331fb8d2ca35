#pragma once
// Waiting on words in shared memory, the one policy for the shm backend: spin for a moment
// (a peer on another core usually answers within microseconds), then sleep on a futex in naps,
// between which the caller checks what can end the wait early (a dead peer, the deadline).
// When ranks outnumber cores, spinning takes the core from the very rank being waited for, so
// the spin then yields the processor at every turn instead of burning it (the group's own
// ranks outnumber the cores, or the rank's cpus are shared: common/cpus_shared.hpp); and even
// with a core each, the scheduler sometimes puts two ranks on one core for a while, which a
// waiter sees from the cpu its poster last posted from (Word::poster_cpu): it then yields too.

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/cpus_shared.hpp"

namespace idist::detail::shm {

using Clock = std::chrono::steady_clock;

// A 32-bit word that other processes change, and how many of them sleep on it, in a cache line
// of its own. post() wakes the futex only when someone sleeps: the common case is a store.
// The rest of the line carries what the word's owner says of the step it posts (the shm
// backend's call notes): written before the post, read by whoever saw the post, in the same
// cache line, so a reader that waited on the word pays nothing more to read them.
struct alignas(64) Word {
  std::atomic<std::uint32_t> value{0};
  std::atomic<std::uint32_t> sleepers{0};
  // By step modulo 3: with one-sided steps (shm_backend.cpp) a rank may post up to two steps
  // past one that a peer has yet to read the notes of.
  std::atomic<std::uint64_t> note[3][2]{};
  // Who posted last, and from which cpu (sched_getcpu; -1: none yet): see wait_for. A rank's
  // arrival and a ring's head or tail have one poster; the generation's is whichever rank
  // arrives last, which may be the waiter itself, hence the process.
  std::atomic<std::int32_t> poster_cpu{-1};
  std::atomic<std::int32_t> poster_pid{0};
};
static_assert(sizeof(Word) == 64, "a Word is one cache line");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex words must be plain 32-bit words");

// Stores `value` and wakes every sleeper.
void post(Word& word, std::uint32_t value);
// Adds `delta` and wakes every sleeper; returns the new value.
std::uint32_t post_add(Word& word, std::uint32_t delta);
// Wakes every sleeper without changing the word: they look again, and at what ended their wait.
void wake_now(Word& word);

// Counters wrap around: `a` has reached `b` when it is at most 2^31 ahead of it.
inline bool reached(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) >= 0; }

struct WaitPolicy {
  bool oversubscribed = false;  // more ranks in the group than cores on this host
};

// Spins for a moment (impl::kSpin) until ready() holds; false if it did not. Yields as
// wait_for does, from what `watched` says of its last poster.
template <class Ready>
bool spin_for(const Word& watched, const WaitPolicy& policy, Ready&& ready);

// Spins, then sleeps, until ready(word's value) holds. Between naps (at most `nap` each), calls
// between_naps(), which throws to end the wait.
template <class Ready, class BetweenNaps>
void wait_for(Word& word, const WaitPolicy& policy, Ready&& ready, BetweenNaps&& between_naps);

// --- implementation ----------------------------------------------------------------------------

namespace impl {
void pause_once(bool oversubscribed);
// Whether another process last posted `word` from the cpu this thread runs on (sched_getcpu:
// a load from the rseq area where glibc registers one, else the vDSO).
bool poster_shares_cpu(const Word& word);
// FUTEX_WAIT while the word holds `seen`, for at most `nap`; returns at once if it does not.
void sleep_while(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds nap);
inline constexpr auto kSpin = std::chrono::microseconds(50);
inline constexpr auto kNap = std::chrono::milliseconds(20);
}  // namespace impl

template <class Ready>
bool spin_for(const Word& watched, const WaitPolicy& policy, Ready&& ready) {
  if (ready()) return true;
  // Spin, looking at the clock every few turns only: it costs more than a turn.
  const auto spin_until = Clock::now() + impl::kSpin;
  // The spin yields where the rank it waits for last posted from this very cpu (asked after a
  // few turns, past the answers that come at once, and again every 16): there only a yield lets
  // it run, and pausing through a budget first cost 20 us per 8-byte all_reduce on 2 ranks the
  // scheduler had put on one core (5.3-6.1 us yielding at once; 0.3-0.8 on two cores). Elsewhere
  // it never yields: a yield gives nothing to the rank waited for, but this core, for a whole
  // slice, to whatever else runs here (a compiler on a busy machine).
  bool yield = policy.oversubscribed || cpus_shared();
  for (unsigned turn = 1;; ++turn) {
    impl::pause_once(yield);
    if (ready()) return true;
    if (turn % 16 == 8 && !policy.oversubscribed) yield = cpus_shared() || impl::poster_shares_cpu(watched);
    if (turn % 64 == 0 && Clock::now() > spin_until) return false;
  }
}

template <class Ready, class BetweenNaps>
void wait_for(Word& word, const WaitPolicy& policy, Ready&& ready, BetweenNaps&& between_naps) {
  if (spin_for(word, policy, [&] { return ready(word.value.load(std::memory_order_acquire)); })) return;
  // between_naps() runs before every sleep, not only after one: what ends a wait early (a
  // peer's death) is announced by a wake-up that is lost when it comes before we sleep, and the
  // nap would then run its course while a launcher stops us.
  struct Sleeping {
    Word& word;
    Sleeping(Word& w) : word(w) { word.sleepers.fetch_add(1, std::memory_order_seq_cst); }
    ~Sleeping() { word.sleepers.fetch_sub(1, std::memory_order_relaxed); }
  };
  for (;;) {
    {
      Sleeping sleeping(word);
      const auto seen = word.value.load(std::memory_order_seq_cst);
      if (ready(seen)) return;
      between_naps();
      impl::sleep_while(word.value, seen, impl::kNap);
    }
    if (ready(word.value.load(std::memory_order_acquire))) return;
  }
}

}  // namespace idist::detail::shm
