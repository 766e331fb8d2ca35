#pragma once
// The supervisor's phases, one at a time, with the transitions it may make in one table.
//
//   starting -> running -> stopping ----------> awaiting_verdict -> starting (the next attempt)
//                   |                     |  (nodes)            '-> finishing -> done
//                   '-> cleaning ---------+--> starting (a restart on one node)
//                   (ranks ended;         '--> finishing
//                    leftovers go)
//   Any phase before finishing may go to finishing (a signal, the timeout, the job's end).
//
// starting: the attempt's nodes meet (with a coordinator), then its ranks start. running:
// they run. stopping: we signalled them (a failure, a signal, the timeout, another node's end,
// a stall kill). cleaning: every rank ended on its own; what they left behind gets SIGTERM,
// then SIGKILL after --grace. awaiting_verdict: this node's ranks are gone, the other nodes'
// may not be; the rendezvous says what follows. finishing: the job is over; the console gets
// its last lines and node 0 waits (bounded) until every node has the verdict. done: the event
// loop may end.
//
// Two invariants hold in every phase, and the supervisor keeps its signal handler and its
// timeout armed until `done` for them: SIGTERM ends idist-run within --grace + 1 s, and
// --timeout ends it on time (tests/e2e/phases.sh).

#include <string_view>

namespace idist::launchers::supervision {

enum class Phase { starting, running, stopping, cleaning, awaiting_verdict, finishing, done };

std::string_view phase_name(Phase phase);

// Whether the supervisor may go from `from` to `to` (the diagram above).
bool may_enter(Phase from, Phase to);

}  // namespace idist::launchers::supervision
