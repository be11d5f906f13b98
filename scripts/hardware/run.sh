#!/usr/bin/env bash
# scripts/hardware.sh run [--bundle DIR] [--out DIR] [--budget S] [STAGE...]:
# runs, on the GPU machine, the stages of scripts/hardware/stages.sh from
# the bundle and the source tree alone (it builds nothing but torch_eccl,
# against the machine's own torch). Each stage runs under its own limit and
# none starts once the run's budget (330 s) is spent, so a hang costs one
# stage. Writes OUT/report.md (every figure and verdict, written as it
# goes) and OUT/logs.tar.gz (every command's whole output); OUT is --out,
# else $OUT, else hardware-out/.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
root=$PWD
source scripts/hardware/stages.sh
bundle=hw-bundle out=${OUT:-hardware-out} budget=330
stages=()
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -*) echo "hardware.sh run: unknown option '$1'" >&2; exit 2 ;;
    *) [ -n "${hw_stage_title[$1]:-}" ] || { echo "hardware.sh run: unknown stage '$1' (${hw_stage_order[*]})" >&2; exit 2; }
       stages+=("$1"); shift ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || stages=("${hw_stage_order[@]}")
[ -f "$bundle/manifest.txt" ] || { echo "hardware.sh run: no bundle at $bundle (make it with scripts/hardware.sh pack)" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd) B=$bundle
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/eccl-hw.XXXXXX")
logs=$work/logs
mkdir -p "$logs"
report=$out/report.md body=$work/body.md summary=$work/summary.md
: >"$body"
: >"$summary"
started=$(date +%s)
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
cores=$(nproc)

say() { printf '%s\n' "$*" >>"$body"; printf '%s\n' "$*"; }
elapsed() { echo $(($(date +%s) - started)); }
# report.md is the summary so far followed by every section so far: it is
# whole whenever the run is cut off.
publish() {
  {
    echo "# eccl on a GPU machine: $(date -u +%Y-%m-%d) ($(uname -n))"
    echo ""
    echo "| stage | verdict | seconds |"
    echo "| --- | --- | --- |"
    cat "$summary"
    echo ""
    cat "$body"
  } >"$report"
  tar -C "$work" -czf "$out/logs.tar.gz" logs 2>/dev/null || true
}
trap publish EXIT

source scripts/hardware/machine.sh
source scripts/hardware/steps.sh
probe_machine

for stage in "${stages[@]}"; do
  say ""
  say "## $stage: ${hw_stage_title[$stage]}"
  t0=$(date +%s)
  why=$(unmet_needs "$stage")
  left=$((budget - $(elapsed)))
  if [ -n "$why" ]; then
    verdict="skipped: $why"
  elif [ "$left" -lt 20 ]; then
    verdict="not started: the run's ${budget} s were spent"
  else
    limit=${hw_stage_limit[$stage]}
    [ "$limit" -le "$left" ] || limit=$left
    stage_deadline=$(($(date +%s) + limit))
    step_failures=0 step_timeouts=0 stage_notes=""
    "stage_$stage"
    if [ "$step_timeouts" -gt 0 ]; then
      verdict="**TIMED OUT** ($step_timeouts command(s) at the stage's $limit s)"
    elif [ "$step_failures" -gt 0 ]; then
      verdict="**FAILED** ($step_failures command(s))"
    else
      verdict="passed"
    fi
    [ -z "$stage_notes" ] || verdict="$verdict; $stage_notes"
  fi
  say ""
  say "Verdict: $verdict"
  echo "| $stage | $verdict | $(($(date +%s) - t0)) |" >>"$summary"
  publish
done
say ""
say "Run took $(elapsed) s (budget $budget s)."
publish
grep -qE 'FAILED|TIMED OUT' "$summary" && exit 1
exit 0
