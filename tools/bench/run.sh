#!/usr/bin/env bash
# Runs every benchmark of issue 6 and prints the table (docs/benchmarks.md).
#
# Usage: tools/bench/run.sh [--quick] [--max-state-mb N] [--reps N] [--no-install] [--no-torch]
#                           [--build-dir DIR | --bin-dir DIR] [--out DIR] [--data DIR]
#                           [--parts 1,2,3,4,5] [--threads 1,2] [--python PATH]
#   --quick          fewer and shorter runs (a few minutes), states of 10 and 100 MB
#   --max-state-mb   largest checkpoint state (default 1000: states of 10, 100, 1000 MB;
#                    1000 needs about 4 GB of memory and 6 GB of disk)
#   --reps           runs per figure (default 7; --quick 3)
#   --no-install     do not install the peers' packages; PyTorch parts are skipped
#                    when python3-torch is missing
#   --no-torch       run no PyTorch side at all (nothing installed for it), even
#                    where torch is there: Foreman's rows alone, quicker
#   --build-dir      a configured release build to use (default build-release,
#                    built with tools/scripts/build.sh release when missing)
#   --bin-dir        benchmark programs built elsewhere (e.g. a bundle copied to a
#                    machine without the build's dependencies): nothing is built
#   --out            where the raw results and table.md go (default a new
#                    directory under ${TMPDIR:-/tmp})
#   --data           Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
#   --parts          which parts to run (default all: 1,2,3,4,5 of issue 6,
#                    6, issue 13's cluster throughput and ps-kill recovery:
#                    tools/bench/cluster_bench.sh, and 7, issue 15's GPU: samples/s
#                    at batch 128/1024/8192, the main job with --device gpu:0,
#                    the checkpoint stall; PyTorch eager on CUDA beside it;
#                    skipped with one line when no GPU can be used)
#   --threads        part 1's thread counts (default 1,2; e.g. 1,8,16 on a 16-core machine)
#   --workers        part 6's cluster sizes, 1 ps + N workers each (default 1,2; e.g.
#                    1,2,4,8 on a 16-core machine: each task pinned to its own core)
#   --python         the peer's Python with torch (default /usr/bin/python3, Debian's)
#
# Installs what only the benchmarks need (python3-torch, libopenblas0-pthread),
# as root or via sudo; CI and the README's set-up do not. Part 1 pins both
# sides alike: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS = n,
# torch.set_num_threads(n) = Foreman's intra-op threads, and the process to n
# cores with taskset (one logical CPU per physical core first); the runs
# alternate (Foreman tn, PyTorch tn, and at 1 thread Foreman with
# FOREMAN_MAX_ISA=baseline). machine.txt records the CPU's model and
# instruction sets, peer.t<n>.txt what the peer ran (version, BLAS, oneDNN).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

quick=0
max_state_mb=1000
reps=
install=1
no_torch=0
build_dir=build-release
out=
data=/usr/share/datasets/fashion-mnist
parts=1,2,3,4,5,6,7
threads_csv=1,2
workers_csv=1,2
bin_dir=
python=/usr/bin/python3
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --max-state-mb) max_state_mb=$2; shift ;;
    --reps) reps=$2; shift ;;
    --no-install) install=0 ;;
    --no-torch) no_torch=1; install=0 ;;
    --build-dir) build_dir=$2; shift ;;
    --out) out=$2; shift ;;
    --data) data=$2; shift ;;
    --parts) parts=$2; shift ;;
    --threads) threads_csv=$2; shift ;;
    --workers) workers_csv=$2; shift ;;
    --bin-dir) bin_dir=$2; shift ;;
    --python) python=$2; shift ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/!p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $reps ]]; then reps=$((quick ? 3 : 7)); fi
IFS=, read -ra thread_counts <<<"$threads_csv"
for t in "${thread_counts[@]}"; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --threads wants thread counts >= 1 separated by commas, not '$threads_csv'" >&2; exit 2; }
done
if ((quick)); then
  train_steps=100; train_warmup=20; gb_min_time=0.1; recovery_reps=$reps
else
  train_steps=400; train_warmup=50; gb_min_time=0.5; recovery_reps=$reps
fi
sizes=()
for mb in 10 100 1000; do
  if ((mb <= max_state_mb)) && ! ((quick && mb > 100)); then sizes+=("$mb"); fi
done
sizes_csv=$(IFS=,; echo "${sizes[*]:-}")

log() { echo "run.sh: $*" >&2; }
part() { [[ ,$parts, == *,$1,* ]]; }

