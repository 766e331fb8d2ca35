// Launch plans (test_plan, continued): binding ranks to cpus, by default and with --bind.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/resources.hpp"
#include "launcher_envs.hpp"
#include "plan_helpers.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

namespace {

// A node of `cpus` cpus, idist-run's mask `mask` of them.
CpuView node(std::vector<int> mask, int cpus, std::string source = "online cpus") {
  CpuView v;
  v.mask = std::move(mask);
  for (int c = 0; c < cpus; ++c) v.allotted.push_back(c);
  v.allotted_source = std::move(source);
  return v;
}

}  // namespace

TEST_CASE("binding by default: each rank a cpu of its own where the ranks fit a mask nobody narrowed") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::where_fits, 2, node({0, 1}, 2));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(plan.binding.starts_with("bound (the default"));
  bind_ranks(plan, Bind::where_fits, 2, node({0, 1, 2, 3, 4, 5, 6, 7}, 8));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  // A cgroup's cpuset (a container's allotment) is the machine to share, not someone's binding.
  bind_ranks(plan, Bind::where_fits, 2, [] {
    auto v = node({4, 5}, 0, "cgroup cpuset 4-5");
    v.allotted = {4, 5};
    return v;
  }());
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{4}, {5}});
}

TEST_CASE("binding by default leaves out the cpus other idist-run jobs here bound ranks to") {
  LaunchPlan plan;
  auto view = node({0, 1, 2, 3}, 4);
  view.claimed = {0, 1};  // a job of 2 ranks started before us
  bind_ranks(plan, Bind::where_fits, 2, view);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{2}, {3}});
  CHECK(plan.binding.find("leaving out those other idist-run jobs here bound ranks to cpu(s) 0-1") != std::string::npos);
  // Too few left: unbound, as beside work we cannot see (two fake hosts on one machine).
  bind_ranks(plan, Bind::where_fits, 3, view);
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("other idist-run jobs here bound ranks to cpu(s) 0-1, which leaves fewer than a cpu") !=
        std::string::npos);
  // --bind is the user's word: the whole mask, claimed or not.
  bind_ranks(plan, Bind::always, 2, view);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
}

TEST_CASE("holding the binding: the chosen cpus are claimed; claimed meanwhile, the binding is chosen again") {
  const auto dir = std::filesystem::temp_directory_path() / ("idist-plan-claims-" + std::to_string(::getpid()));
  const auto env = [&](std::string_view name) -> std::optional<std::string> {
    if (name == kCpuClaimsVar) return dir.string();
    return std::nullopt;
  };
  const auto view = cpu_view(env);
  LaunchPlan plan;
  plan.local_count = 1;
  bind_ranks(plan, Bind::where_fits, 1, view);
  if (plan.cpu_shares.empty()) {
    MESSAGE("skipped: this process's mask is not the machine's (" << plan.binding << ")");
    return;
  }
  {
    const auto held = hold_binding(plan, Bind::where_fits, env);
    CHECK(held->role() == HeldBinding::Role::bound_by_default);
    CHECK(held->claimed() == view.mask);  // one rank: every cpu is its share
    CHECK(claimed_cpus(view.mask, dir) == view.mask);
  }
  CHECK(claimed_cpus(view.mask, dir).empty());
  if (view.mask.size() < 2) {
    MESSAGE("skipped the rest: one cpu, so no other to bind to");
    std::filesystem::remove_all(dir);
    return;
  }
  // Another job claims the first cpu between our look and our claim.
  CpuClaims other;
  REQUIRE(other.claim_all({view.mask.front()}, dir));
  bind_ranks(plan, Bind::where_fits, 1, view);  // the look from before the other's claim
  const auto held = hold_binding(plan, Bind::where_fits, env);
  auto rest = view.mask;
  rest.erase(rest.begin());
  CHECK(held->claimed() == rest);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{rest});
  // A second job finds none free: unbound, and it says so to the bound ones (UnboundMark).
  LaunchPlan second;
  second.local_count = 1;
  bind_ranks(second, Bind::where_fits, 1, cpu_view(env));
  CHECK(second.cpu_shares.empty());
  const auto unbound = hold_binding(second, Bind::where_fits, env);
  CHECK(unbound->role() == HeldBinding::Role::unbound_for_want);
  CHECK(unbound->marked());
  CHECK(others_run_unbound(dir));
  // --no-bind finds the same: its ranks share the claimed cpus, and it says so too.
  LaunchPlan unbinding;
  unbinding.local_count = 1;
  bind_ranks(unbinding, Bind::never, 1, cpu_view(env));
  CHECK(unbinding.binding.find("fewer than a cpu per rank") != std::string::npos);
  CHECK(hold_binding(unbinding, Bind::never, env)->role() == HeldBinding::Role::unbound_for_want);
  // --bind onto cpus another job claimed: bound all the same, and marked.
  LaunchPlan forced;
  forced.local_count = 1;
  bind_ranks(forced, Bind::always, 1, cpu_view(env));
  const auto over = hold_binding(forced, Bind::always, env);
  CHECK(over->role() == HeldBinding::Role::bound_over_claims);
  CHECK(over->marked());
  CHECK_FALSE(forced.cpu_shares.empty());
  other.release();
  std::filesystem::remove_all(dir);
}

