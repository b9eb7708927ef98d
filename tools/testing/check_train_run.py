#!/usr/bin/python3
"""Checks what `foreman train` left in its checkpoint directory, with the
independent readers of tfformat.py (no code shared with Foreman's C++).

    /usr/bin/python3 tools/testing/check_train_run.py DIR --step N --hidden H[,H2...]
        [--batch-size B] [--examples 60000] [--optimizer adam|momentum|sgd]
        [--same-as OTHER_DIR] [--checkpoint-steps S,S,...]

1. DIR/checkpoint names model.ckpt-N; that bundle reads back with every CRC
   checked and holds exactly the variables of the MLP (TF1 tf.layers.dense
   names), the optimizer's slots under TF1's names, global_step == N and the
   data position (input_pipeline/epoch, input_pipeline/index) N batches in;
   every float is finite.
2. Every event file under DIR and DIR/eval reads back (CRCs, Event protos);
   DIR's hold loss, accuracy, learning_rate, weight histograms, a START
   session log and a CHECKPOINT session log for each of --checkpoint-steps
   (default: N); DIR/eval's hold the test accuracy and loss.
3. With --same-as: OTHER_DIR's model.ckpt-N has bitwise the same tensors.

Exit status 0 when all holds; 1 with one line per problem; 2 for bad usage.
"""

import argparse
import glob
import math
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfformat as tf  # noqa: E402


def latest_checkpoint(d):
    with open(os.path.join(d, "checkpoint"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r'^model_checkpoint_path: "([^"]*)"$', text, re.M)
    if not m:
        raise tf.FormatError(f"{d}/checkpoint: no model_checkpoint_path in {text!r}")
    p = m.group(1)
    return p if os.path.isabs(p) else os.path.join(d, p)


def expected_variables(hidden, optimizer):
    dims = [784] + hidden + [10]
    want = {"global_step": ("int64", []), "input_pipeline/epoch": ("int64", []),
            "input_pipeline/index": ("int64", [])}
    for i in range(len(dims) - 1):
        layer = "dense" if i == 0 else f"dense_{i}"
        for var, shape in ((f"{layer}/kernel", [dims[i], dims[i + 1]]), (f"{layer}/bias", [dims[i + 1]])):
            want[var] = ("float32", shape)
            if optimizer == "adam":
                want[var + "/Adam"] = ("float32", shape)
                want[var + "/Adam_1"] = ("float32", shape)
            elif optimizer == "momentum":
                want[var + "/Momentum"] = ("float32", shape)
    if optimizer == "adam":
        want["beta1_power"] = ("float32", [])
        want["beta2_power"] = ("float32", [])
    return want


def bits(t):
    if t.dtype == "float32":
        return struct.pack(f"<{len(t.values)}f", *t.values)
    return repr(t.values).encode()


def check_checkpoint(args, problems):
    try:
        prefix = latest_checkpoint(args.dir)
        b = tf.read_bundle(prefix)
    except (OSError, tf.FormatError) as e:
        problems.append(str(e))
        return None
    if os.path.basename(prefix) != f"model.ckpt-{args.step}":
        problems.append(f"{args.dir}/checkpoint: latest is {prefix}, expected model.ckpt-{args.step}")
    want = expected_variables(args.hidden, args.optimizer)
    for name in sorted(set(want) - set(b.tensors)):
        problems.append(f"{prefix}: no variable '{name}'")
    for name in sorted(set(b.tensors) - set(want)):
        problems.append(f"{prefix}: unexpected variable '{name}'")
    for name in sorted(set(want) & set(b.tensors)):
        t = b.tensors[name]
        if (t.dtype, t.shape) != want[name]:
            problems.append(f"{prefix}: '{name}' is {t.dtype} {t.shape}, expected {want[name][0]} {want[name][1]}")
        if t.dtype == "float32" and not all(math.isfinite(v) for v in t.values):
            problems.append(f"{prefix}: '{name}' holds a NaN or Inf")
    step = b.tensors.get("global_step")
    if step is not None and step.values != [args.step]:
        problems.append(f"{prefix}: global_step {step.values}, expected [{args.step}]")
    per_epoch = -(-args.examples // args.batch_size)
    epoch, index = args.step // per_epoch, (args.step % per_epoch) * args.batch_size
    for name, value in (("input_pipeline/epoch", epoch), ("input_pipeline/index", index)):
        t = b.tensors.get(name)
        if t is not None and t.values != [value]:
            problems.append(f"{prefix}: {name} {t.values}, expected [{value}] after {args.step} batches of "
                            f"{args.batch_size}")
    if args.optimizer == "adam" and "beta1_power" in b.tensors:
        got = b.tensors["beta1_power"].values[0]
        if not math.isclose(got, 0.9 ** (args.step + 1), rel_tol=1e-4):
            problems.append(f"{prefix}: beta1_power {got}, expected 0.9^{args.step + 1}")
    print(f"check_train_run: {prefix}: {len(b.tensors)} variables read back")
    return b


def event_files(d):
    return sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))


