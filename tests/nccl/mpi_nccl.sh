#!/usr/bin/env bash
# tests/nccl/mpi_nccl.sh BURSTLAB — `burstlab run --transport nccl` end to end (spec §7.4):
#   1. one process driving the GPUs it sees (a thread per rank), every algorithm;
#   2. two processes under mpirun, every algorithm of the table x dtypes, checked against the
#      fp64 oracle and the closed-form bytes of spec §7.5 (a FAIL or a "NO" fails);
#   3. the failure paths: --inject-failure 1:0 (rank 1 throws) and 1:0:hang (rank 1 stops
#      talking; --timeout 5) must end every rank with a non-zero exit and a message naming the
#      rank, the operation, the phase and the step, well within the timeout.
# On a machine with fewer GPUs than ranks, the ranks share a GPU: each process gets its own
# NCCL_HOSTID, so NCCL takes them for separate hosts and moves data over sockets on loopback
# (a correctness check of the transport, not a performance one).
# Exit 77 (ctest: skipped) without a GPU or mpirun, unless BURSTLAB_REQUIRE_GPU=1.
set -uo pipefail
bin=$1
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

# 3. failures end every rank, with the message, within the timeout.
expect_failure() {  # name, timeout bound (s), pattern..., --, command
  local name=$1 bound=$2; shift 2
  local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done; shift
  local t0=$(date +%s)
  timeout 300 "$@" >"$log" 2>&1
  local rc=$? t=$(( $(date +%s) - t0 )) ok=1
  [ $rc -ne 0 ] || ok=0
  [ $t -le "$bound" ] || ok=0
  for p in "${pats[@]}"; do grep -q -- "$p" "$log" || ok=0; done
  if [ $ok = 1 ]; then echo "pass $name (exit $rc after ${t}s)"; passed=$((passed + 1))
       grep -E 'error|rank [0-9]' "$log" | sed 's/^/    /' | head -12
  else echo "FAIL $name (exit $rc after ${t}s; expected non-zero within ${bound}s and: ${pats[*]})"
       sed 's/^/    /' "$log" | tail -30; failures=$((failures + 1)); fi
}
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
