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

void wake_all(Word& word) {
  if (word.sleepers.load(std::memory_order_seq_cst) > 0) futex(word.value, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace

void post(Word& word, std::uint32_t value) {
  word.poster_cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  word.value.store(value, std::memory_order_seq_cst);
  wake_all(word);
}

std::uint32_t post_add(Word& word, std::uint32_t delta) {
  word.poster_cpu.store(::sched_getcpu(), std::memory_order_relaxed);
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

bool on_this_cpu(std::int32_t cpu) { return cpu >= 0 && ::sched_getcpu() == cpu; }

void sleep_while(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds nap) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
  const timespec timeout{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
  futex(word, FUTEX_WAIT, seen, &timeout);
}

}  // namespace impl
}  // namespace idist::detail::shm
