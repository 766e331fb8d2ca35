#!/bin/bash
# Says which attempt it is in and on which port; rank 0 exits 9 while IDIST_RESTART_COUNT is
# below $1, the other ranks then sleep until stopped. From attempt $1 on, every rank exits 0.
echo "attempt $IDIST_RESTART_COUNT rank $RANK MASTER_PORT=$MASTER_PORT"
if [ "$IDIST_RESTART_COUNT" -lt "$1" ]; then
  if [ "$RANK" = 0 ]; then sleep 0.2; echo "rank 0 fails in attempt $IDIST_RESTART_COUNT" >&2; exit 9; fi
  exec sleep "1000$MARKER"
fi
exit 0
