// idist::spawn and idist::Parallel as a program uses them (tests/e2e/spawn.sh):
//
//   spawn_check spawn N            spawn N ranks running every tutorial collective, checked
//   spawn_check twice              spawn 2 ranks, then 3, then 1; the caller's signal handler survives
//   spawn_check fail throw|exit3|signal
//                                  one of 3 ranks fails; the caller gets SpawnError naming it,
//                                  and no process (rank, or a helper a rank forked) is left
//   spawn_check threads            spawn from a process with a second thread is refused
//   spawn_check parallel [N]       Parallel, with nproc_per_node N when given; fn says whether
//                                  it ran in the caller's process
//   spawn_check node R PORT ID [T] node R of 2 (2 ranks each) without a scheduler, rank 0's store
//                                  at 127.0.0.1:PORT, rdzv_id ID, timeout T seconds
//
// Prints "... ok" lines and exits 0 when every check holds; else says what differs, exits 1.
#include <idist/launch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("rank " + std::to_string(idist::get_rank()) + ": " + what);
}

template <class T>
std::string str(const std::vector<T>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return "[" + out + "]";
}

// Every collective of the tutorial and of "Pytorch - 3 Distributed Computing", checked.
void collectives(int local_rank, const std::string& tag) {
  const int r = idist::get_rank(), n = idist::get_world_size();
  expect(local_rank == idist::get_local_rank(), "fn got local_rank " + std::to_string(local_rank) +
                                                    ", get_local_rank() says " + std::to_string(idist::get_local_rank()));
  std::vector<std::int64_t> t = {1 + 2 * r, 2 + 2 * r};
  idist::all_reduce(t);
  expect(t == std::vector<std::int64_t>{n * n, n * n + n}, "all_reduce gave " + str(t));
  const auto all = idist::all_gather(2.0 * r);
  for (int i = 0; i < n; ++i) expect(all.at(static_cast<std::size_t>(i)) == 2.0 * i, "all_gather gave " + str(all));
  const auto msg = idist::broadcast(std::string("hello from rank ") + std::to_string(r), 0);
  expect(msg == "hello from rank 0", "broadcast gave " + msg);
  idist::barrier();
  std::vector<std::int64_t> one = {r + 1};
  idist::reduce(one, {.dst = 0});
  if (r == 0) expect(one[0] == n * (n + 1) / 2, "reduce gave " + str(one));
  const auto gathered = idist::gather(static_cast<std::int64_t>(r), {.dst = 0});
  if (r == 0)
    for (int i = 0; i < n; ++i) expect(gathered.at(static_cast<std::size_t>(i)) == i, "gather gave " + str(gathered));
  std::vector<std::int64_t> to_scatter;
  for (int i = 0; i < n; ++i) to_scatter.push_back(10 + i);
  std::vector<std::int64_t> mine(1);
  idist::scatter(to_scatter, mine, {.src = 0});
  expect(mine[0] == 10 + r, "scatter gave " + str(mine));
  const auto rs = idist::reduce_scatter(std::vector<std::int64_t>(static_cast<std::size_t>(n), r + 1));
  expect(rs == std::vector<std::int64_t>{n * (n + 1) / 2}, "reduce_scatter gave " + str(rs));
  if (n > 1) {  // a ring
    std::vector<std::int64_t> out = {r}, in = {-1};
    auto sent = idist::isend(out, (r + 1) % n);
    idist::recv(in, (r + n - 1) % n);
    sent.wait();
    expect(in[0] == (r + n - 1) % n, "recv gave " + str(in));
  }
  std::printf("%s: rank %d/%d: collectives ok\n", tag.c_str(), r, n);
}

// Processes whose parent is us, zombies included.
std::vector<int> our_children() {
  std::vector<int> found;
  DIR* dir = ::opendir("/proc");
  for (const dirent* e; dir != nullptr && (e = ::readdir(dir)) != nullptr;) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat;
    std::getline(in, stat);
    const auto close = stat.rfind(')');
    if (close != std::string::npos && std::atoi(stat.c_str() + close + 4) == ::getpid())
      found.push_back(std::atoi(e->d_name));
  }
  if (dir != nullptr) ::closedir(dir);
  return found;
}

