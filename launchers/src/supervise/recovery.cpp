#include "recovery.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "idist/env_contract.hpp"
#include "idist_store/server.hpp"

namespace idist::launchers::supervision {

namespace {

// Losses this close together make one generation: a node's ranks killed together, a kill
// that takes a rank's child too. Short beside a step; the survivors already wait in reform().
constexpr auto kReformSettle = std::chrono::milliseconds(50);
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
  if (!f.offered) return "recovery is not offered (--recovery off, several nodes, or no generation store)";
  if (!f.lost) return "the rank failed on its own (a non-zero exit is the program's verdict, not a loss)";
  if (f.survivors == 0) return "no rank is left";
  if (f.survivors < f.min_world)
    return fmt::format("{} rank{} would be left, fewer than --min-world {}", f.survivors, f.survivors == 1 ? "" : "s",
                       f.min_world);
  if (f.opted_in < f.survivors)
    return fmt::format("{} of the {} ranks left did not opt in (idist::InitOptions::recovery)", f.survivors - f.opted_in,
                       f.survivors);
  return "";
}

LiveRecovery::LiveRecovery(asio::io_context& io, bool wanted, int min_world)
    : wanted_(wanted), min_world_(min_world), settle_(io) {}

LiveRecovery::~LiveRecovery() = default;

void LiveRecovery::offer(Attempt& attempt) {
  if (!wanted_) return;
  // A store for each attempt: a restarted attempt's ranks count generations from 0 again, and
  // must not find the last attempt's announcements.
  store_.reset();
  {
    try {
      store_ = std::make_unique<idist::detail::TcpStoreServer>(
          idist::detail::StoreServerOptions{.host = "127.0.0.1", .port = 0, .token = job_token(attempt)});
    } catch (const std::exception& e) {
      spdlog::warn("live recovery is off for this job: cannot start its store ({})", e.what());
      wanted_ = false;
      return;
    }
  }
  const auto tag = std::string(env::kRecoveryStore) + "=";
  const auto address = fmt::format("{}{}:{}", tag, store_->listen_address(), store_->port());
  for (auto& p : attempt.processes) {
    std::erase_if(p.env, [&](const std::string& e) { return e.rfind(tag, 0) == 0; });
    p.env.push_back(address);
  }
  generation_ = 0;
  lost_.clear();
  announced_ = 0;
  members_.clear();
  attempt_ = nullptr;
  settle_.cancel();
}

bool LiveRecovery::take_loss(LiveAttempt& attempt, Rank& rank, bool root_cause) {
  RecoveryFacts facts{.offered = wanted_ && store_ != nullptr, .lost = root_cause, .min_world = min_world_};
  for (const auto& r : attempt.ranks) {
    if (&r == &rank || !r.running()) continue;
    ++facts.survivors;
    if (r.recorder && r.recorder->beat_pid() != 0) ++facts.opted_in;
  }
  if (const auto why = why_not_reform(facts); !why.empty()) {
    // Said where the program took part in recovery, so that a user sees why it ended instead.
    if (facts.offered && root_cause && facts.opted_in > 0) spdlog::warn("live recovery: the attempt ends: {}", why);
    return false;
  }
  attempt_ = &attempt;
  lost_.push_back(&rank);
  last_loss_ = std::chrono::steady_clock::now();
  spdlog::warn("rank {} (pid {}) {}: live recovery: the {} other rank{} opted in, and may re-form without it",
               rank.spec->rank, rank.record->pid, detail::describe(*rank.record), facts.survivors,
               facts.survivors == 1 ? "" : "s");
  settle_.expires_after(kReformSettle);
  settle_.async_wait([this, &attempt](auto ec) {
    if (!ec && attempt_ == &attempt) announce(attempt);
  });
  return true;
}

std::optional<std::size_t> LiveRecovery::recent_loss(const LiveAttempt& attempt) const {
  if (attempt_ != &attempt || lost_.empty() || std::chrono::steady_clock::now() - last_loss_ > kConsequenceWindow)
    return std::nullopt;
  return static_cast<std::size_t>(lost_.back() - attempt.ranks.data());
}

void LiveRecovery::ended(const LiveAttempt& attempt, const Rank& rank) {
  if (!wanted_ || !store_) return;
  const bool others = std::any_of(attempt.ranks.begin(), attempt.ranks.end(), [&](const Rank& r) { return r.running(); });
  if (!others) return;
  try {
    store_->set(env::ended_key(rank.spec->rank), {});
  } catch (const std::exception&) {
    // The survivors wait until IDIST_TIMEOUT instead.
  }
}

std::optional<std::size_t> LiveRecovery::unrecovered(const LiveAttempt& attempt) {
  if (attempt_ != &attempt || lost_.empty()) return std::nullopt;
  const auto index_of = [&](std::size_t i) { return static_cast<std::size_t>(lost_[i] - attempt.ranks.data()); };
  if (announced_ < lost_.size()) return index_of(announced_);
  std::vector<std::string> keys;
  for (int m : members_) keys.push_back(env::joined_key(generation_, m));
  try {
    const auto joined = store_->check(keys);
    if (std::find(joined.begin(), joined.end(), false) == joined.end()) return std::nullopt;
  } catch (const std::exception& e) {
    spdlog::warn("live recovery: cannot tell whether the ranks re-formed ({})", e.what());
  }
  spdlog::warn("live recovery: a rank of generation {} ended without re-forming (its program did not call "
               "idist::reform()): the loss stands",
               generation_);
  return index_of(last_cause_);
}

void LiveRecovery::announce(LiveAttempt& attempt) {
  std::vector<int> members;
  for (const auto& r : attempt.ranks)
    if (r.running() && std::find(lost_.begin(), lost_.end(), &r) == lost_.end()) members.push_back(r.spec->rank);
  if (members.empty()) return;
  ++generation_;
  try {
    const auto text = fmt::format("members={}", fmt::join(members, ","));
    store_->set(env::generation_key(generation_), {text.begin(), text.end()});
  } catch (const std::exception& e) {
    // The survivors wait in vain, and their IDIST_TIMEOUT ends it: say why now.
    spdlog::error("live recovery: cannot announce generation {}: {}", generation_, e.what());
    return;
  }
  // The losses since the last announcement, and the world they leave.
  std::vector<std::string> losses;
  for (auto i = announced_; i < lost_.size(); ++i)
    losses.push_back(fmt::format("rank {} {}", lost_[i]->spec->rank, detail::describe(*lost_[i]->record)));
  const auto before = members_.empty() ? attempt.ranks.size() : members_.size();
  const auto line = fmt::format("{}; world {} -> {}", fmt::join(losses, ", "), before, members.size());
  spdlog::info("generation {}: ranks {} go on as a world of {} ({})", generation_, fmt::join(members, ", "),
               members.size(), line);
  attempt.record.reforms.push_back(line);
  last_cause_ = announced_;
  announced_ = lost_.size();
  members_ = std::move(members);
}

}  // namespace idist::launchers::supervision
