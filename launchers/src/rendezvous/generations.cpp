#include "generations.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include "idist/env_contract.hpp"
#include "idist_store/server.hpp"

namespace idist::launchers::rendezvous {

namespace {

// Losses this close together make one generation: a node's ranks killed together, a kill
// that takes a rank's child too. Short beside a step; the survivors already wait in reform().
constexpr auto kSettle = std::chrono::milliseconds(50);
// How often a replacement waiting for the admission in flight looks whether it was taken.
constexpr auto kAdmitCheck = std::chrono::milliseconds(100);
// How often an announced generation is looked at until every member joined it: its time is
// the summary's, and a re-form takes a few tenths of a second.
constexpr auto kTakenCheck = std::chrono::milliseconds(10);

}  // namespace

Generations::Generations(boost::asio::io_context& io, const std::string& host, const std::string& token, int world,
                         Announced announced)
    : store_(std::make_unique<idist::detail::TcpStoreServer>(
          idist::detail::StoreServerOptions{.host = host, .port = 0, .token = token})),
      settle_(io),
      announced_(std::move(announced)),
      members_(static_cast<std::size_t>(std::max(world, 0))),
      admit_timer_(io),
      taken_timer_(io) {
  std::iota(members_.begin(), members_.end(), 0);
}

Generations::~Generations() = default;

std::string Generations::listen_address() const { return store_->listen_address(); }

int Generations::port() const { return store_->port(); }

void Generations::lose(const std::vector<int>& ranks, std::string why) {
  if (standing_down_) return;
  bool member = false;
  for (int r : ranks) {
    // A replacement lost before it was admitted: nothing to announce of it.
    for (auto* list : {&joining_, &queued_, &in_flight_})
      std::erase_if(*list, [&](const auto& a) { return a.first == r; });
    member = member || std::find(members_.begin(), members_.end(), r) != members_.end();
  }
  if (!member) return;
  leaving_.insert(leaving_.end(), ranks.begin(), ranks.end());
  if (why_.empty()) since_ = std::chrono::steady_clock::now();  // admissions pending go back: not its start
  why_.push_back(std::move(why));
  settle();
}

void Generations::admit(int origin, std::string why) {
  if (standing_down_ || ending_) return;
  queued_.emplace_back(origin, std::move(why));
  admit_queued();
}

void Generations::admit_queued() {
  if (queued_.empty() || standing_down_) return;
  // Once every member joined the last generation: one still re-forming takes the newest, and
  // would find the admission where the others are in the generation before it.
  bool taken = generation_ == 0;
  if (!taken) {
    const auto joined = members_joined();
    if (!joined) return;  // the store is gone with the attempt
    taken = *joined == members_.size();
  }
  if (!taken) {
    admit_timer_.expires_after(kAdmitCheck);
    admit_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](auto ec) {
      if (!ec && !alive.expired()) admit_queued();
    });
    return;
  }
  if (why_.empty() && joining_.empty()) since_ = std::chrono::steady_clock::now();
  joining_.insert(joining_.end(), std::make_move_iterator(queued_.begin()), std::make_move_iterator(queued_.end()));
  queued_.clear();
  settle();
}

std::optional<std::size_t> Generations::members_joined() {
  std::vector<std::string> keys;
  for (int m : members_) keys.push_back(env::joined_key(generation_, m));
  try {
    const auto joined = store_->check(keys);
    return static_cast<std::size_t>(std::count(joined.begin(), joined.end(), true));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool Generations::joined(int origin) {
  if (joined_.count(origin) > 0) return true;
  std::vector<std::string> keys;
  for (std::uint64_t g = 1; g <= generation_; ++g) keys.push_back(env::joined_key(g, origin));
  try {
    const auto joined = store_->check(keys);
    if (std::find(joined.begin(), joined.end(), true) == joined.end()) return false;
  } catch (const std::exception&) {
    return false;
  }
  joined_.insert(origin);  // for good: the supervisor asks of every rank at every loss and end
  return true;
}

void Generations::publish(std::uint64_t generation, const std::vector<int>& members, const std::string& store,
                          const std::string& line, const std::vector<int>& local, std::uint64_t last_loss) {
  if (standing_down_ || generation <= generation_) return;
  // Keys up to it are written (below): a word from etcd this far ahead is not the job's.
  if (generation - generation_ > 1000)
    throw std::runtime_error(fmt::format("generation {} is {} past this store's {}", generation,
                                         generation - generation_, generation_));
  const auto text = fmt::format("members={};store={}", fmt::join(members, ","), store);
  const auto grown = text + std::string(env::kGrowTag);
  // Every key up to it: a node may read the state past a generation (a read answered after a
  // newer change), and a rank waits for the one after its own, then takes the newest.
  for (auto g = generation_ + 1; g <= generation; ++g) {
    const auto& word = g > last_loss ? grown : text;
    store_->set(env::generation_key(g), {word.begin(), word.end()});
  }
  const bool loss = last_loss > std::max(generation_, recovered_generation_);
  generation_ = generation;
  members_ = members;
  if (!loss) return;  // it only admits: the job may end before its members take it
  last_line_ = line;
  recovered_generation_ = last_loss;
  recovered_members_.clear();
  for (int m : members)
    if (std::find(local.begin(), local.end(), m) != local.end()) recovered_members_.push_back(m);
}

bool Generations::joined_current(const std::vector<int>& ranks) {
  std::vector<std::string> keys;
  for (int r : ranks)
    if (std::find(members_.begin(), members_.end(), r) != members_.end())
      keys.push_back(env::joined_key(generation_, r));
  const auto joined = store_->check(keys);
  return std::all_of(joined.begin(), joined.end(), [](bool b) { return b; });
}

void Generations::settle() {
  settle_.expires_after(kSettle);
  // A wait that completed is run even once this object is gone: the token says whether it is.
  settle_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](auto ec) {
    if (!ec && !alive.expired() && !standing_down_) announce();
  });
}

