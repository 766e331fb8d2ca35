#!/bin/bash
# Each rank prints many long lines at once, to catch lines mixed between ranks.
line=$(printf "%0300d" 0 | tr 0 "$([ "$RANK" = 0 ] && echo A || echo B)")
for _ in $(seq 3000); do echo "$line"; done
