#!/bin/bash
# idist-run's settings from a config file (--config, IDIST_CONFIG) and from IDIST_* variables:
# precedence (command line > environment > file, read back from --dry-run's JSON), every bad
# input as one line on stderr and exit 2, the example profiles in config/, and the schema
# against what idist-run accepts (keys, types, ranges), so that neither can drift.
# usage: config.sh IDIST_RUN CONFIG_DIR
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
CONFIG_DIR=$(realpath "$2")
SCHEMA=$CONFIG_DIR/idist-run.schema.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# --log-dir makes its directory even in a dry run: keep that out of the source tree.
cd "$TMP" || exit 1

# A clean environment, so that nothing from the caller's shell (a SLURM allocation, an exported
# IDIST_NPROC_PER_NODE) changes what idist-run sees.
run() { env -i PATH="$PATH" HOME="${HOME:-/root}" "$@"; }
q() { jq -r "$1" <<<"$2"; }
json() { printf '%s' "$2" >"$TMP/$1.json"; }

echo "# precedence: command line > environment > file"
json base '{"nproc_per_node": 2, "master_port": 1111, "grace": 2.5, "tag_output": true, "max_restarts": 3, "backend": "gloo"}'
F=$TMP/base.json
out=$(run "$RUN" --config "$F" --dry-run /bin/true)
check "file: exit 0" equals $? 0
check "file: nproc_per_node gives the world size" equals "$(q .world_size "$out")" 2
check "file: master_port" equals "$(q .master_port "$out")" 1111
check "file: grace, tag_output, max_restarts, backend" equals \
  "$(q '[.settings.grace, .settings.tag_output, .settings.max_restarts, .backend] | map(tostring) | join(" ")' "$out")" \
  "2.5 true 3 gloo"
check "file: settings_from names the key and the file" equals "$(q .settings_from.nproc_per_node "$out")" "nproc_per_node in $F"
check "file: provenance names the key and the file" equals "$(q .provenance.world_size "$out")" "nproc_per_node in $F"
check "file: untouched settings keep their defaults" equals \
  "$(q '[.settings.launcher, .settings.forward_signals, .settings_from.launcher] | join(" ")' "$out")" "auto USR1,USR2 default"

ENV=(IDIST_NPROC_PER_NODE=3 IDIST_MASTER_PORT=2222 IDIST_GRACE=1 IDIST_TAG_OUTPUT=0 IDIST_MAX_RESTARTS=4)
out=$(run "${ENV[@]}" "$RUN" --config "$F" --dry-run /bin/true)
check "env over file: world size, port" equals "$(q '[.world_size, .master_port] | map(tostring) | join(" ")' "$out")" "3 2222"
check "env over file: grace, tag_output (0), max_restarts" equals \
  "$(q '[.settings.grace, .settings.tag_output, .settings.max_restarts] | map(tostring) | join(" ")' "$out")" "1 false 4"
check "env over file: the file still gives what env leaves unset" equals "$(q .backend "$out")" gloo
check "env over file: settings_from names the variable" equals "$(q .settings_from.master_port "$out")" IDIST_MASTER_PORT
check "env over file: provenance names the variable" equals "$(q .provenance.master_port "$out")" IDIST_MASTER_PORT

out=$(run "${ENV[@]}" "$RUN" --config "$F" --dry-run -n 4 --master-port 3333 --grace 0.5 --tag-output /bin/true)
check "command line over env: world size, port" equals "$(q '[.world_size, .master_port] | map(tostring) | join(" ")' "$out")" "4 3333"
check "command line over env: grace, tag_output" equals \
  "$(q '[.settings.grace, .settings.tag_output] | map(tostring) | join(" ")' "$out")" "0.5 true"
check "command line over env: settings_from names the option" equals \
  "$(q '[.settings_from.nproc_per_node, .settings_from.master_port, .settings_from.max_restarts] | join(" ")' "$out")" \
  "--nproc-per-node --master-port IDIST_MAX_RESTARTS"
