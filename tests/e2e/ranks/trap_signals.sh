#!/bin/bash
# Reports the signals it gets (USR1, USR2, TERM) and goes on. Ends after about $1 seconds, or
# as soon as it got every signal named after $1 ("trap_signals.sh 30 USR1 USR2"): waiting for
# what the test sends rather than for a fixed time, so that on a loaded machine the rank cannot
# end before the test's last signal lands (the test sends it only once the first one was seen).
# No subprocess but `sleep` once "up" is printed: forwarded signals go to the whole process
# group, and one that killed a `$(seq ...)` computing the loop would end the loop at once.
for sig in USR1 USR2 TERM; do trap "echo \"rank \$RANK got $sig\"; got_$sig=1" $sig; done
seconds=$1
shift
got_all() {
  [ $# -gt 0 ] || return 1
  local sig var
  for sig in "$@"; do
    var=got_$sig
    [ -n "${!var:-}" ] || return 1
  done
}
echo "rank $RANK up"
for ((i = 0; i < seconds * 10; i++)); do
  got_all "$@" && break
  sleep 0.1
done
echo "rank $RANK done"