int fail_mode(const std::string& how) {
  const std::string helper_file = "spawn_check_helper." + std::to_string(::getpid());
  const int failing = how == "exit3" ? 2 : 1;
  try {
    idist::spawn(
        [&](int, const std::string& mode) {
          if (idist::get_rank() == 0) {  // leaves a helper behind, in a session of its own
            const pid_t helper = ::fork();
            if (helper == 0) {
              ::setsid();
              ::pause();
              ::_exit(0);
            }
            std::ofstream(helper_file) << helper << "\n";
          }
          idist::barrier();  // the helper exists before anyone fails
          if (idist::get_rank() == failing) {
            std::fprintf(stderr, "rank %d fails (%s)\n", failing, mode.c_str());
            if (mode == "throw") throw std::runtime_error("boom from rank 1");
            if (mode == "exit3") std::exit(3);
            if (mode == "signal") ::kill(::getpid(), SIGKILL);
          }
          idist::barrier();  // the others wait here until they are stopped
        },
        {.nproc_per_node = 3, .timeout = std::chrono::seconds(60)}, how);
  } catch (const idist::SpawnError& e) {
    std::printf("caught: %s\n", e.what());
    int bad = 0;
    const auto check = [&](bool ok, const std::string& what) {
      std::printf("%s - %s\n", ok ? "ok" : "not ok", what.c_str());
      bad += ok ? 0 : 1;
    };
    check(e.rank() == failing, "SpawnError::rank() is " + std::to_string(failing) + " (" + std::to_string(e.rank()) + ")");
    check(e.op() == "spawn", "op is spawn");
    if (how == "throw") {
      check(e.exit_code() == 1, "a throwing rank exits 1");
      check(std::string(e.what()).find("boom from rank 1") != std::string::npos, "the message carries the exception's");
    } else if (how == "exit3") {
      check(e.exit_code() == 3, "exit code 3");
    } else {
      check(e.signal() == SIGKILL && !e.exit_code(), "killed by SIGKILL");
    }
    check(!e.last_stderr().empty(), "its last stderr lines come with it");
    const auto children = our_children();
    check(children.empty(), "no child left (" + std::to_string(children.size()) + ")");
    std::ifstream in(helper_file);
    int helper = 0;
    in >> helper;
    std::remove(helper_file.c_str());
    check(helper > 0 && ::kill(helper, 0) != 0 && errno == ESRCH,
          "the helper rank 0 left in its own session is gone (pid " + std::to_string(helper) + ")");
    return bad == 0 ? 0 : 1;
  }
  std::printf("not ok - spawn returned although rank %d failed\n", failing);
  return 1;
}

