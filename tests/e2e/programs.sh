#!/bin/bash
# What idist-run does with the program it starts, by the kind of program: a Python interpreter
# named on the command line (--local-rank-arg after the script).
# usage: programs.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1

echo "# python3 named on the command line, with --local-rank-arg (as torch.distributed.launch)"
cat >train.py <<'EOF'
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--epochs", type=int)
args = parser.parse_args()
assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ["LOCAL_RANK"])
print(f"local_rank {args.local_rank} epochs {args.epochs}")
EOF
mkdir -p pkg && cp train.py pkg/train.py && touch pkg/__init__.py
for form in "$(command -v python3) train.py" "python3 -u train.py" "python3 -m pkg.train"; do
  # shellcheck disable=SC2086 # the form is words
  out=$("$RUN" --local-rank-arg -n 2 $form --epochs 3 2>&1)
  rc=$?
  check "$form: every rank parses --local_rank=N (exit $rc)" eval \
    '[ $rc = 0 ] && contains "$out" "local_rank 0 epochs 3" && contains "$out" "local_rank 1 epochs 3"' || echo "$out"
done

finish
