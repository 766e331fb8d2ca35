#pragma once
// The signals idist-run handles: which it may forward, and which stop the job.

#include <signal.h>

namespace idist::launchers::detail {

struct NamedSignal {
  const char* name;
  int number;
};

// What --forward-signals may name: signals a user or a scheduler sends to a job. SIGKILL and
// SIGSTOP cannot be caught, and SIGCHLD, SIGPIPE and the fault signals are ours.
inline constexpr NamedSignal kForwardable[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},
                                               {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                                               {"ALRM", SIGALRM}, {"WINCH", SIGWINCH}};

// Signals that stop the job unless forwarded: the four a user or a scheduler stops a job with,
// and the others of kForwardable whose default action would kill idist-run without a summary.
inline constexpr int kTeardownSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

// Whether `sig` means "stop" to a program too: then the ranks get it as it came; the others
// (SIGUSR1 may mean "checkpoint") reach them as SIGTERM when they stop the job.
inline bool is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT; }

}  // namespace idist::launchers::detail