void Generations::ended(int rank) {
  leaving_.push_back(rank);
  ending_ = true;
  // A member that ended never joins the generation being timed: it has no time.
  if (timing_ == generation_ && std::find(members_.begin(), members_.end(), rank) != members_.end()) {
    timing_ = 0;
    taken_timer_.cancel();
  }
  try {
    store_->set(env::ended_key(rank), {});
  } catch (const std::exception&) {
    // The survivors wait until IDIST_TIMEOUT instead.
  }
}

bool Generations::all_joined() {
  if (recovered_generation_ == 0) return true;
  // A member that joined a later generation (one admitting a replacement, announced before it
  // re-formed: it takes the newest) went on too.
  const auto span = generation_ - recovered_generation_ + 1;
  std::vector<std::string> keys;
  for (int m : recovered_members_)
    for (auto g = recovered_generation_; g <= generation_; ++g) keys.push_back(env::joined_key(g, m));
  const auto joined = store_->check(keys);
  for (std::size_t i = 0; i < recovered_members_.size(); ++i)
    if (std::none_of(joined.begin() + static_cast<std::ptrdiff_t>(i * span),
                     joined.begin() + static_cast<std::ptrdiff_t>((i + 1) * span), [](bool b) { return b; }))
      return false;
  return true;
}

std::string Generations::unrecovered() {
  if (pending()) return fmt::format("{}, and the job ended before it could re-form without it", fmt::join(why_, ", "));
  try {
    if (all_joined()) return "";
  } catch (const std::exception& e) {
    spdlog::warn("live recovery: cannot tell whether the ranks re-formed ({})", e.what());
  }
  return fmt::format("{}, and a rank of generation {} ended without re-forming (its program did not call "
                     "idist::reform()): the loss stands",
                     last_line_, recovered_generation_);
}

void Generations::stand_down() {
  standing_down_ = true;
  settle_.cancel();
  admit_timer_.cancel();
  taken_timer_.cancel();
}

std::string Generations::status() {
  if (generation_ == 0) return "";
  auto out = fmt::format("live recovery: generation {}, a world of {}", generation_, members_.size());
  if (timing_ == generation_) {
    const std::chrono::duration<double> since = std::chrono::steady_clock::now() - timing_since_;
    out += fmt::format(", re-forming for {:.1f} s: {} of {} joined", since.count(), members_joined().value_or(0),
                       members_.size());
  }
  return out + "\n";
}

void Generations::time_taken() {
  if (timing_ == 0 || standing_down_) return;
  if (timing_ != generation_) {  // its announcement failed after generation_ moved on
    timing_ = 0;
    return;
  }
  const auto joined = members_joined();
  if (!joined) return;  // the store is gone with the attempt
  if (*joined == members_.size()) {
    timing_ = 0;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - timing_since_;
    if (taken_) taken_(generation_, took.count());
    return;
  }
  // Closely for the first second (a re-form takes tenths), then as the admissions are looked at.
  taken_timer_.expires_after(std::chrono::steady_clock::now() - timing_since_ < std::chrono::seconds(1) ? kTakenCheck
                                                                                                   : kAdmitCheck);
  taken_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](auto ec) {
    if (!ec && !alive.expired()) time_taken();
  });
}

void Generations::announce() {
  // A wait re-armed after its last one completed: announced already.
  if (why_.empty() && joining_.empty()) return;
  const bool loss = !why_.empty();
  if (!loss && ending_) return joining_.clear();  // nobody is left to admit it at a step boundary
  std::vector<int> members;
  for (int m : members_)
    if (std::find(leaving_.begin(), leaving_.end(), m) == leaving_.end()) members.push_back(m);
  std::vector<std::string> admitted;
  if (loss) {
    // The members re-form now, mid-step: a replacement joins only at a step boundary, so one
    // announced and not yet taken, or about to be, is admitted anew once this one is taken.
    for (auto& a : in_flight_)
      if (!joined(a.first)) {
        std::erase(members, a.first);
        queued_.push_back(std::move(a));
      }
    queued_.insert(queued_.end(), std::make_move_iterator(joining_.begin()), std::make_move_iterator(joining_.end()));
    in_flight_.clear();
  } else {
    for (auto& a : joining_) {
      members.push_back(a.first);
      admitted.push_back(a.second);
    }
    in_flight_ = std::move(joining_);
  }
  joining_.clear();
  if (members.empty()) return;
  ++generation_;
  try {
    const auto text = fmt::format("members={}{}", fmt::join(members, ","), loss ? "" : env::kGrowTag);
    store_->set(env::generation_key(generation_), {text.begin(), text.end()});
  } catch (const std::exception& e) {
    // The survivors wait in vain, and their IDIST_TIMEOUT ends it: say why now.
    spdlog::error("live recovery: cannot announce generation {}: {}", generation_, e.what());
    return;
  }
  const auto line = fmt::format("{}; world {} -> {}", fmt::join(loss ? why_ : admitted, ", "), members_.size(),
                                members.size());
  spdlog::info("generation {}: ranks {} go on as a world of {} ({})", generation_, fmt::join(members, ", "),
               members.size(), line);
  if (loss) {
    last_line_ = fmt::format("{}", fmt::join(why_, ", "));
    recovered_generation_ = generation_;
    recovered_members_ = members;
  }
  why_.clear();
  leaving_.clear();
  members_ = std::move(members);
  timing_ = generation_;
  timing_since_ = since_;
  admit_queued();  // those held back: once this generation is taken
  if (announced_) announced_(generation_, members_, line, loss);
  time_taken();
}

}  // namespace idist::launchers::rendezvous
