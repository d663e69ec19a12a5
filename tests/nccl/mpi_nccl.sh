#!/usr/bin/env bash
# tests/nccl/mpi_nccl.sh BURSTLAB [faults|soak] — `burstlab run --transport nccl` end to end (spec §7.4).
# Without a second argument:
#   1. one process driving the GPUs it sees (a thread per rank), every algorithm;
#   2. two processes under mpirun, every algorithm of the table x dtypes, checked against the
#      fp64 oracle and the closed-form bytes of spec §7.5 (a FAIL or a "NO" fails);
#   3. the failure paths: --inject-failure 1:0 (rank 1 throws) and 1:0:hang (rank 1 stops
#      talking; --timeout 5) must end every rank with a non-zero exit and a message naming the
#      rank, the operation, the phase and the step, well within the timeout.
# With `faults`: the fault matrix. Every algorithm x {forward, backward} x {its first, its last
# step} x {throw (--timeout 60), hang (--timeout 5)}, under mpirun -np 2 and, on a machine with 2
# GPUs or more, as 2 threads of one process: each run must exit non-zero (never 134, never
# std::terminate), within FAULT_BOUND_S seconds (default 30, start-up included), with the
# injected rank's message (rank, phase, step) and the other rank's. One table row per run.
#   FAULT_HANG_TIMEOUT the hang runs' --timeout (default 5 s).
#   FAULT_LAUNCH  "mpirun threads" (default both), FAULT_KINDS "throw hang", FAULT_ALGOS
#   (default every algorithm): subsets, e.g. to split the matrix over several commands.
#   Then `kill -9` of rank 1 under mpirun in the middle of a long run: every process must be gone,
#   with a non-zero exit, within --timeout + 5 s of the kill.
# With `soak`: SOAK_PASSES (default 200) timed passes of ring, then of burst, in ONE process (2
#   GPUs as threads; `run --repeat`), against a run of 20 passes: the peaks of the GPUs' used
#   memory (nvidia-smi), open file descriptors and resident host memory, sampled every 0.2 s,
#   must not grow with the passes (by at most SOAK_SLACK_MIB, default 64, and 2 descriptors).
# On a machine with fewer GPUs than ranks, the ranks share a GPU: each process gets its own
# NCCL_HOSTID, so NCCL takes them for separate hosts and moves data over sockets on loopback
# (a correctness check of the transport, not a performance one).
# Exit 77 (ctest: skipped) without a GPU or mpirun, unless BURSTLAB_REQUIRE_GPU=1.
set -uo pipefail
bin=$1
what=${2:-checks}
case $what in checks|faults|soak) ;; *) echo "usage: $0 BURSTLAB [faults|soak]"; exit 2 ;; esac
skip() {
  if [ "${BURSTLAB_REQUIRE_GPU:-0}" != 0 ]; then echo "FAIL: BURSTLAB_REQUIRE_GPU=1 but $1"; exit 1; fi
  echo "skipped: $1"; exit 77
}
gpus=0
command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || skip "no GPU"
command -v mpirun >/dev/null 2>&1 || skip "no mpirun"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
np=2
launch=(mpirun -np $np --oversubscribe --bind-to none)
if [ "$gpus" -lt "$np" ]; then
  launch+=(env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 sh -c 'NCCL_HOSTID=burstlab-rank-$OMPI_COMM_WORLD_RANK exec "$@"' sh)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failures=0 passed=0
check_run() {  # name, then the command
  local name=$1; shift
  local t0=$(date +%s)
  "$@" >"$log" 2>&1
  local rc=$? t=$(( $(date +%s) - t0 ))
  if [ $rc -ne 0 ] || grep -q -E 'FAIL|  NO' "$log"; then
    echo "FAIL $name (exit $rc, ${t}s)"; sed 's/^/    /' "$log" | tail -40; failures=$((failures + 1))
  else
    echo "pass $name (${t}s)"; passed=$((passed + 1))
  fi
}
shape=(--impl cuda --hq 4 --hkv 2 --nq 333 --nk 333 -d 64 --pass both --seed 7)
declare -A flags=(
  [ring]="--partition zigzag --mask causal"
  [burst]="--partition zigzag --mask causal+document:3"
  [double-ring]="--gpus-per-node 1 --partition zigzag --mask causal"
  [distflash]="--partition contiguous --mask causal"
  [attention2d]="--partition striped --mask causal"
  [attention2d-o]="--partition striped --mask window:40,0 --overlap"
  [ulysses]="--partition zigzag --mask causal"
  [allgather]="--partition zigzag --mask none"
  [usp]="--ulysses-degree 2 --partition zigzag --mask causal")

