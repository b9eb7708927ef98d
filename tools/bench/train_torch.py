#!/usr/bin/python3
"""PyTorch's side of the training-throughput benchmark (issue 6, part 1).

The model, initialisation and optimizer of Foreman's MLP (foreman::nn::Mlp):
784-256-10 with ReLU, Glorot/Xavier-uniform kernels, zero biases, Adam with
TF1's defaults (lr 1e-3, beta1 0.9, beta2 0.999, epsilon 1e-8), mean sparse
softmax cross-entropy; batch 128 from the same Fashion-MNIST IDX files,
pixels scaled to [0, 1], reshuffled every epoch. torch.set_num_threads(n) is
set to Foreman's intra-op threads (run.sh also sets OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS to it and pins the process to as
many cores with taskset).

Prints "RUN train.torch.t<n>.samples_per_s <v> samples/s" after `--warmup`
untimed and `--steps` timed steps (run.sh gathers the runs). With `--info
FILE` it also writes, after the timed steps, "key: value" lines saying what
actually ran: PyTorch's and Python's versions, torch.get_num_threads(), the
CPU capability ATen dispatches to, whether oneDNN (mkldnn) is available, the
BLAS/LAPACK/OpenMP/oneDNN libraries mapped into the process
(/proc/self/maps) and OpenBLAS's own configuration and core type when it is
one of them, and the thread variables of the environment.

    train_torch.py --data DIR --threads N [--steps 400] [--warmup 50] [--seed 1] [--info FILE]

With `--device cuda` (issue 15) the same model trains on the GPU, eager (no
torch.compile, no CUDA graphs), with the whole training set already on the
device (float32, converted once) and the batches gathered there from a
permutation drawn on the device; the timed steps end with one
torch.cuda.synchronize(). It prints "RUN train.torch.cuda.b<batch>.samples_per_s
<v> samples/s device=<name>" (exit 77, "SKIP ...", when torch.cuda is not
available). With `--epochs N` it instead trains N whole epochs the way
`foreman train` does (learning rate 1e-3 x 0.8^(step / 1000), continuous),
then evaluates the test set, and prints "RUN train.torch.<cpu|cuda>.main_job_s
<s> s accuracy=<a> steps=<n>" (the training loop's wall time, data already in
memory, evaluation excluded).

    train_torch.py --data DIR --threads N --device cuda [--batch 128] [--epochs 15]
"""
import argparse
import gzip
import ctypes
import os
import platform
import re
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def peer_info(threads):
    """What ran, as "key: value" lines (see the module's comment)."""
    config = torch.__config__.show()
    info = {"torch": "PyTorch %s on Python %s" % (torch.__version__, platform.python_version())}
    info["torch_threads"] = "torch.get_num_threads() = %d (asked for %d)" % (torch.get_num_threads(), threads)
    capability = None
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get_capability is not None:
        capability = get_capability()
    else:
        m = re.search(r"CPU capability usage: *(\S+)", config)
        capability = m.group(1) if m else "unknown"
    info["torch_cpu_capability"] = capability
    dnnl = re.search(r"(?:Intel\(R\) MKL-DNN|oneDNN) v?(\S+)", config)
    info["torch_onednn"] = "%s%s" % ("available" if torch.backends.mkldnn.is_available() else "not available",
                                    (" (v%s)" % dnnl.group(1)) if dnnl else "")
    info["torch_mkl"] = "available" if torch.backends.mkl.is_available() else "not available"
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    info["torch_blas_info"] = blas.group(1) if blas else "unknown"
    info["torch_parallel"] = "; ".join(line.strip() for line in torch.__config__.parallel_info().splitlines()
                                       if "backend" in line)
    libs = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            path = fields[5] if len(fields) >= 6 else ""
            if re.search(r"blas|lapack|mkl|dnnl|mkldnn|blis|omp", os.path.basename(path)) and path not in libs:
                libs.append(path)
    info["torch_libs"] = " ".join(libs) or "none found in /proc/self/maps"
    for path in libs:
        if "openblas" not in os.path.basename(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            for name in ("openblas_get_config", "openblas_get_corename"):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_char_p
                info[name] = fn().decode(errors="replace")
            lib.openblas_get_num_threads.restype = ctypes.c_int
            info["openblas_get_num_threads"] = str(lib.openblas_get_num_threads())
        except (OSError, AttributeError) as e:
            info["openblas"] = "%s (%s)" % (path, e)
    info["torch_env"] = " ".join("%s=%s" % (k, os.environ.get(k, "unset")) for k in (
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_CORETYPE"))
    info["torch_affinity"] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return "".join("%s: %s\n" % kv for kv in info.items())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--info", help="also write what ran (versions, backends, threads) to this file")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--epochs", type=int, default=0, help="train this many epochs (the main job) instead")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP train_torch.py --device cuda: torch.cuda is not available (PyTorch %s)" % torch.__version__,
              flush=True)
        raise SystemExit(77)
    device = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 throughout, as Foreman
        torch.backends.cudnn.allow_tf32 = False

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    x_all = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0).to(device)
    y_all = torch.from_numpy(labels.astype(np.int64)).to(device)

    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    for layer in (model[0], model[2]):
        torch.nn.init.xavier_uniform_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)

    n = x_all.shape[0]
    # As foreman::data::Dataset: the last batch of an epoch holds the rest.
    batches_per_epoch = (n + args.batch - 1) // args.batch
    generator = torch.Generator(device=device).manual_seed(args.seed)
    order = torch.randperm(n, generator=generator, device=device)
    index = 0

    def step():
        nonlocal order, index
        if index == batches_per_epoch:
            order = torch.randperm(n, generator=generator, device=device)
            index = 0
        idx = order[index * args.batch:(index + 1) * args.batch]
        index += 1
        x = x_all[idx]
        y = y_all[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss, len(idx)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    if args.epochs > 0:
        # The main job: as `foreman train`'s defaults (exponential_decay, not staircase).
        total = args.epochs * batches_per_epoch
        sync()
        start = time.perf_counter()
        for global_step in range(total):
            for group in opt.param_groups:
                group["lr"] = 1e-3 * 0.8 ** (global_step / 1000.0)
            loss, _ = step()
        sync()
        took = time.perf_counter() - start
        test_images = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
        test_labels = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))
        with torch.no_grad():
            xt = torch.from_numpy(test_images.reshape(len(test_images), -1).astype(np.float32) / 255.0).to(device)
            yt = torch.from_numpy(test_labels.astype(np.int64)).to(device)
            accuracy = float((model(xt).argmax(dim=1) == yt).float().mean())
        print("loss %.4f" % float(loss))
        print("RUN train.torch.%s.main_job_s %.6g s accuracy=%.4f steps=%d" % (args.device, took, accuracy, total),
              flush=True)
        return

    for _ in range(args.warmup):
        step()
    sync()
    samples = 0
    start = time.perf_counter()
    for _ in range(args.steps):
        loss, rows = step()
        samples += rows
    sync()
    took = time.perf_counter() - start
    print("loss %.4f" % float(loss))
    if args.info:
        with open(args.info, "w") as f:
            f.write(peer_info(args.threads))
    if args.device == "cuda":
        print("RUN train.torch.cuda.b%d.samples_per_s %.6g samples/s device=%s" %
              (args.batch, samples / took, torch.cuda.get_device_name(0)), flush=True)
    else:
        batch = "" if args.batch == 128 else "b%d." % args.batch
        print("RUN train.torch.%st%d.samples_per_s %.6g samples/s" % (batch, args.threads, samples / took), flush=True)


if __name__ == "__main__":
    main()
