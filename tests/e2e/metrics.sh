#!/bin/bash
# idist-run --metrics (issue 47): a running 2-rank job's endpoint read by Debian's
# python3-prometheus-client parser and scraped by a real Prometheus server (Debian's
# `prometheus`), which answers a PromQL query for every metric; then bad input.
# usage: metrics.sh IDIST_RUN METRICS_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy metrics_rank "$2"  # $PROG: a test beside this one running metrics_rank is not ours to stop
PROM_PID=
trap 'kill $PROM_PID 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
PY=/usr/bin/python3  # Debian's, with its python3-prometheus-client
export OMP_NUM_THREADS=1

for need in prometheus curl; do
  command -v $need >/dev/null || { echo "SKIP: no $need here (scripts/setup.sh installs it)"; exit 77; }
done
$PY -c 'import prometheus_client' 2>/dev/null || { echo "SKIP: no python3-prometheus-client here"; exit 77; }

port=$(random_port)
# Steps of 10 ms until the file `stop` appears: the job runs while the checks below read it.
"$RUN" -n 2 --metrics "127.0.0.1:$port" "$PROG" 0 10 >out 2>&1 &
job=$!
cat >parse.py <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
def samples(name, **want):
    return [s for f in families.values() for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]
for rank in ("0", "1"):
    for name, labels, least in [("idist_collective_calls_total", {"op": "all_reduce", "backend": "gloo"}, 100),
                                ("idist_collective_bytes_total", {"op": "all_reduce", "backend": "gloo"}, 100 * 262144),
                                ("idist_collective_seconds_count", {"op": "all_reduce", "backend": "gloo"}, 1),
                                ("idist_collective_seconds_sum", {"op": "all_reduce", "backend": "gloo"}, 1e-6),
                                ("idist_between_collectives_seconds_count", {}, 50),
                                ("idist_step_seconds_count", {}, 50),
                                ("idist_last_step_seconds", {}, 0.009),
                                ("idist_rank_cpu_seconds_total", {}, 0.5),
                                ("idist_rank_resident_bytes", {}, 1e6)]:
        got = samples(name, rank=rank, **labels)
        if len(got) != 1 or got[0].value < least:
            sys.exit(f"{name} of rank {rank} {labels}: {[s.value for s in got]}, expected one of at least {least}")
        if set(got[0].labels) - {"op", "backend", "le"} != {"job", "node", "host", "rank"}:
            sys.exit(f"{name}: labels {sorted(got[0].labels)}")
    if len(samples("idist_rank_state", rank=rank)) != 1:
        sys.exit(f"idist_rank_state of rank {rank}: {samples('idist_rank_state', rank=rank)}")
# Each call is timed or stands for the calls it was sampled from: the histogram's count is the calls'.
for rank in ("0", "1"):
    calls = samples("idist_collective_calls_total", rank=rank, op="all_reduce")[0].value
    timed = samples("idist_collective_seconds_count", rank=rank, op="all_reduce")[0].value
    if not 0.5 * calls <= timed <= 1.5 * calls:
        sys.exit(f"rank {rank}: {timed} all_reduce calls in the histogram against {calls} made")
for name, value in [("idist_job_world_size", 2), ("idist_job_attempt", 0), ("idist_job_restarts_total", 0)]:
    got = samples(name)
    if [s.value for s in got] != [value]:
        sys.exit(f"{name}: {[s.value for s in got]}, expected {value}")
step = samples("idist_step_seconds_sum", rank="0")[0].value / samples("idist_step_seconds_count", rank="0")[0].value
print(f"# rank 0: {samples('idist_collective_calls_total', rank='0', op='all_reduce')[0].value:.0f} all_reduce calls, "
      f"steps of {step * 1e3:.1f} ms")