# 3. failures end every rank, with the message, within the timeout.
expect_failure() {  # name, timeout bound (s), pattern..., --, command
  local name=$1 bound=$2; shift 2
  local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done; shift
  local t0=$(date +%s)
  timeout 300 "$@" >"$log" 2>&1
  local rc=$? t=$(( $(date +%s) - t0 )) ok=1 why=""
  [ $rc -ne 0 ] || { ok=0; why="exit 0"; }
  # 134: SIGABRT (std::terminate); 124: killed by `timeout` (a hang)
  if [ $rc -eq 134 ] || [ $rc -eq 124 ] || grep -q -E 'terminate called|signal 6|Aborted' "$log"; then
    ok=0; why="abort or hang"
  fi
  [ $t -le "$bound" ] || { ok=0; why="${t}s > ${bound}s"; }
  # A pattern "A||B" is met by either (mpirun's MPI_Abort may kill a rank before it prints).
  for p in "${pats[@]}"; do
    local met=0 alt rest=$p
    while :; do
      alt=${rest%%||*}
      grep -q -F -- "$alt" "$log" && met=1
      [ "$alt" = "$rest" ] && break
      rest=${rest#*||}
    done
    [ $met = 1 ] || { ok=0; why="no '$p'"; }
  done
  first=$(grep -m1 -E 'rank [0-9]+: ' "$log" | cut -c1-200)
  if [ $ok = 1 ]; then echo "pass $name (exit $rc after ${t}s)"; passed=$((passed + 1))
       grep -E 'error|rank [0-9]' "$log" | sed 's/^/    /' | head -12
  else echo "FAIL $name (exit $rc after ${t}s: $why; expected non-zero within ${bound}s and: ${pats[*]})"
       sed 's/^/    /' "$log" | tail -30; failures=$((failures + 1)); fi
  rows+=("$(printf '%-4s %s | exit %3d | %3ds | %s' "$([ $ok = 1 ] && echo pass || echo FAIL)" "$name" "$rc" "$t" \
    "$first")")
}
rows=()

if [ "$what" = faults ]; then
  # The last step each pass enters with 2 ranks and the flags above (tests/distributed/
  # test_faults.cpp's TheNcclMatrixTableIsEachPassLastStepOnTwoRanks runs the same on SimComm
  # and pins this table): ring-like schedules G steps, distflash P/2 + 1, attention2d on a 1x2
  # grid 3 in each pass, attention2d-o 4 (a column of one member keeps dK, dV home: no
  # reduce-scatter, no transpose back), ulysses 2, allgather 1 and 2, usp with u = 2 a ring of
  # one group between its all-to-alls: 3.
  declare -A last_fwd=([ring]=1 [burst]=1 [double-ring]=1 [distflash]=1 [attention2d]=2 [attention2d-o]=3
                       [ulysses]=1 [allgather]=0 [usp]=2)
  declare -A last_bwd=([ring]=1 [burst]=1 [double-ring]=1 [distflash]=1 [attention2d]=2 [attention2d-o]=3
                       [ulysses]=1 [allgather]=1 [usp]=2)
  base=(--impl cuda --hq 4 --hkv 2 --nq 333 --nk 333 -d 64 --seed 7 --dtype bf16)
  bound=${FAULT_BOUND_S:-30}
  launches=${FAULT_LAUNCH:-mpirun threads}
  for launch_kind in $launches; do
    if [ "$launch_kind" = threads ] && [ "$gpus" -lt 2 ]; then
      echo "skipped: the threads fault matrix needs 2 GPUs in one process (this machine has $gpus)"
      continue
    fi
    pre=("${launch[@]}"); world=()
    [ "$launch_kind" = threads ] && { pre=(); world=(--world 2); }
    for algo in ${FAULT_ALGOS:-ring burst double-ring distflash attention2d attention2d-o ulysses allgather usp}; do
      a=$algo; [ "$algo" = attention2d-o ] && a=attention2d
      for phase in forward backward; do
        if [ $phase = forward ]; then pass=fwd; last=${last_fwd[$algo]}; sfx=""
        else pass=bwd; last=${last_bwd[$algo]}; sfx=":bwd"; fi
        steps="0"; [ "$last" != 0 ] && steps="0 $last"
        for step in $steps; do
          for kind in ${FAULT_KINDS:-throw hang}; do
            if [ $kind = throw ]; then
              spec="1:$step$sfx"; to=60
              # Under mpirun the failing rank's MPI_Abort may end rank 0 before it prints its own error.
              pats=("rank 1: fault injection (--inject-failure $spec) in $phase step $step: injected failure"
                    "another rank failed||stopped after the first failure||MPI_ABORT was invoked on rank 1")
            else
              # The other rank's watchdog fires (the hanging rank waits up to twice the timeout);
              # with threads only the first rank's error is printed, under mpirun each process's.
              spec="1:$step$sfx:hang"; to=${FAULT_HANG_TIMEOUT:-5}
              pats=("did not complete within the timeout of $(printf '%.1f' "$to") s")
              # Under mpirun rank 0's MPI_Abort ends the hanging rank, which may not get to print.
              [ "$launch_kind" = mpirun ] &&
                pats+=("rank 1: fault injection (--inject-failure $spec), hanging in $phase step $step||MPI_ABORT was invoked on rank 0")
            fi
            expect_failure "$(printf '%-7s %-13s %-8s step %d %-5s' $launch_kind $algo $phase $step $kind)" "$bound" \
              "${pats[@]}" -- \
              "${pre[@]}" "$bin" run --transport nccl "${world[@]}" --algo $a "${base[@]}" --pass $pass \
              --inject-failure "$spec" --timeout $to ${flags[$algo]}
          done
        done
      done
    done
  done
  # kill -9 of one rank in the middle of a pass: mpirun (or the others' watchdogs) must end every
  # process within the timeout + 5 s of the kill.
  if [[ " $launches " == *" mpirun "* ]]; then
    pids=$(mktemp -d)
    t0=$(date +%s)
    "${launch[@]}" sh -c 'echo $$ > '"$pids"'/rank$OMPI_COMM_WORLD_RANK; exec "$@"' sh \
      "$bin" run --transport nccl --algo ring --impl cuda --hq 8 --hkv 8 --nq 16384 --nk 16384 -d 128 --dtype bf16 \
      --partition zigzag --mask causal --pass both --repeat 100000 --timeout 10 >"$log" 2>&1 &
    mp=$!
    # wait until both ranks run and have started passes (NCCL set up), then kill rank 1
    for _ in $(seq 1 120); do [ -s "$pids/rank1" ] && [ -s "$pids/rank0" ] && break; sleep 0.5; done
    sleep 8
    victim=$(cat "$pids/rank1" 2>/dev/null)
    tk=$(date +%s)
    if [ -n "$victim" ] && kill -0 "$victim" 2>/dev/null; then
      kill -9 "$victim"
      ( sleep 60; kill -9 $mp 2>/dev/null ) & guard=$!
      wait $mp; rc=$?
      kill $guard 2>/dev/null
      # mpirun may return before rank 0 is gone: wait for it too (its watchdog ends it at --timeout)
      r0=$(cat "$pids/rank0")
      for _ in $(seq 1 300); do kill -0 "$r0" 2>/dev/null || break; sleep 0.1; done
      t=$(( $(date +%s) - tk ))
      alive=no; kill -0 "$r0" 2>/dev/null && alive=yes
      first=$(grep -m1 -E 'rank [0-9]+|killed|signal 9|exited on signal' "$log" | cut -c1-200)
      if [ $rc -ne 0 ] && [ $t -le 15 ] && [ $alive = no ]; then ok=pass; passed=$((passed + 1))
      else ok=FAIL; failures=$((failures + 1)); sed 's/^/    /' "$log" | tail -20; fi
      echo "$ok mpirun kill -9 rank 1 (mpirun exit $rc ${t}s after the kill; rank 0 alive after: $alive)"
      rows+=("$(printf '%-4s %-45s | exit %3d | %3ds | %s' $ok "mpirun  ring kill -9 rank 1 mid-run" $rc $t "$first")")
    else
      echo "FAIL mpirun kill -9: rank 1 never started or ended early ($(( tk - t0 ))s)"; sed 's/^/    /' "$log" | tail -20
      failures=$((failures + 1)); kill -9 $mp 2>/dev/null; wait $mp 2>/dev/null
    fi
    for f in "$pids"/rank*; do kill -9 "$(cat "$f")" 2>/dev/null; done
    rm -rf "$pids"
  fi
  echo
  echo "fault matrix (launch, algorithm, phase, step, kind | exit code | seconds | first message line):"
  printf '%s\n' "${rows[@]}"
  echo "$passed passed, $failures failed"
  [ $failures -eq 0 ]
  exit
fi

if [ "$what" = soak ]; then
  [ "$gpus" -ge 2 ] || skip "the soak needs 2 GPUs in one process (this machine has $gpus)"
  passes=${SOAK_PASSES:-200} slack=${SOAK_SLACK_MIB:-64}
  # The peaks are whole-GPU figures: another process on the GPUs would be counted as a leak.
  others=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c . || true)
  if [ "${others:-0}" -gt 0 ]; then
    echo "FAIL soak: $others other process(es) use the GPUs (nvidia-smi --query-compute-apps); the soak reads" \
      "the GPUs' whole used memory, so it must run alone"
    exit 1
  fi
  # One run of `passes` passes, sampled every 0.2 s: "peak device MiB, peak descriptors, peak RSS
  # MiB, seconds, exit code". The GPUs' used memory is read for the whole GPU (checked above to be
  # this process's alone; per-process figures need the host's PID namespace).
  peaks() {
    # The check after the passes (the same in both runs) allocates per OpenMP thread: with a
    # thread per core and a malloc arena per thread, the peaks of a 20- and a 200-pass run differed
    # by -55 to +262 MiB on 32-core hosts with flat device memory and descriptors. Two threads and
    # two arenas for the check.
    MALLOC_ARENA_MAX=2 "$bin" run --transport nccl --world 2 --algo $1 --impl cuda --hq 8 --hkv 8 --nq 32768 --nk 32768 \
      -d 128 --dtype bf16 --partition zigzag --mask causal --pass both --repeat "$2" --check-rows 8 --threads 2 >"$log" 2>&1 &
    local pid=$! dev=0 fds=0 rss=0 t0=$(date +%s%N) d f r
    while kill -0 $pid 2>/dev/null; do
      d=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
      f=$(ls /proc/$pid/fd 2>/dev/null | wc -l)
      r=$(awk '/^VmRSS/ { print int($2 / 1024) }' /proc/$pid/status 2>/dev/null)
      [ "${d:-0}" -gt $dev ] && dev=$d; [ "${f:-0}" -gt $fds ] && fds=$f; [ "${r:-0}" -gt $rss ] && rss=$r
      sleep 0.2
    done
    wait $pid
    local rc=$?
    echo "$dev $fds $rss $(( ($(date +%s%N) - t0) / 1000000 )) $rc"
  }
  # A leak of x per pass shows as (passes - 20) x more at the peak of the long run than of the short.
  for algo in ring burst; do
    read -r d1 f1 r1 ms1 rc1 <<<"$(peaks $algo 20)"
    read -r d2 f2 r2 ms2 rc2 <<<"$(peaks $algo "$passes")"
    checked=$(grep -cE ' PASS( |$)' "$log")
    line="device peak $d1 -> $d2 MiB, descriptors $f1 -> $f2, RSS peak $r1 -> $r2 MiB (20 -> $passes passes; ${ms1} -> ${ms2} ms a run)"
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $checked -ge 2 ] && [ $(( d2 - d1 )) -le $slack ] && [ $(( f2 - f1 )) -le 2 ] &&
       [ $(( r2 - r1 )) -le $slack ]; then
      echo "pass soak $algo: $line"; passed=$((passed + 1))
    else
      echo "FAIL soak $algo (exit $rc1, $rc2; $checked rows PASS): $line"; tail -20 "$log" | sed 's/^/    /'
      failures=$((failures + 1))
    fi
  done
  echo "$passed passed, $failures failed"
  [ $failures -eq 0 ]
  exit
