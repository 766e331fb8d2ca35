#include "election.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "client.hpp"
#include "proposal.hpp"

namespace idist::launchers::etcd_rdzv {

Place place_of(std::vector<Candidate> candidates, const std::string& own) {
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.create_revision, a.key) < std::tie(b.create_revision, b.key);
  });
  Place place;
  if (!candidates.empty()) place.leader_since = candidates.front().create_revision;
  const auto me = std::find_if(candidates.begin(), candidates.end(), [&](const Candidate& c) { return c.key == own; });
  if (me == candidates.end()) return place;
  if (me == candidates.begin()) {
    place.role = Place::Role::leader;
  } else {
    place.role = Place::Role::waiting;
    place.predecessor = std::prev(me)->key;
  }
  return place;
}

std::vector<Candidate> candidates_of(const Json& answer, const std::string& election_prefix) {
  std::vector<Candidate> out;
  std::set<std::string> seen;
  auto take = [&](const Json& range) {
    for (const auto& kv : range.value("kvs", Json::array())) {
      if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string()) continue;
      std::string key = etcd::unbase64(kv["key"].get<std::string>());
      if (key.rfind(election_prefix, 0) != 0 || !seen.insert(key).second) continue;
      out.push_back(Candidate{std::move(key), as_ll(kv, "create_revision")});
    }
  };
  if (!answer.is_object()) return out;
  take(answer);
  for (const auto& r : answer.value("responses", Json::array()))
    if (r.is_object() && r.contains("response_range")) take(r["response_range"]);
  return out;
}

Election::Election(const std::string& prefix, Io io) : prefix_(prefix + "election/"), io_(std::move(io)) {}

Election::~Election() { stop(); }

Json Election::put_op(long long lease, const std::string& id) const {
  // The lease's id names the key, as etcd's own election does: one candidate per session.
  return Json{{"request_put",
               {{"key", etcd::base64(own_)}, {"value", etcd::base64(Json(id).dump())}, {"lease", std::to_string(lease)}}}};
}

// The candidate created last up to revision `up_to` (0: any) and the one before it: this node
// and its predecessor, once its key is the newest there is. Two keys, however long the queue.
Json Election::place_read(long long up_to) const {
  Json range{{"key", etcd::base64(prefix_)},
             {"range_end", etcd::base64(etcd::prefix_end(prefix_))},
             {"sort_order", "DESCEND"},
             {"sort_target", "CREATE"},
             {"limit", "2"},
             {"keys_only", true}};
  if (up_to > 0) range["max_create_revision"] = std::to_string(up_to);
  return range;
}

Json Election::campaign_ops(long long lease, const std::string& id) {
  own_ = prefix_ + fmt::format("{:x}", lease);
  // Beside the place read, the first candidate: whose time the job's state is judged from.
  const Json first{{"key", etcd::base64(prefix_)},   {"range_end", etcd::base64(etcd::prefix_end(prefix_))},
                   {"sort_order", "ASCEND"},         {"sort_target", "CREATE"},
                   {"limit", "1"},                   {"keys_only", true}};
  return Json::array({put_op(lease, id), Json{{"request_range", place_read(0)}}, Json{{"request_range", first}}});
}

Place Election::begin(const Json& answer, long long revision) {
  const auto candidates = candidates_of(answer, prefix_);
  for (const auto& c : candidates)
    if (c.key == own_) own_revision_ = c.create_revision;
  const Place place = place_of(candidates, own_);
  settle(place, revision);
  return place;
}

void Election::rejoin(long long lease, const std::string& id) {
  if (stage_ != Stage::absent) return;
  stage_ = Stage::queued;
  Json body{{"compare", Json::array()}, {"success", Json::array({put_op(lease, id), Json{{"request_range", place_read(0)}}})}};
  io_.call("/v3/kv/txn", std::move(body), [this](const std::string& error, const Json& j) {
    if (stage_ == Stage::stopped) return;
    if (!error.empty()) return io_.failed(error);
    begin(j, j.contains("header") ? as_ll(j["header"], "revision") : 0);
  });
}

void Election::settle(const Place& place, long long revision) {
  if (stage_ == Stage::stopped) return;
  switch (place.role) {
    case Place::Role::leader: {
      const bool waited = stage_ == Stage::checking;
      stage_ = Stage::leading;
      return io_.elected(revision, waited);
    }
    case Place::Role::absent:
      stage_ = Stage::absent;
      return io_.absent();
    case Place::Role::waiting:
      break;
  }
  stage_ = Stage::waiting;
  // From the revision read: a delete since then comes as the watch's first event.
  watch_ = io_.watch(place.predecessor, revision + 1, [this](bool deleted) {
    if (!deleted || stage_ != Stage::waiting) return;
    io_.unwatch(std::exchange(watch_, -1));
    check_again();
  });
}

// The predecessor is gone: this node leads now, unless another candidate is still before it
// (the predecessor left the queue from its middle), whose delete it then waits for.
void Election::check_again() {
  stage_ = Stage::checking;
  io_.call("/v3/kv/range", place_read(own_revision_), [this](const std::string& error, const Json& j) {
    if (stage_ == Stage::stopped) return;
    if (!error.empty()) return io_.failed(error);
    settle(place_of(candidates_of(j, prefix_), own_), j.contains("header") ? as_ll(j["header"], "revision") : 0);
  });
}

void Election::stop() {
  if (watch_ >= 0 && io_.unwatch) io_.unwatch(std::exchange(watch_, -1));
  stage_ = Stage::stopped;
}

}  // namespace idist::launchers::etcd_rdzv
