// The rendezvous on etcd at scale: N simulated nodes (EtcdRendezvous, one process, one event
// loop) join one job on a real etcd and wait for their assignments. Prints the time from the
// first join to the last assignment, and checks every answer: node ranks 0..N-1 each once,
// each node's first rank, the world size. The job's keys are left for the caller to remove
// (the nodes detach without leaving).
// usage: rdzv_scale_etcd ENDPOINTS JOB_ID N     exit 0 when every answer is right
#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "idist/launchers/etcd_rendezvous.hpp"

namespace L = idist::launchers;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: rdzv_scale_etcd ENDPOINTS JOB_ID N\n");
    return 2;
  }
  const int n = std::stoi(argv[3]);
  constexpr int kRanksPerNode = 8;
  spdlog::set_level(spdlog::level::warn);
  boost::asio::io_context io;
  std::vector<std::shared_ptr<L::EtcdRendezvous>> nodes;
  int assigned = 0, failed = 0;
  const auto start = Clock::now();
  Clock::time_point first{}, last{};
  for (int i = 0; i < n; ++i) {
    L::EtcdRendezvousOptions o;
    o.endpoints = argv[1];
    o.job_id = argv[2];
    o.min_nodes = o.max_nodes = n;
    o.nproc = kRanksPerNode;
    o.join_timeout = std::chrono::seconds(120);
    o.dead_after = std::chrono::seconds(30);  // the simulation's loop is busy: no lease may lapse
    o.heartbeat = std::chrono::seconds(2);
    o.local_addr = "127.0.0.1";
    auto node = std::make_shared<L::EtcdRendezvous>(o);
    node->start(io, {});
    node->join(0, [&, i](const std::optional<L::RemoteVerdict>& ended) {
      if (ended) {
        if (++failed == 1) std::fprintf(stderr, "node %d: %s\n", i, ended->cause.c_str());
      } else {
        ++assigned;
      }
      last = Clock::now();
      if (assigned + failed == 1) first = last;
      if (assigned + failed == n) io.stop();
    });
    nodes.push_back(node);
  }
  io.run_for(std::chrono::seconds(180));
  std::vector<int> seen(static_cast<std::size_t>(n));
  int wrong = 0;
  for (const auto& node : nodes) {
    const auto& a = node->assignment();
    if (a.node_rank < 0 || a.node_rank >= n || a.nnodes != n || a.world_size != n * kRanksPerNode ||
        a.rank_base != a.node_rank * kRanksPerNode)
      ++wrong;
    else
      ++seen[static_cast<std::size_t>(a.node_rank)];
  }
  for (int s : seen) wrong += s == 1 ? 0 : 1;
  for (auto& node : nodes) node->detach();
  std::printf("%d simulated nodes on etcd: %d assigned, %d failed, %d wrong; last assignment %.2f s after the first join "
              "(the first %.2f s)\n",
              n, assigned, failed, wrong, std::chrono::duration<double>(last - start).count(),
              std::chrono::duration<double>(first - start).count());
  return assigned == n && wrong == 0 ? 0 : 1;
}