fi

# 1. threads of one process: as many ranks as GPUs (one here, two on a 2-GPU machine).
w1=$(( gpus < np ? 1 : np ))
for algo in ring burst; do
  check_run "threads world=$w1 $algo bf16" "$bin" run --transport nccl --algo $algo --world $w1 "${shape[@]}" \
    --dtype bf16 ${flags[$algo]}
done

# 2. mpirun, every algorithm; ring and burst in every dtype.
for algo in ring burst double-ring distflash attention2d attention2d-o ulysses allgather usp; do
  a=$algo; extra=${flags[$algo]}
  [ "$algo" = attention2d-o ] && a=attention2d
  dtypes="bf16"
  [ "$algo" = ring ] || [ "$algo" = burst ] && dtypes="bf16 fp16 fp32"
  for dt in $dtypes; do
    check_run "mpirun np=$np $algo $dt" "${launch[@]}" "$bin" run --transport nccl --algo $a "${shape[@]}" --dtype $dt $extra
  done
done

# The benchmark's form: two algorithms next to the single kernel, the scaling table in the JSON.
check_run "mpirun np=$np ring,burst --single --json" sh -c '"$@" | tee /dev/stderr | grep -q "\"speedup\""' sh \
  "${launch[@]}" "$bin" run --transport nccl --algo ring,burst --single --repeat 2 --json "${shape[@]}" --dtype bf16 \
  --partition zigzag --mask causal

