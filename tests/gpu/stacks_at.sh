#!/bin/bash
# stacks_at.sh AT LIMIT COMMAND...: runs COMMAND; if it still runs AT seconds later, prints
# every thread's stack (cuda-gdb, or gdb, attached in batch mode: the GPU machine has no gdb
# but cuda-gdb, which also debugs host code), then lets it run until LIMIT seconds, when it is
# killed (exit 124). Otherwise exits with COMMAND's status. For a GPU run that has one try:
# where a call waits, the stacks say on what.
at=$1 limit=$2
shift 2
"$@" &
pid=$!
waited=0
while kill -0 $pid 2>/dev/null; do
  if [ $waited = $((at * 10)) ]; then
    debugger=$(command -v cuda-gdb || command -v gdb)
    echo "stacks_at: still running after ${at} s; every thread's stack (${debugger:-no debugger here}):"
    [ -n "$debugger" ] && timeout 60 "$debugger" -batch -p $pid -ex "thread apply all bt 15" 2>&1 |
      grep -E "^Thread |^#" | sed 's/^/  | /' | head -200
  fi
  if [ $waited -ge $((limit * 10)) ]; then
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    echo "stacks_at: killed after ${limit} s"
    exit 124
  fi
  sleep 0.1
  waited=$((waited + 1))
done
wait $pid
