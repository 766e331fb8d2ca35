// The etcd rendezvous' proposer election (launchers/src/rendezvous/etcd/election.hpp) without
// etcd: where a candidate stands as a pure function of the candidates read, then Election's
// reads and watches against a small in-memory etcd that keeps create revisions, sorts and
// limits ranges as etcd does, and counts the watches each delete wakes.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/etcd/client.hpp"
#include "rendezvous/etcd/election.hpp"

namespace etcd = idist::launchers::etcd;
namespace etcd_rdzv = idist::launchers::etcd_rdzv;
using etcd_rdzv::Candidate;
using etcd_rdzv::Json;
using Role = etcd_rdzv::Place::Role;

namespace {

const std::string kJob = "/idist/rdzv/job/";
const std::string kElection = kJob + "election/";

// A queue of `n` candidates, e<i> created at revision 10 * (i + 1), given out of order.
std::vector<Candidate> queue_of(int n) {
  std::vector<Candidate> out;
  for (int i = n - 1; i >= 0; i -= 2) out.push_back({kElection + "e" + std::to_string(i), 10LL * (i + 1)});
  for (int i = n % 2 == 0 ? 0 : 1; i < n; i += 2) out.push_back({kElection + "e" + std::to_string(i), 10LL * (i + 1)});
  return out;
}

std::string e(int i) { return kElection + "e" + std::to_string(i); }

}  // namespace

TEST_CASE("election: the first created leads, every other waits on the one created just before it") {
  const auto q = queue_of(8);
  REQUIRE(q.size() == 8);
  const auto leader = etcd_rdzv::place_of(q, e(0));
  CHECK(leader.role == Role::leader);
  CHECK(leader.predecessor.empty());
  CHECK(leader.leader_since == 10);
  for (int i = 1; i < 8; ++i) {
    const auto p = etcd_rdzv::place_of(q, e(i));
    CHECK(p.role == Role::waiting);
    CHECK(p.predecessor == e(i - 1));
    CHECK(p.leader_since == 10);
  }
}

TEST_CASE("election: a predecessor leaving from the middle: its successor waits on the one before it, no one leads anew") {
  auto q = queue_of(6);
  std::erase_if(q, [](const Candidate& c) { return c.key == e(3); });
  const auto p = etcd_rdzv::place_of(q, e(4));
  CHECK(p.role == Role::waiting);
  CHECK(p.predecessor == e(2));
  CHECK(etcd_rdzv::place_of(q, e(0)).role == Role::leader);
  CHECK(etcd_rdzv::place_of(q, e(5)).predecessor == e(4));  // unchanged: it was not woken
}

TEST_CASE("election: the leader leaving: the second leads, the others still wait on the same keys") {
  auto q = queue_of(5);
  std::vector<std::string> before;
  for (int i = 2; i < 5; ++i) before.push_back(etcd_rdzv::place_of(q, e(i)).predecessor);
  std::erase_if(q, [](const Candidate& c) { return c.key == e(0); });
  CHECK(etcd_rdzv::place_of(q, e(1)).role == Role::leader);
  CHECK(etcd_rdzv::place_of(q, e(1)).leader_since == 20);
  for (int i = 2; i < 5; ++i) CHECK(etcd_rdzv::place_of(q, e(i)).predecessor == before[static_cast<std::size_t>(i - 2)]);
}

TEST_CASE("election: a tie (which etcd never makes: one transaction per candidate key) still makes one leader") {
  const std::vector<Candidate> q = {{kElection + "b", 7}, {kElection + "a", 7}, {kElection + "c", 9}};
  CHECK(etcd_rdzv::place_of(q, kElection + "a").role == Role::leader);
  CHECK(etcd_rdzv::place_of(q, kElection + "b").role == Role::waiting);
  CHECK(etcd_rdzv::place_of(q, kElection + "b").predecessor == kElection + "a");
  CHECK(etcd_rdzv::place_of(q, kElection + "c").predecessor == kElection + "b");
}

TEST_CASE("election: its own key missing (its lease lost, the keys deleted): absent, neither leading nor waiting") {
  const auto q = queue_of(3);
  const auto p = etcd_rdzv::place_of(q, e(7));
  CHECK(p.role == Role::absent);
  CHECK(p.predecessor.empty());
  CHECK(etcd_rdzv::place_of({}, e(0)).role == Role::absent);
  // The re-check's read: the two newest up to its own revision; without its own key, the two
  // before it, which must not make it wait on them.
  CHECK(etcd_rdzv::place_of({{e(2), 30}, {e(1), 20}}, e(3)).role == Role::absent);
}

