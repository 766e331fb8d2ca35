#!/bin/bash
# Rank 0 copies file $1 to stdout and $2 to stderr (neither ends in a newline), then kills
# itself with SIGKILL: whatever is still in the pipes must reach the console and the logs.
# The other ranks sleep until stopped.
if [ "$RANK" = 0 ]; then
  cat "$1"
  cat "$2" >&2
  kill -9 $$
fi
exec sleep "1000$MARKER"
