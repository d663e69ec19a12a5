# scripts/steps.sh — sourced by the GPU check scripts (gpu-check, nccl-check, lmhead-check): run
# each step under a time limit with its output in a log, and print the table of steps at the end.
declare -a NAMES STATUS SECS
step() {  # step NAME LIMIT_SECONDS LOGFILE command...
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS
  echo "== $name (limit ${limit}s, log $log)"
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  NAMES+=("$name"); SECS+=($((SECONDS - t0)))
  if [ $rc -eq 0 ]; then STATUS+=("PASS"); else STATUS+=("FAIL(rc=$rc)"); tail -n 30 "$log"; fi
  return $rc
}
visible_gpus() {  # the GPUs a process here sees: CUDA_VISIBLE_DEVICES' entries where set, else nvidia-smi's
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .
  else nvidia-smi -L 2>/dev/null | grep -c '^GPU '; fi
}
skip() {  # skip NAME REASON: a step that could not run here, listed in the table (not a failure)
  echo "== $1: skipped: $2"
  NAMES+=("$1"); SECS+=(0); STATUS+=("SKIP")
}
steps_table() {  # prints one line per step; returns 1 when any step failed
  local i failed=0
  for i in "${!NAMES[@]}"; do
    printf '  %-16s %-12s %5ss\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}"
    [ "${STATUS[$i]}" = PASS ] || [ "${STATUS[$i]}" = SKIP ] || failed=1
  done
  return $failed
}
