#!/bin/bash
# --log-dir on a full disk (a 64 KiB tmpfs the test mounts): every log file that could not
# take every byte is named with the bytes it lacks, a job whose ranks all succeeded exits 1,
# summary.json records the loss when it can be written and is never left empty or cut, and
# the console still gets every byte. Exits 77 (skipped) where mount is not permitted.
# usage: full_disk.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$1
RANKS="$(cd "$(dirname "$0")" && pwd)/ranks"
TMP=$(mktemp -d)
trap 'umount "$TMP/disk" 2>/dev/null; rm -rf "$TMP"' EXIT
command -v jq >/dev/null || { echo "jq is missing"; exit 77; }
mkdir "$TMP/disk"
if ! err=$(mount -t tmpfs -o size=64k tmpfs "$TMP/disk" 2>&1); then
  echo "# SKIP: cannot mount a tmpfs to fill ($err); run as root"
  exit 77
fi

head -c 150000 /dev/urandom | base64 -w 76 >"$TMP/big.txt"   # 200 KB, three times the disk
total=$(stat -c %s "$TMP/big.txt")

# lost_line FILE: the error line for FILE: "... N bytes lost (the file has the first M of T)".
lost_line() { grep -F "idist-run: --log-dir: $1: No space left on device: " "$TMP/$2.err"; }

# --- the disk fills up, summary.json cannot be written either --------------------------------
"$RUN" -n 2 --log-dir "$TMP/disk/logs" "$RANKS/fill_disk.sh" "$TMP/big.txt" >"$TMP/full.out" 2>"$TMP/full.err"
rc=$?
dir=$(echo "$TMP"/disk/logs/*)
log="$dir/attempt_0/rank_0.out"
line=$(lost_line "$log" full)
kept=$(stat -c %s "$log")
lost=$(sed -n 's/.*: \([0-9]*\) bytes lost (the file has the first .*/\1/p' <<<"$line")
echo "  full disk: $log kept $kept of $total bytes, $lost lost; exit $rc"
echo "  $(grep -F 'idist-run: exit status 1:' "$TMP/full.err")"
check "full disk, every rank succeeded: exit 1, not 0" equals $rc 1
check "full disk: no rank failed" equals "$(grep -c 'exited with code' "$TMP/full.err")" 0
check "full disk: one line for the file, with what it kept and lost" \
  contains "$line" ": $((total - kept)) bytes lost (the file has the first $kept of $total)"
check "full disk: only the file that lost bytes is named" equals "$(grep -c 'bytes lost' "$TMP/full.err")" 1
check "full disk: the file is a clean prefix of the output" cmp -s "$log" <(head -c "$kept" "$TMP/big.txt")
check "full disk: the exit status is explained on one line" \
  contains "$(cat "$TMP/full.err")" "idist-run: exit status 1: every rank succeeded, but their logs under $dir lack $lost bytes; free space there"
check "full disk: summary.json cannot be written, and says so" \
  contains "$(cat "$TMP/full.err")" "idist-run: --log-dir: cannot write $dir/summary.json: No space left on device"
check "full disk: no empty or cut summary.json left behind" test ! -e "$dir/summary.json" -a ! -e "$dir/summary.json.tmp"
check "full disk: the console got every byte" cmp -s "$TMP/full.out" "$TMP/big.txt"
rm -rf "$TMP/disk/logs"

# --- the disk fills up, then has room for summary.json again --------------------------------------
head -c 32768 /dev/zero >"$TMP/disk/filler"
"$RUN" -n 2 --log-dir "$TMP/disk/logs" "$RANKS/fill_disk.sh" "$TMP/big.txt" "$TMP/disk/filler" \
  >"$TMP/room.out" 2>"$TMP/room.err"
rc=$?
dir=$(echo "$TMP"/disk/logs/*)
json="$dir/summary.json"
kept=$(stat -c %s "$dir/attempt_0/rank_0.out")
echo "  full disk, then room: rank_0.out kept $kept of $total bytes; summary.json says $(jq -c .log_bytes_lost "$json") lost"
check "room for summary.json: exit 1" equals $rc 1
check "room for summary.json: the file's line" contains "$(lost_line "$dir/attempt_0/rank_0.out" room)" \
  ": $((total - kept)) bytes lost (the file has the first $kept of $total)"
check "summary.json: exit code 1 and the bytes lost" equals "$(jq -c '[.exit_code, .log_bytes_lost]' "$json")" "[1,$((total - kept))]"
check "summary.json: per rank and stream" equals \
  "$(jq -c '[.attempts[0].ranks[] | .log_bytes_lost]' "$json")" "[{\"out\":$((total - kept)),\"err\":0},{\"out\":0,\"err\":0}]"
check "summary.json: the outcome says why" equals "$(jq -r .outcome "$json")" \
  "every rank succeeded, but $((total - kept)) bytes of their output are missing from --log-dir"
check "room for summary.json: the console got every byte" cmp -s "$TMP/room.out" "$TMP/big.txt"

finish
