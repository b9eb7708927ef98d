#!/usr/bin/env bash
# A cluster of three `foreman train` processes on 127.0.0.1 (docs/train.md
# "Clusters"): a ps, the chief (worker 0) and worker 1, each started on its
# own as with TF1, training a small MLP on the real Fashion-MNIST. Nothing
# makes the chief wait for the other workers (as in TF1), so a run ended by
# --max-steps could end before worker 1 joins; instead the run ends once
# both workers have trained a step, by a SIGTERM to the chief (as `foreman
# cluster local` forwards one): the chief stops at the step boundary, ends
# training on the ps, takes its final checkpoint and exits 0; worker 1's
# next update is refused (OUT_OF_RANGE) and it exits 0 saying so; the ps
# sees training end and exits 0. Then: the chief's final checkpoint is at
# the global_step it ended training at, which is the sum of the updates the
# two workers had accepted (none lost); an independent reader
# (tools/testing/tfformat.py, no code shared with the C++) finds every MLP
# variable, the optimizer's slots and worker 0's data position in it;
# worker 1 and the ps wrote nothing; the cluster flags were not stored, so a
# single-process run resumes the checkpoint. Bad cluster flags are exit 2
# naming the flag, before anything is created.
#
#   cluster_e2e_test.sh FOREMAN TOOLS_TESTING_DIR HEARTBEAT_MS CONNECTION_TIMEOUT_MS
set -u
foreman=$1
tools=$2
heartbeat_ms=$3
timeout_ms=$4
NAME=cluster_e2e_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

# Three free ports on 127.0.0.1 (bound together, so distinct).
ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"

