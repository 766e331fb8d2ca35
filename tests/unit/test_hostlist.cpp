// The SLURM hostlist parser: a table written from SLURM's rules, malformed lists, and the
// same table run through the real `scontrol show hostnames` when SLURM's client is installed.
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "idist/launchers/hostlist.hpp"

using idist::launchers::expand_hostlist;
using idist::launchers::HostlistError;
using Hosts = std::vector<std::string>;

namespace {

const std::vector<std::pair<std::string, Hosts>> kTable = {
    {"node", {"node"}},
    {"n[1-2]", {"n1", "n2"}},
    {"gpu[001-003,010]", {"gpu001", "gpu002", "gpu003", "gpu010"}},
    {"a,b[3-4],c", {"a", "b3", "b4", "c"}},
    {"n[8-10]", {"n8", "n9", "n10"}},
    {"x[098-100]", {"x098", "x099", "x100"}},
    {"n[01-2]", {"n01", "n02"}},
    {"n[00-01,9]", {"n00", "n01", "n9"}},
    {"n[1,1]", {"n1", "n1"}},
    {"n[1-2],n[2-3]", {"n1", "n2", "n2", "n3"}},
    {"rack[1-2]-node[01-02]", {"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}},
    {"b[3-4]c[1-2]", {"b3c1", "b3c2", "b4c1", "b4c2"}},
    {"n[1-2][3-4]", {"n13", "n14", "n23", "n24"}},
    {"[1-2]", {"1", "2"}},
    {"a-b", {"a-b"}},
    {"a b,c", {"a", "b", "c"}},
    {"x,,y", {"x", "y"}},
    {"gpu[001-003,010],a,b[3-4]c[1-2]", {"gpu001", "gpu002", "gpu003", "gpu010", "a", "b3c1", "b3c2", "b4c1", "b4c2"}},
    {"n[7]", {"n7"}},
};

const std::vector<std::string> kMalformed = {
    "n[5-3]", "n[1-2", "n1-2]", "n[]", "n[a-b]", "n[1-3:2]", "n[1-2]-ib", "n[1-2]x", "n[ 1-2]", "n]1[",
    "n[1-2000000]", "a[1-1024]b[1-1024]c[1-2]",
};

// Runs `scontrol show hostnames LIST` with a throwaway slurm.conf; nullopt when absent.
std::optional<Hosts> scontrol_hostnames(const std::string& list) {
  static const std::string conf = [] {
    auto dir = std::filesystem::temp_directory_path() / ("idist-hostlist-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "slurm.conf") << "ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n"
                                         "PartitionName=p Nodes=n1\n";
    return (dir / "slurm.conf").string();
  }();
  const std::string cmd = "SLURM_CONF=" + conf + " scontrol show hostnames '" + list + "' 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  Hosts hosts;
  std::array<char, 512> line{};
  while (std::fgets(line.data(), line.size(), pipe) != nullptr) {
    std::string h(line.data());
    while (!h.empty() && h.back() == '\n') h.pop_back();
    hosts.push_back(h);
  }
  ::pclose(pipe);
  return hosts;
}

bool have_scontrol() { return std::system("command -v scontrol >/dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("expands SLURM host lists") {
  for (const auto& [list, hosts] : kTable) {
    CAPTURE(list);
    CHECK(expand_hostlist(list) == hosts);
  }
  CHECK(expand_hostlist("").empty());
}

TEST_CASE("malformed lists are errors quoting the list") {
  for (const auto& list : kMalformed) {
    CAPTURE(list);
    try {
      expand_hostlist(list);
      FAIL("accepted");
    } catch (const HostlistError& e) {
      CHECK(std::string(e.what()).find("invalid host list '" + list + "': ") == 0);
    }
  }
}

TEST_CASE("agrees with scontrol show hostnames") {
  if (!have_scontrol()) {
    // Exit code 77 is this ctest entry's SKIP_RETURN_CODE: ctest then reports "Skipped".
    std::printf("SKIPPED: scontrol (Debian package slurm-client) is not installed\n");
    std::exit(77);
  }
  for (const auto& [list, hosts] : kTable) {
    CAPTURE(list);
    CHECK(scontrol_hostnames(list) == std::optional<Hosts>(expand_hostlist(list)));
  }
  // Where we refuse a list, scontrol refuses it too (it prints "Invalid hostlist"), except for
  // the unbalanced "n[1-2" and "n[ 1-2]", which it turns into nonsense ("n]", "n01 n02").
  for (const auto& list : {"n[5-3]", "n[]", "n[a-b]", "n[1-3:2]", "n[1-2]-ib", "n[1-2]x"}) {
    CAPTURE(list);
    const auto out = scontrol_hostnames(list);
    REQUIRE(out);
    CHECK(out->back().find("Invalid hostlist") != std::string::npos);
  }
}
