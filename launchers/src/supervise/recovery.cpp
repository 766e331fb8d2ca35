#include "recovery.hpp"

#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "idist/common/duration.hpp"
#include "idist/env_contract.hpp"
#include "rendezvous/generations.hpp"

namespace idist::launchers::supervision {

namespace {

// A survivor failing this soon after a loss failed of it (see recent_loss).
constexpr auto kConsequenceWindow = std::chrono::seconds(2);

std::string job_token(const Attempt& attempt) {
  const std::string tag = std::string(env::kJobToken) + "=";
  if (attempt.processes.empty()) return "";
  for (const auto& e : attempt.processes.front().env)
    if (e.rfind(tag, 0) == 0) return e.substr(tag.size());
  return "";
}

}  // namespace

std::string why_not_reform(const RecoveryFacts& f) {
  if (!f.offered) return "recovery is not offered (--recovery off, or no generation store)";
  if (!f.lost) return "the rank failed on its own (a non-zero exit is the program's verdict, not a loss)";
  if (f.survivors == 0 && !f.joint) return "no rank is left";
  if (f.survivors < f.min_world && !f.joint)
    return fmt::format("{} rank{} would be left, fewer than --min-world {}", f.survivors, f.survivors == 1 ? "" : "s",
                       f.min_world);
  if (f.opted_in < f.survivors)
    return fmt::format("{} of the {} ranks left{} did not opt in (idist::InitOptions::recovery)",
                       f.survivors - f.opted_in, f.survivors, f.joint ? " on this node" : "");
  return "";
}

LiveRecovery::LiveRecovery(asio::io_context& io, bool wanted, int min_world, Coordinator* coordinator)
    : io_(io),
      wanted_(wanted),
      min_world_(min_world),
      coordinator_(coordinator) {}

LiveRecovery::~LiveRecovery() = default;

Coordinator::Events LiveRecovery::hear(Coordinator::Events events, std::function<LiveAttempt*()> current) {
  events.reformed = [this, current](std::uint64_t g, const std::string& line, const std::vector<int>& members) {
    reformed(current(), g, line, members);
  };
  events.replace = [this, current](int lost, int origin, std::uint64_t after) {
    replace_granted(current(), lost, origin, after);
  };
  events.members_ended = [this, current](const std::vector<int>& unjoined) { members_ended(current(), unjoined); };
  return events;
}

void LiveRecovery::allow_replacements(int max, StartRank start, std::function<void()> recheck) {
  max_replacements_ = max;
  start_rank_ = std::move(start);
  recheck_ = std::move(recheck);
}

void LiveRecovery::answered(int lost) {
  if (awaited_.empty()) return;
  if (lost < 0) awaited_.clear();
  std::erase(awaited_, lost);
  if (awaited_.empty() && recheck_) recheck_();
}

void LiveRecovery::make_room(LiveAttempt& a) const {
  const auto n = a.attempt.processes.size();
  const auto room = n + static_cast<std::size_t>(wanted_ ? max_replacements_ : 0);
  a.attempt.processes.reserve(room);
  a.record.ranks.reserve(room);
  a.ranks.reserve(room);
  a.record.ranks.resize(n);
  a.ranks.resize(n);
}

void LiveRecovery::offer(Attempt& attempt) {
  stand_down();
  // A store for each attempt: a restarted attempt's ranks count generations from 0 again, and
  // must not find the last attempt's announcements.
  generations_.reset();
  offered_ = false;
  capable_ = false;
  admits_said_ = false;
  covered_ = 0;
  lost_.clear();
  announced_ = 0;
  attempt_ = nullptr;
  to_replace_.clear();
  joining_.clear();
  awaited_.clear();
  reform_index_.clear();
  heard_.clear();
  admitted_.clear();
  world0_ = attempt.processes.size();
  if (!wanted_) return;
  std::string address;
  if (joint()) {
    address = coordinator_->assignment().recovery_store;  // none: its store failed
  } else {
    try {
      generations_ = std::make_unique<rendezvous::Generations>(
          io_, "127.0.0.1", job_token(attempt),
          static_cast<int>(attempt.processes.size()),
          [this](std::uint64_t g, const std::vector<int>&, const std::string& line, bool loss) {
            if (attempt_ == nullptr) return;
            reform_index_[g] = attempt_->record.reforms.size();
            attempt_->record.reforms.push_back(line);
            if (!loss) return;
            last_cause_ = announced_;
            announced_ = lost_.size();
            for (const Rank* lost : std::exchange(to_replace_, {})) replace(*attempt_, *lost, g);
          });
      generations_->on_taken([this](std::uint64_t g, double seconds) { taken(g, seconds); });
      address = fmt::format("{}:{}", generations_->listen_address(), generations_->port());
    } catch (const std::exception& e) {
      spdlog::warn("live recovery is off for this job: cannot start its store ({})", e.what());
      wanted_ = false;
      return;
    }
  }
  if (address.empty()) return;
  offered_ = true;
  // A node that joins the attempt live (rules::JoinLive): its ranks are replacements of no lost
  // rank, admitted once they beat, as any.
  const auto joins_after = joint() ? coordinator_->assignment().joins_after : -1;
  if (joins_after >= 0) world0_ = 0;
  const auto tag = std::string(env::kRecoveryStore) + "=";
  for (auto& p : attempt.processes) {
    std::erase_if(p.env, [&](const std::string& e) { return e.rfind(tag, 0) == 0; });
    p.env.push_back(tag + address);
    if (joins_after >= 0) p.env.push_back(fmt::format("{}={}@{}", env::kReplacement, p.rank, joins_after));
  }
}

void LiveRecovery::started(LiveAttempt& attempt) {
  if (world0_ == 0) {
    for (auto& r : attempt.ranks) joining_.emplace_back(&r, -1);
    admit_joined_node(attempt);  // now, where none has a heartbeat to wait for
  }
  maybe_capable(attempt);
}

void LiveRecovery::began(LiveAttempt& attempt, Rank& rank) {
  maybe_capable(attempt);
  const auto j = std::find_if(joining_.begin(), joining_.end(), [&](const auto& x) { return x.first == &rank; });
  if (j == joining_.end()) return;
  // Ready once it beats: its program set up, at its first collective, waiting to be admitted.
  if (j->second >= 0) {
    const auto why = fmt::format("rank {} started in rank {}'s place", rank.spec->rank, j->second);
    if (joint()) coordinator_->admit(attempt.record.index, rank.spec->rank, why);
    if (generations_) generations_->admit(rank.spec->rank, why);
    joining_.erase(j);
    return;
  }
  admit_joined_node(attempt);
}

// A node joining live: its ranks together, in one generation, once every one still there beats
// (one lost meanwhile no longer holds the others back).
void LiveRecovery::admit_joined_node(const LiveAttempt& attempt) {
  const auto waits = [](const auto& x) {
    return x.second < 0 && x.first->running() && x.first->recorder && x.first->recorder->beat_pid() == 0;
  };
  if (std::any_of(joining_.begin(), joining_.end(), waits)) return;
  for (const auto& [r, lost] : joining_)
    if (lost < 0 && r->running())
      coordinator_->admit(attempt.record.index, r->spec->rank,
                          fmt::format("rank {} joined with node {}", r->spec->rank, coordinator_->assignment().node_rank));
  std::erase_if(joining_, [](const auto& x) { return x.second < 0; });
}

// Over several nodes, the rendezvous hears once every running rank here opted in (it beats),
// and again once every one admits replacements (a node may then join the attempt live).
void LiveRecovery::maybe_capable(const LiveAttempt& attempt) {
  if (!offered_ || !joint() || admits_said_) return;
  const auto& ranks = attempt.ranks;
  const bool running = std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running(); });
  const auto every = [&](auto said) {
    return std::all_of(ranks.begin(), ranks.end(), [&](const Rank& r) { return !r.running() || (r.recorder && said(r)); });
  };
  if (!running || !every([](const Rank& r) { return r.recorder->beat_pid() != 0; })) return;
  const bool admits = every([](const Rank& r) { return r.recorder->admits_pid() != 0; });
  if (capable_ && !admits) return;
  capable_ = true;
  admits_said_ = admits;
  coordinator_->capable(attempt.record.index, admits);
}

