#include "runtime.hpp"

#include <spdlog/fmt/fmt.h>
#include "log.hpp"
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "backends/carriers.hpp"
#include "common/cpus_shared.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "recorder.hpp"
#include "idist/common/host.hpp"
#include "store/memory_store.hpp"
#include "store/prefix_store.hpp"
#include "store_keys.hpp"
#include "store/tcp_store.hpp"

namespace idist::detail {
using namespace store_keys;

namespace {

// The library's single piece of global mutable state.
std::unique_ptr<Runtime>& default_runtime() {
  static std::unique_ptr<Runtime> instance;
  return instance;
}

std::string choose_backend(const env::Contract& contract, const InitOptions& options) {
  if (contract.backend.empty() || contract.backend == options.backend) return options.backend;
  // The launcher's choice wins so a GPU program can be smoke-tested on CPU; say so once.
  if (contract.rank == 0)
    std::cerr << "idist: IDIST_BACKEND=" << contract.backend << " overrides the backend '" << options.backend
              << "' the program asked for\n";
  return contract.backend;
}

using Clock = std::chrono::steady_clock;

}  // namespace

std::uint64_t next_runtime_id() {
  static std::atomic<std::uint64_t> last = 0;
  return ++last;
}

void Runtime::adopt(const Layout& layout, const ErrorSite& site) {
  auto& c = contract_;
  if (c.from_env && (c.world_size != layout.size || c.rank != layout.rank))
    throw Error(site, fmt::format("the environment says rank {} of {} but MPI says rank {} of {}; the mpi backend needs "
                                  "every rank started by one mpirun (mpirun -np {} idist-run ...), or use gloo",
                                  c.rank, c.world_size, layout.rank, layout.size, c.world_size));
  c.rank = layout.rank;
  c.world_size = layout.size;
  c.local_rank = layout.local_rank;
  c.local_world_size = layout.local_size;
  c.node_rank = layout.node_rank;
  c.nnodes = layout.nnodes;
}

namespace {

// A write to a peer that died (Gloo's writev, a store connection) raises SIGPIPE, whose default
// action kills the process without a word: the survivors of a rank's crash then die "of
// SIGPIPE" and the job's summary blames them. Ignored, the write fails with EPIPE and becomes
// an error naming the peer. Only the default action is replaced: a program's own handler (or
// its own SIG_IGN, as Python sets) stays. Process-wide, once, and documented in the README.
void ignore_sigpipe_unless_handled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0)
      ::signal(SIGPIPE, SIG_IGN);
  });
}

}  // namespace

void Runtime::check_intranode(const std::string& backend, const ErrorSite& site) const {
  if (contract_.intranode != "shm") return;
  if (backend != "gloo")
    throw Error(site, "IDIST_INTRANODE=shm: shared memory carries the gloo backend, not " + backend +
                          "; unset IDIST_INTRANODE or choose gloo");
  if (contract_.world_size > 1 && !shared_memory_serves(hosts_, contract_))
    throw Error(site, "IDIST_INTRANODE=shm: no two ranks share a host, so shared memory has nothing to join; unset "
                      "IDIST_INTRANODE (auto) or set it to off");
}

