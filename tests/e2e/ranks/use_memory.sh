#!/bin/bash
# Becomes a process that takes $1 MiB of memory and keeps it (tail holds a line that never
# ends), so that in a memory cgroup with a smaller limit the kernel's OOM killer kills the rank
# itself with SIGKILL.
echo "rank $RANK takes $1 MiB"
exec tail < <(head -c "$1M" /dev/zero)
