#include "proposal.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <iterator>
#include <numeric>
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
                     .port = field<int>(value, "port", 0),
                     .store = field<int>(value, "store", 0),
                     .store_for = field<int>(value, "store_for", -1),
                     .lease = field<std::string>(value, "lease", ""),
                     .recovery = field<bool>(value, "recovery", false)};
        s.nodes[n.id] = n;
      } else if (rest.rfind("left/", 0) == 0 || rest.rfind("gone/", 0) == 0) {
        auto& into = rest[0] == 'l' ? s.left : s.gone;
        into[rest.substr(5)] = value.is_string() ? value.get<std::string>() : std::string("?");
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
  for (auto [kind, into] : {std::pair{"fail", &s.fails}, {"over", &s.overs}, {"stalled", &s.stalls}, {"views", &s.views},
                            {"lost", &s.losts}, {"capable", &s.capables}, {"ended", &s.endeds},
                            {"admit", &s.admits}, {"joined", &s.joineds}})
    for (auto& [k, r] : reports[kind])
      if (k.rfind(mine, 0) == 0) (*into)[k.substr(mine.size())] = r;
  return s;
}

std::string member_name(const Snapshot& s, std::size_t r) { return fmt::format("node {} ({})", r, host_of(s.member(r))); }

std::string lost_text(const Snapshot& s, std::size_t r, const std::string& dead_after) {
  // Said by the node itself before it went, so before what another saw of its going.
  if (const auto l = s.left.find(s.member(r)); l != s.left.end())
    return fmt::format("{} left the job: {}", member_name(s, r), l->second);
  if (const auto g = s.gone.find(s.member(r)); g != s.gone.end())
    return fmt::format("{} was lost: {}", member_name(s, r), g->second);
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
  Assignment a{.attempt = s.attempt(),
               .node_rank = static_cast<int>(r),
               .nnodes = static_cast<int>(s.members().size()),
               .world_size = world,
               .rank_base = base,
               .master_addr = field<std::string>(zero, "addr", host_of(s.member(0))),
               .master_port = field<int>(zero, "port", 0),
               .recovery_store = {}};  // this node's own store (coordinator.cpp)
  // A node that joined the attempt live (rules::JoinLive): its ranks are its replacements.
  const auto id = s.member(r);
  if (const auto live = s.state.value("live", Json::object()); live.contains(id)) {
    const auto origins = field<std::vector<int>>(s.state.value("extra", Json::object()), id.c_str(), {});
    a.rank_base = origins.empty() ? world : origins.front();
    a.world_size = origins.empty() ? world : origins.back() + 1;  // RANK is the origin (server.cpp)
    a.joins_after = field<long long>(live, id.c_str(), 0);
  }
  return a;
}

namespace {

// Whether rank `rank` of member `id` is a loss re-formed without, or reported to be (live
// recovery): a member's "over" may name it as its first failure.
bool loss_of(const Snapshot& s, const std::string& id, int rank) {
  for (const auto& j : s.state.value("lost_ranks", Json::array()))
    if (j.is_number_integer() && j.get<int>() == rank) return true;
  const auto lost = s.losts.find(id);
  if (lost == s.losts.end() || !lost->second.body.is_array()) return false;
  return std::any_of(lost->second.body.begin(), lost->second.body.end(),
                     [&](const Json& f) { return field<int>(f, "rank", -1) == rank; });
}

// Failures of the running attempt, in the order they were written (a member's "over" says its
// final word, in the place of its "fail", unless that word is a loss the others re-form
// without, which would hide the "fail": a rank that exited non-zero after it, say): reports
// first, then members that vanished without saying their ranks were gone.
std::vector<rules::Failure> failures(const Snapshot& s, const ProposerView& view) {
  std::vector<std::pair<long long, rules::Failure>> out;
  for (std::size_t r = 0; r < s.members().size(); ++r) {
    const std::string id = s.member(r);
    const auto over = s.overs.find(id);
    const auto fail = s.fails.find(id);
    const bool over_says_loss = over != s.overs.end() && over->second.body.contains("failure") &&
                                loss_of(s, id, field<int>(over->second.body["failure"], "rank", -1));
    if (over != s.overs.end() && over->second.body.contains("failure") && !(over_says_loss && fail != s.fails.end())) {
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
                                   .order = 0,
                                   .recovers = n.recovery});
  }
  std::stable_sort(out.begin(), out.end(), [](const rules::Candidate& a, const rules::Candidate& b) {
    const int ra = a.prev_rank >= 0 ? a.prev_rank : INT_MAX;
    const int rb = b.prev_rank >= 0 ? b.prev_rank : INT_MAX;
    return std::tie(ra, a.host, a.id) < std::tie(rb, b.host, b.id);
  });
  for (std::size_t i = 0; i < out.size(); ++i) out[i].order = i;
  return out;
}

bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A loss re-formed without, as the state keeps it: its node rank with it.
Json recovered_json(const rules::Failure& f) {
  Json j = rendezvous::failure_json(LocalFailure{.rank = f.rank, .how = f.how, .exit_code = f.exit_code,
                                                 .root_cause = f.root, .lost_peer = f.lost_peer, .recoverable = true});
  j["node_rank"] = f.node_rank;
  return j;
}

// The ranks whose program ended while others ran, as the members said (a/K/ended/ID).
std::vector<int> ended_ranks(const Snapshot& s) {
  std::vector<int> out;
  for (const auto& [id, r] : s.endeds)
    if (r.body.is_array())
      for (const auto& k : r.body)
        if (k.is_number_integer() && !has(out, k.get<int>())) out.push_back(k.get<int>());
  std::sort(out.begin(), out.end());
  return out;
}

// The members of the current generation: its word in the state, or every rank of the attempt.
std::vector<int> current_members(const Snapshot& s, const rules::State& st) {
  if (const auto gen = s.state.value("gen", Json::object()); gen.contains("members"))
    return field<std::vector<int>>(gen, "members", {});
  int world = 0;
  for (const auto& m : st.members) world += m.nproc;
  std::vector<int> out(static_cast<std::size_t>(world));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

// The member that runs rank (or replacement) `k`, or nullptr.
const rules::Member* holder(const rules::State& st, int k) {
  const auto m = std::find_if(st.members.begin(), st.members.end(), [&](const rules::Member& m) { return rules::holds(m, k); });
  return m == st.members.end() ? nullptr : &*m;
}

// Whether replacement `origin` joined a generation, as its node said (a/K/joined/ID).
bool joined_any(const Snapshot& s, int origin) {
  return std::any_of(s.joineds.begin(), s.joineds.end(), [&](const auto& j) {
    return has(field<std::vector<int>>(j.second.body, "origins", {}), origin);
  });
}

// "addr:port" of node `id`'s generations store for the state's attempt; "" where it has none.
std::string store_of(const Snapshot& s, const std::string& id) {
  const auto node = s.nodes.find(id);
  if (node == s.nodes.end() || node->second.store <= 0 || node->second.store_for != s.attempt()) return "";
  return fmt::format("{}:{}", node->second.addr, node->second.store);
}

// The generation the survivors go on as after `step` re-formed without its losses: the current
// one's members that are still running and neither lost nor ended, connecting through the store
// of the first one's node. A replacement admitted that has not joined yet is left out: the loss
// re-forms mid-step, and it is admitted anew once this generation is taken (admission()).
Json next_generation(const Snapshot& s, const rules::Step& step) {
  const auto& st = step.state;
  const auto ended = ended_ranks(s);
  const auto before = current_members(s, st);
  Json members = Json::array();
  std::string store;
  for (int k : before) {
    const auto* m = holder(st, k);
    if (!m || m->gone || m->over || has(st.lost_ranks, k) || has(ended, k)) continue;
    if (has(m->extra, k) && !joined_any(s, k)) continue;
    members.push_back(k);
    if (store.empty()) store = store_of(s, m->id);
  }
  std::vector<std::string> why;
  for (const auto& action : step.actions)
    if (const auto* r = std::get_if<rules::ReformInPlace>(&action)) why.push_back(r->why);
  const auto g = field<std::uint64_t>(s.state.value("gen", Json::object()), "g", 0) + 1;
  return Json{{"g", g},
              {"members", members},
              {"store", store},
              {"line", fmt::format("{}; world {} -> {}", fmt::join(why, ", "), before.size(), members.size())},
              {"last_loss", g}};
}

// Replacements ready (a/K/admit/ID) join in a generation of their own (";grow": nobody is lost,
// and the members admit them at a step boundary), as Generations::admit does on the built-in
// rendezvous: only once every member's node said its ranks joined the current generation (one
// still re-forming takes the newest, and would find the admission where the others are in the
// one before), and none after a rank ended its program (the ranks are finishing).
std::optional<Json> admission(const Snapshot& s, const rules::State& st) {
  const auto gen = s.state.value("gen", Json::object());
  const auto g = field<std::uint64_t>(gen, "g", 0);
  if (st.phase != rules::Phase::running || st.reform || !ended_ranks(s).empty()) return std::nullopt;
  const auto members = current_members(s, st);
  if (members.empty()) return std::nullopt;
  std::vector<int> ready;
  std::vector<std::string> why;
  const auto live = s.state.value("live", Json::object());
  for (const auto& m : st.members) {
    const auto a = s.admits.find(m.id);
    if (m.gone || m.over || a == s.admits.end() || !a->second.body.is_array()) continue;
    std::vector<int> mine;
    std::vector<std::string> words;
    for (const auto& j : a->second.body) {
      const int k = field<int>(j, "origin", -1);
      if (!has(m.extra, k) || has(members, k) || has(st.lost_ranks, k) || has(mine, k)) continue;
      mine.push_back(k);
      words.push_back(field<std::string>(j, "why", fmt::format("rank {} is ready", k)));
    }
    // A node that joined live says its ranks one put at a time: together, once all are said.
    if (live.contains(m.id) && std::any_of(m.extra.begin(), m.extra.end(), [&](int k) {
          return !has(mine, k) && !has(members, k) && !has(st.lost_ranks, k);
        }))
      continue;
    ready.insert(ready.end(), mine.begin(), mine.end());
    why.insert(why.end(), words.begin(), words.end());
  }
  if (ready.empty()) return std::nullopt;
  for (int k : members) {
    const auto* m = holder(st, k);
    if (!m || m->gone || m->over) return std::nullopt;  // a loss the next read weighs
    const auto j = s.joineds.find(m->id);
    if (g > 0 && (j == s.joineds.end() || field<std::uint64_t>(j->second.body, "g", 0) < g)) return std::nullopt;
  }
  auto grown = members;
  grown.insert(grown.end(), ready.begin(), ready.end());
  // Generation 0's world connects through rank 0's store; the first after it through the
  // first member's node's generations store, as a loss's would.
  const auto store = g > 0 ? field<std::string>(gen, "store", "") : store_of(s, holder(st, members.front())->id);
  return Json{{"g", g + 1},
              {"members", grown},
              {"store", store},
              {"grow", true},
              {"line", fmt::format("{}; world {} -> {}", fmt::join(why, ", "), members.size(), grown.size())},
              {"last_loss", field<std::uint64_t>(gen, "last_loss", g)}};
}

// Node `j.id` joins the running attempt live: a member whose ranks (nproc 0) are its
// replacements, after the current generation, which its assignment says (assignment_of).
void join_live(const Snapshot& s, const rules::Step& step, const rules::JoinLive& j, Json& next) {
  const auto& st = step.state;
  Json members = Json::array(), nprocs = Json::array(), extra = Json::object();
  for (const auto& m : st.members) {
    members.push_back(m.id);
    nprocs.push_back(m.nproc);
    if (!m.extra.empty()) extra[m.id] = m.extra;
  }
  next["members"] = members;
  next["nproc"] = nprocs;
  next["extra"] = extra;
  auto live = s.state.value("live", Json::object());
  live[j.id] = field<std::uint64_t>(s.state.value("gen", Json::object()), "g", 0);
  next["live"] = live;
}

// What `step` changed of live recovery's replacements in `next`: the grants with its losses,
// each node's replacements, the budget; or a generation admitting those ready; and the ones
// nobody is left to admit. Whether anything changed.
bool replacements(const Snapshot& s, const rules::Step& step, bool reformed, Json& next) {
  const auto& st = step.state;
  bool changed = false;
  auto grants = s.state.value("grants", Json::array());
  for (const auto& action : step.actions)
    if (const auto* r = std::get_if<rules::ReformInPlace>(&action))
      for (const auto& k : r->replace)
        grants.push_back(Json{{"node", st.members[static_cast<std::size_t>(k.node_rank)].id},
                              {"lost", k.lost},
                              {"origin", k.origin}});
  if (grants != s.state.value("grants", Json::array())) {
    Json extra = Json::object();
    for (const auto& m : st.members)
      if (!m.extra.empty()) extra[m.id] = m.extra;
    next["grants"] = grants;
    next["extra"] = extra;
    next["restarts_used"] = st.restarts_used;
    changed = true;
  }
  if (!reformed)
    if (auto grown = admission(s, st)) {
      auto admitted = field<std::vector<int>>(s.state, "admitted", {});
      for (int k : field<std::vector<int>>(*grown, "members", {}))
        if (holder(st, k) && has(holder(st, k)->extra, k) && !has(admitted, k)) admitted.push_back(k);
      next["gen"] = std::move(*grown);
      next["admitted"] = admitted;
      changed = true;
    }
  if (st.phase == rules::Phase::running && s.state.contains("extra")) {
    const auto unjoined = rules::unjoined_after_members_ended(st, current_members(s, st),
                                                              [&](int k) { return joined_any(s, k); });
    if (!unjoined.empty() && unjoined != field<std::vector<int>>(s.state, "unjoined", {})) {
      next["unjoined"] = unjoined;
      changed = true;
    }
  }
  return changed;
}

}  // namespace