bool LiveRecovery::take_loss(LiveAttempt& attempt, Rank& rank, bool root_cause) {
  if (joint() && waiting_to_join(attempt, rank)) return lose_unjoined(attempt, rank);
  if (waiting_to_join(attempt, rank)) {  // a replacement, whatever ended it: none of the job's work
    std::erase_if(joining_, [&](const auto& j) { return j.first == &rank; });
    const auto how = fmt::format("rank {} {}", rank.spec->rank, detail::describe(*rank.record));
    spdlog::warn("{} (pid {}) before it joined: it held none of the job's work", how, rank.record->pid);
    generations_->lose({rank.spec->rank}, how);
    // Its place is still empty: another starts in it while --max-restarts lasts, else the world
    // would shrink for good at each replacement lost while it started.
    replace(attempt, rank, generations_->generation());
    return true;
  }
  // Over several nodes, only once this node said its ranks opted in: the rendezvous would refuse
  // the loss otherwise, and this node then reports it as its own failure, as without recovery.
  RecoveryFacts facts{.offered = offered_ && (!joint() || capable_), .lost = root_cause, .min_world = min_world_,
                      .joint = joint()};
  int admitting = 0;  // survivors whose program admits replacements (will_admit_replacements())
  for (const auto& r : attempt.ranks) {
    if (&r == &rank || !r.running()) continue;
    if (waiting_to_join(attempt, r)) continue;  // no member yet: it joins whatever world goes on
    ++facts.survivors;
    if (r.recorder && r.recorder->beat_pid() != 0) ++facts.opted_in;
    if (r.recorder && r.recorder->admits_pid() != 0) ++admitting;
  }
  if (const auto why = why_not_reform(facts); !why.empty()) {
    // Said where the program took part in recovery, so that a user sees why it ended instead.
    if (facts.offered && root_cause && facts.opted_in > 0) spdlog::warn("live recovery: the attempt ends: {}", why);
    return false;
  }
  attempt_ = &attempt;
  lost_.push_back(&rank);
  last_loss_ = std::chrono::steady_clock::now();
  const auto how = fmt::format("rank {} {}", rank.spec->rank, detail::describe(*rank.record));
  if (joint()) {
    spdlog::warn("{} (pid {}): live recovery: this node's other ranks opted in; the rendezvous decides whether the "
                 "job goes on without it",
                 how, rank.record->pid);
    LocalFailure f{.rank = rank.spec->rank, .how = detail::describe(*rank.record),
                   .exit_code = detail::exit_code_of(*rank.record->status), .root_cause = true, .lost_peer = {},
                   .recoverable = true, .replaceable = replaceable(rank, admitting == facts.survivors)};
    if (f.replaceable) awaited_.push_back(f.rank);
    coordinator_->failed(attempt.record.index, f);
    return true;
  }
  spdlog::warn("{} (pid {}): live recovery: the {} other rank{} opted in, and may re-form without it", how,
               rank.record->pid, facts.survivors, facts.survivors == 1 ? "" : "s");
  if (static_cast<int>(to_replace_.size()) + replacements_ < max_replacements_) {
    // A replacement waits at its first collective until the others admit it: one nobody admits
    // would sit idle to the job's end.
    if (admitting == facts.survivors)
      to_replace_.push_back(&rank);
    else
      spdlog::warn("live recovery: rank {} is not replaced: {} of the {} ranks left do not admit replacements "
                   "(idist::Recovery does; a program calling reform() itself: idist::will_admit_replacements())",
                   rank.spec->rank, facts.survivors - admitting, facts.survivors);
  }
  generations_->lose({rank.spec->rank}, how);
  return true;
}

