#pragma once
// The asking side of `idist-run --status`; the answering side is the supervisor's
// (src/supervise/status_socket.cpp holds both, so the socket's name is written once).

#include <sys/types.h>

#include <optional>

namespace idist::launchers {

// `idist-run --status [PID]`: asks a running idist-run of this user on this host (the only one,
// or the one with that pid) where its ranks are, and prints its answer on stdout, or one line
// on stderr saying why there is none; returns idist-run's exit code (1: no answer, 2: which?).
int print_status(std::optional<pid_t> pid);

}  // namespace idist::launchers
