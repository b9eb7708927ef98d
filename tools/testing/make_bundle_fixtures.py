#!/usr/bin/python3
"""Writes Foreman's independent TF V2 checkpoint (tensor bundle) fixtures.

    /usr/bin/python3 tools/testing/make_bundle_fixtures.py tests/testdata/independent

A test-only tool: the bundles are built from scratch by tools/testing/
tfformat.py (its own LevelDB table writer, protobuf wire encoding by hand,
TF's data layout), sharing no code with Foreman's C++ writer. Each fixture
directory exercises one feature, so a failing reader points at it; combined/
mixes them. Output is deterministic: re-running rewrites identical bytes.

Besides the bundles it writes expected.json (prefix -> name -> {dtype, shape,
values}; strings base64), expected.txt (the same, line-oriented, for C++) and
README.md, then checks itself:
  - every fixture re-reads with tfformat's independent reader and gives the
    intended values, and shows the feature it is meant to show;
  - TF's real checkpoints in tests/testdata/tf-checkpoints read as their
    READMEs say, and this writer reproduces their .index files byte for
    byte from their tensors (validating both reader and writer against TF).
Exits non-zero with a message when any check fails.
"""

import argparse
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfformat as tf  # noqa: E402

T = tf.Tensor
PREFIX_NAME = "model.ckpt"