// Over several nodes: a replacement lost before the job admitted it (no generation has it).
// The rendezvous hears it as a recoverable loss, and may grant another in its place; it is no
// loss of this node's (nothing re-forms without it), so it is not among lost_.
bool LiveRecovery::lose_unjoined(LiveAttempt& attempt, Rank& rank) {
  std::erase_if(joining_, [&](const auto& j) { return j.first == &rank; });
  const auto how = detail::describe(*rank.record);
  spdlog::warn("rank {} {} (pid {}) before it joined: it held none of the job's work", rank.spec->rank, how,
               rank.record->pid);
  const int code = rank.record->status ? detail::exit_code_of(*rank.record->status) : 1;
  const LocalFailure f{.rank = rank.spec->rank, .how = how, .exit_code = code, .root_cause = true,
                       .lost_peer = {}, .recoverable = true, .replaceable = replaceable(rank, true)};
  if (f.replaceable) awaited_.push_back(f.rank);
  coordinator_->failed(attempt.record.index, f);
  admit_joined_node(attempt);
  return true;
}

bool LiveRecovery::replaceable(const Rank& rank, bool survivors_admit) const {
  return survivors_admit && start_rank_ && max_replacements_ > 0 && !rank.spec->entry &&
         (!joint() || coordinator_->grants_replacements());
}