# -- the peers' packages ------------------------------------------------------------
peer_packages=(python3-torch libopenblas0-pthread)
missing=()
for p in "${peer_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})) && ((install)); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { log "not root and no sudo; install ${missing[*]} by hand or pass --no-install"; exit 1; }
    sudo_cmd=(sudo)
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
have_torch=0
if ((no_torch)); then log "--no-torch: PyTorch's runs are skipped"
elif "$python" -c 'import torch' 2>/dev/null; then have_torch=1
else log "PyTorch not available: its runs are skipped"; fi

# -- the build ------------------------------------------------------------------------
bench_targets=(tools/bench/overhead_bench tools/bench/summary_bench tools/bench/checkpoint_bench
               tools/bench/train_bench tools/bench/recovery_bench tools/bench/tcp_roundtrip tools/foreman)
if [[ -n $bin_dir ]]; then
  bin=$(cd "$bin_dir" && pwd)
  build_dir=$bin
else
  if [[ ! -f $build_dir/build.ninja ]]; then
    [[ $build_dir == build-release ]] || { log "$build_dir is not a configured build directory"; exit 1; }
    tools/scripts/build.sh release
  fi
  ninja -C "$build_dir" "${bench_targets[@]}" >&2
  bin=$root/$build_dir/tools/bench
  [[ $build_dir = /* ]] && bin=$build_dir/tools/bench
fi

# -- pinning: the same cores and thread variables for both sides ------------------------------
# Allowed CPUs, one logical CPU per physical core first (then their siblings).
expand_cpus() { local IFS=, r; for r in $1; do if [[ $r == *-* ]]; then seq "${r%-*}" "${r#*-}"; else echo "$r"; fi; done; }
mapfile -t allowed_cpus < <(expand_cpus "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)")
cpu_order=()
if lscpu -p=CPU,CORE,SOCKET >/dev/null 2>&1; then
  declare -A is_allowed=() seen_core=()
  for c in "${allowed_cpus[@]}"; do is_allowed[$c]=1; done
  siblings=()
  while IFS=, read -r cpu core socket; do
    [[ $cpu == \#* || -z ${is_allowed[$cpu]:-} ]] && continue
    key=$socket.${core:-cpu$cpu}
    if [[ -z ${seen_core[$key]:-} ]]; then seen_core[$key]=1; cpu_order+=("$cpu"); else siblings+=("$cpu"); fi
  done < <(lscpu -p=CPU,CORE,SOCKET)
  cpu_order+=("${siblings[@]}")
fi
((${#cpu_order[@]})) || cpu_order=("${allowed_cpus[@]}")
have_taskset=0
command -v taskset >/dev/null && ((${#cpu_order[@]})) && have_taskset=1
pin_cpus() {  # the CPUs for $1 threads, comma-separated
  local n=$1; ((n > ${#cpu_order[@]})) && n=${#cpu_order[@]}
  local IFS=,; echo "${cpu_order[*]:0:n}"
}
pin_desc() {
  if ((!have_taskset)); then echo "not pinned (no taskset or no CPU list)"; return; fi
  local note=""
  (($1 > ${#cpu_order[@]})) && note=", oversubscribed: only ${#cpu_order[@]} CPUs allowed"
  echo "taskset -c $(pin_cpus "$1")$note; OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS = $1; OMP_WAIT_POLICY=PASSIVE"
}
pinned() {  # pinned THREADS CMD...: CMD on those cores with the thread variables set
  local t=$1; shift
  local cmd=(env OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" MKL_NUM_THREADS="$t" OMP_WAIT_POLICY=PASSIVE "$@")
  if ((have_taskset)); then taskset -c "$(pin_cpus "$t")" "${cmd[@]}"; else "${cmd[@]}"; fi
}

# -- where results go -------------------------------------------------------------------
if [[ -z $out ]]; then out=$(mktemp -d "${TMPDIR:-/tmp}/foreman_bench.XXXXXX"); fi
mkdir -p "$out"
runs=$out/runs.txt
: >"$runs"
if [[ -n $bin_dir ]]; then scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench_scratch.XXXXXX")
elif [[ $build_dir = /* ]]; then scratch=$(mktemp -d "$build_dir/bench_scratch.XXXXXX")
else scratch=$(mktemp -d "$root/$build_dir/bench_scratch.XXXXXX"); fi
trap 'rm -rf "$scratch"' EXIT
log "results in $out"

{
  echo "model: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "vendor: $(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "family: $(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "cores: $(nproc)"
  max_mhz=$(lscpu 2>/dev/null | sed -n 's/^CPU max MHz:[[:space:]]*//p' | head -1)
  echo "mhz: ${max_mhz:-$(sed -n 's/^cpu MHz[[:space:]]*: //p' /proc/cpuinfo | head -1)}"
  flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1)
  echo "flags: $flags"
  isa=()
  for f in sse4_2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 \
           avx512_fp16 avx_vnni amx_tile amx_bf16; do
    [[ " $flags " == *" $f "* ]] && isa+=("$f")
  done
  echo "isa: ${isa[*]:-none of sse4_2 avx avx2 fma avx512*}"
  echo "kernel: $(uname -sr)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  [[ -n $bin_dir ]] && echo "build: prebuilt programs in $bin" ||
  echo "build: $build_dir ($(sed -n 's/^buildtype[[:space:]]*=[[:space:]]*//p' "$build_dir/meson-private/cmd_line.txt" 2>/dev/null | head -1))"
  if ((have_torch)); then
    echo "torch: PyTorch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) on $("$python" --version 2>&1)"
    pkg=$(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null || true)
    if [[ -n $pkg && $python == /usr/bin/python3 ]]; then echo "torch_package: Debian python3-torch $pkg"; fi
  fi
  echo "threads: ${thread_counts[*]}"
  for t in "${thread_counts[@]}"; do echo "pin.t$t: $(pin_desc "$t")"; done
  echo "blas: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)"
} >"$out/machine.txt"