namespace {

// The losses in `st` (rules_state's) to weigh one by one, taken out of its failures.
std::vector<rules::Event> pending_losses(const Snapshot& s, rules::State& st) {
  std::vector<rules::Event> out;
  if (st.phase != rules::Phase::running || st.reform) return out;
  const auto member_gone = [&](const rules::Failure& f) {
    return f.rank < 0 && f.node_rank >= 0 && f.node_rank < static_cast<int>(st.members.size()) &&
           st.members[static_cast<std::size_t>(f.node_rank)].gone;
  };
  std::vector<std::pair<long long, rules::Failure>> reported;
  for (std::size_t r = 0; r < st.members.size(); ++r) {
    const auto it = s.losts.find(st.members[r].id);
    if (it == s.losts.end() || !it->second.body.is_array()) continue;
    for (const auto& j : it->second.body) {
      auto f = rendezvous::failure_of(j, static_cast<int>(r));
      f.recoverable = true;
      if (f.rank >= 0 && !has(st.lost_ranks, f.rank)) reported.emplace_back(it->second.revision, std::move(f));
    }
  }
  // A member whose ranks were all lost says the same loss in its "over": the lost key's event
  // weighs it. Another failure (a non-zero exit, a rank its node could not re-form without)
  // ends the attempt whatever else happened.
  const auto reported_loss = [&](const rules::Failure& f) {
    return f.rank >= 0 &&
           std::any_of(reported.begin(), reported.end(), [&](const auto& r) { return r.second.rank == f.rank; });
  };
  if (!std::all_of(st.failures.begin(), st.failures.end(),
                   [&](const rules::Failure& f) { return member_gone(f) || reported_loss(f); }))
    return out;
  std::erase_if(st.failures, reported_loss);
  // Members gone first: their keys went with their lease, "capable" too, which the rules ask of
  // every member still there when they weigh a loss.
  for (const auto& f : st.failures) {
    auto& m = st.members[static_cast<std::size_t>(f.node_rank)];
    m.gone = false;  // the rules mark it gone as they hear it
    m.capable = true;
    out.push_back(rules::Lost{.id = m.id, .text = f.how, .prev_rank = -1, .nodes_left = 0});
  }
  st.failures.clear();
  std::stable_sort(reported.begin(), reported.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [revision, f] : reported) out.push_back(rules::Fail{std::move(f)});
  return out;
}

}  // namespace

