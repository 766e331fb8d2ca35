#!/bin/bash
# Ignores SIGINT and SIGTERM and sleeps: only SIGKILL stops it.
trap '' INT TERM
echo "rank $RANK up"
exec sleep "1000$MARKER"
