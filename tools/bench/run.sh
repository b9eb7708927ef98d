#!/usr/bin/env bash
# Runs every benchmark of issue 6 and prints the table (docs/benchmarks.md).
#
# Usage: tools/bench/run.sh [--quick] [--max-state-mb N] [--reps N] [--no-install]
#                           [--build-dir DIR] [--out DIR] [--data DIR] [--parts 1,2,3,4,5]
#   --quick          fewer and shorter runs (a few minutes), states of 10 and 100 MB
#   --max-state-mb   largest checkpoint state (default 1000: states of 10, 100, 1000 MB;
#                    1000 needs about 4 GB of memory and 6 GB of disk)
#   --reps           runs per figure (default 7; --quick 3)
#   --no-install     do not install the peers' packages; PyTorch parts are skipped
#                    when python3-torch is missing
#   --build-dir      a configured release build to use (default build-release,
#                    built with tools/scripts/build.sh release when missing)
#   --out            where the raw results and table.md go (default a new
#                    directory under ${TMPDIR:-/tmp})
#   --data           Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
#   --parts          which of the issue's parts to run (default all: 1,2,3,4,5)
#
# Installs what only the benchmarks need (python3-torch, libopenblas0-pthread),
# as root or via sudo; CI and the README's set-up do not. PyTorch runs on
# Debian's /usr/bin/python3 with as many threads as Foreman's run it is paired
# with; Foreman's and PyTorch's runs alternate.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

quick=0
max_state_mb=1000
reps=
install=1
build_dir=build-release
out=
data=/usr/share/datasets/fashion-mnist
parts=1,2,3,4,5
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --max-state-mb) max_state_mb=$2; shift ;;
    --reps) reps=$2; shift ;;
    --no-install) install=0 ;;
    --build-dir) build_dir=$2; shift ;;
    --out) out=$2; shift ;;
    --data) data=$2; shift ;;
    --parts) parts=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $reps ]]; then reps=$((quick ? 3 : 7)); fi
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
python=/usr/bin/python3
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
if "$python" -c 'import torch' 2>/dev/null; then have_torch=1; else log "PyTorch not available: its runs are skipped"; fi

# -- the build ------------------------------------------------------------------------
bench_targets=(tools/bench/overhead_bench tools/bench/summary_bench tools/bench/checkpoint_bench
               tools/bench/train_bench tools/bench/recovery_bench)
if [[ ! -f $build_dir/build.ninja ]]; then
  [[ $build_dir == build-release ]] || { log "$build_dir is not a configured build directory"; exit 1; }
  tools/scripts/build.sh release
fi
ninja -C "$build_dir" "${bench_targets[@]}" >&2
bin=$root/$build_dir/tools/bench
[[ $build_dir = /* ]] && bin=$build_dir/tools/bench

# -- where results go -------------------------------------------------------------------
if [[ -z $out ]]; then out=$(mktemp -d "${TMPDIR:-/tmp}/foreman_bench.XXXXXX"); fi
mkdir -p "$out"
runs=$out/runs.txt
: >"$runs"
scratch=$(mktemp -d "$root/$build_dir/bench_scratch.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
log "results in $out"

{
  echo "model: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "vendor: $(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "family: $(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "cores: $(nproc)"
  max_mhz=$(lscpu 2>/dev/null | sed -n 's/^CPU max MHz:[[:space:]]*//p' | head -1)
  echo "mhz: ${max_mhz:-$(sed -n 's/^cpu MHz[[:space:]]*: //p' /proc/cpuinfo | head -1)}"
  echo "flags: $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "kernel: $(uname -sr)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "build: $build_dir ($(sed -n 's/^buildtype[[:space:]]*=[[:space:]]*//p' "$build_dir/meson-private/cmd_line.txt" 2>/dev/null | head -1))"
  if ((have_torch)); then
    echo "torch: PyTorch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) on $("$python" --version 2>&1)"
  fi
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
part 1 && log "1. training throughput ($reps runs per figure, $train_steps steps each)"
for ((i = 0; i < reps; ++i)); do
  part 1 || break
  for t in 1 2; do
    "$bin/train_bench" --data "$data" --threads "$t" --steps "$train_steps" --warmup "$train_warmup" \
      2>>"$out/train.log" | grep '^RUN' >>"$runs"
    if ((have_torch)); then
      # Passive OpenMP waits: GNU OpenMP's default spinning, with OpenBLAS's
      # own threads beside it, slows PyTorch at 2 threads down ~3-10x on a
      # shared machine (measured: 2.1k vs 7.2k samples/s); Foreman's Eigen
      # pool needs no such setting.
      OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$python" "$root/tools/bench/train_torch.py" --data "$data" \
        --threads "$t" --steps "$train_steps" --warmup "$train_warmup" 2>>"$out/train.log" | grep '^RUN' >>"$runs"
    fi
  done
done

# -- 5: recovery --------------------------------------------------------------------------------
if part 5; then
  log "5. recovery"
  "$bin/recovery_bench" --data "$data" --reps "$recovery_reps" --dir "$scratch" \
    2>"$out/recovery.log" | grep '^RUN' >>"$runs"
fi

"$python" "$root/tools/bench/report.py" "$out" | tee "$out/table.md"
log "raw results and table.md in $out"
