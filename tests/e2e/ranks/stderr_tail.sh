#!/bin/bash
# Rank 1 writes 15 numbered lines to stderr and exits 5; the others sleep until stopped.
if [ "$RANK" = 1 ]; then
  for i in $(seq 15); do echo "rank 1 complaint $i" >&2; done
  exit 5
fi
exec sleep "1000$MARKER"
