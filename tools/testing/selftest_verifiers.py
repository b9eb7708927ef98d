#!/usr/bin/python3
"""Self-test of verify_checkpoint.py and verify_events.py: they accept good
files and reject each kind of bad one.

    /usr/bin/python3 tools/testing/selftest_verifiers.py

The inputs are built here with tools/testing/tfformat.py (no Foreman code).
Exit status 0 when every case behaves; 1 otherwise.
"""

import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfformat as tf  # noqa: E402
import verify_checkpoint  # noqa: E402
import verify_events  # noqa: E402

T = tf.Tensor
failures = []


def expect(name, problems, ok):
    if ok and problems:
        failures.append(f"{name}: expected OK, got {problems}")
    elif not ok and not problems:
        failures.append(f"{name}: expected a failure, got OK")
    else:
        print(f"selftest: {name}: {'OK' if ok else 'rejected as expected: ' + problems[0]}")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def checkpoint_cases(d):
    tensors = {
        "f": T("float32", [2, 2], [1.0, -0.0, 2.5, float("inf")]),
        "s": T("string", [3], [b"", b"abc", bytes(range(200))]),
        "i": T("int64", [], [-5]),
    }
    exp = os.path.join(d, "expected.txt")
    with open(exp, "w") as f:
        for n, t in tensors.items():
            f.write(tf.format_tensor_line(n, t) + "\n")

    good = os.path.join(d, "good")
    tf.write_bundle(good, tensors)
    expect("checkpoint: a correct bundle", verify_checkpoint.verify(good, exp), True)

    # The string length checksum taken over the varint bytes (a plausible bug).
    bad = os.path.join(d, "varint_crc")
    index, shards, entries, _ = tf.build_bundle(tensors)
    data = bytearray(shards[0])
    e = entries["s"]
    lengths = b"".join(tf.put_varint(len(x)) for x in tensors["s"].values)
    pos = e["offset"] + len(lengths)
    data[pos:pos + 4] = struct.pack("<I", tf.masked_crc(lengths))
    write(tf.index_path(bad), index)
    write(tf.data_path(bad), bytes(data))
    expect("checkpoint: length checksum over the varint bytes", verify_checkpoint.verify(bad, exp), False)

    # The entry crc32c over lengths as uint64 and the bytes, skipping the
    # length checksum (what include/foreman/bundle.hpp's comment describes).
    bad = os.path.join(d, "entry_crc_u64")
    c = 0
    for x in tensors["s"].values:
        c = tf.crc(struct.pack("<Q", len(x)), c)
    for x in tensors["s"].values:
        c = tf.crc(x, c)
    index, shards, entries, _ = tf.build_bundle(tensors)
    tw = tf.TableWriter()
    tw.add(b"", tf.encode_header(1))
    for n in sorted(entries):
        en = entries[n]
        crc32c = tf.mask(c) if n == "s" else en["crc32c"]
        tw.add(n.encode(), tf.encode_entry(en["dtype"], en["shape"], 0, en["offset"], en["size"], crc32c))
    write(tf.index_path(bad), tw.finish())
    write(tf.data_path(bad), shards[0])
    expect("checkpoint: entry crc32c over uint64 lengths without the length checksum",
           verify_checkpoint.verify(bad, exp), False)

    bad = os.path.join(d, "flipped")
    tf.write_bundle(bad, tensors)
    data = bytearray(open(tf.data_path(bad), "rb").read())
    data[1] ^= 0x10
    write(tf.data_path(bad), bytes(data))
    expect("checkpoint: a flipped data byte", verify_checkpoint.verify(bad, exp), False)

    bad = os.path.join(d, "index_flip")
    tf.write_bundle(bad, tensors)
    idx = bytearray(open(tf.index_path(bad), "rb").read())
    idx[3] ^= 0x01
    write(tf.index_path(bad), bytes(idx))
    expect("checkpoint: a flipped index byte", verify_checkpoint.verify(bad, exp), False)

    other = dict(tensors)
    other["f"] = T("float32", [2, 2], [1.0, 0.0, 2.5, float("inf")])   # +0.0 instead of -0.0
    bad = os.path.join(d, "negzero")
    tf.write_bundle(bad, other)
    expect("checkpoint: +0.0 where -0.0 is expected", verify_checkpoint.verify(bad, exp), False)

    other = dict(tensors)
    other["x"] = T("uint8", [1], [1])
    bad = os.path.join(d, "extra")
    tf.write_bundle(bad, other)
    expect("checkpoint: an extra variable", verify_checkpoint.verify(bad, exp), False)

    other = dict(tensors)
    other["i"] = T("int64", [1], [-5])
    bad = os.path.join(d, "shape")
    tf.write_bundle(bad, other)
    expect("checkpoint: a wrong shape", verify_checkpoint.verify(bad, exp), False)


