#!/usr/bin/python3
"""Checks a TensorBoard event file with an independent reader.

    /usr/bin/python3 tools/testing/verify_events.py <event file> <expected.txt>

Reads the file as TFRecords (uint64 length, masked CRC32C of it, payload,
masked CRC32C of the payload; every CRC checked), parses each payload as a
tensorflow.Event from a hand-written descriptor, and compares the events, in
order, with expected.txt:

    file_name_host <host>            the name is events.out.tfevents.<10 digits>.<host><suffix>
    file_name_suffix <suffix>
    file_version brain.Event:2       the first event
    event <step|-> summary           an Event with a Summary; its values follow:
    value scalar <tag> <float>         simple_value, compared as float32 (bitwise)
    value histogram <tag> <dtype> <n> <v1> ... <vn>
                                       histo, compared with TF's histogram of the
                                       values (default bucket limits, runs of empty
                                       buckets merged); float32 inputs are rounded
                                       to float32 first
    value text <tag> x<hex>            a DT_STRING scalar tensor holding the bytes;
                                       plugin "text"
    event <step|-> session_log <STATUS> x<checkpoint_path hex> x<msg hex>
                                     STATUS: STATUS_UNSPECIFIED START STOP CHECKPOINT

'-' means the Event has no step (0). Every event's wall_time must be a
plausible time (2001..2286) and not earlier than the file_version event's.
Summary metadata (TF's FileWriter rule): a tag's metadata is kept only on the
first value of that tag in the file; any later value with the same tag must
carry none.

Exit status 0 when everything matches; 1 with one line per problem otherwise;
2 for bad usage. Shares no code with Foreman's C++.
"""

import math
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfformat as tf  # noqa: E402

STATUSES = {"STATUS_UNSPECIFIED": 0, "START": 1, "STOP": 2, "CHECKPOINT": 3}
DT_STRING = 7


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def parse_expected(path):
    """(settings dict, [event dicts])"""
    settings = {}
    events = []
    with open(path, encoding="ascii") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            t = line.split()
            where = f"{path}:{lineno}"
            try:
                if t[0] in ("file_name_host", "file_name_suffix", "file_version") and len(t) == 2:
                    settings[t[0]] = t[1]
                elif t[0] == "event" and t[2] == "summary" and len(t) == 3:
                    events.append(dict(step=None if t[1] == "-" else int(t[1]), kind="summary",
                                       values=[], where=where))
                elif t[0] == "event" and t[2] == "session_log" and len(t) == 6:
                    events.append(dict(step=None if t[1] == "-" else int(t[1]), kind="session_log",
                                       status=STATUSES[t[3]], checkpoint_path=tf.parse_value("string", t[4]),
                                       msg=tf.parse_value("string", t[5]), where=where))
                elif t[0] == "value":
                    if not events or events[-1]["kind"] != "summary":
                        raise ValueError("value line outside a summary event")
                    v = dict(kind=t[1], tag=t[2], where=where)
                    if t[1] == "scalar" and len(t) == 4:
                        v["value"] = float(t[3])
                    elif t[1] == "text" and len(t) == 4:
                        v["text"] = tf.parse_value("string", t[3])
                    elif t[1] == "histogram" and len(t) >= 5:
                        dtype, n = t[3], int(t[4])
                        vals = [tf.parse_value(dtype, x) for x in t[5:]]
                        if len(vals) != n:
                            raise ValueError(f"{n} values announced, {len(vals)} given")
                        v["values"] = [f32(x) if dtype == "float32" else float(x) for x in vals]
                    else:
                        raise ValueError("bad value line")
                    events[-1]["values"].append(v)
                else:
                    raise ValueError("unknown line")
            except (ValueError, KeyError, IndexError) as e:
                raise tf.FormatError(f"{where}: {e}") from None
    return settings, events


def same_f32(a, b):
    return struct.pack("<f", a) == struct.pack("<f", b)


def close(a, b):
    if a == b:
        return True
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def check_histogram(where, got, values):
    want = tf.histogram(values)
    problems = []
    for field in ("min", "max", "num"):
        if getattr(got, field) != want[field]:
            problems.append(f"{where}: histo.{field} = {getattr(got, field)!r}, TF gives {want[field]!r}")
    for field in ("sum", "sum_squares"):
        if not close(getattr(got, field), want[field]):
            problems.append(f"{where}: histo.{field} = {getattr(got, field)!r}, TF gives {want[field]!r}")
    gl, gb = list(got.bucket_limit), list(got.bucket)
    if gl != want["bucket_limit"] or gb != want["bucket"]:
        detail = ""
        for i, (a, b) in enumerate(zip(gl, want["bucket_limit"])):
            if a != b:
                detail = f"; first different limit at {i}: {a!r} vs TF's {b!r}"
                break
        if not detail:
            for i, (a, b) in enumerate(zip(gb, want["bucket"])):
                if a != b:
                    detail = f"; first different count at {i}: {a!r} vs TF's {b!r}"
                    break
        problems.append(f"{where}: histo buckets differ from TF's: {len(gl)} limits / {len(gb)} counts, "
                        f"TF gives {len(want['bucket_limit'])} / {len(want['bucket'])}{detail}")
    return problems


