#include "trace_watch.hpp"

#include "idist/common/trace_area.hpp"
#include "rank_process.hpp"

namespace idist::launchers::supervision {

namespace {

namespace rec = common::recorder;

// Often enough that a training's calls are all taken (a ring holds 8,192), rarely enough to
// cost nothing; an 8-byte loop outruns it, and the file says how many calls were not kept.
constexpr auto kReadEvery = std::chrono::milliseconds(20);
// What idist-run keeps of a node's calls in all (about 50 bytes each here, 300 in the file),
// shared by every rank of every attempt.
constexpr std::size_t kKeptCalls = 1'000'000;
constexpr std::size_t kKeptPerRankAtLeast = 10'000;
// How long node 0 waits at the end for the other nodes' parts.
constexpr auto kWaitForParts = std::chrono::seconds(10);

// The entry numbered `n` when it is whole: its call, or nullopt while a writer holds it or has
// not reached it, while the call is open (unless `last`), or once a newer call took it (`lost`).
std::optional<detail::TracedCall> take(const rec::TraceEntry& e, std::uint64_t n, bool last, bool& lost) {
  lost = false;
  const auto number = e.number.load(std::memory_order_acquire);
  if (number != n + 1) {
    lost = (number & ~rec::kTraceBusy) > n + 1;
    return std::nullopt;
  }
  detail::TracedCall c{.end_ns = e.end_ns.load(std::memory_order_acquire)};
  c.state = e.state.load(std::memory_order_relaxed);
  c.start_ns = e.start_ns;
  c.seq = e.seq;
  c.bytes = e.bytes;
  c.epoch = e.epoch;
  c.group = e.group;
  c.root = e.root;
  c.op = e.op;
  c.kind = e.kind;
  std::atomic_thread_fence(std::memory_order_acquire);
  if (const auto now = e.number.load(std::memory_order_relaxed); now != number) {
    lost = (now & ~rec::kTraceBusy) > n + 1;  // else it is ending now: the next reading takes it
    return std::nullopt;
  }
  if (c.end_ns == 0 && !last) return std::nullopt;
  return c;
}

}  // namespace

void TraceReader::read(const RecorderMemory& memory, bool last, std::size_t keep) {
  const auto* area = memory.trace();
  if (area == nullptr) return;
  for (std::uint32_t r = 0; r < rec::kRings; ++r) {
    const auto& ring = area->rings[r];
    auto& cur = cursors_[r];
    const auto next = ring.next.load(std::memory_order_acquire);
    if (next > cur.next + rec::kTraceEntries) {  // gone round since: those calls are lost
      const auto from = next - rec::kTraceEntries;
      std::uint64_t had = 0;
      for (auto it = cur.resolved.begin(); it != cur.resolved.end() && *it < from;) {
        ++had;
        it = cur.resolved.erase(it);
      }
      taken_.lost += from - cur.next - had;
      cur.next = from;
    }
    bool held = false;
    for (auto n = cur.next; n < next; ++n) {
      if (cur.resolved.contains(n)) {
        if (!held) {
          cur.resolved.erase(n);
          cur.next = n + 1;
        }
        continue;
      }
      bool lost = false;
      auto call = take(ring.entries[n % rec::kTraceEntries], n, last, lost);
      // At the end an entry still being written (the rank died writing it) is no call.
      const bool resolved = call || lost || last;
      if (call) taken_.calls.push_back(*call);
      if (lost) ++taken_.lost;
      if (!resolved) held = true;
      else if (held) cur.resolved.insert(n);
      else cur.next = n + 1;
    }
  }
  read_steps(area->steps, last);
  trim(keep);
}

void TraceReader::read_steps(const rec::TraceSteps& steps, bool last) {
  const auto next = steps.next.load(std::memory_order_acquire);
  if (next > steps_next_ + rec::kTraceSteps) steps_next_ = next - rec::kTraceSteps;  // gone round: lost
  for (; steps_next_ < next; ++steps_next_) {
    const auto& mark = steps.marks[steps_next_ % rec::kTraceSteps];
    const auto number = mark.number.load(std::memory_order_acquire);
    const auto at = mark.at_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (number == steps_next_ + 1 && mark.number.load(std::memory_order_relaxed) == number) {
      taken_.steps.emplace_back(number, at);
    } else if (number < steps_next_ + 1 && !last) {
      break;  // being written: the next reading takes it
    }
  }
}

void TraceReader::trim(std::size_t keep) {
  if (taken_.steps.size() > keep)
    taken_.steps.erase(taken_.steps.begin(), taken_.steps.end() - static_cast<std::ptrdiff_t>(keep));
  if (taken_.calls.size() <= keep) return;
  const auto drop = taken_.calls.size() - keep;
  taken_.lost += drop;
  taken_.calls.erase(taken_.calls.begin(), taken_.calls.begin() + static_cast<std::ptrdiff_t>(drop));
}

void TraceWatch::start(std::function<LiveAttempt*()> watched) {
  if (!on()) return;
  watched_ = std::move(watched);
  check();
}

void TraceWatch::stop() {
  stopped_ = true;
  timer_.cancel();
}

void TraceWatch::read(LiveAttempt& attempt, bool last) {
  for (auto& r : attempt.ranks) {
    if (!r.recorder) continue;
    auto [it, fresh] = readers_.try_emplace(r.recorder.get(), r.spec->rank, attempt.record.index);
    if (fresh)  // one more rank shares what is kept: the others keep less from now on
      for (auto& [memory, reader] : readers_) reader.trim(keep());
    it->second.read(*r.recorder, last || !r.running(), keep());
  }
}

std::size_t TraceWatch::keep() const {
  return std::max(kKeptPerRankAtLeast, kKeptCalls / std::max<std::size_t>(1, readers_.size()));
}

void TraceWatch::check() {
  if (stopped_) return;
  if (LiveAttempt* attempt = watched_()) read(*attempt, false);
  timer_.expires_after(kReadEvery);
  timer_.async_wait([this](auto ec) {
    if (!ec) check();
  });
}

std::string TraceWatch::write(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, detail::TraceNode node) {
  for (const auto& a : attempts) read(*a, true);
  node.end_ns = rec::precise_ns();  // the ranks' clock, not the coarse one
  for (const auto& a : attempts)
    for (const auto& r : a->ranks)
      if (const auto it = readers_.find(r.recorder.get()); r.recorder && it != readers_.end())
        node.ranks.push_back(it->second.taken());
  return detail::write_trace(path_, node, node.node_rank == 0 ? kWaitForParts : std::chrono::milliseconds(0));
}

}  // namespace idist::launchers::supervision