# 3. failures end every rank, with the message, within the timeout (expect_failure above).
expect_failure "mpirun injected failure" 60 "rank 1: " "(--inject-failure 1:0)" "forward step 0: injected failure" \
  "rank 0:" "another rank failed" -- \
  "${launch[@]}" "$bin" run --transport nccl --algo ring --inject-failure 1:0 --timeout 60 "${shape[@]}" --dtype bf16 \
  --partition zigzag --mask causal
expect_failure "mpirun injected hang, --timeout 5" 60 "did not complete within the timeout of 5.0 s" \
  "forward step 0" -- \
  "${launch[@]}" "$bin" run --transport nccl --algo burst --inject-failure 1:0:hang --timeout 5 "${shape[@]}" \
  --dtype bf16 --partition zigzag --mask causal

# ---- 4. conform through NCCL (checks mode) ------------------------------------------------------
# `burstlab conform --transport nccl`: the quick suite's cases (the adversarial ones included),
# every algorithm's column on the cuda engine, judged by the fp64 oracle, in bf16 and in fp16,
# under mpirun (one process per GPU) and, with 2 GPUs or more, as threads of one process. Passes
# when it exits 0, prints one matrix (rank 0 alone) under its "transport: NCCL" line, and ends with
# "N passed, 0 failed", N >= 1 ('n/a' cells are the algorithms' refusals, listed under the matrix).
# Then the failure path: rank 1 throws, or hangs, in the first cell; every process ends non-zero
# within the bound (under mpirun the later cells are reported 'not run'; as threads they run on a
# new world).
conform_run() {  # name, then the command
  local name=$1; shift
  local t0=$(date +%s)
  "$@" >"$log" 2>&1
  local rc=$? t=$(( $(date +%s) - t0 ))
  local summary matrices
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | head -1)
  matrices=$(grep -c '^case ' "$log")
  # a FAIL cell or note line ("PASS/FAIL" in the summary line is neither)
  if [ $rc -eq 0 ] && ! grep -qE '(^|[[:space:]])FAIL' "$log" && [[ $summary =~ ^[1-9][0-9]*\ passed,\ 0\ failed ]] &&
     [ "$matrices" -eq 1 ] && grep -q '^transport: NCCL (' "$log"; then
    echo "pass $name (${t}s): $(grep -m1 '^transport: ' "$log"); ${summary%% (*}; $(grep -c '^n/a ' "$log") n/a groups"
    passed=$((passed + 1))
  else
    echo "FAIL $name (exit $rc, ${t}s, $matrices matrices, '$summary')"; sed 's/^/    /' "$log" | tail -60
    failures=$((failures + 1))
  fi
}
for dt in bf16 fp16; do
  conform_run "conform mpirun np=$np quick $dt" "${launch[@]}" "$bin" conform --transport nccl --dtype $dt
  [ "$gpus" -ge 2 ] &&
    conform_run "conform threads world=2 quick $dt" "$bin" conform --transport nccl --world 2 --dtype $dt