def read_events(path, problems):
    try:
        with open(path, "rb") as f:
            records = tf.read_records(f.read(), path)
        return [tf.parse_message("Event", payload, f"{path}: record at offset {off}") for off, payload in records]
    except (OSError, tf.FormatError) as e:
        problems.append(str(e))
        return []


def check_events(args, problems):
    tags, checkpoints, starts = {}, set(), 0
    files = event_files(args.dir)
    if not files:
        problems.append(f"{args.dir}: no event file")
    for path in files:
        for ev in read_events(path, problems):
            kind = ev.WhichOneof("what")
            if kind == "summary":
                for v in ev.summary.value:
                    tags.setdefault(v.tag, set()).add(v.WhichOneof("value"))
            elif kind == "session_log":
                if ev.session_log.status == 3:
                    checkpoints.add(ev.step)
                elif ev.session_log.status == 1:
                    starts += 1
    for tag, kind in (("loss", "simple_value"), ("accuracy", "simple_value"), ("learning_rate", "simple_value"),
                      ("dense/kernel", "histo"), ("dense/bias", "histo")):
        if kind not in tags.get(tag, set()):
            problems.append(f"{args.dir}: no {kind} '{tag}' in the event files (tags: {sorted(tags)})")
    if args.step > 1 and "global_step/sec" not in tags:
        problems.append(f"{args.dir}: no 'global_step/sec' in the event files")
    if starts == 0:
        problems.append(f"{args.dir}: no SessionLog START")
    for s in args.checkpoint_steps or [args.step]:
        if s not in checkpoints:
            problems.append(f"{args.dir}: no SessionLog CHECKPOINT at step {s} (found {sorted(checkpoints)})")
    eval_tags = set()
    eval_dir = os.path.join(args.dir, "eval")
    for path in event_files(eval_dir):
        for ev in read_events(path, problems):
            if ev.WhichOneof("what") == "summary":
                eval_tags.update(v.tag for v in ev.summary.value)
    if args.eval and not {"accuracy", "loss"} <= eval_tags:
        problems.append(f"{eval_dir}: no test accuracy and loss (tags: {sorted(eval_tags)})")
    print(f"check_train_run: events: {len(files)} file(s), {len(tags)} tags, CHECKPOINT at {sorted(checkpoints)}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--hidden", required=True)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--examples", type=int, default=60000)
    p.add_argument("--optimizer", default="adam", choices=["adam", "momentum", "sgd"])
    p.add_argument("--checkpoint-steps", default="")
    p.add_argument("--eval", action="store_true", help="DIR/eval must hold test accuracy and loss")
    p.add_argument("--same-as")
    try:
        args = p.parse_args(argv[1:])
        args.hidden = [] if args.hidden == "none" else [int(h) for h in args.hidden.split(",")]
        args.checkpoint_steps = [int(s) for s in args.checkpoint_steps.split(",") if s]
    except (SystemExit, ValueError):
        return 2
    problems = []
    b = check_checkpoint(args, problems)
    check_events(args, problems)
    if args.same_as and b is not None:
        try:
            other = tf.read_bundle(os.path.join(args.same_as, f"model.ckpt-{args.step}"))
        except (OSError, tf.FormatError) as e:
            problems.append(str(e))
            other = None
        if other is not None:
            differ = [n for n in sorted(set(b.tensors) | set(other.tensors))
                      if n not in b.tensors or n not in other.tensors or bits(b.tensors[n]) != bits(other.tensors[n])]
            if differ:
                problems.append(f"{args.dir} and {args.same_as} differ at step {args.step} in: {', '.join(differ)}")
            else:
                print(f"check_train_run: {args.dir} and {args.same_as}: bitwise the same {len(b.tensors)} "
                      f"tensors at step {args.step}")
    for problem in problems:
        print("check_train_run: FAIL:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
