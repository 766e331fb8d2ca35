#include "backends/shm/sync.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace idist::detail::shm {
namespace {

// Not FUTEX_PRIVATE_FLAG: the word is in memory that other processes map.
long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

// This process, as posts record it: read once (getpid is a system call). A child forked
// later keeps its parent's, which only matters to a child that joins its parent's group, and
// none does: ranks are exec'd.
const std::int32_t kThisProcess = static_cast<std::int32_t>(::getpid());

void record_poster(Word& word) {
  word.poster_cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  word.poster_pid.store(kThisProcess, std::memory_order_relaxed);
}

void wake_all(Word& word) {
  if (word.sleepers.load(std::memory_order_seq_cst) > 0) futex(word.value, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace

void post(Word& word, std::uint32_t value) {
  record_poster(word);
  word.value.store(value, std::memory_order_seq_cst);
  wake_all(word);
}

std::uint32_t post_add(Word& word, std::uint32_t delta) {
  record_poster(word);
  const auto now = word.value.fetch_add(delta, std::memory_order_seq_cst) + delta;
  wake_all(word);
  return now;
}

void wake_now(Word& word) { futex(word.value, FUTEX_WAKE, INT_MAX, nullptr); }

namespace impl {

void pause_once(bool oversubscribed) {
  if (oversubscribed) {
    ::sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool poster_shares_cpu(const Word& word) {
  const auto cpu = word.poster_cpu.load(std::memory_order_relaxed);
  return cpu >= 0 && word.poster_pid.load(std::memory_order_relaxed) != kThisProcess && ::sched_getcpu() == cpu;
}

void sleep_while(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds nap) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
  const timespec timeout{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
  futex(word, FUTEX_WAIT, seen, &timeout);
}

}  // namespace impl
}  // namespace idist::detail::shm