out=$(run "$RUN" --config "$F" --dry-run --tag-output=false /bin/true)
check "--tag-output=false turns off a file's true" equals "$(q .settings.tag_output "$out")" false
out=$(run IDIST_NPROC_PER_NODE=abc "$RUN" --dry-run -n 2 /bin/true 2>&1)
check "a variable the command line overrides is not read" equals "$?/$(q .world_size "$out")" "0/2"
out=$(run IDIST_NPROC_PER_NODE= "$RUN" --config "$F" --dry-run /bin/true 2>&1)
check "an empty variable is refused, naming it (one rule with the options: config::empty_value)" equals "$?/$out" \
  "2/idist-run: error: IDIST_NPROC_PER_NODE is set but empty: unset it or give a number of processes or auto"

json other '{"nproc_per_node": 5}'
out=$(run IDIST_CONFIG="$F" "$RUN" --dry-run /bin/true)
check "IDIST_CONFIG names the file" equals "$(q .world_size "$out")" 2
out=$(run IDIST_CONFIG="$F" "$RUN" --config "$TMP/other.json" --dry-run /bin/true)
check "--config wins over IDIST_CONFIG" equals "$(q .world_size "$out")" 5

json dashes '{"nproc-per-node": 2, "max-restarts": 1, "tag-output": true, "node_rank": 0, "nnodes": 1}'
out=$(run "$RUN" --config "$TMP/dashes.json" --dry-run /bin/true)
check "keys take '-' as well as '_'" equals \
  "$(q '[.world_size, .settings.max_restarts, .settings.tag_output] | map(tostring) | join(" ")' "$out")" "2 1 true"

json flags '{"tag_output": false, "force_spawn": true, "verbose": true, "dry_run": true}'
out=$(run "$RUN" --config "$TMP/flags.json" /bin/false 2>"$TMP/flags.err")
check "flags in a file: dry_run true prints the plan and starts nothing" equals "$?/$(q .launcher "$out")" "0/spawn"
check "flags in a file: true and false" equals \
  "$(q '[.settings.tag_output, .settings.force_spawn, .settings.verbose] | map(tostring) | join(" ")' "$out")" \
  "false true true"
json verbose '{"verbose": true, "program": ["/bin/true"]}'
run "$RUN" --config "$TMP/verbose.json" 2>"$TMP/verbose.err"
check "flags in a file: verbose true makes idist-run say what it does" contains "$(cat "$TMP/verbose.err")" "run id"
out=$(run IDIST_DRY_RUN=1 IDIST_TAG_OUTPUT=yes IDIST_FORCE_SPAWN=true "$RUN" /bin/false)
check "flags from the environment: 1, yes, true" equals "$?/$(q '.settings.tag_output and .settings.force_spawn' "$out")" "0/true"

echo "# names that already mean something else to a rank are not read"
out=$(run IDIST_TIMEOUT=1 IDIST_LAUNCHER=slurm "$RUN" --dry-run /bin/true)
check "IDIST_TIMEOUT (a collective's timeout) is not the job's --timeout" equals "$(q '.settings | has("timeout")' "$out")" false
check "IDIST_LAUNCHER (what a rank was started by) is not --launcher" equals "$(q .settings.launcher "$out")" auto
out=$(run IDIST_JOB_TIMEOUT=30 IDIST_LAUNCHER_KIND=spawn "$RUN" --dry-run /bin/true)
check "IDIST_JOB_TIMEOUT and IDIST_LAUNCHER_KIND are" equals \
  "$(q '[.settings.timeout, .settings.launcher, .settings_from.timeout] | map(tostring) | join(" ")' "$out")" \
  "30 spawn IDIST_JOB_TIMEOUT"