Runtime::Runtime(const env::Contract& contract, const InitOptions& options)
    : contract_(contract), id_(next_runtime_id()) {
  ignore_sigpipe_unless_handled();
  follow_cpus_shared(contract_);
  // A replacement beats once it asks to join (join_when_ready): idist-run admits it then.
  if (options.recovery && contract_.replacement_origin < 0)
    heartbeat_ = std::make_unique<Heartbeat>(launcher_segment());
  // One deadline for the whole rendezvous: reaching the store and everyone joining.
  const auto deadline = Clock::now() + contract_.timeout;
  const std::string backend = choose_backend(contract_, options);
  ErrorSite site{contract_.rank, contract_.world_size, "init", backend};
  raised_at(site, [&] {
    std::optional<Layout> native;
    try {
      native = native_layout(backend);
    } catch (const std::exception& e) {
      throw Error(site, e.what());
    }
    if (!native && !contract_.unread_launcher.empty())
      throw Error(site, "started by an outer launcher (" + contract_.unread_launcher +
                            ") without idist-run, so RANK and WORLD_SIZE are not set and every task would compute "
                            "alone: start it as `<launcher> idist-run PROGRAM` (e.g. mpiexec -n 3 idist-run ./prog), or "
                            "initialise through idist::Parallel, which reads the launcher (<idist/launch.hpp>)");
    if (native) {
      adopt(*native, site);
      site.rank = contract_.rank;
      site.world_size = contract_.world_size;
      follow_cpus_shared(contract_);  // MPI's count of the ranks on this node; no join follows
    }
    if (contract_.world_size == 1 || native) {
      // A backend with its own world needs no rendezvous; the store still serves sub-groups'
      // bookkeeping within this process.
      store_ = std::make_unique<MemoryStore>(contract_.timeout);
    } else if (contract_.replacement_origin >= 0) {
      if (!options.recovery)
        throw Error(site, "started as a replacement (IDIST_REPLACEMENT) without InitOptions::recovery");
      backend_ = backend;
      recovery_ = true;
      recovery_carriers(contract_, site);  // as the ranks it joins did, from the same environment
      joining_ = true;
      pending_join_ = true;  // at its first use of the world
      return;
    } else {
      if (contract_.rank == 0)
        server_ = std::make_unique<TcpStoreServer>(
            StoreServerOptions{.host = contract_.master_addr,
                               .port = contract_.master_port,
                               .token = contract_.job_token,
                               .bind_all = contract_.store_bind_all});
      store_ = std::make_unique<TcpStore>(
          TcpStoreOptions{contract_.master_addr, contract_.master_port, contract_.job_token, contract_.timeout});
      if (options.recovery) recovery_carriers(contract_, site);
      join(deadline, agreed_settings(contract_, backend, options.recovery));
      rendezvous_ = true;
    }
    if (contract_.world_size == 1) hosts_ = {0};
    backend_ = backend;
    check_intranode(backend, site);
    recovery_ = options.recovery;
    origins_.resize(static_cast<std::size_t>(contract_.world_size));
    std::iota(origins_.begin(), origins_.end(), 0);
    connect_world();
    watch_generations();
  });
}

void Runtime::connect_world(const std::atomic<bool>* superseded) {
  BackendInit init{contract_.rank, contract_.world_size, *store_, kWorldPrefix, contract_.timeout, contract_, hosts_};
  init.superseded = superseded;
  auto impl = make_backend(backend_, init);
  std::vector<int> everyone(static_cast<std::size_t>(contract_.world_size));
  std::iota(everyone.begin(), everyone.end(), 0);
  auto world = std::make_unique<ProcessGroup>(
      std::move(impl), group_options(contract_.rank, contract_.world_size, "world", kWorldPrefix, everyone));
  std::lock_guard lock(groups_mu_);
  world_ = std::move(world);
}

Runtime::~Runtime() {
  generation_watch_.reset();  // it aborts groups: gone before they are
  // Connections first (groups before the world they came from), then the store client, then
  // (rank 0) the server they came through.
  groups_.clear();
  world_.reset();
  store_.reset();
  server_.reset();
}

std::shared_ptr<const GroupState> Runtime::new_group(const std::vector<int>& ranks) {
  const ErrorSite site = world().site("new_group");
  if (ranks.empty()) throw Error(site, "ranks is empty; a group needs at least one rank");
  std::vector<bool> seen(static_cast<std::size_t>(contract_.world_size));
  for (int r : ranks) {
    if (r < 0 || r >= contract_.world_size)
      throw Error(site, fmt::format("rank {} is not in the world (size {})", r, contract_.world_size));
    if (seen[static_cast<std::size_t>(r)]) throw Error(site, fmt::format("rank {} is listed twice", r));
    seen[static_cast<std::size_t>(r)] = true;
  }
  auto state = std::make_shared<GroupState>();
  state->ranks = ranks;
  state->runtime_id = id_;
  state->description = fmt::format("group [{}]", fmt::join(ranks, ", "));
  // Every rank counts every group, member or not, so all agree on each group's key prefix.
  const int id = groups_made_++;
  state->id = id;
  const auto me = std::find(ranks.begin(), ranks.end(), contract_.rank);
  if (me == ranks.end()) return state;
  state->rank = static_cast<int>(me - ranks.begin());
  const int size = static_cast<int>(ranks.size());
  const auto prefix = fmt::format("idist/group/{}/", id);
  auto options = group_options(state->rank, size, state->description, prefix, ranks);
  options.group_id = id;
  auto group = world_->make_group(
      ranks, BackendInit{state->rank, size, *store_, prefix, contract_.timeout, contract_, hosts_of(ranks)},
      std::move(options));
  state->group = group.get();
  std::lock_guard lock(groups_mu_);
  groups_.push_back(std::move(group));
  return state;
}

