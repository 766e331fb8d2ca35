#pragma once
// `idist-run --trace FILE` (issue 47): the ranks' calls as a Chrome/Perfetto trace, in the
// Trace Event JSON format (ui.perfetto.dev and chrome://tracing open it): nodes as processes,
// one track per rank (its point-to-point calls on a track beside it), each call a slice with
// its op, bytes, group and state, and who each rank waited for in a collective (the rank that
// entered it last) as an argument and, where the wait is long, an arrow.
//
// Times are wall-clock microseconds from a fixed origin (kTraceOrigin), the same on every node,
// so that nodes' parts fit together without knowing each other's clocks (NTP's agreement is
// theirs). Calls of one rank that overlap without nesting (threads in two groups, an isend
// beside an irecv) go on a second lane of its track, as Perfetto needs. Over several nodes, node K > 0 writes its part to FILE.node<K> (a trace of its own
// ranks); node 0 waits a little for the parts it can read (a shared filesystem, or hosts that
// are namespaces of one machine), writes FILE with every node, and removes them.

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace idist::launchers::detail {

// One call as idist-run took it from a rank's trace (common/trace_area.hpp).
struct TracedCall {
  std::int64_t start_ns = 0;  // CLOCK_MONOTONIC
  std::int64_t end_ns = 0;    // 0: still open at the job's end
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
  std::uint32_t epoch = 0;
  std::int32_t group = -1;
  std::int32_t root = -1;  // a point-to-point call's peer
  std::uint8_t op = 0, kind = 0, state = 0;
};

struct TracedRank {
  int rank = 0;
  int attempt = 0;
  std::deque<TracedCall> calls;  // oldest first within each ring
  // Its program's step marks (idist::mark_step()): each mark's number (1: the first) and when.
  std::vector<std::pair<std::uint64_t, std::int64_t>> steps = {};
  std::uint64_t lost = 0;  // calls the rank's rings overwrote before idist-run read them, or beyond what it keeps
};

struct TraceNode {
  std::string run_id;
  std::string host;
  int node_rank = 0;
  int nnodes = 1;
  std::int64_t end_ns = 0;  // CLOCK_MONOTONIC at the job's end: where an open call's slice stops
  // When this idist-run started (Unix ns): node 0 takes no part written before it (an earlier
  // job's, left where node 0 could not read it then).
  std::int64_t started_unix_ns = 0;
  std::vector<TracedRank> ranks;
};

// Node K's part of FILE.
std::string trace_part_path(const std::string& path, int node_rank);

// Writes `node`'s trace (node 0 or a job of one node: FILE, with the parts of the other nodes it
// finds within `wait_for_parts`; node K: its part), atomically. Returns the line to say; throws
// std::runtime_error naming the file where it cannot be written.
std::string write_trace(const std::string& path, const TraceNode& node, std::chrono::milliseconds wait_for_parts);

// The error a FILE that cannot be written gets, before any rank starts: "" when it can.
std::string check_trace_path(const std::string& path);

}  // namespace idist::launchers::detail
