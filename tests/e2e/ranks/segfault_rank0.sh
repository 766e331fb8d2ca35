#!/bin/bash
# Rank 0 dies of SIGSEGV; the others would sleep.
if [ "$RANK" = 0 ]; then sleep 0.2; kill -SEGV $$; fi
exec sleep "1000$MARKER"
