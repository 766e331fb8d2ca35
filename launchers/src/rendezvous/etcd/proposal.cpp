#include "proposal.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "client.hpp"
#include "rendezvous/wire.hpp"

namespace idist::launchers::etcd_rdzv {

using rendezvous::field;

long long as_ll(const Json& j, const char* key, long long fallback) {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  try {
    if (it->is_string()) return std::stoll(it->get<std::string>());
    if (it->is_number_integer()) return it->get<long long>();
  } catch (const std::exception&) {
  }
  return fallback;
}

std::string host_of(const std::string& id) {
  const auto b = id.rfind('-');
  const auto a = b == std::string::npos || b == 0 ? std::string::npos : id.rfind('-', b - 1);
  return a == std::string::npos ? id : id.substr(0, a);
}

int Snapshot::attempt() const { return field<int>(state, "attempt", 0); }

rules::Phase Snapshot::phase() const { return rules::phase_named(field<std::string>(state, "phase", "gathering")); }

int Snapshot::nproc(std::size_t r) const {
  const auto it = state.find("nproc");
  if (it == state.end()) return 1;
  if (it->is_array()) return r < it->size() && (*it)[r].is_number_integer() ? (*it)[r].get<int>() : 1;
  return it->is_number_integer() ? it->get<int>() : 1;
}

const Json& Snapshot::members() const {
  static const Json none = Json::array();
  const auto it = state.find("members");
  return it != state.end() && it->is_array() ? *it : none;
}

std::string Snapshot::member(std::size_t r) const {
  const auto& m = members();
  return r < m.size() && m[r].is_string() ? m[r].get<std::string>() : std::string();
}

Snapshot snapshot_of(const Json& j, const std::string& prefix) {
  Snapshot s;
  if (j.contains("header")) s.revision = as_ll(j["header"], "revision");
  std::map<std::string, std::vector<std::pair<std::string, Report>>> reports;  // by kind: attempt/ID
  if (j.contains("kvs") && j["kvs"].is_array())
    for (const auto& kv : j["kvs"]) {
      const std::string k = etcd::unbase64(field<std::string>(kv, "key", ""));
      if (k.rfind(prefix, 0) != 0) continue;
      const std::string rest = k.substr(prefix.size());
      Json value = Json::parse(etcd::unbase64(field<std::string>(kv, "value", "")), nullptr, false);
      const long long revision = as_ll(kv, "mod_revision");
      if (rest == "state" && value.is_object()) {
        s.state = value;
        s.state_revision = revision;
      } else if (rest.rfind("node/", 0) == 0 && value.is_object()) {
        NodeRecord n{.id = rest.substr(5),
                     .host = field<std::string>(value, "host", "?"),
                     .addr = field<std::string>(value, "addr", ""),
                     .nproc = std::max(1, field<int>(value, "nproc", 1)),
                     .join = field<int>(value, "join", -1),
                     .port = field<int>(value, "port", 0)};
        s.nodes[n.id] = n;
      } else if (rest.rfind("left/", 0) == 0) {
        s.left[rest.substr(5)] = value.is_string() ? value.get<std::string>() : std::string("?");
      } else if (rest.rfind("a/", 0) == 0) {
        // a/K/fail/ID, a/K/over/ID
        const auto slash = rest.find('/', 2);
        const auto slash2 = slash == std::string::npos ? slash : rest.find('/', slash + 1);
        if (slash2 == std::string::npos) continue;
        const std::string attempt = rest.substr(2, slash - 2);
        const std::string kind = rest.substr(slash + 1, slash2 - slash - 1);
        reports[kind].emplace_back(attempt + "/" + rest.substr(slash2 + 1), Report{revision, value});
      }
    }
  const std::string mine = std::to_string(s.attempt()) + "/";
  for (auto [kind, into] : {std::pair{"fail", &s.fails}, {"over", &s.overs}, {"stalled", &s.stalls}, {"views", &s.views}})
    for (auto& [k, r] : reports[kind])
      if (k.rfind(mine, 0) == 0) (*into)[k.substr(mine.size())] = r;
  return s;
}

std::string member_name(const Snapshot& s, std::size_t r) { return fmt::format("node {} ({})", r, host_of(s.member(r))); }

std::string lost_text(const Snapshot& s, std::size_t r, const std::string& dead_after) {
  if (const auto l = s.left.find(s.member(r)); l != s.left.end())
    return fmt::format("{} left the job: {}", member_name(s, r), l->second);
  return fmt::format("{} was lost: its etcd lease expired (no heartbeat for {})", member_name(s, r), dead_after);
}

int node_rank_of(const Snapshot& s, const std::string& id) {
  for (std::size_t r = 0; r < s.members().size(); ++r)
    if (s.member(r) == id) return static_cast<int>(r);
  return -1;
}

Assignment assignment_of(const Snapshot& s, std::size_t r) {
  int base = 0, world = 0;
  for (std::size_t m = 0; m < s.members().size(); ++m) {
    if (m < r) base += s.nproc(m);
    world += s.nproc(m);
  }
  const auto zero = s.state.value("zero", Json::object());
  return Assignment{.attempt = s.attempt(),
                        .node_rank = static_cast<int>(r),
                        .nnodes = static_cast<int>(s.members().size()),
                        .world_size = world,
                        .rank_base = base,
                        .master_addr = field<std::string>(zero, "addr", host_of(s.member(0))),
                        .master_port = field<int>(zero, "port", 0),
                        .recovery_store = {}};  // live recovery on etcd: not yet (docs/RECOVERY.md)
}

namespace {

// Failures of the running attempt, in the order they were written (a member's "over" says its
// final word, in the place of its "fail"): reports first, then members that vanished without
// saying their ranks were gone.
std::vector<rules::Failure> failures(const Snapshot& s, const ProposerView& view) {
  std::vector<std::pair<long long, rules::Failure>> out;
  for (std::size_t r = 0; r < s.members().size(); ++r) {
    const std::string id = s.member(r);
    const auto over = s.overs.find(id);
    const auto fail = s.fails.find(id);
    if (over != s.overs.end() && over->second.body.contains("failure")) {
      const long long revision = fail != s.fails.end() ? fail->second.revision : over->second.revision;
      out.emplace_back(revision, rendezvous::failure_of(over->second.body["failure"], static_cast<int>(r)));
    } else if (fail != s.fails.end()) {
      out.emplace_back(fail->second.revision, rendezvous::failure_of(fail->second.body, static_cast<int>(r)));
    } else if (!s.nodes.count(id) && over == s.overs.end()) {
      rules::Failure f;
      f.node_rank = static_cast<int>(r);
      f.how = lost_text(s, r, view.dead_after);
      f.root = true;
      out.emplace_back(LLONG_MAX, std::move(f));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<rules::Failure> fs;
  for (auto& [revision, f] : out) fs.push_back(std::move(f));
  return fs;
}

// The nodes that ask to be in attempt `from` or later and are not members. etcd has no order
// of joining: they are preferred past MAX, and ranked, by the last attempt's rank, host, id.
std::vector<rules::Candidate> candidates(const Snapshot& s, int from) {
  std::set<std::string> in;
  for (const auto& m : s.members()) in.insert(m.is_string() ? m.get<std::string>() : std::string());
  std::map<std::string, int> prev;
  for (const auto& m : s.state.value("prev", Json::array()))
    if (m.is_string()) prev.emplace(m.get<std::string>(), static_cast<int>(prev.size()));
  std::vector<rules::Candidate> out;
  for (const auto& [id, n] : s.nodes) {
    if (n.join < from || n.join < 0 || in.count(id)) continue;
    const auto p = prev.find(id);
    out.push_back(rules::Candidate{.id = id,
                                   .host = n.host,
                                   .nproc = n.nproc,
                                   .hosting = false,
                                   .wanted_rank = std::nullopt,
                                   .prev_rank = p == prev.end() ? -1 : p->second,
                                   .order = 0});
  }
  std::stable_sort(out.begin(), out.end(), [](const rules::Candidate& a, const rules::Candidate& b) {
    const int ra = a.prev_rank >= 0 ? a.prev_rank : INT_MAX;
    const int rb = b.prev_rank >= 0 ? b.prev_rank : INT_MAX;
    return std::tie(ra, a.host, a.id) < std::tie(rb, b.host, b.id);
  });
  for (std::size_t i = 0; i < out.size(); ++i) out[i].order = i;
  return out;
}

}  // namespace

rules::State rules_state(const Snapshot& s, const ProposerView& view) {
  rules::State st;
  st.phase = s.phase();
  st.attempt = s.attempt();
  st.restarts_used = field<int>(s.state, "restarts_used", 0);
  st.cause = field<std::string>(s.state, "cause", "");
  st.reform = field<bool>(s.state, "reform", false);
  st.last_call = view.last_call;
  int base = 0;
  for (std::size_t r = 0; r < s.members().size(); ++r) {
    const std::string id = s.member(r);
    const bool over = s.overs.count(id) > 0;
    const bool gone = !s.nodes.count(id);
    st.members.push_back(rules::Member{.id = id, .host = host_of(id), .nproc = s.nproc(r), .base = base, .over = over, .gone = gone});
    base += s.nproc(r);
    if (gone && over) st.departures.push_back(lost_text(s, r, view.dead_after));
  }
  st.waiting = candidates(s, st.attempt);
  st.failures = failures(s, view);
  return st;
}

std::optional<Json> next_state(const Snapshot& s, const rules::Step& step) {
  const auto& st = step.state;
  Json next = s.state;
  bool assigned = false;
  for (const auto& action : step.actions) {
    if (std::holds_alternative<rules::Assign>(action)) assigned = true;
    const auto* a = std::get_if<rules::Announce>(&action);
    if (!a) continue;
    if (a->verdict.then != rules::Verdict::Then::restart) {
      next["phase"] = rules::phase_name(rules::Phase::done);
      next["verdict"] = rendezvous::verdict_json(a->verdict);
      return next;
    }
    return Json{{"attempt", st.attempt},
                {"phase", rules::phase_name(rules::Phase::gathering)},
                {"restarts_used", st.restarts_used},
                {"prev", s.members()},
                {"gathers", field<std::uint64_t>(s.state, "gathers", 0)},
                {"verdict", rendezvous::verdict_json(a->verdict)}};
  }
  if (assigned) {
    // Every node receives this state: ids only (a node finds its rank there), each node's
    // nproc once if they are all the same, and node 0's address for MASTER_ADDR.
    Json members = Json::array();
    Json nprocs = Json::array();
    bool same = true;
    for (const auto& m : st.members) {
      members.push_back(m.id);
      nprocs.push_back(m.nproc);
      same = same && m.nproc == st.members.front().nproc;
    }
    const auto zero = st.members.empty() ? s.nodes.end() : s.nodes.find(st.members.front().id);
    next["phase"] = rules::phase_name(rules::Phase::running);
    next["members"] = members;
    next["nproc"] = same ? Json(st.members.empty() ? 1 : st.members.front().nproc) : nprocs;
    next["zero"] = zero == s.nodes.end() ? Json::object() : Json{{"addr", zero->second.addr}, {"port", zero->second.port}};
    next.erase("prev");
    next.erase("cause");
    next["reform"] = false;
    return next;
  }
  if (st.phase == rules::Phase::ending && s.phase() != rules::Phase::ending) {
    next["phase"] = rules::phase_name(rules::Phase::ending);
    next["cause"] = st.cause;
    next["reform"] = st.reform;
    return next;
  }
  return std::nullopt;
}

}  // namespace idist::launchers::etcd_rdzv
