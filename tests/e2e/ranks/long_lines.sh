#!/bin/bash
# Every rank writes 500 lines of 3000 and 9000 characters (more than a pipe writes at once),
# made of the rank's own letter, all at the same time as the others.
letter=$(printf "\\x$(printf %x $((65 + RANK)))")
short=$(printf "%03000d" 0 | tr 0 "$letter")
long=$short$short$short
for _ in $(seq 250); do
  echo "$short"
  echo "$long"
done
