#pragma once
// How long the supervisor waits, for what, in one place: each bound is a promise the launcher's
// users see (how soon a job ends after a failure, after Ctrl-C, after its last rank), so they
// are read together and changed together.

#include <chrono>

namespace idist::launchers::supervision {

// How long the other ranks may take to end on their own after a first failure that may be a
// consequence (a non-zero exit) before they are stopped; see Supervisor::judge().
constexpr auto kSettleTime = std::chrono::milliseconds(250);

// How long output may keep coming once every rank and leftover is gone (a process outside our
// tree may hold a pipe); after that we stop reading rather than wait forever.
constexpr auto kDrainTime = std::chrono::seconds(2);

// A stop signal within this of the first is the same stop delivered twice (a Ctrl-C reaches
// the whole foreground group: a wrapper such as timeout, or a script's trap, forwards it to us
// as well), not a second Ctrl-C: no hand presses twice in 0.2 s.
constexpr auto kSameSignal = std::chrono::milliseconds(200);

// The most the job's end may take once it is decided: the console's last lines and, on node 0,
// the other nodes hearing the verdict (each bounded on its own, by kConsoleStall and the
// rendezvous' drain; this holds whatever they do).
constexpr auto kFinishBound = std::chrono::seconds(15);

// How long leftovers may ignore SIGTERM before we say that the job's end waits for them.
constexpr auto kLeftoverNotice = std::chrono::seconds(1);

}  // namespace idist::launchers::supervision
