#!/bin/bash
# Reports the signals it gets (USR1, USR2, TERM) and goes on; exits 0 after about $1 seconds.
for sig in USR1 USR2 TERM; do trap "echo \"rank \$RANK got $sig\"" $sig; done
echo "rank $RANK up"
for _ in $(seq $(( $1 * 10 ))); do sleep 0.1; done
echo "rank $RANK done"