TEST_CASE("not bound by default: more ranks than cpus, or a mask the user or an outer launcher narrowed") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::where_fits, 3, node({0, 1}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("3 rank(s) on 2 usable cpu(s)") != std::string::npos);
  // taskset -c 0 idist-run -n 1, srun --cpu-bind: the mask is narrower than the machine.
  bind_ranks(plan, Bind::where_fits, 1, node({0}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("narrower than the online cpus") != std::string::npos);
  bind_ranks(plan, Bind::where_fits, 2, node({2, 3, 4, 5}, 8));
  CHECK(plan.cpu_shares.empty());
  // --no-bind: never.
  bind_ranks(plan, Bind::never, 2, node({0, 1}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.starts_with("not bound: --no-bind"));
}

TEST_CASE("--bind binds whatever the mask and count: within a narrowed mask, and ranks sharing cpus") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::always, 2, node({2, 3, 4, 5}, 8));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{2, 3}, {4, 5}});
  bind_ranks(plan, Bind::always, 3, node({0, 1}, 2));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0}, {1}, {0}});
  CHECK(plan.binding.find("some share a cpu") != std::string::npos);
}

TEST_CASE("make_plan binds spawned ranks, says so in --dry-run, and leaves exec mode to the outer launcher") {
  const auto mask = usable_cpus();
  const auto allotted = allotted_cpus().cpus;
  const bool whole = std::all_of(allotted.begin(), allotted.end(),
                                 [&](int c) { return std::binary_search(mask.begin(), mask.end(), c); });
  auto o = options(static_cast<int>(mask.size()));
  auto plan = make_plan(o, from({}));
  CHECK(plan.cpu_shares.empty() == !whole);
  auto json = nlohmann::json::parse(dry_run_json(plan));
  CHECK(json["binding"]["bound"] == whole);
  CHECK(json["binding"]["why"] == plan.binding);
  CHECK(json["binding"]["cpus"].size() == plan.cpu_shares.size());
  // One rank per cpu and one more: not bound.
  plan = make_plan(options(static_cast<int>(mask.size()) + 1), from({}));
  CHECK(plan.cpu_shares.empty());
  o.bind = Bind::never;
  CHECK(make_plan(o, from({})).cpu_shares.empty());
  // A rank per task of an outer launcher, exec'd in place.
  plan = make_plan(options(), from(kSrunCyclicTask1));
  REQUIRE(plan.mode == Mode::exec);
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("outer launcher") != std::string::npos);
}
