#!/bin/bash
# Rank 1 writes some output, the last line unfinished, and exits 3; the others would sleep
# forever (marked with the run's MARKER so the test can look for leftovers).
if [ "$RANK" = 1 ]; then
  echo "rank 1 about to fail"
  printf 'last words without newline' >&2
  sleep 0.3
  exit 3
fi
exec sleep "1000$MARKER"
