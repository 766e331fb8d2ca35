#include "strangers.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace idist::launchers::rendezvous {

void Strangers::refused(const std::string& peer, const std::string& address, const std::string& why) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!armed_ && now - logged_ >= std::chrono::seconds(1)) {
    logged_ = now;
    spdlog::warn("rendezvous: refused a connection from {}: {}", peer, why);
    return;
  }
  ++counted_.count;
  auto& addresses = counted_.addresses;
  if (addresses.size() < kNamed && std::find(addresses.begin(), addresses.end(), address) == addresses.end())
    addresses.push_back(address);
  auto& reasons = counted_.reasons;
  const auto reason = std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == why; });
  if (reason != reasons.end()) {
    ++reason->second;
  } else if (reasons.size() < kNamed) {
    reasons.emplace_back(why, 1);
  } else {
    ++counted_.other_reasons;
  }
  if (armed_) return;
  armed_ = true;
  timer_.expires_at(logged_ + std::chrono::seconds(1));
  timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](auto ec) {
    if (!ec && !alive.expired()) log();
  });
}

void Strangers::other_job(const std::string& address) {
  if (other_job_.count(address) || other_job_.size() < 64) {
    ++other_job_[address];
  } else {
    ++other_job_unnamed_;
  }
}

void Strangers::log() {
  armed_ = false;
  if (counted_.count == 0) return;
  auto r = std::exchange(counted_, Counted{});
  logged_ = std::chrono::steady_clock::now();
  std::vector<std::string> reasons;
  const bool one_reason = r.reasons.size() == 1 && r.other_reasons == 0;
  for (const auto& [why, n] : r.reasons) reasons.push_back(one_reason ? why : fmt::format("{} (x{})", why, n));
  if (r.other_reasons > 0) reasons.push_back(fmt::format("other reasons (x{})", r.other_reasons));
  spdlog::warn("rendezvous: refused {} connection{} from {}{} in the last second: {}", r.count, r.count == 1 ? "" : "s",
               fmt::join(r.addresses, ", "), r.addresses.size() < kNamed ? "" : " and others", fmt::join(reasons, "; "));
}

void Strangers::flush() {
  if (counted_.count > 0) log();  // the count its timer would have logged
  timer_.cancel();
}

std::string Strangers::other_job_text() const {
  if (other_job_.empty()) return "";
  int count = other_job_unnamed_;
  std::vector<std::string> addresses;
  for (const auto& [address, n] : other_job_) {
    count += n;
    addresses.push_back(address);
  }
  return fmt::format("; refused {} connection{} from {}{} with another job id (--rdzv-id)", count,
                     count == 1 ? "" : "s", fmt::join(addresses, ", "), other_job_unnamed_ > 0 ? " and others" : "");
}

}  // namespace idist::launchers::rendezvous
