#!/usr/bin/env bash
# Smoke test of the benchmark programs (tools/bench, issue 6): each starts
# and exits cleanly with tiny sizes and prints the lines run.sh collects, and
# report.py turns them into a table. Measures nothing; installs nothing.
# PyTorch's scripts run only when /usr/bin/python3 has torch; the MLP
# programs only when Fashion-MNIST is installed (dataset-fashion-mnist).
# Usage: bench_smoke_test.sh OVERHEAD SUMMARY CHECKPOINT TRAIN RECOVERY BENCH_SRC_DIR TCP_ROUNDTRIP KERNEL
set -u
overhead=$1
summary=$2
checkpoint=$3
train=$4
recovery=$5
src=$6
tcp_roundtrip=$7
kernel=$8
data=${FOREMAN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
python=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench_smoke_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/results" "$tmp/scratch"
runs=$tmp/results/runs.txt
: >"$runs"
gb=(--benchmark_min_time=0.001 --benchmark_repetitions=2 --benchmark_enable_random_interleaving=true
    --benchmark_out_format=json)

# -- 2. runtime overhead ---------------------------------------------------------------
out=$(TMPDIR=$tmp/scratch timeout 120 "$overhead" "${gb[@]}" --benchmark_out="$tmp/results/overhead.json" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "overhead_bench exited $rc: $out"
for b in BM_BareStep BM_SessionRun BM_MonitoredSessionNoHooks BM_MonitoredTrainingSession; do
  has "^$b/real_time_median " "$out" || fail "overhead_bench: no median for $b: $out"
done
has 'ERROR OCCURRED' "$out" && fail "overhead_bench reported an error: $out"

# -- 4. summaries ----------------------------------------------------------------------
out=$(TMPDIR=$tmp/scratch timeout 120 "$summary" "${gb[@]}" --benchmark_out="$tmp/results/summary.json" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "summary_bench exited $rc: $out"
for b in BM_SummaryWriterActor/1000 BM_EventFileWriterDirect/1000; do
  has "^$b/real_time_median .*items_per_second=" "$out" || fail "summary_bench: no events/s for $b: $out"
done
has 'ERROR OCCURRED' "$out" && fail "summary_bench reported an error: $out"

# -- 3. checkpoints (1 MB; torch.save when present) ----------------------------------------
torch_args=()
have_torch=0
if "$python" -c 'import torch' 2>/dev/null; then
  have_torch=1
  torch_args=(--torch "$python $src/checkpoint_torch.py")
fi
out=$(timeout 120 "$checkpoint" --sizes-mb 1 --reps 1 --dir "$tmp/scratch" "${torch_args[@]}" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "checkpoint_bench exited $rc: $out"
for f in stall_s stall_cpu_s stall_page_faults waited_saves memcpy_fresh_s memcpy_warm_s memcpy_warm_cpu_s write_s write_MBps \
         write_first_s syncs_per_save dd_MBps write_vs_dd dd_nsync_MBps write_vs_dd_nsync; do
  has "^RESULT ckpt\.1MB\.$f median=[0-9.e+-]+ min=.* n=[0-9]+ unit=" "$out" || fail "checkpoint_bench: no $f: $out"
done
((have_torch)) && ! has '^RESULT ckpt\.1MB\.torch_save_MBps ' "$out" && fail "checkpoint_bench: no torch.save: $out"
grep '^RESULT' <<<"$out" >>"$runs"
[[ -z $(ls -A "$tmp/scratch") ]] || fail "checkpoint_bench left files behind: $(ls -R "$tmp/scratch")"

# -- 6. the floor under a cluster round trip (127.0.0.1, a few small trades) -------------------
out=$(timeout 60 "$tcp_roundtrip" 1000 3000 20 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "tcp_roundtrip exited $rc: $out"
has '^RUN cluster\.tcp_roundtrip_us [0-9]+ us p10=[0-9]+ p90=[0-9]+ request_bytes=1000 answer_bytes=3000 reps=20$' "$out" ||
  fail "tcp_roundtrip: $out"
# kernel_bench: on the CPU device (both legs the same code), every row with
# its baseline; without a GPU, --device gpu:0 skips saying why.
out=$(timeout 120 "$kernel" --device cpu --batches 16,33 --reps 1 --ops 2 --replays 2 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "kernel_bench --device cpu exited $rc: $out"
for b in 16 33; do
  for name in gemm.fwd0 gemm.fwd1 gemm.kgrad1 gemm.dgrad gemm.kgrad0 xent_stats bias_grad.l0 bias_grad.l1; do
    has "^RUN kernel\.$name\.b$b [0-9.]+ us baseline=[0-9.]+ ratio=[0-9.]+x$" "$out" || fail "kernel_bench: no $name.b$b row: $out"
  done
done
has '^RUN kernel\.adam_update [0-9.]+ us baseline=[0-9.]+ ratio=[0-9.]+x$' "$out" || fail "kernel_bench: no adam_update row: $out"
[[ $(grep -c '^RUN kernel\.' <<<"$out") -eq 17 ]] || fail "kernel_bench: not 17 rows: $out"
out=$(timeout 60 "$kernel" --device cpu --reps 0 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "^kernel_bench: --reps wants an integer in \[1, 100\], got '0'" "$out" || fail "kernel_bench --reps 0: rc $rc: $out"
if devices=$(timeout 60 "$(dirname "$kernel")/../tools/foreman" devices 2>&1) && has '^no CUDA devices' "$devices"; then
  out=$(timeout 60 "$kernel" --device gpu:0 2>&1)
  rc=$?
  [[ $rc -eq 77 ]] && has '^SKIP kernel_bench --device gpu:0: ' "$out" || fail "kernel_bench --device gpu:0 without a GPU: rc $rc: $out"
fi
out=$(timeout 60 "$tcp_roundtrip" 1000 0 20 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "ANSWER_BYTES must be a whole number in \[1, [0-9]+\], not '0'" "$out" ||
  fail "tcp_roundtrip with 0 answer bytes: rc $rc: $out"

# -- 1, 5. the MLP: training throughput and recovery ----------------------------------------
if [[ -f $data/train-images-idx3-ubyte.gz ]]; then
  out=$(timeout 120 "$train" --data "$data" --threads 1 --steps 3 --warmup 1 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "train_bench exited $rc: $out"
  has '^RUN train\.foreman\.t1\.samples_per_s [0-9.e+]+ samples/s isa=(baseline|avx2|avx512)$' "$out" || fail "train_bench: $out"
  grep '^RUN' <<<"$out" >>"$runs"
  # The GPU mode (issue 15; run.sh's part 7): without a usable GPU one SKIP
  # line naming why, exit 77; with one, every figure's line.
  out=$(timeout 120 "$train" --data "$data" --device gpu:0 --batches 128,256 --steps 3 --warmup 1 --save-every 2 \
        --saves 2 2>&1)
  rc=$?
  if [[ $rc -eq 77 ]]; then
    has "^SKIP train_bench --device gpu:0: SessionConfig.device '/gpu:0'" "$out" || fail "train_bench --device gpu:0 skipped without saying why: $out"
  else
    [[ $rc -eq 0 ]] || fail "train_bench --device gpu:0 exited $rc: $out"
    for b in 128 256; do
      has "^RUN train\.foreman\.gpu\.b$b\.samples_per_s [0-9.e+]+ samples/s device=/gpu:0$" "$out" || fail "train_bench gpu b$b: $out"
    done
    for f in ckpt_stall_s ckpt_d2h_copy_s ckpt_stall_over_copy; do
      has "^RUN train\.foreman\.gpu\.$f [0-9.e+-]+ " "$out" || fail "train_bench gpu: no $f: $out"
    done
  fi
  out=$(timeout 30 "$train" --device tpu 2>&1)
  rc=$?
  [[ $rc -eq 2 ]] && has "^train_bench: --device wants cpu, gpu:N or cpu-gathered, not 'tpu'" "$out" || fail "train_bench --device tpu: rc $rc: $out"
  # The GPU mode's code on the CPU device (--device cpu-gathered): every line.
  out=$(TMPDIR=$tmp/scratch timeout 120 "$train" --data "$data" --device cpu-gathered --batches 64,100 --steps 3 --warmup 1 \
        --save-every 2 --saves 2 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "train_bench --device cpu-gathered exited $rc: $out"
  for b in 64 100; do
    has "^RUN train\.foreman\.cpu_gathered\.b$b\.samples_per_s [0-9.e+]+ samples/s device=/cpu:0$" "$out" || fail "train_bench cpu-gathered b$b: $out"
  done
  has '^RUN train\.foreman\.cpu_gathered\.ckpt_stall_s [0-9.e+-]+ s saves=2 device=/cpu:0$' "$out" || fail "train_bench cpu-gathered: no stall: $out"
  has '^RUN train\.foreman\.cpu_gathered\.ckpt_d2h_copy_s [0-9.e+-]+ s copies=20$' "$out" || fail "train_bench cpu-gathered: no copy: $out"
  has '^RUN train\.foreman\.cpu_gathered\.ckpt_stall_over_copy [0-9.e+-]+ x$' "$out" || fail "train_bench cpu-gathered: no ratio: $out"
  [[ -z $(ls -A "$tmp/scratch") ]] || fail "train_bench cpu-gathered left files behind: $(ls -R "$tmp/scratch")"
  if ((have_torch)); then
    out=$(timeout 120 "$python" "$src/train_torch.py" --data "$data" --threads 1 --steps 3 --warmup 1 \
          --info "$tmp/results/peer.t1.txt" 2>&1)
    rc=$?
    [[ $rc -eq 0 ]] || fail "train_torch.py exited $rc: $out"
    info=$(cat "$tmp/results/peer.t1.txt" 2>&1)
    has '^torch: PyTorch [0-9]' "$info" || fail "train_torch.py --info: no version: $info"
    has '^torch_threads: torch.get_num_threads\(\) = 1 ' "$info" || fail "train_torch.py --info: threads: $info"
    has '^torch_onednn: (available|not available)' "$info" || fail "train_torch.py --info: oneDNN: $info"
    has '^torch_libs: ' "$info" || fail "train_torch.py --info: no libraries: $info"
    has '^RUN train\.torch\.t1\.samples_per_s [0-9.e+]+ samples/s$' "$out" || fail "train_torch.py: $out"
    grep '^RUN' <<<"$out" >>"$runs"
    out=$(timeout 120 "$python" "$src/train_torch.py" --data "$data" --threads 1 --device cuda --steps 3 --warmup 1 2>&1)
    rc=$?
    if [[ $rc -eq 77 ]]; then
      has '^SKIP train_torch.py --device cuda: torch.cuda is not available' "$out" || fail "train_torch.py --device cuda: $out"
    else
      [[ $rc -eq 0 ]] && has '^RUN train\.torch\.cuda\.b128\.samples_per_s [0-9.e+]+ samples/s device=' "$out" ||
        fail "train_torch.py --device cuda exited $rc: $out"
    fi
  fi
  out=$(timeout 180 "$recovery" --data "$data" --reps 1 --abort-at 3 --dir "$tmp/scratch" 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "recovery_bench exited $rc: $out"
  has '^RUN recovery\.default_backoff_s [0-9.e+-]+ s$' "$out" || fail "recovery_bench: $out"
  has '^RUN recovery\.no_backoff_s [0-9.e+-]+ s$' "$out" || fail "recovery_bench: $out"
  has 'Recovered from a preemption error' "$out" || fail "recovery_bench did not recover: $out"
  grep '^RUN' <<<"$out" >>"$runs"
else
  echo "SKIP: no Fashion-MNIST in $data: train_bench and recovery_bench not run"
fi

# -- the table ------------------------------------------------------------------------------
echo "model: smoke" >"$tmp/results/machine.txt"
out=$("$python" "$src/report.py" "$tmp/results" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "report.py exited $rc: $out"
has '^\| 2 \| runtime overhead per step' "$out" || fail "report.py: no overhead row: $out"
has '^\| 3 \| 1 MB: training-loop stall per save' "$out" || fail "report.py: no checkpoint row: $out"
has '^\| 3 \| 1 MB: background write, [0-9]+ syncs per save \(MB/s\) \| [0-9]' "$out" ||
  fail "report.py: no row against dd with the save's syncs: $out"
has '^\| 4 \| summaries through the summary_writer actor \(events/s\) \| [0-9]' "$out" || fail "report.py: $out"
if ((have_torch)) && [[ -f $data/train-images-idx3-ubyte.gz ]]; then
  has '^Peer: PyTorch [0-9].*libraries loaded: ' "$out" || fail "report.py: no peer backend in the header: $out"
fi

# -- report.py's verdicts on part 1, from synthetic runs --------------------------------------
# t1: the peer's runs spread 2.0x (inconclusive); the baseline ISA 3.5x slower with
# isa= fields (met); t2: a steady peer, the ratio stated.
mkdir -p "$tmp/synthetic"
cat >"$tmp/synthetic/runs.txt" <<'EOF'
RUN train.foreman.t1.samples_per_s 35000 samples/s isa=avx512
RUN train.torch.t1.samples_per_s 10000 samples/s
RUN train.foreman_baseline_isa.t1.samples_per_s 10000 samples/s isa=baseline
RUN train.foreman.t2.samples_per_s 40000 samples/s isa=avx512
RUN train.torch.t2.samples_per_s 20000 samples/s
RUN train.foreman.t1.samples_per_s 35000 samples/s isa=avx512
RUN train.torch.t1.samples_per_s 20000 samples/s
RUN train.foreman_baseline_isa.t1.samples_per_s 10000 samples/s isa=baseline
RUN train.foreman.t2.samples_per_s 40000 samples/s isa=avx512
RUN train.torch.t2.samples_per_s 21000 samples/s
RUN train.foreman.b1024.t1.samples_per_s 50000 samples/s isa=avx512
RUN train.foreman.b1024.t2.samples_per_s 90000 samples/s isa=avx512
RUN train.foreman.b1024.t1.samples_per_s 50000 samples/s isa=avx512
RUN train.foreman.b1024.t2.samples_per_s 90000 samples/s isa=avx512
EOF
printf 'model: smoke\nisa: avx2 fma avx512f\npin.t1: taskset -c 0\n' >"$tmp/synthetic/machine.txt"
out=$("$python" "$src/report.py" "$tmp/synthetic" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "report.py (synthetic) exited $rc: $out"
has '^\| 1 \| MLP [^|]*, 1 thread \(samples/s\) \| 35000 [^|]*\(isa=avx512\) \|[^|]*spread 2\.00× \| inconclusive \(peer spread 2\.00×\)[^|]*\| ≥ 1\.3× [^|]* \| inconclusive \|$' "$out" ||
  fail "report.py: a peer spread of 2.0x is not inconclusive: $out"
has '^\| 1 \| [^|]*default build vs FOREMAN_MAX_ISA=baseline[^|]*\| [^|]*\(isa=avx512\) \| baseline ISA \(isa=baseline\) [^|]* \| 3\.50× [^|]*\| ≥ 3× baseline ISA \| yes \|$' "$out" ||
  fail "report.py: no baseline ISA row with its isa= fields: $out"
has '^\| 1 \| MLP [^|]*, 2 threads \(samples/s\) \|[^|]*\|[^|]*spread 1\.05× \| 1\.95× ' "$out" ||
  fail "report.py: the 2-thread ratio: $out"
# Issue 27's intra-op scaling: 2 threads against 1 of the same invocation.
has '^\| 1 \| intra-op scaling, batch 128: 2 threads / 1 thread \(samples/s\) \| 40000 [^|]* vs 35000 [^|]*\| PyTorch [^|]*\| 1\.14× [^|]*\| ≥ 1\.4× 1 thread \| \*\*no\*\* \|$' "$out" ||
  fail "report.py: no batch-128 scaling row with its verdict: $out"
has '^\| 1 \| intra-op scaling, batch 1024: 2 threads / 1 thread \(samples/s\) \| 90000 [^|]* vs 50000 [^|]*\| – \| 1\.80× [^|]*\| ≥ 1\.7× 1 thread \| yes \|$' "$out" ||
  fail "report.py: no batch-1024 scaling row with its verdict: $out"
has '^CPU instruction sets: avx2 fma avx512f\.$' "$out" || fail "report.py: no instruction sets: $out"

# Part 6 (cluster_bench.sh's lines): the ratio per pair of runs against the
# one process, its goal, worker 0's network fields; the sync rows (global
# steps/s, stale gradients); the ps-kill recovery row against its goal of
# 2 s + the restore (the median restore: 0.05 s).
mkdir -p "$tmp/cluster"
cat >"$tmp/cluster/runs.txt" <<'EOF'
RUN cluster.single 100000 samples/s steps_per_sec=781 cpu_ms_per_step=1.5
RUN cluster.ps1_w1 40000 samples/s steps_per_sec=312 cpu_ms_per_step=3.5 copied_per_step=3300000 reads=15 read_us=900 fused_reads=985 applies=1000 apply_us=1100 apply_bytes=814120 bytes_in=831013000
RUN cluster.ps1_w2 50000 samples/s steps_per_sec=390 cpu_ms_per_step=4 copied_per_step=3300000 reads=15 read_us=1500 fused_reads=485 applies=500 apply_us=1700 apply_bytes=814120 bytes_in=415506500
RUN cluster.single 110000 samples/s steps_per_sec=859 cpu_ms_per_step=1.4
RUN cluster.ps1_w1 55000 samples/s steps_per_sec=430 cpu_ms_per_step=3.3 copied_per_step=3200000 reads=15 read_us=800 fused_reads=985 applies=1000 apply_us=1000 apply_bytes=814120 bytes_in=831013000
RUN cluster.tcp_roundtrip_us 300 us p10=250 p90=400 request_bytes=814120 answer_bytes=818709 reps=2000
RUN cluster.tcp_roundtrip_us 200 us p10=190 p90=260 request_bytes=814120 answer_bytes=818709 reps=2000
RUN cluster.ps1_w2 60000 samples/s steps_per_sec=469 cpu_ms_per_step=3.9 copied_per_step=3200000 reads=15 read_us=1400 fused_reads=485 applies=500 apply_us=1600 apply_bytes=814120 bytes_in=415506500
RUN cluster.ps1_w2_sync 30000 samples/s steps_per_sec=117 cpu_ms_per_step=8 stale=0 copied_per_step=3300000 reads=15 read_us=900 fused_reads=985 applies=1000 apply_us=3000 apply_bytes=814120 bytes_in=831013000
RUN cluster.ps1_w2_sync 40000 samples/s steps_per_sec=156 cpu_ms_per_step=7 stale=2 copied_per_step=3200000 reads=15 read_us=800 fused_reads=985 applies=1000 apply_us=2000 apply_bytes=814120 bytes_in=831013000
RUN cluster.ps_kill_recovery_s 0.7 s recovered_s=0.66 restarted_s=0.5 reachable_s=0.64 restore_s=0.02 steps_lost=110
RUN cluster.ps_kill_recovery_s 2.1 s recovered_s=2 restarted_s=0.5 reachable_s=1.9 restore_s=0.05 steps_lost=unknown
RUN cluster.ps_kill_recovery_s 2.2 s recovered_s=2.1 restarted_s=0.5 reachable_s=2 restore_s=0.1 steps_lost=100
EOF
out=$("$python" "$src/report.py" "$tmp/cluster" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "report.py (cluster) exited $rc: $out"
has '^\| 6 \| training throughput, 1 ps \+ 1 worker \(async\)[^|]*\| 47500 [^|]*\| one process 105000 [^|]*\| 0\.45× \[0\.40–0\.50\] \| ≥ 0\.85× one process \| \*\*no\*\* \|$' "$out" ||
  fail "report.py: no 1 ps + 1 worker row with its ratio and verdict: $out"
has '^\| 6 \|   worker 0.s network per step: round trips; apply \(µs\) \| 1\.0[0-9]* \[[^]]*\]; 1050 \[1000–1100\] ' "$out" ||
  fail "report.py: no network row: $out"
has '^\| 6 \|   the floor: the same bytes. round trip over plain loopback TCP, no CAF, no apply \(µs\) \| 250 \[200–300\] ' "$out" ||
  fail "report.py: no TCP floor row: $out"
has '^\| 6 \|   bytes copied in user space per global step, all processes \(B\) \| [^|]*\| payload [^|]*\| 1\.98× \[1\.95–2\.01\] \| ≤ 2× the payload \| yes \|$' "$out" ||
  fail "report.py: no bytes-copied row with its verdict: $out"
has '^\| 6 \|   CPU time of all its processes per global step \(ms\) \| [^|]*\| one process [^|]*\| 2\.35× \[2\.33–2\.36\] \| ≤ 1\.3× one process \| \*\*no\*\* \|$' "$out" ||
  fail "report.py: no CPU-per-step row with its verdict: $out"
has '^\| 6 \| training throughput, 1 ps \+ 2 workers \(sync, --replicas-to-aggregate 2\)[^|]*\| 35000 [^|]*\| one process 105000 [^|]*\| 0\.33× \[0\.30–0\.36\] \|' "$out" ||
  fail "report.py: no sync row with its ratio: $out"
has '^\| 6 \|   global steps/s [^|]*\| 136 \[117–156\] \| stale 1 \[0–2\] \|' "$out" ||
  fail "report.py: no sync global steps/s row: $out"
has '^\| 6 \| ps kill -9 → the chief.s next step[^|]*\| 2100 \[700–2200\] \| ps reachable again 1900 [^|]*; restore 50 \[20–100\]; steps lost 105 \[100–110\] \|  \| ≤ 2 s \+ restore \| \*\*no\*\* \|$' "$out" ||
  fail "report.py: no ps-kill recovery row with its verdict: $out"

# Part 7 (the GPU, issue 15): the rows and verdicts from train_bench's and
# train_torch.py's lines; a SKIP line instead says the figures were not measured.
mkdir -p "$tmp/gpu"
cat >"$tmp/gpu/runs.txt" <<'EOF'
RUN train.foreman.gpu.b128.samples_per_s 900000 samples/s device=/gpu:0
RUN train.torch.cuda.b128.samples_per_s 100000 samples/s device=NVIDIA H200
RUN train.foreman.gpu.main_job_s 1.2 s accuracy=0.8890 steps=7035
RUN train.torch.cuda.main_job_s 7.2 s accuracy=0.8850 steps=7035
RUN train.foreman.gpu.ckpt_stall_s 0.0011 s saves=20 device=/gpu:0
RUN train.foreman.gpu.ckpt_d2h_copy_s 0.001 s copies=20
RUN train.foreman.gpu.ckpt_stall_over_copy 1.1 x
EOF
echo "model: smoke" >"$tmp/gpu/machine.txt"
out=$("$python" "$src/report.py" "$tmp/gpu" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "report.py (gpu) exited $rc: $out"
has '^\| 7 \| MLP on /gpu:0, batch 128[^|]*\| 900000 [^|]*\| PyTorch eager \(CUDA\) 100000 [^|]*\| 9\.00× [^|]*\| ≥ 1 M samples/s \| \*\*no\*\* \|$' "$out" ||
  fail "report.py: no GPU batch-128 row with its verdict: $out"
has '^\| 7 \| main job on the GPU[^|]*test accuracy 0\.8890 \| 1\.2 [^|]*\| PyTorch eager \(CUDA\) 7\.2 [^|]*accuracy 0\.8850 \| 6\.00× [^|]* faster \| [^|]* \| yes \|$' "$out" ||
  fail "report.py: no GPU main-job row: $out"
has '^\| 7 \| training-loop stall per checkpoint[^|]*\| 1\.1 m [^|]*\| copy 1 m [^|]*\| 1\.10× [^|]*\| ≤ 1\.2× the copy \| yes \|$' "$out" ||
  fail "report.py: no GPU checkpoint-stall row: $out"
echo "SKIP gpu no usable CUDA device: cudaErrorNoDevice" >"$tmp/gpu/runs.txt"
out=$("$python" "$src/report.py" "$tmp/gpu" 2>&1)
has '^\| 7 \| GPU \| not measured: no usable CUDA device: cudaErrorNoDevice \|' "$out" || fail "report.py: a skipped GPU part: $out"

# -- tools/scripts/gpu-check.sh and gpu-bundle.sh (issue 15) without a GPU -----------------
# The check says so in one line and exits 77 within seconds, from the build
# tree and from a bundle (programs and their libraries, no data) run with
# nothing but the bundle's libraries.
build=$(cd "$(dirname "$train")/../.." && pwd)
scripts=$src/../scripts
if devices=$(timeout 60 "$build/tools/foreman" devices 2>&1) && has '^no CUDA devices' "$devices"; then
  SECONDS=0
  out=$(timeout 60 "$scripts/gpu-check.sh" --build-dir "$build" --out "$tmp/gpucheck" 2>&1)
  rc=$?
  [[ $rc -eq 77 ]] && has '^gpu-check: SKIP: no usable GPU \(no CUDA devices: .+\); nothing else was run$' "$out" ||
    fail "gpu-check.sh without a GPU: rc $rc: $out"
  ((SECONDS < 20)) || fail "gpu-check.sh without a GPU took ${SECONDS} s"
  grep -q '^gpu-check: SKIP: no usable GPU' "$tmp/gpucheck/summary.txt" || fail "gpu-check.sh: no summary.txt"
  out=$(timeout 120 "$scripts/gpu-bundle.sh" --build-dir "$build" --out "$tmp/bundle" --no-build --no-data 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "gpu-bundle.sh exited $rc: $out"
  for f in gpu-check.sh tests.txt BUILD.txt bin/foreman bin/train_bench bin/kernel_bench bin/tcp_roundtrip bin/gpu_selftest \
           libexec/foreman \
           tools/bench/run.sh tools/bench/cluster_bench.sh tools/bench/report.py tools/bench/train_torch.py; do
    [[ -e $tmp/bundle/$f ]] || fail "gpu-bundle.sh: no $f in the bundle: $(ls -R "$tmp/bundle" | head -50)"
  done
  has '^size: [0-9.]+ MiB$' "$(cat "$tmp/bundle/BUILD.txt")" || fail "gpu-bundle.sh: no size in BUILD.txt: $(cat "$tmp/bundle/BUILD.txt")"
  # bin/'s programs find the bundle's libraries wherever it is, from any
  # directory, with LD_LIBRARY_PATH unset.
  mv "$tmp/bundle" "$tmp/bundle-moved"
  out=$(cd / && env -u LD_LIBRARY_PATH "$tmp/bundle-moved/bin/foreman" --version 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] && has '^foreman [0-9]' "$out" || fail "the moved bundle's bin/foreman --version: rc $rc: $out"
  # The bundle's lib/ comes before the caller's LD_LIBRARY_PATH (here a
  # folder whose libforeman is not a library at all).
  mkdir -p "$tmp/badlibs" && : >"$tmp/badlibs/$(basename "$(ls "$tmp/bundle-moved/lib/"libforeman.so.* | head -1)")"
  out=$(cd / && LD_LIBRARY_PATH=$tmp/badlibs "$tmp/bundle-moved/bin/foreman" --version 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] && has '^foreman [0-9]' "$out" || fail "the bundle's bin/foreman with another LD_LIBRARY_PATH: rc $rc: $out"
  mv "$tmp/bundle-moved" "$tmp/bundle"
  # Over the 64 MiB that travel to the GPU machine: refused, saying the size.
  mkdir -p "$tmp/bigdata"
  for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    : >"$tmp/bigdata/$f"
  done
  head -c $((70 * 1024 * 1024)) /dev/zero >"$tmp/bigdata/train-images-idx3-ubyte.gz"
  out=$(timeout 120 "$scripts/gpu-bundle.sh" --build-dir "$build" --out "$tmp/bigbundle" --no-build --data "$tmp/bigdata" 2>&1)
  rc=$?
  [[ $rc -eq 1 ]] && has 'is [0-9.]+ MiB: over the 64 MiB that travels to the GPU machine' "$out" ||
    fail "gpu-bundle.sh with 70 MiB of data: rc $rc: $out"
  rm -rf "$tmp/bigdata" "$tmp/bigbundle"
  out=$(timeout 30 "$scripts/gpu-bundle.sh" --out 2>&1)
  rc=$?
  [[ $rc -eq 2 ]] && has '^gpu-bundle.sh: --out wants a value' "$out" || fail "gpu-bundle.sh --out: rc $rc: $out"
  compgen -G "$tmp/bundle/lib/libforeman.so.*" >/dev/null || fail "gpu-bundle.sh: no libforeman in lib/: $(ls "$tmp/bundle/lib")"
  if [[ -e $build/src/libforeman_cuda.so ]]; then  # the CUDA plug-in and the runtime it needs
    [[ -e $tmp/bundle/lib/libforeman_cuda.so ]] && compgen -G "$tmp/bundle/lib/libcudart.so.*" >/dev/null ||
      fail "gpu-bundle.sh: no libforeman_cuda.so or libcudart in lib/: $(ls "$tmp/bundle/lib")"
  fi
  system_libs=$(ls "$tmp/bundle/lib" | grep -E '^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda)\.so' || true)
  [[ -z $system_libs ]] || fail "gpu-bundle.sh copied system libraries: $system_libs"
  grep -q $'^gpu_selftest\tgpu_selftest' "$tmp/bundle/tests.txt" || fail "gpu-bundle.sh: tests.txt: $(cat "$tmp/bundle/tests.txt")"
  out=$(cd "$tmp" && timeout 60 env -u LD_LIBRARY_PATH "$tmp/bundle/gpu-check.sh" --out "$tmp/gpucheck2" 2>&1)
  rc=$?
  [[ $rc -eq 77 ]] && has '^gpu-check: SKIP: no usable GPU \(no CUDA devices: ' "$out" ||
    fail "the bundle's gpu-check.sh without a GPU: rc $rc: $out"
  # Issue 29: with --cpu-threads the CPU rows run without a GPU too (run.sh
  # --parts 1 from the bundle's tools/bench on its bin/), one summary line
  # per figure and a last SKIP line; a budget too small for a step fails it
  # as out of time; bad usage is refused before anything runs.
  if [[ -f $data/train-images-idx3-ubyte.gz ]]; then
    # From another directory, with --data relative to it (run.sh runs in
    # its own): the CPU rows and the cluster rows of 1 ps + 1 worker.
    ln -s "$data" "$tmp/fm"
    out=$(cd "$tmp" && timeout 240 env -u LD_LIBRARY_PATH "$tmp/bundle/gpu-check.sh" --out "$tmp/gpucheck3" \
            --data fm --cpu-threads 1 --cluster --workers 1 --budget-s 200 --python "$python" 2>&1)
    rc=$?
    [[ $rc -eq 77 ]] && has '^gpu-check: CPU, 1 thread\(s\), batch 128: Foreman [0-9.]+ samples/s, PyTorch not measured \(no --with-torch\)$' "$out" &&
      has '^gpu-check: CPU, 1 thread\(s\), batch 1024: Foreman [0-9.]+ samples/s' "$out" &&
      has '^gpu-check: cluster.single: [0-9.]+ samples/s, CPU [0-9.]+ ms per global step$' "$out" &&
      has '^gpu-check: cluster.ps1_w1: [0-9.]+ samples/s \([0-9.]+x one process\), CPU [0-9.]+ ms per global step$' "$out" &&
      has '^gpu-check: SKIP: no usable GPU; the CPU rows asked for passed in [0-9]+ s' "$out" ||
      fail "the bundle's gpu-check.sh --cpu-threads 1 without a GPU: rc $rc: $out"
    # --workers 1 reaches cluster_bench.sh: no cluster of 2 workers ran.
    ! has '^gpu-check: cluster\.ps1_w2' "$out" && ! grep -q 'cluster\.ps1_w2' "$tmp/gpucheck3/cluster/runs.txt" 2>/dev/null ||
      fail "gpu-check.sh --workers 1 ran a cluster of 2 workers (run.sh or gpu-check.sh dropped --workers): $out"
    [[ -s $tmp/gpucheck3/cpu-threads/table.md ]] || fail "gpu-check.sh --cpu-threads 1: no table.md: $(ls -R "$tmp/gpucheck3")"
  fi
  out=$(timeout 60 "$scripts/gpu-check.sh" --build-dir "$build" --out "$tmp/gpucheck4" --cpu-threads 1 --budget-s 10 2>&1)
  rc=$?
  [[ $rc -eq 1 ]] && has '^gpu-check: FAIL: CPU thread scaling: out of time \(needs at least 30 s, [0-9]+ s of the 10 s budget left\)$' "$out" &&
    has '^gpu-check: FAIL: 1 check\(s\) failed' "$out" || fail "gpu-check.sh --budget-s 10 --cpu-threads 1: rc $rc: $out"
  for bad in "--budget-s 0" "--cpu-threads 1,,2" "--workers x" "--workers 2" "--out" "--bogus" "--data /nonexistent" \
             "--with-torch --python /bin/false"; do
    # shellcheck disable=SC2086
    out=$(timeout 30 "$scripts/gpu-check.sh" --build-dir "$build" $bad 2>&1)
    rc=$?
    [[ $rc -eq 2 ]] && has '^gpu-check.sh: ' "$out" || fail "gpu-check.sh $bad: rc $rc: $out"
  done
  mkdir -p "$tmp/notabundle"
  out=$(timeout 60 "$scripts/gpu-bundle.sh" --build-dir "$build" --out "$tmp/notabundle" --no-build --no-data 2>&1)
  rc=$?
  [[ $rc -eq 1 ]] && has 'is not a bundle' "$out" || fail "gpu-bundle.sh replaced a folder that is not a bundle: rc $rc: $out"
else
  echo "note: a CUDA device is visible: gpu-check.sh's no-GPU behaviour is not checked here (run it)"
fi

# -- gpu-check.sh's GPU path, with fake programs -------------------------------------------------
# A bundle whose foreman reports one CUDA device and prints what the real
# one prints (docs/train.md's report lines), whose train_bench prints RUN
# lines, and whose suite has one passing and one skipped program: every
# figure gets its line and the check passes. Then a main job that hangs:
# the budget stops it, the steps after it fail as out of time, and the whole
# check ends within its budget.
fake=$tmp/fakegpu
mkdir -p "$fake/bin" "$fake/data" "$fake/tools/bench"
cp "$src/../scripts/gpu-check.sh" "$fake/"
printf 'fake_ok\tfake_ok\t--flag\n' >"$fake/tests.txt"
printf '#!/bin/sh\n[ "$1" = --flag ] || exit 3\necho ok\n' >"$fake/bin/fake_ok"
printf '#!/bin/sh\nexit 77\n' >"$fake/bin/fake_skip"
cat >"$fake/bin/foreman" <<'EOF'
#!/bin/sh
case $1 in
  devices)
    echo "/cpu:0: avx2 kernels (FOREMAN_MAX_ISA=baseline|avx2|avx512 caps them)"
    echo "1 CUDA device(s)"
    echo "  0: Fake H200, compute capability 9.0, 143000 MiB, 132 SMs" ;;
  train)
    last=7035 device=
    while [ $# -gt 0 ]; do
      [ "$1" = --max-steps ] && last=$2
      [ "$1" = --device ] && device=$2
      shift
    done
    echo "$device $last" >>"$FAKE_LOG"
    [ -n "${FAKE_MAIN_JOB_HANGS:-}" ] && [ "$last" = 7035 ] && exec sleep 300.0417
    [ -n "${FAKE_FAIL_DEVICE:-}" ] && [ "$device" = "$FAKE_FAIL_DEVICE" ] && { echo "cannot use --device $device" >&2; exit 2; }
    echo "test accuracy: ${FAKE_ACCURACY:-0.8890} (test loss 0.3100, 10000 examples, global_step $last)"
    echo "trained $last steps in 1.2 s (5862.5 steps/s, 750400 examples/s)" ;;
  *) exit 2 ;;
esac
EOF
cat >"$fake/bin/train_bench" <<'EOF'
#!/bin/sh
echo "RUN train.foreman.gpu.b128.samples_per_s 1.25e+06 samples/s device=/gpu:0"
echo "RUN train.foreman.gpu.b1024.samples_per_s 8e+06 samples/s device=/gpu:0"
echo "RUN train.foreman.gpu.b8192.samples_per_s 3e+07 samples/s device=/gpu:0"
echo "RUN train.foreman.gpu.ckpt_stall_s 0.0011 s saves=20 device=/gpu:0"
echo "RUN train.foreman.gpu.ckpt_d2h_copy_s 0.001 s copies=20"
echo "RUN train.foreman.gpu.ckpt_stall_over_copy 1.1 x"
EOF
cat >"$fake/bin/kernel_bench" <<'EOF'
#!/bin/sh
echo "RUN kernel.gemm.fwd0.b128 9.50 us baseline=14.25 ratio=1.50x"
echo "RUN kernel.xent_stats.b8192 2.00 us baseline=40.00 ratio=20.00x"
EOF
chmod +x "$fake"/bin/*
export FAKE_LOG=$tmp/fake.devices
: >"$FAKE_LOG"
out=$(cd "$tmp" && timeout 60 "$fake/gpu-check.sh" --out "$tmp/fakecheck" 2>&1)
rc=$?
[[ $(tr '\n' ' ' <"$FAKE_LOG") == "gpu:0 7035 gpu:0 200 cpu 400 gpu:0 600 " ]] ||
  fail "gpu-check.sh ran foreman train with these --device and --max-steps: $(cat "$FAKE_LOG")"
[[ $rc -eq 0 ]] &&
  has '^gpu-check: devices: 0: Fake H200, compute capability 9.0' "$out" &&
  has '^gpu-check: gpu suite: 1 passed \(fake_ok [0-9.]+s\), 0 skipped \(none\), 0 failed$' "$out" &&
  has '^gpu-check: main job: 7035 steps in 1.2 s training time, test accuracy 0.8890 \(target <= 1.5 s and >= 0.88: met\)$' "$out" &&
  has '^gpu-check: checkpoints moved: GPU to step 200, resumed on the CPU to 400, back on the GPU to 600: ok$' "$out" &&
  has '^gpu-check: samples/s at batch 128: Foreman 1.25e\+06, PyTorch eager not measured \(no --with-torch\) \(-\); target >= 1 M: met$' "$out" &&
  has '^gpu-check: samples/s at batch 8192: Foreman 3e\+07, ' "$out" &&
  has '^gpu-check: checkpoint stall: 0.0011 s per save vs the device->host copy 0.001 s = 1.1x \(target <= 1.2x: met\)$' "$out" &&
  has '^gpu-check: kernel gemm.fwd0.b128: 9.50 us per operation, before 14.25 us \(1.50x faster\)$' "$out" &&
  has '^gpu-check: kernel xent_stats.b8192: 2.00 us per operation, before 40.00 us \(20.00x faster\)$' "$out" &&
  has '^gpu-check: PASS: every check passed in [0-9]+ s of a 360 s budget' "$out" ||
  fail "gpu-check.sh with a fake GPU: rc $rc: $out"
[[ $(tail -1 "$tmp/fakecheck/summary.txt") == "gpu-check: PASS"* ]] || fail "gpu-check.sh: summary.txt's last line: $(tail -1 "$tmp/fakecheck/summary.txt")"
# Each failure fails the check, in its line and in summary.txt: a gpu test
# that fails and one that skips although a GPU is listed, a low accuracy, a
# leg of the moved run that fails, and a `foreman devices` that crashes.
printf 'fake_ok\tfake_ok\t--flag\nfake_skip\tfake_skip\t\nfake_fail\tfake_fail\t\n' >"$fake/tests.txt"
printf '#!/bin/sh\nexit 1\n' >"$fake/bin/fake_fail" && chmod +x "$fake/bin/fake_fail"
out=$(cd "$tmp" && FAKE_ACCURACY=0.5000 FAKE_FAIL_DEVICE=cpu timeout 60 "$fake/gpu-check.sh" --out "$tmp/fakecheck4" 2>&1)
rc=$?
[[ $rc -eq 1 ]] &&
  has '^gpu-check: FAIL: gpu suite: fake_fail \(exit 1, ' "$out" &&
  has '^gpu-check: FAIL: gpu suite: fake_skip skipped although foreman devices lists a GPU$' "$out" &&
  has '^gpu-check: FAIL: main job: test accuracy 0.5000 < 0.88$' "$out" &&
  has '^gpu-check: FAIL: checkpoints moved: the leg on cpu to step 400 exited 2 ' "$out" &&
  has '^gpu-check: FAIL: 4 check\(s\) failed' "$out" || fail "gpu-check.sh with failing steps: rc $rc: $out"
[[ $(grep -c '^gpu-check: FAIL: ' "$tmp/fakecheck4/summary.txt") -eq 5 ]] || fail "gpu-check.sh: summary.txt's FAIL lines: $(cat "$tmp/fakecheck4/summary.txt")"
printf 'fake_ok\tfake_ok\t--flag\n' >"$fake/tests.txt"
cp "$fake/bin/foreman" "$fake/foreman.good"
printf '#!/bin/sh\nkill -BUS $$\n' >"$fake/bin/foreman"
out=$(cd "$tmp" && timeout 60 "$fake/gpu-check.sh" --out "$tmp/fakecheck5" 2>&1)
rc=$?
[[ $rc -eq 1 ]] && has '^gpu-check: FAIL: foreman devices exited 135' "$out" ||
  fail "gpu-check.sh with a foreman devices that crashes: rc $rc: $out"
cp "$fake/foreman.good" "$fake/bin/foreman"
SECONDS=0
out=$(cd "$tmp" && FAKE_MAIN_JOB_HANGS=1 timeout 60 "$fake/gpu-check.sh" --out "$tmp/fakecheck2" --budget-s 22 2>&1)
rc=$?
took=$SECONDS
[[ $rc -eq 1 ]] &&
  has '^gpu-check: FAIL: main job: stopped after (1[7-9]|20) s \(its cap or the budget.s end\)$' "$out" &&
  has '^gpu-check: FAIL: checkpoints moved \(leg on gpu:0\): out of time \(needs at least 10 s, [0-9] s of the 22 s budget left\)$' "$out" &&
  has '^gpu-check: FAIL: train_bench --device gpu:0: out of time' "$out" &&
  has '^gpu-check: FAIL: kernel_bench --device gpu:0: out of time' "$out" &&
  has '^gpu-check: FAIL: 4 check\(s\) failed in (1[89]|2[0-2]) s of a 22 s budget' "$out" ||
  fail "gpu-check.sh with a main job that hangs: rc $rc: $out"
((took <= 30)) || fail "gpu-check.sh --budget-s 22 took ${took} s"
pgrep -f "^sleep 300.0417$" >/dev/null && { fail "gpu-check.sh left the hung main job's process running"; pkill -f "^sleep 300.0417$"; }
# SIGTERM to the check (a lent machine's time running out) stops the step
# it is in, writes a last FAIL line and exits 1 at once.
(cd "$tmp" && FAKE_MAIN_JOB_HANGS=1 exec "$fake/gpu-check.sh" --out "$tmp/fakecheck3" >"$tmp/fakecheck3.out" 2>&1) &
check_pid=$!
for _ in $(seq 100); do grep -q '^gpu-check: checkpoints moved\|^gpu-check: gpu suite' "$tmp/fakecheck3.out" 2>/dev/null && break; sleep 0.1; done
sleep 0.5
SECONDS=0
kill -TERM "$check_pid"
wait "$check_pid"
rc=$?
((SECONDS <= 10)) || fail "gpu-check.sh took ${SECONDS} s to stop after SIGTERM"
[[ $rc -eq 1 ]] && has '^gpu-check: FAIL: stopped by a signal after [0-9]+ s' "$(cat "$tmp/fakecheck3.out")" ||
  fail "gpu-check.sh after SIGTERM: rc $rc: $(cat "$tmp/fakecheck3.out")"
pgrep -f "^sleep 300.0417$" >/dev/null && { fail "gpu-check.sh left the main job running after SIGTERM"; pkill -f "^sleep 300.0417$"; }

# run.sh refuses a bad --threads before it installs, builds or runs anything.
out=$(timeout 30 "$src/run.sh" --threads 1,x --no-install --out "$tmp/never" 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "^run.sh: --threads wants thread counts" "$out" || fail "run.sh --threads 1,x: rc $rc: $out"
[[ ! -e $tmp/never ]] || fail "run.sh --threads 1,x created its results directory"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "bench smoke OK"