ProcessGroupOptions Runtime::group_options(int rank, int size, std::string description, std::string prefix,
                                           std::vector<int> members) {
  ProcessGroupOptions o{rank, size, ErrorSite{contract_.rank, contract_.world_size, "", backend_},
                        std::move(description), contract_.debug};
  // The flight recorder's epoch (16 bits kept), which idist-run compares calls within: the
  // runtime's number, then one of its generation's, alike on every member (a replacement's
  // runtime is its process's first, a survivor's counts its re-forms).
  o.epoch = static_cast<std::uint32_t>(generation_ == 0 ? id_ : 0x8000u | (generation_ & 0x7fffu));
  if (prefix != kWorldPrefix) o.members = members;
  if (recovery_ && !contract_.recovery_host.empty())
    o.on_peer_lost = [this, generation = generation_.load()] { abort_generation(generation, "a peer was lost"); };
  if (rendezvous_) {
    o.explain_departure = [this, members, rank, world = prefix == kWorldPrefix](int member, std::string_view op,
                                                                                 std::uint64_t number) {
      return explain_departure(members, rank, member, world, op, number);
    };
    o.explain_timeout = [this, prefix = std::move(prefix), members = std::move(members), rank](
                            std::string_view, std::string_view call, std::uint64_t number) {
      return who_did_not_arrive(prefix, members, rank, call, number);
    };
  }
  return o;
}

std::unique_ptr<Store> Runtime::probe(std::chrono::milliseconds patience) const {
  // After a re-form the world's keys are in the store the generation connects through (idist-
  // run's; on etcd the one its word names, maybe another node's), under the generation's prefix.
  std::unique_lock lock(connect_mu_);
  if (const auto g = generation_.load(); g > 0) {
    const bool said = !connect_host_.empty();  // not before the first word (a replacement's start)
    TcpStoreOptions options{said ? connect_host_ : contract_.recovery_host,
                            said ? connect_port_ : contract_.recovery_port, contract_.job_token, patience};
    lock.unlock();
    return std::make_unique<PrefixStore>(std::make_shared<TcpStore>(std::move(options)), generation_prefix(g));
  }
  lock.unlock();
  return std::make_unique<TcpStore>(
      TcpStoreOptions{contract_.master_addr, contract_.master_port, contract_.job_token, patience});
}

namespace {

// "ranks 2, 3" from group ranks, named by their global ranks.
std::string global_list(const std::vector<int>& members, const std::vector<bool>& present) {
  std::vector<int> missing;
  for (std::size_t g = 0; g < present.size(); ++g)
    if (!present[g]) missing.push_back(members[g]);
  return fmt::format("rank{} {}", missing.size() == 1 ? "" : "s", fmt::join(missing, ", "));
}

// Which of `keys` exist by `until`, asking every few milliseconds: unlike a store wait, it
// ends with the answer for each key rather than a timeout, and leaves the connection usable.
std::vector<bool> present_by(Store& store, const std::vector<std::string>& keys, Clock::time_point until) {
  std::vector<bool> present;
  poll_until(
      [&] {
        present = check_all(store, keys);
        return count_missing(present) == 0;
      },
      until, kStorePolicy);
  return present;
}

}  // namespace

