#!/usr/bin/python3
"""PyTorch's side of the training-throughput benchmark (issue 6, part 1).

The model, initialisation and optimizer of Foreman's MLP (foreman::nn::Mlp):
784-256-10 with ReLU, Glorot/Xavier-uniform kernels, zero biases, Adam with
TF1's defaults (lr 1e-3, beta1 0.9, beta2 0.999, epsilon 1e-8), mean sparse
softmax cross-entropy; batch 128 from the same Fashion-MNIST IDX files,
pixels scaled to [0, 1], reshuffled every epoch. torch.set_num_threads(n) is
set to Foreman's intra-op threads.

Prints "RUN train.torch.t<n>.samples_per_s <v> samples/s" after `--warmup`
untimed and `--steps` timed steps (run.sh gathers the runs).

    train_torch.py --data DIR --threads N [--steps 400] [--warmup 50] [--seed 1]
"""
import argparse
import gzip
import os
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    x_all = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    y_all = torch.from_numpy(labels.astype(np.int64))

    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    for layer in (model[0], model[2]):
        torch.nn.init.xavier_uniform_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)

    n = x_all.shape[0]
    # As foreman::data::Dataset: the last batch of an epoch holds the rest.
    batches_per_epoch = (n + args.batch - 1) // args.batch
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n, generator=generator)
    index = 0

    def step():
        nonlocal order, index
        if index == batches_per_epoch:
            order = torch.randperm(n, generator=generator)
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

    for _ in range(args.warmup):
        step()
    samples = 0
    start = time.perf_counter()
    for _ in range(args.steps):
        loss, rows = step()
        samples += rows
    took = time.perf_counter() - start
    print("loss %.4f" % float(loss))
    print("RUN train.torch.t%d.samples_per_s %.6g samples/s" % (args.threads, samples / took), flush=True)


if __name__ == "__main__":
    main()
