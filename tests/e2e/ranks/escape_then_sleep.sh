#!/bin/bash
# Every rank starts a helper that escapes it (double fork, its own session, SIGTERM
# ignored), says it is up, and sleeps until stopped.
( setsid bash -c 'trap "" TERM; exec sleep "1000$MARKER"' </dev/null >/dev/null 2>&1 & )
echo "rank $RANK up"
exec sleep "1000$MARKER"
