#!/bin/bash
# Bad usage exits 2 with exactly one line on stderr, before any rank starts.
# usage: usage.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
touch "$TMP/not-executable"

bad() {
  local what=$1 expect=$2
  shift 2
  local err rc
  err=$("$RUN" "$@" 2>&1 >/dev/null)
  rc=$?
  check "$what: exit 2" equals $rc 2
  check "$what: one line" equals "$(wc -l <<<"$err")" 1
  check "$what: says '$expect'" contains "$err" "$expect"
}

bad "-n 0" "--nproc-per-node 0 is out of range" -n 0 /bin/true
bad "-n abc" "--nproc-per-node 'abc' is not a number" -n abc /bin/true
bad "-n -1" "--nproc-per-node" -n -1 /bin/true
bad "-n without value" "--nproc-per-node" -n
bad "an unknown option" "unknown option '--bogus'" --bogus /bin/true
bad "no program" "no program given" -n 2
bad "no program after --" "no program given" -n 2 --
bad "a missing program" "program '/nonexistent/prog' does not exist" /nonexistent/prog
bad "a program not in PATH" "program 'no-such-program-xyz' not found in PATH" no-such-program-xyz
bad "a program that is not executable" "is not executable" "$TMP/not-executable"
bad "a directory" "is a directory" "$TMP"
bad "port out of range" "--master-port" --master-port 70000 /bin/true
bad "port 0" "--master-port" --master-port 0 /bin/true
bad "unknown backend" "--backend" --backend tpu /bin/true

bad "mpirun's -np" "unknown option -np: did you mean -n 2 (--nproc-per-node)?" -np 2 /bin/true
bad "mpirun's -np after another option" "did you mean -n 4 (--nproc-per-node)?" --grace 3 -np4 /bin/true
"$RUN" -n 1 /bin/echo -np 2 >/dev/null
check "the program's own -np is the program's" equals $? 0

out=$("$RUN" --help 2>&1)
check "--help exits 0" equals $? 0
check "--help shows examples" contains "$out" "idist-run -n 4 ./train"
check "--help has one Usage line" equals "$(grep -c '^Usage:' <<<"$out")" 1
check "--help: the nodes of a job restart together" contains "$(tr '\n' ' ' <<<"$out")" "every node restarting together"
check "--help does not say that each node restarts on its own" equals "$(count "$out" "restarts on its own")" 0
check "--help tells of PYTHONUNBUFFERED" contains "$out" "PYTHONUNBUFFERED=1"
# --help and the config keys come from one table: every key is an option --help shows.
for key in $("$RUN" --print-config-keys | grep -v '_' | grep -vx -e program -e '\$schema'); do
  contains "$out" "--$key" || check "--help shows --$key, a config key" false
done
check "--help shows an option for every config key" true
out=$("$RUN" --version 2>&1)
check "--version exits 0" equals $? 0
check "--version names the version and backends" contains "$out" "idist-run 0.1.0 (backends: gloo"
# A plugin where libidist would look that is not one (or lacks its libraries): not listed as a
# backend, and said why.
mkdir "$TMP/plugins"
echo "not a library" >"$TMP/plugins/libidist-backend-nccl.so"
out=$(IDIST_PLUGIN_PATH="$TMP/plugins" "$RUN" --version 2>&1)
check "--version: a plugin that does not load is not a backend" equals "$(count "$(head -1 <<<"$out")" nccl)" 0 ||
  echo "$out"
check "--version: ... and says why, as init() would" \
  contains "$out" "nccl: backend 'nccl': cannot load $TMP/plugins/libidist-backend-nccl.so: "
for name in mpi nccl; do
  line=$(grep "^  $name: " <<<"$out")
  check "--version: $name is said installed or not ($line)" eval '[ -n "$line" ]'
done
"$RUN" -n 2 /bin/true
check "a job of /bin/true exits 0" equals $? 0
"$RUN" -n 2 /bin/false
check "a job of /bin/false exits 1" equals $? 1

# The README's option table cannot fall behind the settings table that makes --help: every
# option --help lists is in the README's idist-run block.
readme=$(dirname "$0")/../../README.md
missing=$(comm -23 <("$RUN" --help | grep -oE '^ +(-[a-z], )?--[a-z][a-z-]*' | grep -oE -- '--[a-z][a-z-]*' | sort -u) \
  <(awk '/^## idist-run/ {f = 1} f && /^```$/ {c++; if (c == 2) exit} f' "$readme" | grep -oE -- '--[a-z][a-z-]*' | sort -u))
check "every option of --help is in the README's table${missing:+ (missing: $missing)}" equals "$missing" ""

finish