std::string Runtime::who_did_not_arrive(const std::string& prefix, const std::vector<int>& members, int me,
                                        std::string_view call, std::uint64_t number) {
  // Members that did arrive time out at about the same moment, as we did; a short window
  // catches their word even when they entered a little later. Each says where it timed out
  // (one key per member: the group is unusable after a timeout, so there is no later one), so
  // a member that got past this call, or never reached it, is told from one that is in it.
  constexpr auto kWindow = std::chrono::seconds(2);
  std::unique_ptr<Store> store;
  try {
    store = probe();
  } catch (const std::exception& e) {
    // Rank 0 hosts the store: when it does not answer either, it is the one to look at; when it
    // refuses, it has gone (it may have timed out first and left).
    if (std::string_view(e.what()).find("refused") != std::string_view::npos)
      return fmt::format("rank 0, which hosts the job's store, has closed it ({}): it has ended", e.what());
    return fmt::format("rank 0, which hosts the job's store, does not answer either ({}): it is stopped, frozen or "
                       "too busy to reply (idist-run's stall report says which)",
                       e.what());
  }
  const std::string base = prefix + "timed_out/";
  const std::string mine = fmt::format("{} {}", number, call);
  store->set(base + std::to_string(me), std::vector<char>(mine.begin(), mine.end()));
  const auto keys = numbered_keys(base, static_cast<int>(members.size()));
  const auto present = present_by(*store, keys, Clock::now() + kWindow);
  std::vector<std::string> past, behind, other_call;
  for (std::size_t g = 0; g < present.size(); ++g) {
    if (!present[g] || static_cast<int>(g) == me) continue;
    const auto value = store->get(keys[g]);
    const std::string text(value.begin(), value.end());
    const auto space = text.find(' ');
    const auto theirs = std::strtoull(text.c_str(), nullptr, 10);
    const std::string their_call = space == std::string::npos ? text : text.substr(space + 1);
    const auto who = fmt::format("rank {} in {} as #{}", members[g], their_call, theirs);
    if (theirs > number) {
      past.push_back(who);
    } else if (theirs < number) {
      behind.push_back(who);
    } else if (their_call != call) {
      other_call.push_back(who);
    }
  }
  // Those that left say so in the store (finalize's note): read before saying we are done
  // reading, since rank 0 may close the store as soon as everyone is.
  auto arrived_or_left = present;
  const auto left = count_missing(present) > 0 ? those_that_left(*store, members, arrived_or_left) : std::string();
  // Rank 0 hosts the store and may exit as soon as it raises: it first lets the others that
  // came finish reading, as join() does.
  store->set(base + "read/" + std::to_string(me), {});
  if (contract_.rank == 0) {
    std::vector<std::string> readers;
    for (std::size_t g = 0; g < present.size(); ++g)
      if (present[g]) readers.push_back(base + "read/" + std::to_string(g));
    try {
      wait_all(*store, readers, Clock::now() + kWindow);
    } catch (const std::exception&) {
      // They had their moment.
    }
  }
  std::vector<std::string> parts;
  if (!other_call.empty())
    parts.push_back(fmt::format("the ranks' calls do not match: this rank was in {} as #{}, {} instead", call, number,
                                fmt::join(other_call, ", ")));
  if (!past.empty())
    parts.push_back(fmt::format("this rank is in {} as #{}, but others got past it and timed out later ({}): the "
                                "calls at #{} did not match (another count, dtype or root?)",
                                call, number, fmt::join(past, ", "), number));
  if (!behind.empty())
    parts.push_back(fmt::format("others timed out in an earlier call ({})", fmt::join(behind, ", ")));
  if (count_missing(present) > 0) {
    if (!left.empty()) parts.push_back(left);
    if (count_missing(arrived_or_left) > 0)
      parts.push_back(fmt::format("{} did not arrive at it (no word from them within {}s of the timeout)",
                                  global_list(members, arrived_or_left), kWindow.count()));
  }
  if (parts.empty())
    return "every rank of the group was in this very call and timed out too: the transport held it (a cut or "
           "overloaded link, a peer stuck inside the backend)";
  return fmt::format("{}", fmt::join(parts, "; "));
}

