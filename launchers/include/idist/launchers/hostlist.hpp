#pragma once
// SLURM's compressed host lists, as in SLURM_STEP_NODELIST: "n[1-2]", "gpu[001-003,010]",
// "a,b[3-4],c", "rack[1-2]-node[01-02]". Checked against `scontrol show hostnames`.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idist::launchers {

// Malformed list; the message quotes the list and says what is wrong.
class HostlistError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Refuses lists that would expand beyond this, so a hostile or mistyped list cannot exhaust memory.
inline constexpr std::size_t kMaxHosts = 1 << 20;

// Expands a host list, in SLURM's order:
//  - items are separated by commas or whitespace outside brackets; empty items are skipped;
//  - a bracket holds comma-separated numbers or ranges lo-hi (lo <= hi); numbers are
//    zero-padded to the width of lo as written ("[08-10]" -> 08 09 10, "[8-10]" -> 8 9 10);
//  - several brackets in one name expand as a product, the first varying slowest; text may
//    stand between brackets but not after the last one (scontrol rejects "n[1-2]x");
//  - duplicates are kept.
std::vector<std::string> expand_hostlist(std::string_view list);

}  // namespace idist::launchers