# --max-steps: a bound only (the SIGTERM ends the run); a progress line per step.
model=(--hidden 32 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
     --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
ckpt=$tmp/run
bound=120

# 1. Bad cluster flags: exit 2 naming the flag, before anything is created.
out=$(timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --job-name worker --task-index 0 2>&1); code=$?
[[ $code -eq 2 ]] || fail "a half-given cluster exited $code, expected 2: $out"
has "missing: --ps-hosts, --worker-hosts" "$out" || fail "a half-given cluster does not name what is missing: $out"
out=$(timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" "${net[@]}" --job-name worker \
      --task-index 2 2>&1); code=$?
[[ $code -eq 2 ]] || fail "--task-index 2 of 2 workers exited $code, expected 2: $out"
has "--task-index 2 is out of range" "$out" || fail "a bad --task-index is not named: $out"
out=$(timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --ps-hosts 127.0.0.1:70000 \
      --worker-hosts "127.0.0.1:$chief_port" --job-name ps --task-index 0 2>&1); code=$?
[[ $code -eq 2 ]] || fail "a port of 70000 exited $code, expected 2: $out"
has "--ps-hosts entry 1 \(task 0\) '127.0.0.1:70000'" "$out" || fail "a bad --ps-hosts entry is not named: $out"
[[ ! -e $tmp/bad ]] || fail "a refused cluster start created its --checkpoint-dir"

# 2. The cluster. Worker 1 first: once it is waiting for the chief's
#    session (its header printed), the chief starts. Once each worker has
#    printed a step, the chief gets a SIGTERM.
"$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused" \
  --ps-wait-secs "$bound" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_line "^foreman train: worker 1 of 2" "$tmp/worker1.out" "$bound" "$worker_pid" \
  || fail "worker 1 did not start: $(cat "$tmp/worker1.out")"
# --signal-ends-training: the SIGTERM is the request to end the job (without
# it a SIGTERM evicts only the chief: cluster_evict_test.sh).
"$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$ckpt" \
  --save-checkpoint-secs 600 --signal-ends-training >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_for_line "^step [0-9]+" "$tmp/chief.out" "$bound" "$chief_pid" || fail "the chief trained no step"
wait_for_line "^step [0-9]+" "$tmp/worker1.out" "$bound" "$worker_pid" || fail "worker 1 trained no step"
kill -TERM "$chief_pid" 2>/dev/null
wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
chief_out=$(cat "$tmp/chief.out")
worker_out=$(cat "$tmp/worker1.out")
ps_out=$(cat "$tmp/ps.out")
[[ $chief_rc -eq 0 ]] || fail "the chief exited $chief_rc: $chief_out"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc: $worker_out"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc: $ps_out"
has "^ps task 0: training ended" "$ps_out" || fail "the ps did not see training end: $ps_out"
has "^worker 1: the chief ended training" "$worker_out" || fail "worker 1 did not stop at the chief's end: $worker_out"

# Each worker's own steps, and the global_step the chief ended training at.
k0=$(sed -n 's/^worker 0: trained \([0-9]*\) steps.*/\1/p' <<<"$chief_out")
k1=$(sed -n 's/^worker 1: trained \([0-9]*\) steps.*/\1/p' <<<"$worker_out")
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
[[ $k0 =~ ^[0-9]+$ && $k0 -ge 1 ]] || fail "the chief trained no step: $chief_out"
[[ $k1 =~ ^[0-9]+$ && $k1 -ge 1 ]] || fail "worker 1 trained no step: $worker_out"
[[ $final =~ ^[0-9]+$ ]] || fail "the chief did not say where it ended training: $chief_out"
has "^stopped by SIGTERM after its final checkpoint" "$chief_out" || fail "the chief did not stop at the SIGTERM: $chief_out"
echo "worker 0: $k0 steps, worker 1: $k1 steps, training ended at global_step $final"
if [[ $k0 =~ ^[0-9]+$ && $k1 =~ ^[0-9]+$ && $final =~ ^[0-9]+$ ]]; then
  (( k0 + k1 == final )) || fail "global_step $final is not the $k0 + $k1 updates the workers had accepted"
fi
has "^checkpoints: $ckpt \(latest: $ckpt/model.ckpt-$final\)" "$chief_out" \
  || fail "the chief's latest checkpoint is not model.ckpt-$final: $chief_out"
has "^test accuracy: " "$chief_out" || fail "the chief did not evaluate: $chief_out"
[[ ! -e $tmp/unused ]] || fail "worker 1 created its --checkpoint-dir"
[[ ! -e $tmp/ps_unused ]] || fail "the ps created its --checkpoint-dir"
if [[ -f $ckpt/train_settings.txt ]]; then
  ! grep -Eiq "hosts|job|task|heartbeat|tls|insecure" "$ckpt/train_settings.txt" \
    || fail "cluster flags stored in train_settings.txt: $(cat "$ckpt/train_settings.txt")"
else
  fail "the chief wrote no train_settings.txt"
fi

# 3. The independent reader: every MLP variable with its Adam slots and
#    beta powers, global_step == the final step, worker 0's data position.
if [[ $final =~ ^[0-9]+$ && $k0 =~ ^[0-9]+$ ]]; then
  "$py" -B - "$tools" "$ckpt/model.ckpt-$final" "$final" "$k0" <<'EOF' || fail "the independent reader on model.ckpt-$final"
import math, sys
sys.path.insert(0, sys.argv[1])
import tfformat as tf
from check_train_run import expected_variables
prefix, final, k0 = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = tf.read_bundle(prefix)
want = expected_variables([32], "adam")
problems = [f"no variable '{n}'" for n in sorted(set(want) - set(b.tensors))]
problems += [f"unexpected variable '{n}'" for n in sorted(set(b.tensors) - set(want))]
for n in sorted(set(want) & set(b.tensors)):
    t = b.tensors[n]
    if (t.dtype, t.shape) != want[n]:
        problems.append(f"'{n}' is {t.dtype} {t.shape}, expected {want[n]}")
    if t.dtype == "float32" and not all(math.isfinite(v) for v in t.values):
        problems.append(f"'{n}' holds a NaN or Inf")
if b.tensors.get("global_step") and b.tensors["global_step"].values != [final]:
    problems.append(f"global_step {b.tensors['global_step'].values}, expected [{final}]")
# Worker 0's position: k0 batches of 50 into epoch 0 (60000 examples).
for n, v in (("input_pipeline/epoch", k0 * 50 // 60000), ("input_pipeline/index", k0 * 50 % 60000)):
    if b.tensors.get(n) and b.tensors[n].values != [v]:
        problems.append(f"{n} {b.tensors[n].values}, expected [{v}] (worker 0's {k0} batches of 50)")
for p in problems:
    print(f"{prefix}: {p}")
print(f"independent reader: {prefix}: {len(b.tensors)} variables read back")
sys.exit(1 if problems else 0)
EOF
fi

# 4. A single-process run resumes the cluster's checkpoint (the cluster
#    flags were not stored): 5 more steps.
if [[ $final =~ ^[0-9]+$ ]]; then
  out=$(timeout "$bound" "$foreman" train --checkpoint-dir "$ckpt" --max-steps "$((final + 5))" 2>&1); code=$?
  [[ $code -eq 0 ]] || fail "the single-process resume exited $code: $out"
  has "Restoring parameters from $ckpt/model.ckpt-$final" "$out" \
    || fail "the single-process resume did not restore model.ckpt-$final: $out"
  has "^trained 5 steps" "$out" || fail "the single-process resume did not train 5 steps: $out"
fi

if ((failures > 0)); then
  echo "--- ps:"; echo "$ps_out"; echo "--- chief:"; echo "$chief_out"; echo "--- worker 1:"; echo "$worker_out"
  failures_summary
  exit 1
fi
echo "cluster_e2e_test: OK"
