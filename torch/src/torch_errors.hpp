#pragma once
// The one way idist::torch reports a bad call: libidist's detail::refuse (idist.hpp), which
// throws idist::Error named like libidist's own ("[idist rank r/n] op(backend): ..."), so that
// a training script sees one kind of error (the protocol of idist/errors.hpp).

#include "idist/idist.hpp"