void Runtime::monitored_barrier(const GroupState* state, std::chrono::milliseconds timeout) {
  ProcessGroup& group = state == nullptr ? *world_ : *state->group;
  const ErrorSite site = group.site("monitored_barrier");
  if (!rendezvous_) return group.barrier();  // a world of one, or MPI's own world: no store to collect in
  std::vector<int> members = state == nullptr ? std::vector<int>() : state->ranks;
  if (state == nullptr) {
    members.resize(static_cast<std::size_t>(contract_.world_size));
    std::iota(members.begin(), members.end(), 0);
  }
  const std::string prefix = state == nullptr ? std::string(kWorldPrefix) : fmt::format("idist/group/{}/", state->id);
  const auto base = fmt::format("{}monitored_barrier/{}/", prefix, monitored_barriers_[prefix]++);
  const std::string result_key = base + "result";
  raised_at(site, [&] {
    store_->set(base + std::to_string(group.rank()), {});
    if (group.rank() != 0) {
      // Rank 0 decides; its verdict comes a moment after its own deadline.
      auto reader = probe();
      const auto patience = timeout + std::chrono::seconds(5);
      // -> bool: vector<bool>'s [0] is a proxy into the temporary vector, dangling once returned.
      if (!poll_until([&]() -> bool { return reader->check({result_key})[0]; }, Clock::now() + patience, kStorePolicy))
        throw TimeoutFailure(fmt::format("rank {} never reported, within {}", members[0], duration_text(patience)));
      const auto verdict = reader->get(result_key);
      if (!verdict.empty()) throw TimeoutFailure(std::string(verdict.begin(), verdict.end()));
      return;
    }
    const auto keys = numbered_keys(base, group.size());
    auto reader = probe();
    // A member that called finalize() will never come: the wait ends once every member has
    // arrived or left, and the verdict says what those that left did.
    std::vector<bool> present;
    poll_until(
        [&] {
          present = check_all(*reader, keys);
          if (count_missing(present) == 0) return true;
          const auto left = finalized_among(*reader, members);
          for (std::size_t g = 0; g < present.size(); ++g)
            if (!present[g] && !left[g]) return false;
          return true;
        },
        Clock::now() + timeout, kStorePolicy);
    std::vector<std::string> parts;
    auto arrived_or_left = present;
    if (const auto left = those_that_left(*reader, members, arrived_or_left); !left.empty()) parts.push_back(left);
    if (count_missing(arrived_or_left) > 0)
      parts.push_back(
          fmt::format("{} did not arrive within {}", global_list(members, arrived_or_left), duration_text(timeout)));
    const auto verdict = fmt::format("{}", fmt::join(parts, "; "));
    reader->set(result_key, std::vector<char>(verdict.begin(), verdict.end()));
    // The members read the verdict at once; then the leavers are told (tell_leavers may wait
    // for one to read its key, on the rank that hosts the store).
    std::vector<int> leavers;
    for (std::size_t g = 0; g < present.size(); ++g)
      if (!present[g] && arrived_or_left[g]) leavers.push_back(members[g]);
    tell_leavers(*reader, leavers, fmt::format("monitored_barrier #{}", monitored_barriers_[prefix] - 1));
    if (!verdict.empty()) throw TimeoutFailure(verdict);
  });
}

Runtime& runtime(std::string_view op) {
  auto& rt = default_runtime();
  if (!rt) throw Error(ErrorSite{-1, 0, std::string(op), ""}, "call idist::init() first");
  return *rt;
}

Runtime* runtime_if_initialized() { return default_runtime().get(); }

}  // namespace idist::detail

namespace idist {

void init(const InitOptions& options) {
  auto& rt = detail::default_runtime();
  if (rt)
    throw Error(ErrorSite{rt->contract().rank, rt->contract().world_size, "init", std::string(rt->backend_name())},
                "already initialized; call finalize() first");
  env::Contract contract;
  try {
    contract = env::read_contract();
  } catch (const env::ContractError& e) {
    throw Error(ErrorSite{-1, 0, "init", ""}, std::string("bad environment: ") + e.what());
  }
  rt = std::make_unique<detail::Runtime>(contract, options);
}

void finalize() {
  auto& rt = detail::default_runtime();
  if (!rt) return;
  // Gone even when finalize() raises (a peer left behind): the store and connections close.
  const std::unique_ptr<detail::Runtime> ending = std::move(rt);
  ending->finalize();
}

void mark_step() {
  if (auto* rt = detail::runtime_if_initialized()) rt->mark_step();
  detail::record_step();
}

bool is_initialized() { return detail::runtime_if_initialized() != nullptr; }

}  // namespace idist