# -- 2, 4: Google Benchmark programs ---------------------------------------------------------
gb_args=(--benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true
         --benchmark_min_time="$gb_min_time")
if part 2; then
  log "2. runtime overhead"
  TMPDIR=$scratch "$bin/overhead_bench" "${gb_args[@]}" --benchmark_out="$out/overhead.json" \
    --benchmark_out_format=json >"$out/overhead.txt" 2>"$out/overhead.log"
fi
if part 4; then
  log "4. summaries"
  TMPDIR=$scratch "$bin/summary_bench" "${gb_args[@]}" --benchmark_out="$out/summary.json" \
    --benchmark_out_format=json >"$out/summary.txt" 2>"$out/summary.log"
fi

# -- 3: checkpoints ---------------------------------------------------------------------------
if part 3 && [[ -n $sizes_csv ]]; then
  log "3. checkpoints: states of ${sizes_csv//,/, } MB"
  torch_args=()
  ((have_torch)) && torch_args=(--torch "$python $root/tools/bench/checkpoint_torch.py")
  "$bin/checkpoint_bench" --sizes-mb "$sizes_csv" --reps "$reps" --dir "$scratch" "${torch_args[@]}" \
    2>"$out/checkpoint.log" | tee "$out/checkpoint.txt" | grep '^RESULT' >>"$runs"
fi

# -- 1: training throughput, Foreman and PyTorch alternating ------------------------------------
part 1 && log "1. training throughput ($reps runs per figure, $train_steps steps each, threads ${thread_counts[*]})"
train_args=(--data "$data" --steps "$train_steps" --warmup "$train_warmup")
for ((i = 0; i < reps; ++i)); do
  part 1 || break
  for t in "${thread_counts[@]}"; do
    # Foreman as built (FOREMAN_MAX_ISA unset: the best kernels for this CPU).
    pinned "$t" env -u FOREMAN_MAX_ISA "$bin/train_bench" "${train_args[@]}" --threads "$t" \
      2>>"$out/train.log" | grep '^RUN' >>"$runs"
    if ((have_torch)); then
      # Passive OpenMP waits (for both sides): GNU OpenMP's default spinning,
      # with OpenBLAS's own threads beside it, slows PyTorch at 2 threads down
      # ~3-10x on a shared machine (measured: 2.1k vs 7.2k samples/s).
      info=()
      ((i == 0)) && info=(--info "$out/peer.t$t.txt")
      pinned "$t" "$python" "$root/tools/bench/train_torch.py" "${train_args[@]}" --threads "$t" "${info[@]}" \
        2>>"$out/train.log" | grep '^RUN' >>"$runs"
    fi
    # Batch 1024 (issue 27's intra-op scaling): twice the samples of a batch-128 run.
    pinned "$t" env -u FOREMAN_MAX_ISA "$bin/train_bench" --data "$data" --batch 1024 \
      --steps $(((train_steps + 3) / 4)) --warmup $(((train_warmup + 7) / 8)) --threads "$t" \
      2>>"$out/train.log" | grep '^RUN' >>"$runs"
    if ((have_torch)); then
      pinned "$t" "$python" "$root/tools/bench/train_torch.py" --data "$data" --batch 1024 \
        --steps $(((train_steps + 3) / 4)) --warmup $(((train_warmup + 7) / 8)) --threads "$t" \
        2>>"$out/train.log" | grep '^RUN' >>"$runs"
    fi
    if ((t == 1)); then
      # The same build capped to its baseline kernels (issue 16: default >= 3x
      # baseline). A build without runtime dispatch ignores the variable.
      pinned "$t" env FOREMAN_MAX_ISA=baseline "$bin/train_bench" "${train_args[@]}" --threads "$t" \
        2>>"$out/train.log" | grep '^RUN' | sed 's/^RUN train\.foreman\./RUN train.foreman_baseline_isa./' >>"$runs"
    fi
  done
