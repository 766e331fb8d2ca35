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

Election::Election(const std::string& prefix, Io io)
    : prefix_(prefix + "election/"), last_(prefix + "election_last"), io_(std::move(io)) {}

Election::~Election() { stop(); }

Json Election::put_op(long long lease, const std::string& id) const {
  // The lease's id names the key, as etcd's own election does: one candidate per session.
  return Json{{"request_put",
               {{"key", etcd::base64(own_)}, {"value", etcd::base64(Json(id).dump())}, {"lease", std::to_string(lease)}}}};
}

// The candidate created last up to revision `up_to` and the one before it: this node and its
// predecessor, whatever the queue's length. etcd reads every candidate to sort them (it limits
// after), hence only ever in a read, never in a transaction that writes (below).
Json Election::place_read(long long up_to) const {
  return Json{{"key", etcd::base64(prefix_)},
              {"range_end", etcd::base64(etcd::prefix_end(prefix_))},
              {"sort_order", "DESCEND"},
              {"sort_target", "CREATE"},
              {"limit", "2"},
              {"keys_only", true},
              {"max_create_revision", std::to_string(up_to)}};
}

Json Election::campaign(long long lease, const std::string& id, const Json& also) {
  own_ = prefix_ + fmt::format("{:x}", lease);
  // No range over the candidates here: a transaction that writes runs in etcd's apply loop, one
  // at a time on every member, and a sorted range reads every candidate (etcd sorts, then
  // limits), so that a thousand nodes' first transactions read a million keys and timed out.
  // Its predecessor instead: the candidate that queued last, named by election_last, read
  // and then renamed in the same transaction (so in the order of the create revisions).
  const Json absent{{"key", etcd::base64(own_)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
  Json success = also;
  success.push_back(Json{{"request_range", {{"key", etcd::base64(last_)}}}});
  success.push_back(put_op(lease, id));
  success.push_back(Json{{"request_put", {{"key", etcd::base64(last_)}, {"value", etcd::base64(own_)}, {"lease", std::to_string(lease)}}}});
  // Its key there already: a retry (a member applied the transaction, then timed out), the key
  // created before the candidates that came meanwhile: its create revision is its place.
  Json failure = also;
  failure.push_back(Json{{"request_range", {{"key", etcd::base64(own_)}, {"keys_only", true}}}});
  return Json{{"compare", Json::array({absent})}, {"success", std::move(success)}, {"failure", std::move(failure)}};
}

void Election::begin(const Json& answer, Placed placed) {
  own_revision_ = 0;
  std::string before;
  long long before_since = 0;  // election_last's mod revision: its candidate's create revision
  for (const auto& r : answer.value("responses", Json::array()))
    for (const auto& kv : r.value("response_range", Json::object()).value("kvs", Json::array()))
      if (kv.is_object() && etcd::unbase64(kv.value("key", "")) == last_) {
        before = etcd::unbase64(kv.value("value", ""));
        before_since = as_ll(kv, "mod_revision");
      }
  if (answer.value("succeeded", false)) {
    own_revision_ = answer.contains("header") ? as_ll(answer["header"], "revision") : 0;
    // None named (the first candidate, or the last one's lease gone), or itself: the queue read.
    if (before.empty() || before == own_ || before_since <= 0) return locate(std::move(placed));
    // No read, which would wait behind every transaction queued in etcd's apply loop (a
    // thousand at once): the predecessor's key watched from its creation, so that a delete
    // even before this answer comes as an event.
    Place place;
    place.role = Place::Role::waiting;
    place.predecessor = before;
    settle(place, before_since - 1);
    if (placed) placed(place);
    return;
  }
  for (const auto& c : candidates_of(answer, prefix_))
    if (c.key == own_) own_revision_ = c.create_revision;
  if (own_revision_ > 0) return locate(std::move(placed));
  const Place gone;  // its lease lost already
  settle(gone, 0);
  if (placed) placed(gone);
}

// Its predecessor (and itself), and the first candidate: whose time the job's state is judged
// from. A read-only transaction: both at one revision, answered beside the apply loop, but each
// range reads every candidate: only where election_last could not say.
void Election::locate(Placed placed) {
  Json body{{"compare", Json::array()},
            {"success", Json::array({Json{{"request_range", place_read(own_revision_)}}, Json{{"request_range", first_read()}}})}};
  io_.call("/v3/kv/txn", std::move(body), [this, placed = std::move(placed)](const std::string& error, const Json& j) {
    if (stage_ == Stage::stopped) return;
    if (!error.empty()) return io_.failed(error);
    const Place place = place_of(candidates_of(j, prefix_), own_);
    settle(place, j.contains("header") ? as_ll(j["header"], "revision") : 0);
    if (placed) placed(place);
  });
}

Json Election::first_read() const {
  return Json{{"key", etcd::base64(prefix_)}, {"range_end", etcd::base64(etcd::prefix_end(prefix_))},
              {"sort_order", "ASCEND"},       {"sort_target", "CREATE"},
              {"limit", "1"},                 {"keys_only", true}};
}

void Election::leader_since(std::function<void(long long)> then) {
  io_.call("/v3/kv/range", first_read(), [this, then = std::move(then)](const std::string& error, const Json& j) {
    if (stage_ == Stage::stopped) return;
    if (!error.empty()) return io_.failed(error);
    const auto candidates = candidates_of(j, prefix_);
    then(candidates.empty() ? 0 : candidates.front().create_revision);
  });
}

void Election::rejoin(long long lease, const std::string& id) {
  if (stage_ != Stage::absent) return;
  stage_ = Stage::queued;
  io_.call("/v3/kv/txn", campaign(lease, id, Json::array()), [this](const std::string& error, const Json& j) {
    if (stage_ == Stage::stopped) return;
    if (!error.empty()) return io_.failed(error);
    begin(j, nullptr);
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
