#!/usr/bin/env bash
# tests/nccl/mpi_nccl.sh BURSTLAB [faults] — `burstlab run --transport nccl` end to end (spec §7.4).
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
#   FAULT_LAUNCH  "mpirun threads" (default both), FAULT_KINDS "throw hang", FAULT_ALGOS
#   (default every algorithm): subsets, e.g. to split the matrix over several commands.
# On a machine with fewer GPUs than ranks, the ranks share a GPU: each process gets its own
# NCCL_HOSTID, so NCCL takes them for separate hosts and moves data over sockets on loopback
# (a correctness check of the transport, not a performance one).
# Exit 77 (ctest: skipped) without a GPU or mpirun, unless BURSTLAB_REQUIRE_GPU=1.
set -uo pipefail
bin=$1
what=${2:-checks}
case $what in checks|faults) ;; *) echo "usage: $0 BURSTLAB [faults]"; exit 2 ;; esac
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
  # test_faults.cpp enters them all on SimComm): ring-like schedules G steps, distflash P/2 + 1,
  # attention2d on a 1x2 grid 3 (forward) and 4, attention2d-o 4 and 6, ulysses 2, allgather 1
  # and 2, usp with u = 2 a ring of one group between its all-to-alls: 3.
  declare -A last_fwd=([ring]=1 [burst]=1 [double-ring]=1 [distflash]=1 [attention2d]=2 [attention2d-o]=3
                       [ulysses]=1 [allgather]=0 [usp]=2)
  declare -A last_bwd=([ring]=1 [burst]=1 [double-ring]=1 [distflash]=1 [attention2d]=3 [attention2d-o]=5
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
                    "another rank failed||MPI_ABORT was invoked on rank 1")
            else
              # The other rank's watchdog fires (the hanging rank waits up to twice the timeout);
              # with threads only the first rank's error is printed, under mpirun each process's.
              spec="1:$step$sfx:hang"; to=5
              pats=("did not complete within the timeout of 5.0 s")
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
  echo
  echo "fault matrix (launch, algorithm, phase, step, kind | exit code | seconds | first message line):"
  printf '%s\n' "${rows[@]}"
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

echo "$passed passed, $failures failed"
[ $failures -eq 0 ]
