#!/bin/bash
# A console whose reader pauses, then reads (issue 28, defect 6): what it shows is whole lines
# only, and what it does not show is counted to the byte. The pause is longer than the stall
# (2 s) and the job ends in it, so idist-run drops what it held for the console; a line it had
# half written to the pipe, whose rest it then dropped, showed as a cut line (no newline, and
# the rest counted as not shown). Run $2 times (default 5): before the fix, every run showed one.
# usage: console_cut.sh IDIST_RUN [RUNS]
source "$(dirname "$0")/lib.sh"
RUN=$1
RUNS=${2:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v jq >/dev/null || { echo "jq is missing"; exit 77; }

# 20000 lines of exactly 100 bytes per rank ("rank R line N" padded with x): a few one at a
# time, as a program starts, then the rest by cat in big writes, so that idist-run reads and
# writes many lines at once into a pipe whose last page its first lines began.
for r in 0 1; do
  awk -v r=$r 'BEGIN { pad = sprintf("%99s", ""); gsub(/ /, "x", pad)
    for (i = 1; i <= 20000; i++) { l = sprintf("rank %d line %07d ", r, i); print l substr(pad, 1, 99 - length(l)) } }' \
    >"$TMP/lines_$r.txt"
  tail -n +4 "$TMP/lines_$r.txt" >"$TMP/rest_$r.txt"
done
cat >"$TMP/rank.sh" <<EOF
#!/bin/bash
head -n 3 "$TMP/lines_\$RANK.txt" | while IFS= read -r line; do echo "\$line"; sleep 0.1; done
cat "$TMP/rest_\$RANK.txt"
EOF
chmod +x "$TMP/rank.sh"

clean=0
for i in $(seq "$RUNS"); do
  mkdir "$TMP/run$i"
  "$RUN" -n 2 --log-dir "$TMP/run$i" "$TMP/rank.sh" 2>"$TMP/run$i.err" | (sleep 3; cat >"$TMP/run$i.out")
  json=$(echo "$TMP/run$i"/*/summary.json)
  logged=$(cat "$TMP/run$i"/*/attempt_0/rank_*.out | wc -c)
  shown=$(wc -c <"$TMP/run$i.out")
  dropped=$(jq .console_dropped.stdout.bytes "$json")
  # Not one of our lines, whole; and a last line without its newline.
  cut=$(grep -cvxE 'rank [01] line [0-9]{7} x{79}' "$TMP/run$i.out")
  [ -n "$(tail -c 1 "$TMP/run$i.out")" ] && tail -n 1 "$TMP/run$i.out" | grep -qxE 'rank [01] line [0-9]{7} x{79}' &&
    cut=$((cut + 1))
  echo "  run $i: $shown bytes shown, $dropped not shown, $logged logged; $cut cut line(s)"
  [ "$cut" = 0 ] && [ "$logged" -gt 0 ] && [ "$((shown + ${dropped:-x}))" = "$logged" ] 2>/dev/null && clean=$((clean + 1))
  [ "$cut" = 0 ] || grep -nvxE 'rank [01] line [0-9]{7} x{79}' "$TMP/run$i.out" | head -3 | cut -c1-120 | sed 's/^/  | /'
done
check "a reader that pauses 3 s: whole lines only, shown + not shown = logged, in $clean of $RUNS runs" \
  equals "$clean" "$RUNS"
finish
