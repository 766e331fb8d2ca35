#!/bin/bash
# Prints numbered lines ("rank R line N") as fast as it can until stopped, or $1 of them; each
# line is one write, so the rank never leaves half a line behind when it is killed.
i=0
while [ -z "${1:-}" ] || [ $i -lt "$1" ]; do
  i=$((i + 1))
  echo "rank $RANK line $i"
done