def event(M, step=None, wall_time=None, **what):
    e = M["Event"]()
    e.wall_time = wall_time if wall_time is not None else 1.7e9 + 1
    if step is not None:
        e.step = step
    for k, v in what.items():
        if k == "file_version":
            e.file_version = v
        elif k == "summary":
            e.summary.CopyFrom(v)
        elif k == "session_log":
            e.session_log.CopyFrom(v)
    return e.SerializeToString()


def summary(M, values):
    s = M["Summary"]()
    for kind, tag, payload, meta in values:
        v = s.value.add()
        v.tag = tag
        if meta:
            v.metadata.plugin_data.plugin_name = meta
        if kind == "scalar":
            v.simple_value = payload
        elif kind == "histo":
            h = tf.histogram(payload)
            v.histo.min, v.histo.max, v.histo.num = h["min"], h["max"], h["num"]
            v.histo.sum, v.histo.sum_squares = h["sum"], h["sum_squares"]
            v.histo.bucket_limit.extend(h["bucket_limit"])
            v.histo.bucket.extend(h["bucket"])
        elif kind == "histo_unmerged":   # zero buckets preserved: not what TF writes
            lim = tf.default_bucket_limits()
            h = tf.histogram(payload)
            v.histo.min, v.histo.max, v.histo.num = h["min"], h["max"], h["num"]
            v.histo.sum, v.histo.sum_squares = h["sum"], h["sum_squares"]
            import bisect
            counts = [0.0] * len(lim)
            for x in payload:
                counts[bisect.bisect_right(lim, x)] += 1
            v.histo.bucket_limit.extend(lim)
            v.histo.bucket.extend(counts)
        elif kind == "text":
            v.tensor.dtype = 7
            v.tensor.string_val.append(payload)
    return s


def events_cases(d):
    M = tf.messages()
    exp = os.path.join(d, "expected_events.txt")
    with open(exp, "w") as f:
        f.write("file_name_host h\nfile_name_suffix .s\nfile_version brain.Event:2\n"
                "event 1 summary\nvalue scalar loss 0.1\n"
                "event 2 summary\nvalue histogram w float32 4 -1 0 0.5 0.5\n"
                "event 3 summary\nvalue text t x6869\n"
                "event 4 summary\nvalue text t x6869\n"
                "event 5 session_log START x x6d\n"
                "event - session_log STOP x x\n")
    f32_01 = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    sl_start = M["SessionLog"](status=1, msg="m")
    sl_stop = M["SessionLog"](status=2)

    def build(name, *, scalar=f32_01, histo="histo", second_meta=None, step3=3, corrupt=False,
              fname="events.out.tfevents.1700000001.h.s"):
        recs = [
            event(M, wall_time=1.7e9 + 1, file_version="brain.Event:2"),
            event(M, 1, summary=summary(M, [("scalar", "loss", scalar, None)])),
            event(M, 2, summary=summary(M, [(histo, "w", [-1.0, 0.0, 0.5, 0.5], None)])),
            event(M, step3, summary=summary(M, [("text", "t", b"hi", "text")])),
            event(M, 4, summary=summary(M, [("text", "t", b"hi", second_meta)])),
            event(M, 5, session_log=sl_start),
            event(M, None, session_log=sl_stop),
        ]
        data = bytearray(b"".join(tf.frame_record(r) for r in recs))
        if corrupt:
            data[-3] ^= 0x01
        sub = os.path.join(d, name)
        os.makedirs(sub)
        path = os.path.join(sub, fname)
        write(path, bytes(data))
        return path

    expect("events: a correct file", verify_events.verify(build("good"), exp), True)
    expect("events: a float32 scalar off by one ulp",
           verify_events.verify(build("ulp", scalar=struct.unpack("<f", struct.pack("<I", struct.unpack(
               "<I", struct.pack("<f", f32_01))[0] + 1))[0]), exp), False)
    expect("events: a histogram with empty buckets not merged",
           verify_events.verify(build("unmerged", histo="histo_unmerged"), exp), False)
    expect("events: metadata repeated on a tag's second value",
           verify_events.verify(build("meta", second_meta="text"), exp), False)
    expect("events: a wrong step", verify_events.verify(build("step", step3=30), exp), False)
    expect("events: a flipped byte in the last record",
           verify_events.verify(build("crc", corrupt=True), exp), False)
    expect("events: a wrong file name",
           verify_events.verify(build("name", fname="events.out.tfevents.1700000001.other"), exp), False)


def main():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "ckpt"))
        checkpoint_cases(os.path.join(d, "ckpt"))
        events_cases(d)
    if failures:
        for f in failures:
            print("selftest: FAIL:", f, file=sys.stderr)
        return 1
    print("selftest: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