echo "# the program from the file"
json prog '{"nproc_per_node": 2, "tag_output": true, "program": ["/bin/echo", "from the file"]}'
out=$(run "$RUN" --config "$TMP/prog.json" 2>&1)
check "the file's program runs on every rank, with the file's tag_output" equals \
  "$(sort <<<"$out" | tr '\n' '|')" "[rank 0] from the file|[rank 1] from the file|"
out=$(run "$RUN" --config "$TMP/prog.json" /bin/echo cli 2>&1)
check "a program on the command line replaces the file's, arguments and all" equals "$(sort -u <<<"$out")" "[rank 0] cli
[rank 1] cli"
out=$(run "$RUN" --config "$TMP/prog.json" --dry-run)
check "--dry-run: program in the file" equals "$(q '.settings_from.program + " " + (.command | join(" "))' "$out")" \
  "program in $TMP/prog.json /bin/echo from the file"

echo "# bad input: exit 2, one line on stderr naming the input"
# bad WHAT NEEDLE... -- CMD...: every NEEDLE is in the one line on stderr.
bad() {
  local what=$1 needles=() err rc n
  shift
  while [ "$1" != -- ]; do needles+=("$1"); shift; done
  shift
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  check "$what: exit 2" equals $rc 2
  check "$what: one line" equals "$(wc -l <<<"$err")" 1
  for n in "${needles[@]}"; do check "$what: names '$n'" contains "$err" "$n"; done
}
# bad_file WHAT CONTENT NEEDLE...: the file is named in the error, and so is every NEEDLE.
bad_file() {
  local what=$1 content=$2
  shift 2
  printf '%s' "$content" >"$TMP/bad.json"
  bad "$what" "$TMP/bad.json" "$@" -- run "$RUN" --config "$TMP/bad.json" /bin/true
}
bad "a missing file" "--config '$TMP/missing.json'" "No such file" -- run "$RUN" --config "$TMP/missing.json" /bin/true
bad "a missing file from IDIST_CONFIG" "IDIST_CONFIG='$TMP/missing.json'" -- \
  run IDIST_CONFIG="$TMP/missing.json" "$RUN" /bin/true
bad "a directory" "--config '$TMP'" "is a directory" -- run "$RUN" --config "$TMP" /bin/true
bad "an endless file" "/dev/zero" "larger than" -- run "$RUN" --config /dev/zero /bin/true
if [ "$(id -u)" != 0 ]; then
  printf '{}' >"$TMP/secret.json" && chmod 000 "$TMP/secret.json"
  bad "an unreadable file" "$TMP/secret.json" "Permission denied" -- run "$RUN" --config "$TMP/secret.json" /bin/true
fi
bad_file "invalid JSON" $'{"nproc_per_node": 2,\n "tag_output": tru }' "invalid JSON" "line 2, column 19"
bad_file "an empty file" "" "invalid JSON" "line 1, column 1"
bad_file "a trailing comma" '{"grace": 1,}' "invalid JSON" "line 1, column 13"
bad_file "an array at the top" '[1, 2]' "expected a JSON object"
bad_file "a string at the top" '"nproc_per_node"' "expected a JSON object"
bad_file "an unknown key" '{"nproc_per_node": 2, "bogus_key": 1}' "unknown key 'bogus_key'"
bad_file "a misspelt key" '{"max_restart": 2}' "unknown key 'max_restart'" "did you mean 'max_restarts'"
bad_file "a key given twice" '{"grace": 1, "grace": 2}' "key 'grace' is given twice"
bad_file "both spellings of a key" '{"node_rank": 1, "node-rank": 1}' "'node_rank' and 'node-rank'"
bad_file "a string where an integer belongs" '{"nproc_per_node": "2"}' "key 'nproc_per_node'" "expected an integer"
bad_file "a fraction where an integer belongs" '{"max_restarts": 1.5}' "key 'max_restarts'" "expected an integer"
bad_file "an array where a flag belongs" '{"tag_output": [true]}' "key 'tag_output'" "expected true or false"
bad_file "1 where a flag belongs" '{"verbose": 1}' "key 'verbose'" "expected true or false"
bad_file "a number where a string belongs" '{"master_addr": 10}' "key 'master_addr'" "expected a string"
bad_file "null" '{"master_port": null}' "key 'master_port'" "expected an integer, not null"
bad_file "an object" '{"grace": {"s": 1}}' "key 'grace'" "expected a number"
bad_file "a program that is a string" '{"program": "./train"}' "key 'program'" "array of strings"
bad_file "an empty program" '{"program": []}' "key 'program'" "array of strings"
json noprog '{"program": ["/nonexistent/prog"]}'
bad "a missing program" "$TMP/noprog.json: key 'program'" "/nonexistent/prog' does not exist" -- \
  run "$RUN" --config "$TMP/noprog.json"
