// The cpus a plan's ranks are bound to: what this machine, its cgroup and other idist-run jobs
// (cpu claims) leave, and each rank's share of it (plan.hpp's binding half).
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "idist/launchers/cpu_claims.hpp"
#include "idist/launchers/plan.hpp"
#include "idist/launchers/resources.hpp"

namespace idist::launchers {

CpuView cpu_view(const env::Lookup& env) {
  auto allotted = allotted_cpus();
  auto mask = usable_cpus();
  auto claimed = claimed_cpus(mask, cpu_claims_dir(env));
  return {std::move(mask),   std::move(allotted.cpus), std::move(allotted.source), numa_node_of_cpu(),
          core_of_cpu(),     std::move(claimed)};
}

// Unbound ranks of a busy machine are moved about by the scheduler, and two that land on one
// core take turns at every step of a collective: 8-byte all_reduces on 2 ranks took 0.3-0.8 us
// bound and 11-21 us unbound in most runs (docs/BENCHMARKS.md, item 14). Hence binding by
// default, as mpirun does, but only where each rank gets a cpu of its own, and only among the
// cpus nobody chose for us (a mask narrower than the allotment is someone's binding, which we
// keep rather than cut up). The price, measured there too: a bound rank cannot leave a core
// that other work shares, so large calls on a machine busy with other jobs can be slower bound.
// Other idist-run jobs' bound ranks are work we can see (cpu_claims.hpp): their cpus are left
// out, and where the rest are too few our ranks stay unbound and the bound jobs let go.
void bind_ranks(LaunchPlan& plan, Bind bind, int ranks, const CpuView& view) {
  plan.cpu_shares.clear();
  plan.binding_wants_cpus = false;
  const std::size_t n = view.mask.size();
  const std::string here =
      std::to_string(ranks) + " rank(s) on " + std::to_string(n) + " usable cpu(s) (" + cpu_list(view.mask) + ")";
  std::vector<int> free;
  std::set_difference(view.mask.begin(), view.mask.end(), view.claimed.begin(), view.claimed.end(),
                      std::back_inserter(free));
  const std::string others =
      view.claimed.empty() ? "" : "other idist-run jobs here bound ranks to cpu(s) " + cpu_list(view.claimed);
  const bool too_few_free = !view.claimed.empty() && static_cast<std::size_t>(ranks) > free.size();
  if (bind == Bind::never) {
    plan.binding = "not bound: --no-bind (or IDIST_BIND=0, or bind: false in a config file)";
    if (too_few_free) plan.binding += "; " + others + ", which leaves fewer than a cpu per rank";
    plan.binding_wants_cpus = too_few_free;
    return;
  }
  if (bind == Bind::always) {
    plan.cpu_shares = cpu_shares(view.mask, ranks, view.numa, view.core);
    plan.binding = "bound (--bind): " + here;
    if (static_cast<std::size_t>(ranks) > n) plan.binding += ", so some share a cpu";
    return;
  }
  if (ranks > 0 && static_cast<std::size_t>(ranks) > n) {
    plan.binding = "not bound: " + here + ": binding would put ranks on one cpu for good; the scheduler may "
                   "move them (--bind forces it)";
    return;
  }
  const bool narrowed = !view.allotted.empty() && std::any_of(view.allotted.begin(), view.allotted.end(), [&](int c) {
    return !std::binary_search(view.mask.begin(), view.mask.end(), c);
  });
  if (narrowed) {
    plan.binding = "not bound: idist-run's affinity mask (" + cpu_list(view.mask) + ") is narrower than the " +
                   view.allotted_source + ": the user or an outer launcher bound it, and its ranks stay within it "
                   "(--bind shares it out)";
    return;
  }
  if (too_few_free) {
    plan.binding = "not bound: " + here + ", and " + others + ", which leaves fewer than a cpu per rank; the "
                   "scheduler may move them (--bind forces it)";
    plan.binding_wants_cpus = true;
    return;
  }
  plan.cpu_shares = cpu_shares(free, ranks, view.numa, view.core);
  plan.binding = "bound (the default where every rank gets a cpu; --no-bind to opt out): " + here;
  if (!others.empty()) plan.binding += ", leaving out those " + others;
}

namespace {
void unbind_for_others(LaunchPlan& plan) {
  plan.cpu_shares.clear();
  plan.binding = "not bound: another idist-run job here runs unbound for want of free cpus";
}
}  // namespace

void follow_binding(LaunchPlan& plan, HeldBinding& held) {
  if (held.let_go_if_shared() && !plan.cpu_shares.empty()) unbind_for_others(plan);
}

std::unique_ptr<HeldBinding> hold_binding(LaunchPlan& plan, Bind bind, const env::Lookup& env) {
  using Role = HeldBinding::Role;
  CpuClaims claims;
  const auto dir = cpu_claims_dir(env);
  auto chosen = [&] {
    std::vector<int> cpus;
    for (const auto& share : plan.cpu_shares) cpus.insert(cpus.end(), share.begin(), share.end());
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
  };
  const auto mask = usable_cpus();
  if (plan.mode != Mode::spawn) return std::make_unique<HeldBinding>(Role::unbound, std::move(claims), mask, dir);
  if (bind == Bind::never)
    return std::make_unique<HeldBinding>(plan.binding_wants_cpus ? Role::unbound_for_want : Role::unbound,
                                         std::move(claims), mask, dir);
  if (bind == Bind::always) {
    const auto cpus = chosen();
    // Asked before claiming: a look meets our own claims too.
    const bool over_claims = !claimed_cpus(cpus, dir).empty();
    claims.claim_free(cpus, dir);
    return std::make_unique<HeldBinding>(over_claims ? Role::bound_over_claims : Role::bound_by_request,
                                         std::move(claims), mask, dir);
  }
  // A job already runs unbound for want of cpus: binding now would only be let go at once.
  if (!plan.cpu_shares.empty() && others_run_unbound(dir)) unbind_for_others(plan);
  // Jobs started at the same moment may each see the others' cpus free; whoever claims second
  // looks again. A few rounds, then unbound rather than waiting on the others.
  for (int round = 1; !plan.cpu_shares.empty(); ++round) {
    if (claims.claim_all(chosen(), dir))
      return std::make_unique<HeldBinding>(Role::bound_by_default, std::move(claims), mask, dir);
    if (round == 3) {
      plan.cpu_shares.clear();
      plan.binding = "not bound: other idist-run jobs starting here at the same time kept claiming the cpus it chose";
      break;
    }
    bind_ranks(plan, bind, plan.local_count, cpu_view(env));
  }
  return std::make_unique<HeldBinding>(plan.binding_wants_cpus ? Role::unbound_for_want : Role::unbound,
                                       std::move(claims), mask, dir);
}

}  // namespace idist::launchers
