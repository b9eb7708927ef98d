#!/usr/bin/python3
"""torch.save of the tensors checkpoint_bench saves (issue 6, part 3).

The same state as checkpoint_bench's MakeState: float32 tensors of at most
16 MiB named layer_NNN/kernel, filled with the same pattern. Times
torch.save(state, path) plus the fsync that makes it durable (Foreman's saves
are fsync'ed; torch.save alone is not), and prints "SECONDS <s>".

    checkpoint_torch.py --mb N --dir DIR
"""
import argparse
import os
import time

import torch

CHUNK_BYTES = 16 << 20


def make_state(mib):
    state = {}
    left = mib << 20
    i = 0
    while left > 0:
        n = min(left, CHUNK_BYTES)
        state["layer_%03d/kernel" % i] = (torch.arange(n // 4, dtype=torch.int64) % 1000).to(torch.float32) * 0.001
        left -= n
        i += 1
    return state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = make_state(args.mb)
    path = os.path.join(args.dir, "torch_state.pt")
    start = time.perf_counter()
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    took = time.perf_counter() - start
    os.unlink(path)
    print("SECONDS %.9f" % took, flush=True)


if __name__ == "__main__":
    main()