bad "a file without a program, none given" "no program given" -- run "$RUN" --config "$F"
bad "IDIST_NPROC_PER_NODE=abc" "IDIST_NPROC_PER_NODE='abc'" "not a number" -- run IDIST_NPROC_PER_NODE=abc "$RUN" /bin/true
bad "IDIST_TAG_OUTPUT=maybe" "IDIST_TAG_OUTPUT='maybe'" "expected 1 or 0" -- run IDIST_TAG_OUTPUT=maybe "$RUN" /bin/true
bad "IDIST_JOB_TIMEOUT=soon" "IDIST_JOB_TIMEOUT='soon'" "--timeout 'soon'" -- run IDIST_JOB_TIMEOUT=soon "$RUN" /bin/true
bad "IDIST_LAUNCHER_KIND=pbs" "IDIST_LAUNCHER_KIND='pbs'" "pbs" -- run IDIST_LAUNCHER_KIND=pbs "$RUN" /bin/true
bad "IDIST_FORCE_SPAWN=2" "IDIST_FORCE_SPAWN='2'" -- run IDIST_FORCE_SPAWN=2 "$RUN" /bin/true

echo "# a value out of range: the command line's message, after the variable or key"
# same_as_cli KEY VARIABLE JSON_VALUE TEXT CLI_ARGS...
same_as_cli() {
  local key=$1 var=$2 value=$3 text=$4
  shift 4
  local cli env file
  cli=$(run "$RUN" "$@" /bin/true 2>&1 >/dev/null)
  cli=${cli#idist-run: error: }
  printf '{"%s": %s}' "$key" "$value" >"$TMP/range.json"
  file=$(run "$RUN" --config "$TMP/range.json" /bin/true 2>&1 >/dev/null)
  check "$key $value in a file: '$cli' after the file and key" equals "$file" \
    "idist-run: error: $TMP/range.json: key '$key': $cli"
  [ -z "$text" ] && return  # an empty variable is refused in words of its own (above)
  env=$(run "$var=$text" "$RUN" /bin/true 2>&1 >/dev/null)
  check "$var=$text: '$cli' after the variable" equals "$env" "idist-run: error: $var='$text': $cli"
}
same_as_cli nproc_per_node IDIST_NPROC_PER_NODE 0 0 -n 0
same_as_cli nproc_per_node IDIST_NPROC_PER_NODE 5000 5000 -n 5000
same_as_cli nnodes IDIST_NNODES 0 0 --nnodes 0
same_as_cli node_rank IDIST_NODE_RANK 70000 70000 --node-rank 70000
same_as_cli master_addr IDIST_MASTER_ADDR '""' "" --master-addr ""
same_as_cli master_port IDIST_MASTER_PORT 70000 70000 --master-port 70000
same_as_cli port_range IDIST_PORT_RANGE '"30000-20000"' 30000-20000 --port-range 30000-20000
same_as_cli launcher IDIST_LAUNCHER_KIND '"pbs"' pbs --launcher pbs
same_as_cli backend IDIST_BACKEND '"tpu"' tpu --backend tpu
same_as_cli grace IDIST_GRACE -1 -1 --grace -1
same_as_cli timeout IDIST_JOB_TIMEOUT 0 0 --timeout 0
same_as_cli max_restarts IDIST_MAX_RESTARTS -1 -1 --max-restarts -1
same_as_cli forward_signals IDIST_FORWARD_SIGNALS '"KILL"' KILL --forward-signals KILL
same_as_cli log_dir IDIST_LOG_DIR '"/proc/nope"' /proc/nope --log-dir /proc/nope

echo "# the example profiles"
# A recorded task of `srun -N2 --ntasks-per-node=1` (node 1 of 2), for the SLURM profile.
SLURM_TASK=(SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_NTASKS=2
  SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=2 SLURM_STEP_TASKS_PER_NODE='1(x2)' SLURM_STEP_NODELIST='node[1-2]'
  SLURM_NODELIST='node[1-2]')
profiles=0
for profile in "$CONFIG_DIR"/*.json; do
  [ "$profile" = "$SCHEMA" ] && continue
  profiles=$((profiles + 1))
  name=$(basename "$profile")
  case $name in
    slurm.json) where=("${SLURM_TASK[@]}") ;;
    two-nodes.json) where=(IDIST_RDZV_ID=profile-test) ;;
    *) where=() ;;
  esac
  out=$(run "${where[@]}" "$RUN" --config "$profile" --dry-run /bin/true)
  check "$name: accepted" equals $? 0
  check "$name: every value it sets is in the plan's settings" equals \
    "$(jq -n --slurpfile f "$profile" --argjson plan "$out" '[$f[0] | to_entries[]
       | select(.key != "$schema" and .key != "program") | .value == $plan.settings[.key]] | all')" true
done
check "there are example profiles ($profiles)" test "$profiles" -ge 3
out=$(run "$RUN" --config "$CONFIG_DIR/single-node.json" --dry-run /bin/true)
check "single-node.json: 4 ranks here, tagged" equals "$(q '[.world_size, .settings.tag_output] | map(tostring) | join(" ")' "$out")" \
  "4 true"
out=$(run IDIST_NODE_RANK=1 IDIST_RDZV_ID=exp7 "$RUN" --config "$CONFIG_DIR/two-nodes.json" --dry-run /bin/true)
check "two-nodes.json with IDIST_NODE_RANK=1: ranks 4-7 of 8, the nodes meet at 10.0.0.1:29500" equals \
  "$(q '[(.ranks | map(.rank) | join(",")), .world_size, .master_addr, .rendezvous.port] | map(tostring) | join(" ")' "$out")" \
  "4,5,6,7 8 10.0.0.1 29500"
out=$(run "$RUN" --config "$CONFIG_DIR/two-nodes.json" --node-rank 1 --rdzv-id exp7 --dry-run /bin/true)
check "two-nodes.json with --node-rank 1: node 1" equals "$(q .node_rank "$out")" 1
out=$(run "${SLURM_TASK[@]}" "$RUN" --config "$CONFIG_DIR/slurm.json" --dry-run /bin/true)
check "slurm.json in a SLURM step: node 1 of 2 spawns ranks 4-7" equals \
  "$(q '[.launcher, (.ranks | map(.rank) | join(",")), .world_size] | map(tostring) | join(" ")' "$out")" "slurm 4,5,6,7 8"
bad "two-nodes.json without the job's secret" "--rdzv-id" -- run "$RUN" --config "$CONFIG_DIR/two-nodes.json" --dry-run /bin/true
bad "slurm.json outside SLURM" "--launcher slurm" -- run "$RUN" --config "$CONFIG_DIR/slurm.json" /bin/true

echo "# the schema agrees with idist-run"
check "the schema's properties are exactly the keys idist-run accepts" equals \
  "$(jq -r '.properties | keys[]' "$SCHEMA" | sort)" "$(run "$RUN" --print-config-keys | sort)"
check "the schema forbids other keys" equals "$(jq .additionalProperties "$SCHEMA")" false
check "the schema is draft 2020-12" equals "$(jq -r '.["$schema"]' "$SCHEMA")" "https://json-schema.org/draft/2020-12/schema"
# Values at and beyond each bound the schema states, of each type it names: idist-run must
# take what the schema allows and refuse, naming the key, what it forbids.
declare -A SAMPLE=([master_addr]=localhost [rdzv_id]=exp-1 [rdzv_endpoint]=localhost:29400 [rdzv_conf]=heartbeat=0.5 [port_range]=1-65535 [forward_signals]=sigusr1,TERM [log_dir]=$TMP/logs [metrics]=127.0.0.1:9100 [trace]=$TMP/trace.json)
cases=$(jq -r '
  .properties | to_entries[] | select(.value["$ref"] == null and .key != "$schema" and .key != "program")
  | .key as $k | .value as $p
  | if $p.enum then ($p.enum[] | ["good", $k, tojson]), ["bad", $k, ("not-" + $p.enum[0] | tojson)], ["bad", $k, "5"]
    elif $p.type == "integer" or $p.type == ["integer", "string"] then
      (if ($p.type | type) != "array" then empty
       elif $p.pattern == "^auto$" then ["good", $k, "\"auto\""], ["bad", $k, "\"Auto\""]
       else ["good", $k, "\"1:2\""], ["bad", $k, "\"1-2\""], ["bad", $k, "\"2:1\""] end),
      (if $p.minimum != null then ["good", $k, ($p.minimum | tojson)], ["bad", $k, ($p.minimum - 1 | tojson)] else empty end),
      (if $p.maximum != null then ["good", $k, ($p.maximum | tojson)], ["bad", $k, ($p.maximum + 1 | tojson)] else empty end),
      ["bad", $k, "\"1\""], ["bad", $k, "1.5"]
    elif $p.type == "number" then
      (if $p.minimum != null then ["good", $k, ($p.minimum | tojson)], ["bad", $k, ($p.minimum - 0.5 | tojson)] else empty end),
      (if $p.exclusiveMinimum != null then ["good", $k, ($p.exclusiveMinimum + 0.5 | tojson)],
         ["bad", $k, ($p.exclusiveMinimum | tojson)] else empty end),
      (if $p.maximum != null then ["good", $k, ($p.maximum | tojson)], ["bad", $k, ($p.maximum + 0.5 | tojson)] else empty end),
      ["bad", $k, "\"1\""]
    elif $p.type == "boolean" then ["good", $k, "true"], ["good", $k, "false"], ["bad", $k, "\"true\""], ["bad", $k, "1"]
    elif $p.type == "string" then ["sample", $k, ""],
      (if $p.minLength then ["bad", $k, "\"\""] else empty end),
      (if $p.pattern then ["bad", $k, "\"?\""] else empty end), ["bad", $k, "5"]
    else ["unknown", $k, ""] end
  | @tsv' "$SCHEMA")
wrong=0
tried=0
while IFS=$'\t' read -r kind key value; do
  if [ "$kind" = sample ]; then
    if [ -z "${SAMPLE[$key]+set}" ]; then
      check "config.sh has a sample value for the string key $key" false
      continue
    fi
    kind=good
    value=$(jq -n --arg v "${SAMPLE[$key]}" '$v')
  fi
  [ "$kind" = unknown ] && { check "the schema gives $key a type config.sh knows" false; continue; }
  tried=$((tried + 1))
  printf '{"%s": %s}' "$key" "$value" >"$TMP/bound.json"
  out=$(run "$RUN" --config "$TMP/bound.json" --dry-run /bin/true 2>"$TMP/bound.err")
  rc=$?
  err=$(cat "$TMP/bound.err")
  if [ "$kind" = good ]; then
    # A value the schema allows may still be refused by the plan (--launcher slurm outside
    # SLURM), but never as a bad value of its key.
    # --dry-run on the command line beats the file's dry_run false.
    [ "$key" = dry_run ] && value=true
    # A secret (rdzv_id: the store's password) is in the plan, but hidden.
    [ "$key" = rdzv_id ] && value='"<hidden>"'
    if [ $rc = 0 ]; then
      [ "$(jq --argjson v "$value" --arg k "$key" '.settings[$k] == $v' <<<"$out")" = true ] ||
        { wrong=$((wrong + 1)); echo "  $key $value: accepted but the plan's settings say $(jq -c --arg k "$key" '.settings[$k]' <<<"$out")"; }
    elif [ $rc != 2 ] || contains "$err" "key '$key'"; then
      wrong=$((wrong + 1))
      echo "  $key $value: the schema allows it, idist-run said ($rc): $err"
    fi
  elif [ $rc != 2 ] || ! contains "$err" "key '$key'" || [ "$(wc -l <<<"$err")" != 1 ]; then
    wrong=$((wrong + 1))
    echo "  $key $value: the schema forbids it, idist-run said ($rc): $err"
  fi
done <<<"$cases"
check "idist-run takes what the schema allows and refuses what it forbids ($tried values, $wrong wrong)" equals "$wrong" 0
for alias in $(jq -r '.properties | to_entries[] | select(.value["$ref"] != null) | .key' "$SCHEMA"); do
  target=$(jq -r --arg a "$alias" '.properties[$a]["$ref"] | sub("#/properties/"; "")' "$SCHEMA")
  check "the schema's $alias is $target's other spelling" equals "$alias" "${target//_/-}"
done
if python3 -c 'import jsonschema' 2>/dev/null; then
  for profile in "$CONFIG_DIR"/*.json; do
    [ "$profile" = "$SCHEMA" ] && continue
    python3 - "$SCHEMA" "$profile" <<'EOF'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
jsonschema.Draft202012Validator(schema).validate(json.load(open(sys.argv[2])))
EOF
    rc=$?
    check "$(basename "$profile") is valid under the schema (python3 jsonschema)" equals $rc 0
  done
else
  echo "# python3 jsonschema is not installed: the profiles were checked by idist-run only"
fi

echo "# --print-config: the effective settings and where each came from"
json print '{"nproc_per_node": 4, "grace": 10, "program": ["./train", "--epochs", "3"]}'
out=$(IDIST_GRACE=30 "$RUN" --config "$TMP/print.json" --tag-output --print-config 2>&1)
check "--print-config exits 0 without running anything" equals $? 0
row_of() { grep -E "^$1 " <<<"$out" | tr -s ' '; }
check "a file value names its key and file: $(row_of nproc_per_node)" equals "$(row_of nproc_per_node)" \
  "nproc_per_node 4 nproc_per_node in $TMP/print.json"
check "a variable beats the file: $(row_of grace)" equals "$(row_of grace)" "grace 30 IDIST_GRACE"
check "the command line: $(row_of tag_output)" equals "$(row_of tag_output)" "tag_output true --tag-output"
check "a default: $(row_of max_restarts)" equals "$(row_of max_restarts)" "max_restarts 0 default"
check "an unset one: $(row_of timeout)" equals "$(row_of timeout)" "timeout (unset) -"
check "the file's program: $(row_of program)" equals "$(row_of program)" "program ./train --epochs 3 program in $TMP/print.json"
settings=$("$RUN" --print-config-keys | grep -v -e - -e '^program$' -e '^\$schema$' | wc -l)
check "one row per setting ($settings), plus a header and the program" equals "$(wc -l <<<"$out")" $((settings + 2))
err=$(IDIST_GRACE=abc "$RUN" --print-config 2>&1 >/dev/null)
rc=$?
check "--print-config checks values too: exit 2 naming the variable: $err" eval '[ $rc = 2 ] && contains "$err" "IDIST_GRACE="'

finish