TEST_CASE("election: candidates read from a range answer and from every range of a txn answer, each once") {
  auto kv = [](const std::string& key, long long create) {
    return Json{{"key", etcd::base64(key)}, {"create_revision", std::to_string(create)}, {"mod_revision", std::to_string(create)}};
  };
  const Json range{{"header", {{"revision", "40"}}}, {"kvs", {kv(e(1), 20), kv(e(0), 10)}}};
  const auto a = etcd_rdzv::candidates_of(range, kElection);
  REQUIRE(a.size() == 2);
  CHECK(a[0].key == e(1));
  CHECK(a[0].create_revision == 20);
  const Json txn{{"header", {{"revision", "41"}}},
                 {"responses",
                  {{{"response_put", Json::object()}},
                   {{"response_range", {{"kvs", {kv(kJob + "state", 5)}}}}},
                   {{"response_range", {{"kvs", {kv(e(2), 41), kv(e(1), 20)}}}}},
                   {{"response_range", {{"kvs", {kv(e(0), 10)}}}}},
                   {{"response_range", {{"kvs", {kv(e(0), 10)}}}}}}}};
  const auto b = etcd_rdzv::candidates_of(txn, kElection);
  CHECK(b.size() == 3);  // the state is no candidate; e0, read twice, is one
  const auto p = etcd_rdzv::place_of(b, e(2));
  CHECK(p.predecessor == e(1));
  CHECK(p.leader_since == 10);
}

namespace {

// Enough of etcd for the election: leased puts that keep a key's create revision, deletes,
// ranges over a prefix sorted by create revision with a limit and max_create_revision, and
// watches on one key, each wake-up counted.
struct FakeEtcd {
  long long revision = 1;
  std::map<std::string, long long> created;  // key -> create revision
  std::map<std::string, std::string> values;
  std::map<std::string, long long> modified;  // key -> mod revision
  struct Watch {
    std::string key;
    std::function<void(bool)> on_event;
  };
  std::map<int, Watch> watches;
  int next_watch = 0;
  int wakeups = 0;  // watch events delivered
  int calls = 0;    // requests answered

  Json range(const Json& r) const {
    const std::string from = etcd::unbase64(r["key"].get<std::string>());
    // No range_end: the one key.
    const std::string to = r.contains("range_end") ? etcd::unbase64(r["range_end"].get<std::string>()) : from + '\0';
    const long long max_create = r.contains("max_create_revision") ? std::stoll(r["max_create_revision"].get<std::string>()) : 0;
    std::vector<Candidate> in;
    for (const auto& [k, c] : created)
      if (k >= from && k < to && (max_create == 0 || c <= max_create)) in.push_back({k, c});
    const bool down = r.value("sort_order", "") == "DESCEND";
    std::sort(in.begin(), in.end(), [down](const Candidate& a, const Candidate& b) {
      return down ? a.create_revision > b.create_revision : a.create_revision < b.create_revision;
    });
    const auto limit = static_cast<std::size_t>(std::stoll(r.value("limit", std::string("0"))));
    if (limit > 0 && in.size() > limit) in.resize(limit);
    Json kvs = Json::array();
    for (const auto& c : in)
      kvs.push_back({{"key", etcd::base64(c.key)},
                     {"create_revision", std::to_string(c.create_revision)},
                     {"mod_revision", std::to_string(modified.count(c.key) ? modified.at(c.key) : c.create_revision)},
                     {"value", etcd::base64(values.count(c.key) ? values.at(c.key) : "")}});
    return Json{{"kvs", kvs}};
  }

  void call(const std::string& path, const Json& body, const etcd_rdzv::Election::Reply& reply) {
    ++calls;
    const Json header{{"revision", std::to_string(revision)}};
    if (path == "/v3/kv/range") return reply("", Json{{"header", header}, {"kvs", range(body)["kvs"]}});
    ++revision;
    // Compares: a key's create revision 0 (the key absent), as the election's.
    bool succeeded = true;
    for (const auto& c : body.value("compare", Json::array()))
      succeeded = succeeded && created.count(etcd::unbase64(c["key"].get<std::string>())) == 0;
    Json responses = Json::array();
    for (const auto& op : body[succeeded ? "success" : "failure"]) {
      if (op.contains("request_put")) {
        const std::string k = etcd::unbase64(op["request_put"]["key"].get<std::string>());
        created.try_emplace(k, revision);
        values[k] = etcd::unbase64(op["request_put"]["value"].get<std::string>());
        modified[k] = revision;
      }
      if (op.contains("request_range")) responses.push_back({{"response_range", range(op["request_range"])}});
    }
    reply("", Json{{"header", {{"revision", std::to_string(revision)}}}, {"succeeded", succeeded}, {"responses", responses}});
  }