done

# -- 5: recovery --------------------------------------------------------------------------------
if part 5; then
  log "5. recovery"
  "$bin/recovery_bench" --data "$data" --reps "$recovery_reps" --dir "$scratch" \
    2>"$out/recovery.log" | grep '^RUN' >>"$runs"
fi

# -- 6: cluster (issue 13): one process, 1 ps + 1 worker, 1 ps + 2 workers async and sync; ps-kill recovery
if part 6; then
  log "6. cluster throughput ($reps runs per figure, $((train_steps * 5)) steps each)"
  foreman_bin=$build_dir/tools/foreman
  [[ -n $bin_dir ]] && foreman_bin=$bin/foreman
  floor=()  # the plain-TCP floor under the round trip, where the build has it
  [[ -x $bin/tcp_roundtrip ]] && floor=(--tcp-roundtrip "$bin/tcp_roundtrip")
  TMPDIR=$scratch "$root/tools/bench/cluster_bench.sh" "$foreman_bin" --steps $((train_steps * 5)) --reps "$reps" \
    --recovery-reps "$recovery_reps" --data "$data" --workers "$workers_csv" "${floor[@]}" \
    2>"$out/cluster.log" | grep '^RUN' >>"$runs"
fi

# -- 7: the GPU (issue 15): Foreman's device step and PyTorch eager on CUDA, alternating -----------
if part 7; then
  gpu_rc=0
  gpu_probe=$("$bin/train_bench" --data "$data" --device gpu:0 --batches 1 --steps 1 --warmup 0 --saves 0 \
              2>>"$out/gpu.log") || gpu_rc=$?
  if ((gpu_rc == 77)); then
    why=$(sed -n 's/^SKIP train_bench --device gpu:0: //p' <<<"$gpu_probe" | head -1)
    log "7. GPU: skipped, no usable GPU (${why:-train_bench said nothing})"
    echo "SKIP gpu ${why:-no usable GPU}" >>"$runs"
  elif ((gpu_rc != 0)); then
    log "7. GPU: train_bench --device gpu:0 failed (exit $gpu_rc; $out/gpu.log)"; exit 1
  else
    foreman_bin=$build_dir/tools/foreman
    [[ -n $bin_dir ]] && foreman_bin=$bin/foreman
    gpu_reps=$reps; ((quick)) && gpu_reps=1
    log "7. GPU ($gpu_reps runs per figure, $train_steps steps per batch size; the main job $gpu_reps time(s))"
    for ((i = 0; i < gpu_reps; ++i)); do
      "$bin/train_bench" --data "$data" --device gpu:0 --batches 128,1024,8192 --steps "$train_steps" \
        --warmup "$train_warmup" 2>>"$out/gpu.log" | grep '^RUN' >>"$runs"
      if ((have_torch)); then
        for b in 128 1024 8192; do
          "$python" "$root/tools/bench/train_torch.py" --data "$data" --threads 1 --device cuda --batch "$b" \
            --steps "$train_steps" --warmup "$train_warmup" 2>>"$out/gpu.log" | grep '^RUN' >>"$runs" || true
        done
      fi
      # The main job as a user runs it (docs/train.md's training time: the
      # "trained N steps in T s" line), in a fresh directory each time.
      job_out=$("$foreman_bin" train --device gpu:0 --data-dir "$data" --checkpoint-dir "$scratch/gpu-main.$i" \
                2>>"$out/gpu.log") || { log "7. GPU: foreman train --device gpu:0 failed ($out/gpu.log)"; exit 1; }
      echo "$job_out" >>"$out/gpu.log"
      secs=$(sed -n 's/^trained \([0-9]*\) steps in \([0-9.]*\) s .*/\2/p' <<<"$job_out")
      steps=$(sed -n 's/^trained \([0-9]*\) steps in .*/\1/p' <<<"$job_out")
      acc=$(sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' <<<"$job_out")
      echo "RUN train.foreman.gpu.main_job_s ${secs:-nan} s accuracy=${acc:-?} steps=${steps:-?}" >>"$runs"
      rm -rf "$scratch/gpu-main.$i"
      if ((have_torch)); then
        "$python" "$root/tools/bench/train_torch.py" --data "$data" --threads 1 --device cuda --epochs 15 \
          2>>"$out/gpu.log" | grep '^RUN' >>"$runs" || true
      fi
    done
    "$bin/train_bench" --data "$data" --device gpu:0 --batches 128 --steps 1 --warmup 100 --save-every 50 --saves 20 \
      2>>"$out/gpu.log" | grep '^RUN train.foreman.gpu.ckpt' >>"$runs"
  fi
fi

"$python" "$root/tools/bench/report.py" "$out" | tee "$out/table.md"
log "raw results and table.md in $out"
