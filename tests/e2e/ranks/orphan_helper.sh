#!/bin/bash
# Starts a short-lived helper that is orphaned at once (re-parented to idist-run, the
# subreaper) and ends 0.2 s later, then says so and sleeps $1 seconds before exiting 0.
( sleep 0.2 & )
echo "rank $RANK up"
sleep "$1"
