#!/bin/bash
# Rank 1 fails; the others ignore SIGTERM, so only the SIGKILL after --grace stops them.
if [ "$RANK" = 1 ]; then sleep 0.2; exit 1; fi
trap '' TERM
exec sleep "1000$MARKER"