def f32(x):
    """The float32 nearest x, as a Python float (exactly representable)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def forge_int32_with_masked_crc(target_masked):
    """An int32 whose 4 little-endian bytes have masked CRC32C == target.
    CRC32C over a fixed 4 bytes is an affine bijection over GF(2)^32, so the
    bytes are found by Gaussian elimination."""
    target = tf.unmask(target_masked) ^ tf.crc(b"\0\0\0\0")
    cols = [tf.crc(struct.pack("<I", 1 << j)) ^ tf.crc(b"\0\0\0\0") for j in range(32)]
    # rows: equation per output bit i: sum_j A[i][j] x_j = target_i
    rows = []
    for i in range(32):
        coeffs = 0
        for j in range(32):
            if (cols[j] >> i) & 1:
                coeffs |= 1 << j
        rows.append([coeffs, (target >> i) & 1])
    pivots = []
    r = 0
    for j in range(32):
        p = next((k for k in range(r, 32) if (rows[k][0] >> j) & 1), None)
        if p is None:
            continue
        rows[r], rows[p] = rows[p], rows[r]
        for k in range(32):
            if k != r and (rows[k][0] >> j) & 1:
                rows[k][0] ^= rows[r][0]
                rows[k][1] ^= rows[r][1]
        pivots.append(j)
        r += 1
    if r != 32:
        raise RuntimeError("CRC32C over 4 bytes should be a bijection")
    x = 0
    for row, j in zip(rows, pivots):
        if row[1]:
            x |= 1 << j
    value = struct.unpack("<i", struct.pack("<I", x))[0]
    assert tf.mask(tf.crc(struct.pack("<i", value))) == target_masked
    return value


# -- the fixtures -----------------------------------------------------------------
# Each: name -> dict(about=..., tensors={name: (Tensor, rule)}, options for
# tfformat.build_bundle, checks=[callables on the re-read Bundle]).

def dtypes_fixture():
    t = {
        "float32_scalar": (T("float32", [], [1.5]), "1.5"),
        "float32_2x3x4": (T("float32", [2, 3, 4], [(i - 12) * 0.25 for i in range(24)]),
                          "(i - 12) * 0.25 for flat index i = 0..23"),
        "float32_empty": (T("float32", [0], []), "no elements"),
        "float32_special": (T("float32", [5], [-0.0, f32(3.4028234663852886e38), f32(1.401298464324817e-45),
                                              f32(-1.1754943508222875e-38), f32(0.1)]),
                            "-0.0, FLT_MAX, smallest denormal 2^-149, -FLT_MIN, float32(0.1)"),
        "float64_vector": (T("float64", [5], [i * 0.1 for i in range(5)]), "i * 0.1 in double, i = 0..4"),
        "float64_scalar": (T("float64", [], [-2.718281828459045]), "-e"),
        "float64_special": (T("float64", [3], [5e-324, 1.7976931348623157e308, -0.0]),
                            "smallest denormal, DBL_MAX, -0.0"),
        "int32_2x3": (T("int32", [2, 3], [i * 1000 - 2500 for i in range(6)]), "i * 1000 - 2500"),
        "int32_scalar": (T("int32", [], [-7]), "-7"),
        "int32_extremes": (T("int32", [2], [-2 ** 31, 2 ** 31 - 1]), "INT32_MIN, INT32_MAX"),
        "int64_vector": (T("int64", [4], [0, -1, 2 ** 40 + 5, -(2 ** 40)]), "0, -1, 2^40 + 5, -2^40"),
        "int64_scalar": (T("int64", [], [2 ** 53 + 1]), "2^53 + 1 (not representable as a double)"),
        "int64_extremes": (T("int64", [2], [-2 ** 63, 2 ** 63 - 1]), "INT64_MIN, INT64_MAX"),
        "int64_empty_0x3": (T("int64", [0, 3], []), "no elements (shape [0,3])"),
        "uint8_2x3x4": (T("uint8", [2, 3, 4], [(i * 10) % 256 for i in range(24)]), "(i * 10) % 256"),
        "uint8_all_256": (T("uint8", [256], list(range(256))), "i = 0..255"),
        "uint8_scalar": (T("uint8", [], [255]), "255"),
    }
    return dict(about="Every supported numeric dtype (float32, float64, int32, int64, uint8) as a "
                      "scalar, vectors, a [2,3,4] tensor and zero-element tensors ([0], [0,3]), "
                      "plus extreme values. Layout exactly as TF writes it.",
                tensors=t, options={}, checks=[])


LONG_300 = bytes(ord("a") + i % 26 for i in range(300))
LONG_16500 = bytes((i * 7 + 3) % 256 for i in range(16500))


def strings_fixture():
    t = {
        "scalar": (T("string", [], [b"hello"]), '"hello"'),
        "vector": (T("string", [4], [b"alpha", b"", b"gamma", b"delta"]),
                   '"alpha", "" (empty), "gamma", "delta"'),
        "long": (T("string", [3], [LONG_300, LONG_16500, b"end"]),
                 "[bytes(ord('a') + i % 26 for i in range(300)) (2-byte varint length), "
                 "bytes((i * 7 + 3) % 256 for i in range(16500)) (3-byte varint length), \"end\"]"),
        "non_ascii": (T("string", [2, 2], ["h\u00e9llo".encode(), "\u65e5\u672c\u8a9e".encode(),
                                           b"\xff\xfe\x80\x00", b"\x00"]),
                      'UTF-8 "h\u00e9llo", UTF-8 "\u65e5\u672c\u8a9e", bytes ff fe 80 00, byte 00'),
        "all_empty": (T("string", [3], [b"", b"", b""]), 'three empty strings'),
        "empty_tensor": (T("string", [0], []), "no elements (4 data bytes: the length checksum alone)"),
        "matrix": (T("string", [2, 3], [f"r{r}c{c}".encode() for r in range(2) for c in range(3)]),
                   '"r<row>c<col>"'),
    }
    return dict(about="DT_STRING tensors in TF's layout: varint64 lengths, the masked CRC32C of the "
                      "lengths (as uint32 LE each), then the bytes. Scalar, vectors with empty "
                      "strings, strings of 300 and 16500 bytes (2- and 3-byte varints), non-ASCII "
                      "and NUL bytes, a zero-element string tensor.",
                tensors=t, options={}, checks=[])


def snappy_fixture():
    t = {}
    for layer in range(25):
        base = f"model/encoder/layer_{layer:02d}/attention/self/query"
        t[base + "/kernel"] = (T("float32", [2, 3], [(layer * 6 + j) * 0.5 for j in range(6)]),
                               "(layer * 6 + j) * 0.5, j = 0..5")
        t[base + "/step"] = (T("int64", [], [layer * 1000]), "layer * 1000")

    def check(b):
        data = [x for x in b.block_types if x[0] == "data"]
        if not data or not all(x[1] == tf.SNAPPY_COMPRESSION for x in data):
            return f"expected every data block snappy-compressed, got {b.block_types}"
        return None
    return dict(about="The .index table's blocks snappy-compressed (block type 1), as LevelDB "
                      "stores a block when compression saves at least 1/8: 50 variables "
                      "model/encoder/layer_NN/attention/self/query/{kernel,step} (float32 [2,3], "
                      "int64 scalar), in one data block stored compressed; the one-entry index "
                      "block and the empty metaindex block stay raw (compression would not save "
                      "1/8; combined/ has a compressed index block). TF itself writes "
                      "uncompressed indexes, but its reader (LevelDB's table format) accepts "
                      "snappy.",
                tensors=t, options=dict(compression=tf.SNAPPY_COMPRESSION), checks=[check])


def multi_block_fixture():
    t = {f"var_{i:03d}": (T("int32", [2], [i, -i]), "[i, -i] for var_<i>") for i in range(200)}

    def check(b):
        data = [x for x in b.block_types if x[0] == "data"]
        index = [x for x in b.block_types if x[0] == "index"]
        if len(data) < 5:
            return f"expected several data blocks, got {len(data)}"
        if not any(x[2] >= 2 for x in data):
            return "expected data blocks with more than one restart point"
        if index[0][3] != len(data):
            return "index entry count differs from the data block count"
        return None
    return dict(about="An .index table of many data blocks (block size 512 bytes: about 20 entries "
                      "a block, so blocks carry 2 restart points, one every 16 keys) and an index "
                      "block with one shortened separator key per data block. Uncompressed. "
                      "200 int32 [2] variables var_000..var_199.",
                tensors=t, options=dict(block_size=512), checks=[check])


def out_of_order_fixture():
    t = {
        "a": (T("float32", [4], [0.5, 1.0, 1.5, 2.0]), "[0.5, 1, 1.5, 2]"),
        "b": (T("int32", [3], [-1, 0, 1]), "[-1, 0, 1]"),
        "c": (T("float64", [2], [1e100, -1e-100]), "[1e100, -1e-100]"),
        "d": (T("string", [2], [b"first", b"second"]), '["first", "second"]'),
        "e": (T("int64", [], [123456789012]), "123456789012"),
        "f": (T("uint8", [3], [7, 8, 9]), "[7, 8, 9]"),
    }
    order = sorted(t, reverse=True)

    def check(b):
        offs = [b.entries[n].offset for n in sorted(t)]
        if not all(x > y for x, y in zip(offs, offs[1:])):
            return f"expected offsets decreasing in key order, got {offs}"
        return None
    return dict(about="Data stored in reverse key order: the data file holds f, e, d, c, b, a, so "
                      "offsets decrease as keys increase (a reader must seek by offset).",
                tensors=t, options=dict(data_order=order), checks=[check])


def _zero_field_tensors():
    crc_zero_value = forge_int32_with_masked_crc(0)
    return {
        "a_first_at_offset_0": (T("float32", [3], [1.0, 2.0, 3.0]), "[1, 2, 3]; stored first: offset 0"),
        "b_scalar": (T("float32", [], [2.5]), "2.5"),
        "c_empty_size_0": (T("float32", [0], []), "no elements: size 0"),
        "d_masked_crc32c_0": (T("int32", [], [crc_zero_value]),
                              f"{crc_zero_value}: chosen so that the masked CRC32C of its 4 bytes is 0"),
        "e_zero_dim_0x3": (T("int64", [0, 3], []), "no elements; first dim has size 0"),
        "f_string_scalar": (T("string", [], [b"no shape"]), '"no shape"'),
    }


def _field_numbers(msg_bytes):
    """Top-level field numbers present in a serialized message, in order."""
    out = []
    pos = 0
    while pos < len(msg_bytes):
        key, pos = tf.get_varint(msg_bytes, pos)
        field, wt = key >> 3, key & 7
        out.append(field)
        if wt == 0:
            _, pos = tf.get_varint(msg_bytes, pos)
        elif wt == 1:
            pos += 8
        elif wt == 5:
            pos += 4
        elif wt == 2:
            n, pos = tf.get_varint(msg_bytes, pos)
            pos += n
        else:
            raise tf.FormatError(f"wire type {wt}")
    return out


def omitted_zero_fields_fixture():
    t = _zero_field_tensors()

    def check(b):
        raw = b.raw
        if raw[b""] != b"\x08\x01":
            return f"header should be num_shards=1 alone, got {raw[b''].hex()}"
        want_missing = {"a_first_at_offset_0": [3, 4], "b_scalar": [2, 3], "c_empty_size_0": [3, 5],
                        "d_masked_crc32c_0": [3, 6], "f_string_scalar": [2, 3]}
        for name, missing in want_missing.items():
            fields = _field_numbers(raw[name.encode()])
            if any(f in fields for f in missing):
                return f"'{name}' should omit fields {missing}, has {fields}"
        return None
    return dict(about="Zero-valued proto3 fields omitted, as a proto3 serializer may: the header is "
                      "num_shards=1 alone (no endianness, no version); scalars have no shape "
                      "field; offset 0, shard_id 0, size 0 and a crc32c of 0 (a value forged so "
                      "its masked CRC32C is 0) are absent; a dimension of size 0 is an empty Dim.",
                tensors=t, options=dict(encoding="minimal"), checks=[check])


def explicit_zero_fields_fixture():
    t = _zero_field_tensors()

    def check(b):
        for name in t:
            fields = _field_numbers(b.raw[name.encode()])
            if fields != [1, 2, 3, 4, 5, 6]:
                return f"'{name}' should carry fields 1..6 explicitly, has {fields}"
        if _field_numbers(b.raw[b""]) != [1, 2, 3]:
            return "header should carry num_shards, endianness and version"
        return None
    return dict(about="The same tensors as omitted_zero_fields/, with every field written "
                      "explicitly even when zero (shard_id 0, offset 0, size 0, crc32c 0, "
                      "endianness LITTLE = 0, min_consumer 0, Dim.size 0): legal protobuf that "
                      "a non-proto3 writer may produce.",
                tensors=t, options=dict(encoding="explicit"), checks=[check])


OBJECT_GRAPH = bytes((i * 37 + 11) % 256 for i in range(150))


def tf2_names_fixture():
    A = "/.ATTRIBUTES/VARIABLE_VALUE"
    t = {
        "_CHECKPOINTABLE_OBJECT_GRAPH": (T("string", [], [OBJECT_GRAPH]),
                                         "bytes((i * 37 + 11) % 256 for i in range(150)) (not a real "
                                         "TrackableObjectGraph)"),
        "layer_with_weights-0/kernel" + A: (T("float32", [3, 2], [i * 0.125 for i in range(6)]), "i * 0.125"),
        "layer_with_weights-0/bias" + A: (T("float32", [2], [0.25, -0.25]), "[0.25, -0.25]"),
        "layer_with_weights-1/kernel" + A: (T("float32", [2, 1], [1.0, -1.0]), "[1, -1]"),
        "layer_with_weights-1/bias" + A: (T("float32", [1], [0.5]), "[0.5]"),
        "layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m" + A:
            (T("float32", [3, 2], [i * -0.5 for i in range(6)]), "i * -0.5"),
        "optimizer/iter" + A: (T("int64", [], [42]), "42"),
        "optimizer/learning_rate" + A: (T("float32", [], [f32(0.001)]), "float32(0.001)"),
        "save_counter" + A: (T("int64", [], [1]), "1"),
    }
    return dict(about="TF2 object-based checkpoint names (tf.train.Checkpoint): "
                      "<path>/.ATTRIBUTES/VARIABLE_VALUE, an optimizer slot, save_counter, and "
                      "_CHECKPOINTABLE_OBJECT_GRAPH as a DT_STRING scalar of arbitrary bytes.",
                tensors=t, options={}, checks=[])


def aligned_data_fixture():
    t = {
        "a": (T("float32", [3], [1.0, 2.0, 3.0]), "[1, 2, 3]"),
        "b": (T("string", [2], [b"x", b"yz"]), '["x", "yz"]'),
        "c": (T("uint8", [5], [1, 2, 3, 4, 5]), "[1, 2, 3, 4, 5]"),
        "d": (T("float64", [1], [-3.5]), "[-3.5]"),
    }

    def check(b):
        offs = [b.entries[n].offset for n in sorted(t)]
        if offs != [0, 64, 128, 192]:
            return f"expected offsets 0, 64, 128, 192, got {offs}"
        return None
    return dict(about="TF's BundleWriter data_alignment = 64: zero padding after each tensor, so "
                      "tensors start at offsets 0, 64, 128, 192 and the data file has gaps (a "
                      "reader must use the entries' offsets, not sum the sizes).",
                tensors=t, options=dict(alignment=64), checks=[check])


def two_shards_fixture():
    t = {
        "a": (T("float32", [2], [1.0, 2.0]), "[1, 2]; shard 0"),
        "b": (T("int64", [2], [3, 4]), "[3, 4]; shard 1"),
        "c": (T("string", [], [b"shard zero"]), '"shard zero"; shard 0'),
        "d": (T("float64", [], [6.25]), "6.25; shard 1"),
    }
    shard = {"a": 0, "b": 1, "c": 0, "d": 1}

    def check(b):
        if b.header.num_shards != 2:
            return "expected num_shards 2"
        got = {n: b.entries[n].shard_id for n in t}
        if got != shard:
            return f"shard ids {got}"
        return None
    return dict(about="A bundle with two data shards (what TF's sharded Saver writes after "
                      "MergeBundles): header num_shards=2, data files model.ckpt.data-00000-of-00002 "
                      "and model.ckpt.data-00001-of-00002; a and c in shard 0, b and d in shard 1.",
                tensors=t, options=dict(num_shards=2, shard_of=lambda n: shard[n]), checks=[check])


def combined_fixture(parts):
    t = {}
    for part_name, part in parts:
        for name, value in part["tensors"].items():
            t[f"{part_name}/{name}"] = value
    order = sorted(t, reverse=True)

    def check(b):
        data = [x for x in b.block_types if x[0] == "data"]
        index = [x for x in b.block_types if x[0] == "index"]
        if len(data) < 5 or not any(x[1] == tf.SNAPPY_COMPRESSION for x in data):
            return f"expected many data blocks, some snappy-compressed: {b.block_types}"
        if index[0][1] != tf.SNAPPY_COMPRESSION:
            return "expected a snappy-compressed index block"
        if b.raw[b""] != b"\x08\x01":
            return "expected the minimal header"
        return None
    return dict(about="Everything at once: the tensors of dtypes/, strings/, tf2_names/, "
                      "out_of_order/, omitted_zero_fields/ and multi_block/ under "
                      "<fixture>/<name>, in one bundle with a snappy-compressed, multi-block "
                      "index (block size 1024), data in reverse key order and zero fields "
                      "omitted.",
                tensors=t, options=dict(compression=tf.SNAPPY_COMPRESSION, block_size=1024,
                                        data_order=order, encoding="minimal"),
                checks=[check])


def all_fixtures():
    fx = [
        ("dtypes", dtypes_fixture()),
        ("strings", strings_fixture()),
        ("snappy", snappy_fixture()),
        ("multi_block", multi_block_fixture()),
        ("out_of_order", out_of_order_fixture()),
        ("omitted_zero_fields", omitted_zero_fields_fixture()),
        ("explicit_zero_fields", explicit_zero_fields_fixture()),
        ("tf2_names", tf2_names_fixture()),
        ("aligned_data", aligned_data_fixture()),
        ("two_shards", two_shards_fixture()),
    ]
    parts = [p for p in fx if p[0] in ("dtypes", "strings", "tf2_names", "out_of_order",
                                       "omitted_zero_fields", "multi_block")]
    fx.append(("combined", combined_fixture(parts)))
    return fx


# -- TF's real checkpoints --------------------------------------------------------------

TF_REAL = {
    # values from the fixtures' README.txt (tensorflow/serving testdata)
    "serving-half_plus_three": {
        "a": T("float32", [], [0.5]), "b": T("float32", [], [3.0]), "c": T("float32", [], [3.0]),
    },
    "serving-half_plus_two_mkl": {
        "a": T("float32", [], [0.5]), "b": T("float32", [], [2.0]), "c": T("float32", [], [3.0]),
        "conv2d/bias": T("float32", [1], [0.0]),
        "conv2d_1/bias": T("float32", [1], [0.0]),
        "conv2d_2/bias": T("float32", [1], [0.0]),
        "conv2d/kernel": T("float32", [1, 1, 1, 1], [f32(-0.522395968)]),
        "conv2d_1/kernel": T("float32", [1, 1, 1, 1], [f32(-1.04511201)]),
        "conv2d_2/kernel": T("float32", [1, 1, 1, 1], [f32(1.57794321)]),
    },
}


def check_tf_real(tf_dir, errors):
    for fixture, expected in TF_REAL.items():
        prefix = os.path.join(tf_dir, fixture, "variables")
        try:
            b = tf.read_bundle(prefix)
        except tf.FormatError as e:
            errors.append(f"TF fixture {fixture}: {e}")
            continue
        if set(b.tensors) != set(expected):
            errors.append(f"TF fixture {fixture}: names {sorted(b.tensors)}, README says {sorted(expected)}")
            continue
        for name, t in expected.items():
            errors.extend(f"TF fixture {fixture}: {d}" for d in tf.compare_tensor(name, t, b.tensors[name]))
        # This writer, fed TF's tensors, must reproduce TF's files byte for byte.
        index, shards, _, _ = tf.build_bundle(b.tensors)
        with open(tf.index_path(prefix), "rb") as f:
            if f.read() != index:
                errors.append(f"TF fixture {fixture}: our writer does not reproduce variables.index")
        with open(tf.data_path(prefix), "rb") as f:
            if f.read() != shards[0]:
                errors.append(f"TF fixture {fixture}: our writer does not reproduce the data file")


# -- output -------------------------------------------------------------------------------

def readme(fixtures, files):
    lines = [
        "# Independent TF V2 checkpoint fixtures",
        "",
        "Generated by `tools/testing/make_bundle_fixtures.py` (do not edit by hand; re-run",
        "`/usr/bin/python3 tools/testing/make_bundle_fixtures.py tests/testdata/independent`,",
        "which is deterministic and re-checks everything it writes).",
        "",
        "**Source:** written from scratch by Foreman's Python test tools",
        "(`tools/testing/tfformat.py`: its own LevelDB-table writer, protobuf wire",
        "encoding by hand, TF's tensor_bundle data layout), sharing no code with",
        "Foreman's C++ bundle writer. The same writer reproduces TF's real",
        "`tests/testdata/tf-checkpoints/*/variables.index` byte for byte, which the",
        "generator checks on every run. **License:** Apache-2.0, as Foreman.",
        "",
        "Each directory holds one bundle with prefix `<dir>/model.ckpt`",
        "(`model.ckpt.index`, `model.ckpt.data-00000-of-00001`; `two_shards/` has two",
        "data files) and shows one feature,",
        "so a failing reader points at it; `combined/` mixes them.",
        "",
        "Expected values, machine-readable:",
        "",
        "- `expected.json`: prefix (relative to this directory) -> name ->",
        "  `{dtype, shape, values}`; values flattened row-major; strings base64.",
        "- `expected.txt`: the same, one line per tensor, for C++:",
        "  `bundle <prefix>` then `tensor <name> <dtype> <shape> <n> <v1> ... <vn>`;",
        "  floats in shortest round-trip decimal, strings as `x` + hex of the bytes.",
        "",
        "Values are exact: every float is compared bitwise (e.g. -0.0 is not 0.0).",
        "In the rules below, `i` is the flat row-major element index.",
        "",
    ]
    for name, fx in fixtures:
        lines.append(f"## {name}/")
        lines.append("")
        lines.append(fx["about"])
        lines.append("")
        lines.append("Files: " + ", ".join(f"`{f}` ({n} bytes)" for f, n in files[name]) + ".")
        lines.append("")
        if name == "combined":
            lines.append(f"{len(fx['tensors'])} tensors: those of the fixtures named above, with the "
                         "same values (see there).")
            lines.append("")
            continue
        lines.append("| name | dtype | shape | values |")
        lines.append("|---|---|---|---|")
        for tname in sorted(fx["tensors"], key=lambda n: n.encode()):
            t, rule = fx["tensors"][tname]
            if name == "multi_block" and tname not in ("var_000", "var_001", "var_199"):
                if tname == "var_002":
                    lines.append("| ... | | | |")
                continue
            lines.append(f"| `{tname}` | {t.dtype} | {tf.format_shape(t.shape)} | {rule} |")
        lines.append("")
    return "\n".join(lines)


def generate(out_dir):
    fixtures = all_fixtures()
    expected_json = {}
    txt = ["# Generated by tools/testing/make_bundle_fixtures.py; do not edit.",
           "# bundle <prefix relative to this file's directory>",
           "# tensor <name> <dtype> <shape> <n> <v1> ... <vn>",
           "#   floats: shortest round-trip decimal; strings: 'x' + hex of the bytes"]
    files = {}
    for name, fx in fixtures:
        d = os.path.join(out_dir, name)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        tensors = {n: v[0] for n, v in fx["tensors"].items()}
        tf.write_bundle(os.path.join(d, PREFIX_NAME), tensors, **fx["options"])
        files[name] = [(f, os.path.getsize(os.path.join(d, f))) for f in sorted(os.listdir(d))]
        rel = f"{name}/{PREFIX_NAME}"
        expected_json[rel] = {n: tf.tensor_to_json(tensors[n]) for n in sorted(tensors, key=lambda s: s.encode())}
        txt.append(f"bundle {rel}")
        for n in sorted(tensors, key=lambda s: s.encode()):
            txt.append(tf.format_tensor_line(n, tensors[n]))
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected_json, f, indent=1, sort_keys=False)
        f.write("\n")
    with open(os.path.join(out_dir, "expected.txt"), "w") as f:
        f.write("\n".join(txt) + "\n")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(readme(fixtures, files) + "\n")
    return fixtures


def self_check(out_dir, fixtures, tf_dir):
    errors = []
    # 1. Every fixture re-reads with the independent reader and shows its feature.
    for name, fx in fixtures:
        prefix = os.path.join(out_dir, name, PREFIX_NAME)
        try:
            b = tf.read_bundle(prefix)
        except tf.FormatError as e:
            errors.append(f"{name}: {e}")
            continue
        want = {n: v[0] for n, v in fx["tensors"].items()}
        if set(b.tensors) != set(want):
            errors.append(f"{name}: names differ: {sorted(set(b.tensors) ^ set(want))}")
            continue
        for n, t in want.items():
            errors.extend(f"{name}: {d}" for d in tf.compare_tensor(n, t, b.tensors[n]))
        for check in fx["checks"]:
            msg = check(b)
            if msg:
                errors.append(f"{name}: {msg}")
    # 2. expected.txt and expected.json say the same as the fixtures.
    groups = tf.parse_expected(os.path.join(out_dir, "expected.txt"))
    with open(os.path.join(out_dir, "expected.json")) as f:
        ej = json.load(f)
    if [g[0] for g in groups] != list(ej):
        errors.append("expected.txt and expected.json list different bundles")
    for prefix, tensors in groups:
        b = tf.read_bundle(os.path.join(out_dir, prefix))
        for n, t in tensors.items():
            errors.extend(f"expected.txt {prefix}: {d}" for d in tf.compare_tensor(n, t, b.tensors.get(n, t)))
            j = ej[prefix][n]
            jt = tf.Tensor(j["dtype"], j["shape"],
                           [__import__("base64").b64decode(v) for v in j["values"]]
                           if j["dtype"] == "string" else j["values"])
            errors.extend(f"expected.json {prefix}: {d}" for d in tf.compare_tensor(n, jt, b.tensors[n]))
    # 3. The files are what the generator builds (deterministic, and not stale).
    for name, fx in fixtures:
        tensors = {n: v[0] for n, v in fx["tensors"].items()}
        index, shards, _, _ = tf.build_bundle(tensors, **fx["options"])
        prefix = os.path.join(out_dir, name, PREFIX_NAME)
        with open(tf.index_path(prefix), "rb") as f:
            if f.read() != index:
                errors.append(f"{name}: the index differs from what the generator builds (re-run it)")
        for i, s in enumerate(shards):
            with open(tf.data_path(prefix, i, len(shards)), "rb") as f:
                if f.read() != s:
                    errors.append(f"{name}: data shard {i} differs from what the generator builds (re-run it)")
    # 4. TF's real checkpoints: our reader agrees with their README, our writer
    #    reproduces their bytes.
    check_tf_real(tf_dir, errors)
    return errors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="e.g. tests/testdata/independent")
    ap.add_argument("--tf-checkpoints", default=os.path.join(here, "..", "..", "tests", "testdata",
                                                              "tf-checkpoints"),
                    help="TF's real fixtures to validate the reader and writer against")
    ap.add_argument("--check-only", action="store_true", help="do not write; only check out_dir")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    fixtures = all_fixtures() if args.check_only else generate(args.out_dir)
    errors = self_check(args.out_dir, fixtures, args.tf_checkpoints)
    if errors:
        for e in errors:
            print("FAIL:", e, file=sys.stderr)
        return 1
    print(f"OK: {len(fixtures)} fixtures in {args.out_dir} {'checked' if args.check_only else 'written'} and re-read; TF's real "
          f"checkpoints in {os.path.normpath(args.tf_checkpoints)} read as documented and "
          f"reproduced byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