PY
# Scraped until every figure is there (a loaded machine starts the ranks late), 60 s at most.
end=$((SECONDS + 60))
until curl -s "http://127.0.0.1:$port/metrics" >scrape && $PY parse.py scrape >parse.out 2>&1 || [ $SECONDS -ge $end ]; do
  sleep 0.5
done
check "a running job's /metrics parses with Debian's python3-prometheus-client, every metric per rank, with its labels" \
  $PY parse.py scrape || { cat parse.out; head -40 scrape; }
check "... and an unknown path is 404" eval '[ "$(curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$port/nothing")" = 404 ]'

# A real Prometheus scraping the job every second, asked by PromQL for each metric.
pport=$(random_port)
cat >prometheus.yml <<YML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: idist
    honor_labels: true  # the samples' own job label (the run id), as docs/IDIST-RUN.md says
    static_configs: [{targets: ["127.0.0.1:$port"]}]
YML
prometheus --config.file=prometheus.yml --storage.tsdb.path="$DIR/tsdb" --web.listen-address="127.0.0.1:$pport" \
  >prometheus.log 2>&1 &
PROM_PID=$!
query() { curl -s --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; }
end=$((SECONDS + 60))
until query 'up == 1' 2>/dev/null | grep -q '"value"' || [ $SECONDS -ge $end ]; do sleep 0.2; done
check "Prometheus is up and scrapes the job's endpoint" eval "query 'up == 1' | grep -q '\"value\"'" || tail -5 prometheus.log
sleep 3  # more scrapes: a rate needs two
answered=0
asked=0
for q in 'idist_collective_calls_total{op="all_reduce",backend="gloo"}' 'rate(idist_collective_calls_total[5s]) > 0' \
  'idist_collective_bytes_total' 'histogram_quantile(0.5, rate(idist_collective_seconds_bucket[5s]))' \
  'idist_collective_seconds_sum' 'idist_between_collectives_seconds_count' 'idist_step_seconds_count' \
  'idist_last_step_seconds' 'idist_rank_cpu_seconds_total' 'idist_rank_resident_bytes' 'idist_rank_state' \
  'idist_job_attempt' 'idist_job_restarts_total' 'idist_job_world_size' 'idist_job_reforms_total'; do
  asked=$((asked + 1))
  if query "$q" | $PY -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r["status"]=="success" and r["data"]["result"] else 1)'; then
    answered=$((answered + 1))
  else
    echo "# no answer to $q: $(query "$q" | head -c 300)"
  fi
done
check "Prometheus scraped the job and answers a PromQL query for every metric ($answered of $asked)" test "$answered" = "$asked" ||
  tail -5 prometheus.log
kill $PROM_PID 2>/dev/null

touch stop
wait $job
rc=$?
steps=$(grep -o "done steps=[0-9]*" out | cut -d= -f2)
check "the job itself is untouched: exit 0, its sums right ($steps steps)" \
  eval '[ $rc = 0 ] && grep -q "metrics_rank: done steps=$steps loss=$((2 * steps)) gradient=2" out' || tail -5 out

# Bad input: one line naming --metrics, a non-zero exit, no rank started.
out=$("$RUN" -n 2 --metrics nope "$PROG" 1 1 2>&1)
rc=$?
check "--metrics nope: refused in one line that names it" \
  eval '[ $rc != 0 ] && [ "$(grep -c . <<<"$out")" = 1 ] && contains "$out" "--metrics '\''nope'\''"' || echo "$out"
taken=$(random_port)
$PY -c 'import socket,time,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(5)' "$taken" &
holder=$!
wait_listening "$taken"
out=$("$RUN" -n 2 --metrics "127.0.0.1:$taken" "$PROG" 1 1 2>&1)
rc=$?
kill $holder 2>/dev/null
check "--metrics on a port already taken: refused in one line, exit non-zero" \
  eval '[ $rc != 0 ] && [ "$(grep -c . <<<"$out")" = 1 ] && contains "$out" "cannot listen there"' || echo "$out"
finish
