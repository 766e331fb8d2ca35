#!/bin/bash
# Every rank starts a helper that escapes it: double fork (re-parented away from the rank),
# its own session (out of the rank's process group) and SIGTERM ignored. Then rank 0 exits
# with code $1 (0: success, the job ends with the helpers still there) and the others sleep.
( setsid bash -c 'trap "" TERM; exec sleep "1000$MARKER"' </dev/null >/dev/null 2>&1 & )
echo "rank $RANK up"
if [ "$RANK" = 0 ]; then sleep 0.3; exit "$1"; fi
[ "$1" = 0 ] && exit 0
exec sleep "1000$MARKER"
