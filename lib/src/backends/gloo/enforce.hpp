#pragma once
// Gloo checks a message's size against the receive posted for it on its I/O thread: a peer
// that sends more than this rank's call holds (the ranks called a collective with different
// sizes) throws gloo::EnforceNotMet there, where nothing can catch it, and the process
// terminates with Gloo's raw text ("op.preamble.length <= op.nbytes. 20 vs 16"). A terminate
// handler says it in idist's words instead, naming the call and both sizes; the process still
// ends at once (SIGABRT), as it must: its connections are out of step.

namespace idist::detail::gloo_enforce {

// Installs the handler once per process; `rank` and `world_size` name the process in its line.
void install(int rank, int world_size);

// The collective this process's gloo groups run now ("all_reduce"), for the handler's line.
// A relaxed store of a pointer to a literal: cheap enough for every call.
void calling(const char* op) noexcept;

}  // namespace idist::detail::gloo_enforce