rules::Step decide_read(const Snapshot& s, const ProposerView& view, const rules::Event& event,
                        const rules::Limits& limits) {
  auto state = rules_state(s, view);
  std::vector<rules::Action> actions;
  if (limits.recovery && std::holds_alternative<rules::Reconsider>(event))
    for (const auto& loss : pending_losses(s, state)) {
      auto weighed = rules::decide(std::move(state), loss, limits);
      state = std::move(weighed.state);
      std::move(weighed.actions.begin(), weighed.actions.end(), std::back_inserter(actions));
    }
  auto step = rules::decide(std::move(state), event, limits);
  step.actions.insert(step.actions.begin(), std::make_move_iterator(actions.begin()),
                      std::make_move_iterator(actions.end()));
  return step;
}

rules::State rules_state(const Snapshot& s, const ProposerView& view) {
  rules::State st;
  st.phase = s.phase();
  st.attempt = s.attempt();
  st.restarts_used = field<int>(s.state, "restarts_used", 0);
  st.cause = field<std::string>(s.state, "cause", "");
  st.reform = field<bool>(s.state, "reform", false);
  st.last_call = view.last_call;
  int base = 0;
  const auto extra = s.state.value("extra", Json::object());
  const auto live = s.state.value("live", Json::object());
  for (std::size_t r = 0; r < s.members().size(); ++r) {
    const std::string id = s.member(r);
    const bool over = s.overs.count(id) > 0;
    const bool gone = !s.nodes.count(id);
    // A node that joined live is taken as capable and admitting from its join, as the rules take
    // it (rules::JoinLive): its ranks are replacements, which opt in.
    const bool said = s.capables.count(id) > 0;
    st.members.push_back(rules::Member{.id = id, .host = host_of(id), .nproc = s.nproc(r), .base = base, .over = over,
                                       .gone = gone, .capable = said || live.contains(id),
                                       .extra = field<std::vector<int>>(extra, id.c_str(), {}),
                                       .admits = live.contains(id) ||
                                                 (said && field<bool>(s.capables.at(id).body, "admits", false))});
    base += s.nproc(r);
    if (gone && over) st.departures.push_back(lost_text(s, r, view.dead_after));
  }
  st.waiting = candidates(s, st.attempt);
  st.lost_ranks = field<std::vector<int>>(s.state, "lost_ranks", {});
  // Admitted, as the rules count it, once its node said it joined: one admitted and not joined
  // yet holds none of the job's work, and is left out of a generation a loss makes meanwhile
  // (next_generation), so that the world the rules count is the one written.
  for (int k : field<std::vector<int>>(s.state, "admitted", {}))
    if (joined_any(s, k)) st.admitted.push_back(k);
  st.ended_ranks = ended_ranks(s);
  for (const auto& j : s.state.value("recovered", Json::array()))
    st.recovered.push_back(rendezvous::failure_of(j, field<int>(j, "node_rank", -1)));
  st.failures = failures(s, view);
  // A loss re-formed without is no failure: not the rank's final word that its node says in
  // "over", nor a member gone whose ranks in the current generation (its replacements there
  // too) were all re-formed without.
  const auto members = current_members(s, st);
  std::erase_if(st.failures, [&](const rules::Failure& f) {
    if (f.rank >= 0) return has(st.lost_ranks, f.rank);
    if (f.node_rank < 0 || f.node_rank >= static_cast<int>(st.members.size())) return false;
    const auto& m = st.members[static_cast<std::size_t>(f.node_rank)];
    for (int k : members)
      if (rules::holds(m, k) && !has(st.lost_ranks, k)) return false;
    st.departures.push_back(f.how);
    return true;
  });
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
    for (const char* k :
         {"prev", "cause", "gen", "lost_ranks", "recovered", "ended", "grants", "extra", "admitted", "unjoined", "live"})
      next.erase(k);
    next["reform"] = false;
    return next;
  }
  bool changed = false;
  std::vector<int> lost;
  for (const auto& action : step.actions)
    if (const auto* r = std::get_if<rules::ReformInPlace>(&action)) lost.insert(lost.end(), r->lost.begin(), r->lost.end());
  const auto before = current_members(s, st);
  // A replacement lost before any generation had it: nobody re-forms (its grant is kept below).
  const bool reformed = std::any_of(lost.begin(), lost.end(), [&](int k) { return has(before, k); });
  if (reformed) next["gen"] = next_generation(s, step);
  if (!lost.empty()) {
    next["lost_ranks"] = st.lost_ranks;
    Json recovered = Json::array();
    for (const auto& f : st.recovered) recovered.push_back(recovered_json(f));
    next["recovered"] = recovered;
    changed = true;
  }
  changed = replacements(s, step, reformed, next) || changed;
  for (const auto& action : step.actions)
    if (const auto* j = std::get_if<rules::JoinLive>(&action)) {
      join_live(s, step, *j, next);
      changed = true;
    }
  if (const auto ended = ended_ranks(s); st.phase == rules::Phase::running && !ended.empty() &&
                                         field<std::vector<int>>(s.state, "ended", {}) != ended) {
    next["ended"] = ended;
    changed = true;
  }
  if (st.phase == rules::Phase::ending && s.phase() != rules::Phase::ending) {
    next["phase"] = rules::phase_name(rules::Phase::ending);
    next["cause"] = st.cause;
    next["reform"] = st.reform;
    changed = true;
  }
  return changed ? std::optional(next) : std::nullopt;
}

}  // namespace idist::launchers::etcd_rdzv