def check_value(where, got, want, seen_metadata):
    problems = []
    if got.tag != want["tag"]:
        problems.append(f"{where}: tag {got.tag!r}, expected {want['tag']!r}")
    if got.HasField("metadata"):
        if got.tag in seen_metadata:
            problems.append(f"{where}: tag {got.tag!r} carries metadata again (TF keeps it only on the "
                            f"first value of a tag in a file)")
        seen_metadata.add(got.tag)
    kind = got.WhichOneof("value")
    if want["kind"] == "scalar":
        if kind != "simple_value":
            return problems + [f"{where}: '{got.tag}' holds {kind}, expected simple_value"]
        if not same_f32(got.simple_value, want["value"]):
            problems.append(f"{where}: '{got.tag}' simple_value {got.simple_value!r}, expected {want['value']!r}")
    elif want["kind"] == "histogram":
        if kind != "histo":
            return problems + [f"{where}: '{got.tag}' holds {kind}, expected histo"]
        problems += check_histogram(f"{where}: '{got.tag}'", got.histo, want["values"])
    elif want["kind"] == "text":
        if kind != "tensor":
            return problems + [f"{where}: '{got.tag}' holds {kind}, expected a string tensor"]
        t = got.tensor
        if t.dtype != DT_STRING:
            problems.append(f"{where}: '{got.tag}' tensor dtype {t.dtype}, expected DT_STRING (7)")
        if list(t.tensor_shape.dim) or t.tensor_shape.unknown_rank:
            problems.append(f"{where}: '{got.tag}' tensor shape {t.tensor_shape}, expected a scalar")
        if list(t.string_val) != [want["text"]]:
            problems.append(f"{where}: '{got.tag}' string_val {list(t.string_val)!r}, expected [{want['text']!r}]")
        if got.HasField("metadata") and got.metadata.plugin_data.plugin_name != "text":
            problems.append(f"{where}: '{got.tag}' plugin_name {got.metadata.plugin_data.plugin_name!r}, "
                            f"expected 'text'")
    return problems


def verify(path, expected_path):
    try:
        settings, expected = parse_expected(expected_path)
    except (OSError, tf.FormatError) as e:
        return [f"cannot read {expected_path}: {e}"]
    problems = []
    name = os.path.basename(path)
    m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.*)", name)
    name_secs = None
    if not m:
        problems.append(f"{path}: name is not events.out.tfevents.<10-digit seconds>.<host><suffix>")
    else:
        name_secs = int(m.group(1))
        want_tail = settings.get("file_name_host", "") + settings.get("file_name_suffix", "")
        if "file_name_host" in settings and m.group(2) != want_tail:
            problems.append(f"{path}: name ends in {m.group(2)!r}, expected {want_tail!r}")
    try:
        with open(path, "rb") as f:
            data = f.read()
        records = tf.read_records(data, path)
    except (OSError, tf.FormatError) as e:
        return problems + [str(e)]
    events = []
    for offset, payload in records:
        try:
            events.append((offset, tf.parse_message("Event", payload, f"{path}: record at offset {offset}")))
        except tf.FormatError as e:
            problems.append(str(e))
    if problems:
        return problems
    if not events:
        return [f"{path}: no records"]

    first_off, first = events[0]
    where = f"{path}: record at offset {first_off}"
    if first.WhichOneof("what") != "file_version":
        problems.append(f"{where}: the first event is not a file_version event")
    elif first.file_version != settings.get("file_version", "brain.Event:2"):
        problems.append(f"{where}: file_version {first.file_version!r}")
    t0 = first.wall_time
    if not 1e9 <= t0 < 1e10:
        problems.append(f"{where}: wall_time {t0!r} is not a plausible time")
    elif name_secs is not None and abs(name_secs - t0) > 60:
        problems.append(f"{path}: name says {name_secs} s, the file_version event {t0!r} s")

    rest = events[1:]
    if len(rest) != len(expected):
        problems.append(f"{path}: {len(rest)} events after file_version, expected {len(expected)}")
    seen_metadata = set()
    for (offset, ev), want in zip(rest, expected):
        where = f"{path}: record at offset {offset} (expected per {want['where']})"
        if not (math.isfinite(ev.wall_time) and t0 <= ev.wall_time < 1e10):
            problems.append(f"{where}: wall_time {ev.wall_time!r} (file_version event: {t0!r})")
        want_step = want["step"] if want["step"] is not None else 0
        if ev.step != want_step:
            problems.append(f"{where}: step {ev.step}, expected {want_step}")
        kind = ev.WhichOneof("what")
        if kind != want["kind"]:
            problems.append(f"{where}: holds {kind}, expected {want['kind']}")
            continue
        if kind == "summary":
            vals = list(ev.summary.value)
            if len(vals) != len(want["values"]):
                problems.append(f"{where}: {len(vals)} summary values, expected {len(want['values'])}")
            for got, w in zip(vals, want["values"]):
                problems += check_value(where, got, w, seen_metadata)
        else:
            sl = ev.session_log
            if sl.status != want["status"]:
                problems.append(f"{where}: session_log status {sl.status}, expected {want['status']}")
            if sl.checkpoint_path.encode() != want["checkpoint_path"]:
                problems.append(f"{where}: checkpoint_path {sl.checkpoint_path!r}, expected "
                                f"{want['checkpoint_path']!r}")
            if sl.msg.encode() != want["msg"]:
                problems.append(f"{where}: msg {sl.msg!r}, expected {want['msg']!r}")
    return problems


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    problems = verify(argv[1], argv[2])
    if problems:
        for p in problems:
            print("verify_events: FAIL:", p, file=sys.stderr)
        return 1
    print(f"verify_events: OK: {argv[1]} matches {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