void LiveRecovery::replace_granted(LiveAttempt* attempt, int lost, int origin, std::uint64_t after) {
  // Only an answer awaited: the attempt may be stopping here meanwhile (stand_down), and no rank
  // may start then.
  if (std::find(awaited_.begin(), awaited_.end(), lost) == awaited_.end()) return;
  if (attempt != nullptr && origin >= 0)
    for (const auto& r : attempt->ranks)
      if (r.spec->rank == lost) {
        replace(*attempt, r, after, origin);
        break;
      }
  answered(lost);  // started, or it could not be: either way nothing more is awaited for it
}

void LiveRecovery::members_ended(LiveAttempt* attempt, const std::vector<int>& unjoined) {
  if (attempt == nullptr) return;
  std::vector<const Rank*> waiting;
  for (const auto& r : attempt->ranks)
    if (r.running() && std::find(unjoined.begin(), unjoined.end(), r.spec->rank) != unjoined.end())
      waiting.push_back(&r);
  stop_waiting(waiting);
}

bool LiveRecovery::waiting_to_join(const LiveAttempt& attempt, const Rank& rank) const {
  const auto index = static_cast<std::size_t>(&rank - attempt.ranks.data());
  if (index < world0_) return false;
  // Over several nodes, once a generation has it: its loss is then the job's to re-form without.
  if (joint()) return admitted_.count(rank.spec->rank) == 0;
  return generations_ && !generations_->joined(rank.spec->rank);
}

void LiveRecovery::replace(LiveAttempt& a, const Rank& lost, std::uint64_t generation, std::optional<int> granted) {
  if (a.ranks.size() == a.ranks.capacity() || replacements_ >= max_replacements_ || !start_rank_) return;
  if (lost.spec->entry) {  // a forked function: forking again now would copy our threads' locks
    spdlog::warn("live recovery: rank {} is not replaced: its ranks are forks of this process (idist::spawn), which "
                 "cannot be made again mid-run",
                 lost.spec->rank);
    return;
  }
  // Over several nodes the rendezvous numbers it (after the job's ranks, and every node's
  // replacements before it); on one node, the next index of the attempt's ranks.
  const int origin = granted.value_or(static_cast<int>(a.ranks.size()));
  auto& spec = a.attempt.processes.emplace_back(*lost.spec);
  spec.rank = origin;
  const auto tag = std::string(env::kReplacement) + "=";
  std::erase_if(spec.env, [&](const std::string& e) { return e.rfind(tag, 0) == 0; });  // a replacement's own
  spec.env.push_back(fmt::format("{}={}@{}", env::kReplacement, origin, generation));
  auto& record = a.record.ranks.emplace_back();
  record.rank = origin;
  auto& rank = a.ranks.emplace_back();
  rank.spec = &spec;
  rank.record = &record;
  if (const auto error = start_rank_(rank)) {
    spdlog::warn("live recovery: cannot start a rank in rank {}'s place: {}", lost.spec->rank, *error);
    a.ranks.pop_back();
    a.record.ranks.pop_back();
    a.attempt.processes.pop_back();
    return;
  }
  ++replacements_;
  spdlog::warn("rank {} (pid {}) starts in rank {}'s place ({} of --max-restarts {}); the others admit it at a step "
               "boundary once it is ready",
               origin, record.pid, lost.spec->rank, replacements_, max_replacements_);
  joining_.emplace_back(&rank, lost.spec->rank);
  if (!rank.recorder) began(a, rank);  // no heartbeat to wait for: ready now
}