done
conform_run "conform mpirun np=$np quick bf16 zigzag" "${launch[@]}" "$bin" conform --transport nccl --dtype bf16 \
  --partition zigzag
expect_failure "conform mpirun injected failure" 60 "(--inject-failure 1:0)" "forward step 0: injected failure" \
  "were not run||MPI_ABORT was invoked on rank 1" -- \
  "${launch[@]}" "$bin" conform --transport nccl --impl ring --dtype bf16 --inject-failure 1:0 --timeout 60
expect_failure "conform mpirun injected hang, --timeout 5" 60 "did not complete within the timeout of 5.0 s" -- \
  "${launch[@]}" "$bin" conform --transport nccl --impl ring --dtype bf16 --inject-failure 1:0:hang --timeout 5
if [ "$gpus" -ge 2 ]; then
  # As threads the failed cell's world is replaced: the other 10 cells run and pass.
  expect_failure "conform threads injected failure" 60 "(--inject-failure 1:0)" \
    "the NCCL world was made anew after ring/cuda G=2 on 01_full_mha_bf16" "10 passed, 1 failed" -- \
    "$bin" conform --transport nccl --world 2 --impl ring --dtype bf16 --inject-failure 1:0 --timeout 60
fi
# ---- end of 4 -----------------------------------------------------------------------------------

echo "$passed passed, $failures failed"
[ $failures -eq 0 ]