int twice() {
  static int usr1 = 0;
  ::signal(SIGUSR1, [](int) { ++usr1; });
  idist::spawn([](int lr) { collectives(lr, "first"); }, {.nproc_per_node = 2});
  idist::spawn([](int lr, int extra) { collectives(lr, "second+" + std::to_string(extra)); }, {.nproc_per_node = 3}, 7);
  idist::spawn([](int lr) { collectives(lr, "third"); }, {.nproc_per_node = 1});
  ::raise(SIGUSR1);  // our handler, not the supervisor's nor the default (which would kill us)
  if (usr1 != 1) {
    std::printf("not ok - the caller's SIGUSR1 handler did not survive spawn\n");
    return 1;
  }
  std::printf("twice: ok, %zu children left\n", our_children().size());
  return our_children().empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "spawn" && argc > 2) {
    const int n = std::atoi(argv[2]);
    const pid_t caller = ::getpid();
    idist::spawn(
        [caller](int lr) {
          collectives(lr, "spawn");
          if (idist::get_world_size() > 1 && ::getpid() == caller) throw std::runtime_error("fn ran in the caller");
        },
        {.nproc_per_node = n});
    std::printf("spawn %d: ok\n", n);
    return 0;
  }
  if (mode == "node" && argc > 4) {  // node R of 2 without a scheduler: node R PORT ID [TIMEOUT_S]
    idist::SpawnOptions options{.nproc_per_node = 2, .nnodes = 2, .node_rank = std::atoi(argv[2]),
                                .master_addr = "127.0.0.1", .master_port = std::atoi(argv[3]), .rdzv_id = argv[4]};
    if (argc > 5) options.timeout = std::chrono::seconds(std::atoi(argv[5]));
    idist::spawn([](int lr) { collectives(lr, "node " + std::to_string(idist::get_node_rank())); }, options);
    std::printf("node %s: ok\n", argv[2]);
    return 0;
  }
  if (mode == "twice") return twice();
  if (mode == "mismatch") {
    // Ranks that call all_reduce with different dtypes of one size (gloo over TCP completes it,
    // wrongly), spawned by a caller that ran a world of its own first: the ranks' flight
    // recorders are theirs, not the caller's, so the supervisor sees it and spawn fails.
    idist::init();
    idist::finalize();
    try {
      idist::spawn([](int) {
        if (idist::get_rank() == 1) {
          std::vector<std::int32_t> t(2, 1);
          idist::all_reduce(t);
        } else {
          std::vector<float> t(2, 1.0f);
          idist::all_reduce(t);
        }
      }, {.nproc_per_node = 2});
    } catch (const idist::Error& e) {
      std::printf("spawn failed: %s\n", e.what());
      return 0;
    }
    std::printf("not ok - spawn returned although its ranks' collectives did not match\n");
    return 1;
  }
  if (mode == "fds") {  // a descriptor of the caller's, close-on-exec, used from fn
    const std::string path = "spawn_check_fds." + std::to_string(::getpid());
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    idist::spawn([fd](int) {
      const std::string line = "rank " + std::to_string(idist::get_rank()) + "\n";
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) throw std::runtime_error("write");
    }, {.nproc_per_node = 2});
    ::close(fd);
    std::ifstream in(path);
    int lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    std::remove(path.c_str());
    std::printf("fds: %d lines written through the caller's descriptor\n", lines);
    return lines == 2 ? 0 : 1;
  }
  if (mode == "nosync") {  // std::cout apart from stdio, never flushed by fn
    std::ios::sync_with_stdio(false);
    idist::spawn([](int) { std::cout << "rank " << idist::get_rank() << " says hi\n"; }, {.nproc_per_node = 2});
    return 0;
  }
  if (mode == "children") {  // a child of the caller's own, still running
    const pid_t child = ::fork();
    if (child == 0) {
      ::pause();
      ::_exit(0);
    }
    int rc = 1;
    try {
      idist::spawn([](int) {}, {.nproc_per_node = 2});
      std::printf("not ok - spawn went ahead with a child of the caller's running\n");
    } catch (const idist::Error& e) {
      std::printf("refused: %s\n", e.what());
      rc = ::kill(child, 0) == 0 ? 0 : 1;  // and left alone
    }
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    return rc;
  }
  if (mode == "spawn-mpi") {  // mpi's ranks are mpirun's to start
    idist::spawn([](int) {}, {.backend = "mpi", .nproc_per_node = 2});
    return 0;
  }
  if (mode == "parallel-doc") {  // the README's form, braced options straight into the constructor
    idist::Parallel parallel({.backend = "gloo", .nproc_per_node = 2});
    parallel.run([](int lr) { collectives(lr, "parallel-doc"); });
    return 0;
  }
  if (mode == "parallel-throw") {  // under a launcher: rank 0's fn throws, the others wait in a collective
    try {
      idist::Parallel parallel("gloo");
      parallel.run([](int) {
        if (idist::get_rank() == 0) throw std::runtime_error("rank 0 gives up");
        std::vector<int> t = {1};
        idist::all_reduce(t);
      });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "caught: %s\n", e.what());
      return 3;
    }
    return 0;
  }
  if (mode == "fail" && argc > 2) return fail_mode(argv[2]);
  if (mode == "threads") {
    std::thread waiting([] { std::this_thread::sleep_for(std::chrono::milliseconds(500)); });
    try {
      idist::spawn([](int) {}, {.nproc_per_node = 2});
      std::printf("not ok - spawn with a second thread running went ahead\n");
    } catch (const idist::Error& e) {
      std::printf("refused: %s\n", e.what());
    }
    waiting.join();
    return 0;
  }
  if (mode == "parallel") {
    idist::SpawnOptions options;
    if (argc > 2) options.nproc_per_node = std::atoi(argv[2]);
    const pid_t caller = ::getpid();
    idist::Parallel parallel(options);
    parallel.run(
        [caller](int lr, const std::string& config) {
          collectives(lr, "parallel(" + config + ")");
          std::printf("rank %d in the caller's process: %s\n", idist::get_rank(), ::getpid() == caller ? "yes" : "no");
        },
        std::string("config"));
    std::printf("parallel: %s, ok\n", parallel.spawns() ? "spawned" : "in place");
    return 0;
  }
  std::fprintf(stderr, "usage: spawn_check spawn N | twice | fail throw|exit3|signal | threads | parallel [N]\n");
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
