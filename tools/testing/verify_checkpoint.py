#!/usr/bin/python3
"""Checks a TF V2 checkpoint (tensor bundle) with an independent reader.

    /usr/bin/python3 tools/testing/verify_checkpoint.py <prefix> <expected.txt>

Reads <prefix>.index as a LevelDB table (footer magic, every block's masked
CRC32C, snappy blocks, restart points, key order, index separators), parses
the header and every BundleEntryProto from a hand-written descriptor, reads
each tensor from the data shard(s) the way TensorFlow does (string tensors:
varint64 lengths, the masked CRC32C of the lengths as uint32, the bytes) and
checks every entry's crc32c. Then compares names, dtypes, shapes and values
with expected.txt (format: tools/testing/tfformat.py): the tensor lines
under the 'bundle' line naming <prefix> (relative to expected.txt's
directory), or all tensor lines when there is no 'bundle' line; they give the
bundle's whole content. Also checks what
TF's reader relies on: the header key "" first, num_shards >= 1, little
endian, a version TF accepts, non-overlapping data extents.

Exit status 0 when everything matches; 1 with one line per problem otherwise;
2 for bad usage. Shares no code with Foreman's C++.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfformat as tf  # noqa: E402


def verify(prefix, expected_path):
    problems = []
    try:
        groups = tf.parse_expected(expected_path)
    except (OSError, tf.FormatError) as e:
        return [f"cannot read {expected_path}: {e}"]
    # With 'bundle' lines, use the group naming this prefix (relative to the
    # expected file's directory); without, every tensor line.
    base = os.path.dirname(os.path.abspath(expected_path))
    named = [t for p, t in groups if p is not None
             and os.path.normpath(os.path.join(base, p)) == os.path.normpath(os.path.abspath(prefix))]
    if any(p is not None for p, _ in groups):
        if len(named) != 1:
            return [f"{expected_path}: no 'bundle' line names {prefix}"]
        expected = named[0]
    else:
        expected = {}
        for _, tensors in groups:
            expected.update(tensors)
    try:
        b = tf.read_bundle(prefix)
    except tf.FormatError as e:
        return [str(e)]

    # Data extents of one shard must not overlap.
    extents = {}
    for name, e in b.entries.items():
        extents.setdefault(e.shard_id, []).append((e.offset, e.offset + e.size, name))
    for shard, ex in extents.items():
        ex.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(ex, ex[1:]):
            if s1 < e0:
                problems.append(f"{tf.data_path(prefix, shard, b.header.num_shards)}: '{n0}' "
                                f"[{s0}, {e0}) overlaps '{n1}' [{s1}, {e1})")

    got = set(b.tensors)
    want = set(expected)
    for name in sorted(want - got):
        problems.append(f"{tf.index_path(prefix)}: no variable '{name}'")
    for name in sorted(got - want):
        problems.append(f"{tf.index_path(prefix)}: unexpected variable '{name}'")
    for name in sorted(want & got):
        problems.extend(f"{prefix}: {d}" for d in tf.compare_tensor(name, expected[name], b.tensors[name]))
    return problems


def same_as_tf_layout(prefix):
    """Whether the files are byte for byte what TF's BundleWriter writes for
    these tensors in this data order (informational: other layouts, e.g. a
    snappy index, are still valid)."""
    b = tf.read_bundle(prefix)
    if b.header.num_shards != 1:
        return False
    order = sorted(b.entries, key=lambda n: b.entries[n].offset)
    index, shards, _, _ = tf.build_bundle(b.tensors, data_order=order)
    with open(tf.index_path(prefix), "rb") as f:
        same_index = f.read() == index
    with open(tf.data_path(prefix), "rb") as f:
        same_data = f.read() == shards[0]
    return same_index and same_data


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    prefix, expected_path = argv[1], argv[2]
    problems = verify(prefix, expected_path)
    if problems:
        for p in problems:
            print("verify_checkpoint: FAIL:", p, file=sys.stderr)
        return 1
    print(f"verify_checkpoint: OK: {prefix} matches {expected_path}")
    if same_as_tf_layout(prefix):
        print("verify_checkpoint: note: byte-identical to TF's BundleWriter layout for these tensors")
    else:
        print("verify_checkpoint: note: valid, but not byte-identical to TF's BundleWriter layout")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
