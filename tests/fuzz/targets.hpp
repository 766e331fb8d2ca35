#pragma once
// The fuzz targets' bodies, shared by the libFuzzer executables (clang, tests/fuzz/run.sh) and
// by unit.test_fuzz_regressions (g++), which replays the seed corpus and every input that once
// found a bug, so those stay fixed even where clang is missing.
//
// A target returns normally on any input, valid or not. A broken invariant throws
// FuzzInvariant: the unit test reports it, and in a fuzzer it escapes and aborts, which
// libFuzzer records as a crash. Crashes and sanitizer reports need no help from us.

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idist/env_contract.hpp"
#include "idist/launchers/hostlist.hpp"
#include "idist/launchers/ports.hpp"
#include "parse_whole.hpp"
#include "store/store.hpp"
#include "store/wire.hpp"

namespace idist::fuzz {

class FuzzInvariant : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

inline void expect(bool ok, const char* what) {
  if (!ok) throw FuzzInvariant(what);
}

// The store's decoding, fed a byte stream as a connection would deliver it: length-prefixed
// frames, the first of which must be a hello. Every request that parses must survive
// re-encoding by the client's Writer unchanged, and add() is run on whatever key bytes came.
inline void store_wire(std::string_view input) {
  namespace wire = idist::detail::wire;
  bool authenticated = false;
  while (input.size() >= 4) {
    const auto length = wire::read_u32(input.data());
    input.remove_prefix(4);
    if (wire::check_frame_length(length, authenticated ? wire::kMaxFrame : wire::kMaxHelloFrame) != nullptr) return;
    if (input.size() < length) return;  // the peer closed mid-message
    const auto payload = input.substr(0, length);
    input.remove_prefix(length);

    const auto parsed = wire::parse_request(payload);
    expect(parsed.request.has_value() != (parsed.error != nullptr), "a parse gives a request or a reason, never both");
    if (!parsed.request) {
      if (parsed.fatal || !authenticated) return;
      continue;
    }
    const auto& r = *parsed.request;
    if (!authenticated && r.op != wire::Op::hello) return;
    authenticated = true;

    wire::Writer again(static_cast<std::uint8_t>(r.op));
    switch (r.op) {
      case wire::Op::hello: again.bytes(r.token); break;
      case wire::Op::set: again.bytes(r.key).bytes(r.value); break;
      case wire::Op::get: again.bytes(r.key); break;
      case wire::Op::add: again.bytes(r.key).i64(r.delta); break;
      case wire::Op::wait:
      case wire::Op::check:
        expect(r.keys.size() <= wire::kMaxKeys, "no more than kMaxKeys keys");
        again.u32(static_cast<std::uint32_t>(r.keys.size()));
        for (auto k : r.keys) again.bytes(k);
        break;
    }
    const auto frame = again.frame();
    expect(std::string_view(frame.data() + 4, frame.size() - 4) == payload, "a parsed request re-encodes to its bytes");

    if (r.op == wire::Op::add) {
      std::vector<char> slot(r.key.begin(), r.key.end());
      try {
        const auto value = idist::detail::add_to_counter(slot, r.delta);
        expect(std::string(slot.begin(), slot.end()) == std::to_string(value), "a counter is stored as its decimal text");
      } catch (const std::invalid_argument&) {
      } catch (const std::out_of_range&) {
      }
    }
  }
}

// SLURM host lists: any text either expands within bounds to plain names or is refused.
inline void hostlist(std::string_view input) {
  std::vector<std::string> hosts;
  try {
    hosts = idist::launchers::expand_hostlist(input);
  } catch (const idist::launchers::HostlistError&) {
    return;
  }
  expect(hosts.size() <= idist::launchers::kMaxHosts, "at most kMaxHosts hosts");
  for (const auto& h : hosts) {
    expect(!h.empty(), "no empty host names");
    expect(h.find_first_of(",[] \t\n") == std::string::npos, "no separators or brackets in a host name");
  }
}

// The env contract, from NAME=VALUE lines, and the launchers' number and port-range parsers on
// every value. A contract that reads must be consistent and survive to_variables() unchanged.
inline void env(std::string_view input) {
  std::map<std::string, std::string, std::less<>> vars;
  while (!input.empty()) {
    const auto eol = input.find('\n');
    const auto line = input.substr(0, eol);
    input.remove_prefix(eol == std::string_view::npos ? input.size() : eol + 1);
    const auto eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }

  for (const auto& [name, value] : vars) {
    if (auto n = idist::launchers::parse_whole<int>(value))
      expect(!value.empty() && value.find_first_not_of("-0123456789") == std::string::npos, "parse_whole takes digits only");
    if (auto n = idist::launchers::parse_whole<std::uint64_t>(value))
      expect(value.find_first_not_of("0123456789") == std::string::npos, "parse_whole<unsigned> takes digits only");
    try {
      const auto range = idist::launchers::parse_port_range(name, value);
      expect(1 <= range.first && range.first <= range.last && range.last <= 65535, "a port range is within 1-65535");
      const auto port = idist::launchers::derived_port(value, 1, range);
      expect(range.first <= port && port <= range.last, "a derived port lies in its range");
    } catch (const std::invalid_argument&) {
    }
    try {
      const auto t = idist::env::parse_timeout(name, value);
      expect(t.count() >= 1, "a timeout is positive");
    } catch (const idist::env::ContractError&) {
    }
  }

  auto lookup_in = [](const std::map<std::string, std::string, std::less<>>& m) -> idist::env::Lookup {
    return [&m](std::string_view name) -> std::optional<std::string> {
      auto it = m.find(name);
      if (it == m.end()) return std::nullopt;
      return it->second;
    };
  };
  idist::env::Contract c;
  try {
    c = idist::env::read_contract(lookup_in(vars));
  } catch (const idist::env::ContractError&) {
    return;
  }
  expect(0 <= c.rank && c.rank < c.world_size, "0 <= RANK < WORLD_SIZE");
  expect(0 <= c.local_rank && c.local_rank < c.local_world_size, "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE");
  expect(c.local_world_size <= c.world_size, "LOCAL_WORLD_SIZE <= WORLD_SIZE");
  expect(0 <= c.node_rank && c.node_rank < c.nnodes, "0 <= NODE_RANK < nnodes");
  // A world of one without a port has no store; its exported MASTER_PORT=0 is not meant to be
  // read back.
  if (c.master_port == 0) return;
  std::map<std::string, std::string, std::less<>> exported;
  for (auto& [name, value] : idist::env::to_variables(c)) exported[name] = value;
  const auto back = idist::env::read_contract(lookup_in(exported));
  expect(back.rank == c.rank && back.world_size == c.world_size && back.local_rank == c.local_rank &&
             back.local_world_size == c.local_world_size && back.node_rank == c.node_rank && back.nnodes == c.nnodes &&
             back.master_addr == c.master_addr && back.master_port == c.master_port &&
             back.restart_count == c.restart_count && back.backend == c.backend && back.launcher == c.launcher &&
             back.run_id == c.run_id && back.job_token == c.job_token,
         "to_variables() then read_contract() gives the same contract");
}

}  // namespace idist::fuzz