  void erase(const std::string& key) {
    created.erase(key);
    ++revision;
    std::vector<std::function<void(bool)>> woken;
    for (const auto& [id, w] : watches)
      if (w.key == key) woken.push_back(w.on_event);
    for (auto& f : woken) {
      ++wakeups;
      f(true);
    }
  }
};

// A node: its election on the fake etcd, and whether it was elected (and after a wait).
struct Node {
  std::unique_ptr<etcd_rdzv::Election> election;
  int elected = 0;
  bool waited = false;
  bool absent = false;
};

std::unique_ptr<Node> candidate(FakeEtcd& etcd, long long lease) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  etcd_rdzv::Election::Io io{
      .call = [&etcd](const std::string& path, Json body, etcd_rdzv::Election::Reply reply) { etcd.call(path, body, reply); },
      .watch = [&etcd](const std::string& key, long long, std::function<void(bool)> on_event) {
        etcd.watches[etcd.next_watch] = {key, std::move(on_event)};
        return etcd.next_watch++;
      },
      .unwatch = [&etcd](int id) { etcd.watches.erase(id); },
      .elected = [n](long long, bool waited) {
        ++n->elected;
        n->waited = waited;
      },
      .absent = [n] { n->absent = true; },
      .failed = [](const std::string&) {}};
  node->election = std::make_unique<etcd_rdzv::Election>(kJob, std::move(io));
  const Json body = node->election->campaign(lease, "node-" + std::to_string(lease), Json::array());
  etcd.call("/v3/kv/txn", body, [&](const std::string&, const Json& j) {
    node->election->begin(j, nullptr);
  });
  return node;
}

}  // namespace

TEST_CASE("election on a fake etcd: 8 candidates, one watch each but the leader's; the leader leaves: one wakes") {
  FakeEtcd etcd;
  std::vector<std::unique_ptr<Node>> nodes;
  for (long long lease = 1; lease <= 8; ++lease) nodes.push_back(candidate(etcd, 0x100 + lease));
  CHECK(nodes[0]->elected == 1);
  CHECK_FALSE(nodes[0]->waited);
  for (std::size_t i = 1; i < nodes.size(); ++i) CHECK(nodes[i]->elected == 0);
  CHECK(etcd.watches.size() == 7);
  const int calls = etcd.calls;
  etcd.erase(kElection + "101");
  CHECK(etcd.wakeups == 1);
  CHECK(etcd.calls == calls + 1);  // the woken one's read, and nothing else
  CHECK(nodes[1]->elected == 1);
  CHECK(nodes[1]->waited);
  CHECK(etcd.watches.size() == 6);
  // One from the middle: its successor wakes, reads, and waits on the one before; none leads.
  etcd.erase(kElection + "105");
  CHECK(etcd.wakeups == 2);
  CHECK(etcd.calls == calls + 2);
  for (std::size_t i = 2; i < nodes.size(); ++i) CHECK(nodes[i]->elected == 0);
  etcd.erase(kElection + "104");
  etcd.erase(kElection + "103");
  etcd.erase(kElection + "102");  // the leader: the one that had waited on 105, then 104, leads
  CHECK(nodes[5]->elected == 1);
  CHECK(etcd.watches.size() == 2);
}

TEST_CASE("election on a fake etcd: its own key gone (its lease lost): absent at its next look, then rejoins last") {
  FakeEtcd etcd;
  auto a = candidate(etcd, 1);
  auto b = candidate(etcd, 2);
  auto c = candidate(etcd, 3);
  etcd.erase(kElection + "2");  // b's lease lost: c, behind it, now waits on a
  CHECK(etcd.wakeups == 1);
  CHECK(c->elected == 0);
  etcd.erase(kElection + "1");  // a leaves: b (unaware) and c wake; c leads, b finds itself gone
  CHECK(c->elected == 1);
  CHECK(b->absent);
  CHECK(b->elected == 0);
  b->election->rejoin(2, "node-2");
  CHECK(b->elected == 0);  // last in line now, behind c
  etcd.erase(kElection + "3");
  CHECK(b->elected == 1);
  CHECK(b->waited);
}

TEST_CASE("election: the first transaction reads no range of candidates (etcd would sort them all in its apply loop)") {
  FakeEtcd etcd;
  auto a = candidate(etcd, 1);
  const Json body = a->election->campaign(1, "node-1", Json::array());
  for (const char* branch : {"success", "failure"})
    for (const auto& op : body[branch])
      if (op.contains("request_range")) CHECK_FALSE(op["request_range"].contains("range_end"));
}

TEST_CASE("election on a fake etcd: 8 candidates placed by their transaction alone, the queue read by the first") {
  FakeEtcd etcd;
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.push_back(candidate(etcd, 1));
  const int calls = etcd.calls;
  for (long long lease = 2; lease <= 8; ++lease) nodes.push_back(candidate(etcd, lease));
  CHECK(etcd.calls == calls + 7);  // each: its transaction, and no read
  CHECK(nodes[0]->elected == 1);
  etcd.erase(kElection + "1");
  CHECK(nodes[1]->elected == 1);
}

TEST_CASE("election on a fake etcd: a first transaction applied twice (a retry): placed by its key's first create revision") {
  FakeEtcd etcd;
  etcd.created[kElection + "1"] = ++etcd.revision;  // the try that timed out, applied all the same
  auto b = candidate(etcd, 2);
  auto c = candidate(etcd, 3);
  auto a = candidate(etcd, 1);  // the retry: its key is older than b's and c's
  CHECK_FALSE(a->absent);
  CHECK(a->elected == 1);
  CHECK(b->elected == 0);
  CHECK(etcd.watches.size() == 2);
}