void LiveRecovery::stop_unjoined(const LiveAttempt& attempt) {
  std::vector<const Rank*> waiting;
  for (std::size_t i = 0; i < attempt.ranks.size(); ++i) {
    const Rank& r = attempt.ranks[i];
    if (!r.running()) continue;
    if (!waiting_to_join(attempt, r)) return;  // a rank of the job runs on
    waiting.push_back(&r);
  }
  stop_waiting(waiting);
}

void LiveRecovery::stop_waiting(const std::vector<const Rank*>& waiting) {
  for (const Rank* r : waiting) {
    if (r->record->collateral) continue;  // told already
    spdlog::info("rank {} (pid {}) stops: the job's ranks ended before they admitted it", r->spec->rank,
                 r->record->pid);
    r->record->collateral = true;
    ::kill(-r->record->pid, SIGKILL);  // it holds nothing yet, and waits to join
  }
}

std::optional<std::size_t> LiveRecovery::recent_loss(const LiveAttempt& attempt) const {
  if (attempt_ != &attempt || lost_.empty() || std::chrono::steady_clock::now() - last_loss_ > kConsequenceWindow)
    return std::nullopt;
  return static_cast<std::size_t>(lost_.back() - attempt.ranks.data());
}

void LiveRecovery::ended(const LiveAttempt& attempt, const Rank& rank) {
  if (!offered_) return;
  const bool others = std::any_of(attempt.ranks.begin(), attempt.ranks.end(), [&](const Rank& r) { return r.running(); });
  if (joint()) {
    coordinator_->ended(attempt.record.index, rank.spec->rank);
    return maybe_capable(attempt);  // the others may all beat now
  }
  if (others) generations_->ended(rank.spec->rank);
  if (others) stop_unjoined(attempt);
}

void LiveRecovery::reformed(LiveAttempt* attempt, std::uint64_t generation, const std::string& line,
                            const std::vector<int>& members) {
  if (attempt == nullptr) return;
  admitted_.insert(members.begin(), members.end());
  spdlog::info("generation {}: the job went on ({})", generation, line);
  attempt->record.reforms.push_back(line);
  heard_ = fmt::format("live recovery: generation {} ({})\n", generation, line);
  if (attempt == attempt_) covered_ = lost_.size();
}

void LiveRecovery::taken(std::uint64_t generation, double seconds) {
  const auto i = reform_index_.find(generation);
  if (attempt_ == nullptr || i == reform_index_.end()) return;
  attempt_->record.reform_seconds[i->second] = seconds;
  spdlog::info("generation {}: every member joined it, {} after it was called for", generation,
               common::measured_duration_text(std::chrono::duration<double>(seconds)));
}

void LiveRecovery::forgive(const LiveAttempt& attempt, std::optional<std::size_t>& first_failure) const {
  const auto lost = [&](const Rank& r) { return std::find(lost_.begin(), lost_.end(), &r) != lost_.end(); };
  if (!joint() || attempt_ != &attempt || !first_failure || *first_failure >= attempt.ranks.size() ||
      !lost(attempt.ranks[*first_failure]))
    return;
  // Only where every other rank here ended well: one that failed on its own is this node's
  // failure, whatever the verdict (which then cannot be success; this is the last guard).
  for (const auto& r : attempt.ranks)
    if (!lost(r) && r.record->status && !detail::succeeded(*r.record->status)) return;
  first_failure.reset();
}

std::string LiveRecovery::status_text() { return generations_ ? generations_->status() : heard_; }

void LiveRecovery::stand_down() {
  joining_.clear();
  answered(-1);
  if (generations_) generations_->stand_down();
}

std::optional<std::size_t> LiveRecovery::unrecovered(const LiveAttempt& attempt) {
  if (attempt_ != &attempt || lost_.empty()) return std::nullopt;
  if (joint())
    return covered_ < lost_.size() ? std::optional(static_cast<std::size_t>(lost_[covered_] - attempt.ranks.data()))
                                   : std::nullopt;
  if (!generations_) return std::nullopt;
  const auto why = generations_->unrecovered();
  if (why.empty()) return std::nullopt;
  spdlog::warn("live recovery: {}", why);
  const auto cause = announced_ < lost_.size() ? announced_ : last_cause_;
  return static_cast<std::size_t>(lost_[cause] - attempt.ranks.data());
}

}  // namespace idist::launchers::supervision
