#pragma once
// Backend::abort over gloo: gloo fails what waits on a pair, on both sides, when the pair's
// socket reaches its end, as after a peer's exit; abort shuts the group's sockets down
// (shutdown(2), left open and registered) so that gloo's own loop sees that end. (Its call for
// it, tcp::Pair::signalExceptionExternal, is protected.)

#include <set>
#include <string>

namespace idist::detail::gloo_sockets {

// Every pair of a group listens on an address of its own (gloo's connectFullMesh): a socket of
// this process is the group's when its far end is one of the peers' listening addresses (we
// connected) or its near end one of ours (we accepted). Never by the far end of an accepted
// connection: a peer's outgoing port may be another connection's too. As gloo's
// Address::str() writes them.
struct SocketEnds {
  std::set<std::string> ours, theirs;
};

void shut_down_sockets(const SocketEnds& ends);

}  // namespace idist::detail::gloo_sockets
