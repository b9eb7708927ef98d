"""Independent readers and writers of TensorFlow's on-disk formats, for tests.

Shared by the Python test tools in tools/testing/ only. Nothing here comes
from Foreman's C++ code or its .proto files: the formats are implemented from
their public descriptions (LevelDB's table format, TensorFlow's
tensor_bundle, record_writer and event/summary protos), so that these tools
can check Foreman's files as a second, independent opinion.

Run with Debian's /usr/bin/python3 (python3-protobuf, python3-crc32c,
python3-snappy).

Contents
  crc32c helpers       crc(), mask(), unmask()            (TF's masked CRC32C)
  varints              put_varint(), get_varint()
  protobuf wire        f_varint(), f_bytes(), f_fixed32(), f_double() (encoding by hand)
  message classes      messages(): TF's messages from a hand-written descriptor
  LevelDB tables       TableWriter, read_table()
  tensor bundles       Tensor, encode_tensor_data(), write_bundle(), read_bundle()
  TFRecord files       read_records()
  expected.txt         format_expected_line(), parse_expected()
"""

import base64
import math
import struct

import crc32c as _crc32c
import snappy as _snappy
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


class FormatError(Exception):
    """A file that does not follow its format; the message says where."""


# -- CRC32C -------------------------------------------------------------------

_MASK_DELTA = 0xA282EAD8


def crc(data, init=0):
    """CRC32C (Castagnoli) of `data`, extending `init`."""
    return _crc32c.crc32c(bytes(data), init) & 0xFFFFFFFF


def mask(c):
    """TF/LevelDB's masked CRC: rotate right by 15 bits, add a constant."""
    c &= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(m):
    r = (m - _MASK_DELTA) & 0xFFFFFFFF
    return ((r >> 17) | (r << 15)) & 0xFFFFFFFF


def masked_crc(data):
    return mask(crc(data))


# -- varints ------------------------------------------------------------------

def put_varint(n):
    """Base-128 varint, least significant group first (LevelDB / protobuf)."""
    if n < 0:
        n &= (1 << 64) - 1  # protobuf encodes negative int32/int64 as 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def get_varint(buf, pos, what="varint", max_bytes=10):
    """Decodes a varint at buf[pos:]; returns (value, new_pos)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= len(buf):
            raise FormatError(f"{what}: truncated varint at offset {start}")
        if pos - start >= max_bytes:
            raise FormatError(f"{what}: varint longer than {max_bytes} bytes at offset {start}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


# -- protobuf wire format, by hand ---------------------------------------------
# Wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.

def _key(field, wire_type):
    return put_varint((field << 3) | wire_type)


def f_varint(field, value):
    return _key(field, 0) + put_varint(int(value))


def f_bytes(field, value):
    value = bytes(value)
    return _key(field, 2) + put_varint(len(value)) + value


def f_fixed32(field, value):
    return _key(field, 5) + struct.pack("<I", value & 0xFFFFFFFF)


def f_double(field, value):
    return _key(field, 1) + struct.pack("<d", value)


# -- TF's messages from a hand-written descriptor --------------------------------
# Field numbers are TensorFlow's public wire format (tensor_bundle.proto,
# tensor_shape.proto, versions.proto, tensor_slice.proto, tensor.proto,
# summary.proto, event.proto). Enums are declared as int32 where only their
# numbers matter (same varint encoding).

_T = descriptor_pb2.FieldDescriptorProto
_TYPES = {
    "double": _T.TYPE_DOUBLE, "float": _T.TYPE_FLOAT, "int64": _T.TYPE_INT64,
    "int32": _T.TYPE_INT32, "fixed32": _T.TYPE_FIXED32, "bool": _T.TYPE_BOOL,
    "string": _T.TYPE_STRING, "bytes": _T.TYPE_BYTES, "uint32": _T.TYPE_UINT32,
    "uint64": _T.TYPE_UINT64,
}


def _message(name, fields, nested=(), oneofs=()):
    """fields: (name, number, type, 'opt'|'rep', oneof_name or None).
    type is a scalar type name or '.tensorflow.Message' for messages."""
    m = descriptor_pb2.DescriptorProto(name=name)
    for o in oneofs:
        m.oneof_decl.add(name=o)
    for fname, number, ftype, label, oneof in fields:
        f = m.field.add(name=fname, number=number)
        f.label = _T.LABEL_REPEATED if label == "rep" else _T.LABEL_OPTIONAL
        if ftype.startswith("."):
            f.type = _T.TYPE_MESSAGE
            f.type_name = ftype
        else:
            f.type = _TYPES[ftype]
        if oneof is not None:
            f.oneof_index = list(oneofs).index(oneof)
    for n in nested:
        m.nested_type.add().CopyFrom(n)
    return m


def _build_messages():
    fdp = descriptor_pb2.FileDescriptorProto(
        name="foreman_tests_independent_tf.proto", package="tensorflow", syntax="proto3")
    M = "opt"
    R = "rep"
    msgs = [
        _message("TensorShapeProto", [
            ("dim", 2, ".tensorflow.TensorShapeProto.Dim", R, None),
            ("unknown_rank", 3, "bool", M, None),
        ], nested=[_message("Dim", [("size", 1, "int64", M, None), ("name", 2, "string", M, None)])]),
        _message("VersionDef", [
            ("producer", 1, "int32", M, None),
            ("min_consumer", 2, "int32", M, None),
            ("bad_consumers", 3, "int32", R, None),
        ]),
        _message("TensorSliceProto", [
            ("extent", 1, ".tensorflow.TensorSliceProto.Extent", R, None),
        ], nested=[_message("Extent", [
            ("start", 1, "int64", M, None),
            ("length", 2, "int64", M, "has_length"),
        ], oneofs=["has_length"])]),
        _message("BundleHeaderProto", [
            ("num_shards", 1, "int32", M, None),
            ("endianness", 2, "int32", M, None),   # enum Endianness {LITTLE = 0; BIG = 1;}
            ("version", 3, ".tensorflow.VersionDef", M, None),
        ]),
        _message("BundleEntryProto", [
            ("dtype", 1, "int32", M, None),        # enum DataType
            ("shape", 2, ".tensorflow.TensorShapeProto", M, None),
            ("shard_id", 3, "int32", M, None),
            ("offset", 4, "int64", M, None),
            ("size", 5, "int64", M, None),
            ("crc32c", 6, "fixed32", M, None),
            ("slices", 7, ".tensorflow.TensorSliceProto", R, None),
        ]),
        _message("TensorProto", [
            ("dtype", 1, "int32", M, None),
            ("tensor_shape", 2, ".tensorflow.TensorShapeProto", M, None),
            ("version_number", 3, "int32", M, None),
            ("tensor_content", 4, "bytes", M, None),
            ("half_val", 13, "int32", R, None),
            ("float_val", 5, "float", R, None),
            ("double_val", 6, "double", R, None),
            ("int_val", 7, "int32", R, None),
            ("string_val", 8, "bytes", R, None),
            ("scomplex_val", 9, "float", R, None),
            ("int64_val", 10, "int64", R, None),
            ("bool_val", 11, "bool", R, None),
            ("dcomplex_val", 12, "double", R, None),
            ("uint32_val", 16, "uint32", R, None),
            ("uint64_val", 17, "uint64", R, None),
        ]),
        _message("HistogramProto", [
            ("min", 1, "double", M, None),
            ("max", 2, "double", M, None),
            ("num", 3, "double", M, None),
            ("sum", 4, "double", M, None),
            ("sum_squares", 5, "double", M, None),
            ("bucket_limit", 6, "double", R, None),
            ("bucket", 7, "double", R, None),
        ]),
        _message("SummaryMetadata", [
            ("plugin_data", 1, ".tensorflow.SummaryMetadata.PluginData", M, None),
            ("display_name", 2, "string", M, None),
            ("summary_description", 3, "string", M, None),
            ("data_class", 4, "int32", M, None),
        ], nested=[_message("PluginData", [
            ("plugin_name", 1, "string", M, None),
            ("content", 2, "bytes", M, None),
        ])]),
        _message("Summary", [
            ("value", 1, ".tensorflow.Summary.Value", R, None),
        ], nested=[_message("Value", [
            ("node_name", 7, "string", M, None),
            ("tag", 1, "string", M, None),
            ("metadata", 9, ".tensorflow.SummaryMetadata", M, None),
            ("simple_value", 2, "float", M, "value"),
            ("obsolete_old_style_histogram", 3, "bytes", M, "value"),
            ("image", 4, "bytes", M, "value"),      # a message; kept as bytes here
            ("histo", 5, ".tensorflow.HistogramProto", M, "value"),
            ("audio", 6, "bytes", M, "value"),      # a message; kept as bytes here
            ("tensor", 8, ".tensorflow.TensorProto", M, "value"),
        ], oneofs=["value"])]),
        _message("LogMessage", [
            ("level", 1, "int32", M, None),
            ("message", 2, "string", M, None),
        ]),
        _message("SessionLog", [
            ("status", 1, "int32", M, None),       # STATUS_UNSPECIFIED 0, START 1, STOP 2, CHECKPOINT 3
            ("checkpoint_path", 2, "string", M, None),
            ("msg", 3, "string", M, None),
        ]),
        _message("TaggedRunMetadata", [
            ("tag", 1, "string", M, None),
            ("run_metadata", 2, "bytes", M, None),
        ]),
        _message("Event", [
            ("wall_time", 1, "double", M, None),
            ("step", 2, "int64", M, None),
            ("file_version", 3, "string", M, "what"),
            ("graph_def", 4, "bytes", M, "what"),
            ("summary", 5, ".tensorflow.Summary", M, "what"),
            ("log_message", 6, ".tensorflow.LogMessage", M, "what"),
            ("session_log", 7, ".tensorflow.SessionLog", M, "what"),
            ("tagged_run_metadata", 8, ".tensorflow.TaggedRunMetadata", M, "what"),
            ("meta_graph_def", 9, "bytes", M, "what"),
        ], oneofs=["what"]),
    ]
    for m in msgs:
        fdp.message_type.add().CopyFrom(m)
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(fdp)
    factory = message_factory.MessageFactory(pool)
    out = {}
    for m in msgs:
        desc = pool.FindMessageTypeByName("tensorflow." + m.name)
        out[m.name] = factory.GetPrototype(desc)
    del fd
    return out


_MESSAGES = None


def messages():
    """{'BundleEntryProto': class, 'Event': class, ...}"""
    global _MESSAGES
    if _MESSAGES is None:
        _MESSAGES = _build_messages()
    return _MESSAGES


def parse_message(name, data, what):
    msg = messages()[name]()
    try:
        n = msg.ParseFromString(bytes(data))
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise FormatError(f"{what}: not a valid {name}: {e}") from None
    if n is not None and n != len(data):
        raise FormatError(f"{what}: {name} parsed {n} of {len(data)} bytes")
    return msg


# -- LevelDB tables --------------------------------------------------------------
# A table: data blocks, a metaindex block, an index block, a 48-byte footer.
# Block: entries (varint shared, varint non_shared, varint value_len, key delta,
# value), uint32 restart offsets, uint32 restart count; then a 5-byte trailer
# (type: 0 raw, 1 snappy; masked CRC32C of the stored contents + type byte).
# Footer: metaindex and index BlockHandles (varint64 offset, varint64 size),
# zero-padded to 40 bytes, then the magic number, fixed64 little-endian.

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
NO_COMPRESSION = 0
SNAPPY_COMPRESSION = 1


def _common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shortest_separator(start, limit):
    """A short key k with start <= k < limit (LevelDB's bytewise rule)."""
    i = _common_prefix(start, limit)
    if i >= min(len(start), len(limit)):
        return start  # one is a prefix of the other
    b = start[i]
    if b < 0xFF and b + 1 < limit[i]:
        return start[:i] + bytes([b + 1])
    return start


def short_successor(key):
    """A short key k >= key."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


class _BlockBuilder:
    def __init__(self, restart_interval):
        self.restart_interval = restart_interval
        self.reset()

    def reset(self):
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""
        self.count = 0

    def add(self, key, value):
        shared = 0
        if self.counter < self.restart_interval:
            shared = _common_prefix(self.last_key, key)
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += put_varint(shared) + put_varint(len(key) - shared) + put_varint(len(value))
        self.buf += key[shared:] + value
        self.last_key = key
        self.counter += 1
        self.count += 1

    def size_estimate(self):
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self):
        out = bytes(self.buf) + b"".join(struct.pack("<I", r) for r in self.restarts)
        return out + struct.pack("<I", len(self.restarts))


class TableWriter:
    """Builds a LevelDB-format table in memory. Keys must be added in strictly
    increasing bytewise order. A data block is cut once its estimated size
    reaches block_size; index entries use shortened separator keys."""

    def __init__(self, block_size=4096, restart_interval=16, compression=NO_COMPRESSION,
                 index_restart_interval=1):
        self.block_size = block_size
        self.compression = compression
        self.out = bytearray()
        self.data = _BlockBuilder(restart_interval)
        self.index = _BlockBuilder(index_restart_interval)
        self.restart_interval = restart_interval
        self.last_key = None
        self.pending_handle = None
        self.block_types = []   # (kind, type byte) of every block written

    def add(self, key, value):
        key = bytes(key)
        if self.last_key is not None and key <= self.last_key:
            raise ValueError(f"keys out of order: {self.last_key!r} then {key!r}")
        if self.pending_handle is not None:
            self.index.add(shortest_separator(self.last_key, key), self._handle(self.pending_handle))
            self.pending_handle = None
        self.data.add(key, bytes(value))
        self.last_key = key
        if self.data.size_estimate() >= self.block_size:
            self._flush()

    @staticmethod
    def _handle(h):
        return put_varint(h[0]) + put_varint(h[1])

    def _flush(self):
        if self.data.count == 0:
            return
        self.pending_handle = self._write_block(self.data.finish(), "data")
        self.data.reset()

    def _write_block(self, raw, kind):
        block_type = NO_COMPRESSION
        contents = raw
        if self.compression == SNAPPY_COMPRESSION:
            c = _snappy.compress(raw)
            if len(c) < len(raw) - len(raw) // 8:   # keep only if it saves >= 12.5%
                contents = c
                block_type = SNAPPY_COMPRESSION
        handle = (len(self.out), len(contents))
        self.out += contents
        self.out += bytes([block_type])
        self.out += struct.pack("<I", mask(crc(contents + bytes([block_type]))))
        self.block_types.append((kind, block_type))
        return handle

    def finish(self):
        self._flush()
        meta_handle = self._write_block(_BlockBuilder(self.restart_interval).finish(), "metaindex")
        if self.pending_handle is not None:
            self.index.add(short_successor(self.last_key), self._handle(self.pending_handle))
            self.pending_handle = None
        index_handle = self._write_block(self.index.finish(), "index")
        footer = self._handle(meta_handle) + self._handle(index_handle)
        footer += b"\0" * (40 - len(footer)) + struct.pack("<Q", TABLE_MAGIC)
        self.out += footer
        return bytes(self.out)


def _decode_handle(buf, pos, what):
    off, pos = get_varint(buf, pos, what)
    size, pos = get_varint(buf, pos, what)
    return (off, size), pos


def _read_block(data, handle, what, stats=None):
    off, size = handle
    if off + size + BLOCK_TRAILER_SIZE > len(data) - FOOTER_SIZE:
        raise FormatError(f"{what}: block handle ({off}, {size}) runs past the table's data")
    contents = bytes(data[off:off + size])
    btype = data[off + size]
    (stored,) = struct.unpack_from("<I", data, off + size + 1)
    actual = crc(contents + bytes([btype]))
    if unmask(stored) != actual:
        raise FormatError(f"{what}: block at offset {off}: crc32c mismatch "
                          f"(stored {unmask(stored):#010x}, actual {actual:#010x})")
    if btype == SNAPPY_COMPRESSION:
        try:
            contents = _snappy.uncompress(contents)
        except Exception as e:
            raise FormatError(f"{what}: block at offset {off}: bad snappy data: {e}") from None
    elif btype != NO_COMPRESSION:
        raise FormatError(f"{what}: block at offset {off}: unknown compression type {btype}")
    entries, num_restarts = _parse_block(contents, f"{what} (block at offset {off})")
    if stats is not None:
        stats.append((btype, num_restarts, len(entries)))
    return entries


def _parse_block(b, what):
    if len(b) < 4:
        raise FormatError(f"{what}: block of {len(b)} bytes is too short")
    (num_restarts,) = struct.unpack_from("<I", b, len(b) - 4)
    if num_restarts < 1 or 4 * (num_restarts + 1) > len(b):
        raise FormatError(f"{what}: bad restart count {num_restarts}")
    limit = len(b) - 4 * (num_restarts + 1)
    restarts = list(struct.unpack_from(f"<{num_restarts}I", b, limit))
    if restarts[0] != 0:
        raise FormatError(f"{what}: first restart point is {restarts[0]}, not 0")
    entries = []
    starts = []
    pos = 0
    key = b""
    while pos < limit:
        starts.append(pos)
        shared, pos = get_varint(b, pos, what, 5)
        non_shared, pos = get_varint(b, pos, what, 5)
        vlen, pos = get_varint(b, pos, what, 5)
        if shared > len(key) or pos + non_shared + vlen > limit:
            raise FormatError(f"{what}: corrupt entry at offset {starts[-1]}")
        if starts[-1] in restarts and shared != 0:
            raise FormatError(f"{what}: entry at restart point {starts[-1]} shares {shared} key bytes")
        key = key[:shared] + bytes(b[pos:pos + non_shared])
        pos += non_shared
        entries.append((key, bytes(b[pos:pos + vlen])))
        pos += vlen
    for r in restarts:
        if limit > 0 and r not in starts:
            raise FormatError(f"{what}: restart point {r} is not the start of an entry")
    return entries, num_restarts


def read_table(data, what="table", stats=None):
    """Every (key, value) of a LevelDB table, checked: footer magic, every
    block's CRC, restart points, key order, index separators. `stats`, a list,
    receives ('data'|'index'|'metaindex', compression type, restart count,
    entry count) per block."""
    data = bytes(data)
    if len(data) < FOOTER_SIZE:
        raise FormatError(f"{what}: {len(data)} bytes is too short for a table")
    footer = data[-FOOTER_SIZE:]
    (magic,) = struct.unpack_from("<Q", footer, 40)
    if magic != TABLE_MAGIC:
        raise FormatError(f"{what}: bad table magic {magic:#018x}")
    meta_handle, pos = _decode_handle(footer, 0, what + " footer")
    index_handle, pos = _decode_handle(footer, pos, what + " footer")
    if pos > 40:
        raise FormatError(f"{what}: footer handles overflow the 40-byte area")
    t = []
    meta = _read_block(data, meta_handle, what + " metaindex", t)
    if stats is not None:
        stats.append(("metaindex",) + t[-1])
    index = _read_block(data, index_handle, what + " index", t)
    if stats is not None:
        stats.append(("index",) + t[-1])
    del meta
    out = []
    prev_sep = None
    for sep, hbytes in index:
        handle, hpos = _decode_handle(hbytes, 0, what + " index entry")
        if hpos != len(hbytes):
            raise FormatError(f"{what}: index entry {sep!r} has {len(hbytes) - hpos} trailing bytes")
        block = _read_block(data, handle, what + " data", t)
        if stats is not None:
            stats.append(("data",) + t[-1])
        if not block:
            raise FormatError(f"{what}: empty data block at offset {handle[0]}")
        if block[-1][0] > sep:
            raise FormatError(f"{what}: index key {sep!r} is below its block's last key {block[-1][0]!r}")
        if prev_sep is not None and block[0][0] <= prev_sep:
            raise FormatError(f"{what}: block key {block[0][0]!r} is not above the previous index key")
        prev_sep = sep
        out.extend(block)
    for (a, _), (b, _) in zip(out, out[1:]):
        if not a < b:
            raise FormatError(f"{what}: keys not strictly increasing: {a!r} then {b!r}")
    return out


# -- tensor bundles ----------------------------------------------------------------

# name -> (TF DataType number, struct code, bytes per element)
DTYPES = {
    "float32": (1, "f", 4),
    "float64": (2, "d", 8),
    "int32": (3, "i", 4),
    "uint8": (4, "B", 1),
    "string": (7, None, 0),
    "int64": (9, "q", 8),
}
DTYPE_BY_ENUM = {v[0]: k for k, v in DTYPES.items()}


def num_elements(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Tensor:
    """dtype name, shape (list of ints), values (flat row-major list; str/bytes
    elements for strings, Python numbers otherwise)."""

    def __init__(self, dtype, shape, values):
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype}")
        self.dtype = dtype
        self.shape = list(shape)
        if dtype == "string":
            values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
        self.values = list(values)
        if len(self.values) != num_elements(self.shape):
            raise ValueError(f"{len(self.values)} values for shape {self.shape}")

    def __repr__(self):
        return f"Tensor({self.dtype}, {self.shape}, {self.values!r})"


def encode_tensor_data(t):
    """(bytes in the data file, unmasked CRC32C that the entry's crc32c masks).

    Numbers: little-endian, row-major; the CRC is over those bytes.
    Strings (TF's tensor_bundle.cc WriteStringTensor):
      varint64 length of each element,
      uint32 LE masked CRC32C of the lengths, each taken as a fixed uint32 LE
        (fixed uint64 LE for a length above 2^32-1) -- not of the varint bytes,
      the elements' bytes back to back.
      The entry's CRC runs over the lengths (as uint32/uint64, the same bytes as
      the length checksum), then the 4 stored length-checksum bytes, then the
      elements' bytes."""
    if t.dtype != "string":
        code = DTYPES[t.dtype][1]
        b = struct.pack(f"<{len(t.values)}{code}", *t.values)
        return b, crc(b)
    lengths = b""
    c = 0
    for s in t.values:
        lengths += put_varint(len(s))
        c = crc(struct.pack("<I", len(s)) if len(s) <= 0xFFFFFFFF else struct.pack("<Q", len(s)), c)
    checksum = struct.pack("<I", mask(c))
    c = crc(checksum, c)
    body = b""
    for s in t.values:
        body += s
        c = crc(s, c)
    return lengths + checksum + body, c


def _encode_shape(shape, encoding):
    out = b""
    for d in shape:
        dim = f_varint(1, d) if (d != 0 or encoding == "explicit") else b""
        out += f_bytes(2, dim)
    return out


def encode_entry(dtype, shape, shard_id, offset, size, masked_crc32c, encoding="tf"):
    """A BundleEntryProto, by hand, fields in number order.
    encoding 'tf':       as TF's proto3 C++ serializer: zero scalars omitted,
                         the shape always present (empty for a scalar).
    encoding 'minimal':  as 'tf', and the shape omitted too when it is a scalar.
    encoding 'explicit': every field written, zeros included."""
    explicit = encoding == "explicit"
    out = f_varint(1, DTYPES[dtype][0])
    if shape or encoding != "minimal":
        out += f_bytes(2, _encode_shape(shape, encoding))
    if shard_id or explicit:
        out += f_varint(3, shard_id)
    if offset or explicit:
        out += f_varint(4, offset)
    if size or explicit:
        out += f_varint(5, size)
    if masked_crc32c or explicit:
        out += f_fixed32(6, masked_crc32c)
    return out


def encode_header(num_shards, encoding="tf", producer=1):
    """A BundleHeaderProto (little-endian).
    'tf':       num_shards, version{producer}  (what TF writes: LITTLE = 0 and
                min_consumer = 0 are omitted)
    'minimal':  num_shards only (no version: producer 0, accepted by TF)
    'explicit': num_shards, endianness 0, version{producer, min_consumer 0}"""
    if encoding == "minimal":
        return f_varint(1, num_shards)
    if encoding == "explicit":
        return f_varint(1, num_shards) + f_varint(2, 0) + f_bytes(3, f_varint(1, producer) + f_varint(2, 0))
    return f_varint(1, num_shards) + f_bytes(3, f_varint(1, producer))


def data_path(prefix, shard=0, num_shards=1):
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def index_path(prefix):
    return prefix + ".index"


def build_bundle(tensors, *, data_order=None, encoding="tf", compression=NO_COMPRESSION,
                 block_size=4096, restart_interval=16, alignment=1, num_shards=1, shard_of=None):
    """Lays out a bundle in memory. tensors: {name: Tensor}.
    data_order: names in the order their bytes go into the data file(s)
    (default: sorted). alignment: TF's data_alignment (zero padding after each
    tensor so the next starts at a multiple). shard_of: name -> shard id.
    Returns (index bytes, [data bytes per shard], {name: entry dict}, TableWriter)."""
    names = sorted(tensors, key=lambda n: n.encode("utf-8"))
    order = list(data_order) if data_order is not None else names
    if sorted(order) != sorted(names):
        raise ValueError("data_order must list every tensor once")
    shards = [bytearray() for _ in range(num_shards)]
    entries = {}
    for name in order:
        t = tensors[name]
        shard = shard_of(name) if shard_of else 0
        buf = shards[shard]
        payload, c = encode_tensor_data(t)
        entries[name] = dict(dtype=t.dtype, shape=t.shape, shard_id=shard, offset=len(buf),
                             size=len(payload), crc32c=mask(c))
        buf += payload
        if alignment > 1 and len(buf) % alignment:
            buf += b"\0" * (alignment - len(buf) % alignment)
    table = TableWriter(block_size=block_size, restart_interval=restart_interval, compression=compression)
    table.add(b"", encode_header(num_shards, encoding))
    for name in names:
        e = entries[name]
        table.add(name.encode("utf-8"),
                  encode_entry(e["dtype"], e["shape"], e["shard_id"], e["offset"], e["size"],
                               e["crc32c"], encoding))
    return table.finish(), [bytes(s) for s in shards], entries, table


def write_bundle(prefix, tensors, **kwargs):
    index, shards, entries, table = build_bundle(tensors, **kwargs)
    with open(index_path(prefix), "wb") as f:
        f.write(index)
    for i, s in enumerate(shards):
        with open(data_path(prefix, i, len(shards)), "wb") as f:
            f.write(s)
    return entries, table


def _decode_string_tensor(buf, n, name, what):
    """Returns (values, unmasked crc as TF computes it)."""
    pos = 0
    lengths = []
    c = 0
    for i in range(n):
        ln, pos = get_varint(buf, pos, f"{what}: string length {i}")
        lengths.append(ln)
        c = crc(struct.pack("<I", ln) if ln <= 0xFFFFFFFF else struct.pack("<Q", ln), c)
    if pos + 4 > len(buf):
        raise FormatError(f"{what}: string lengths run past the entry's size")
    (stored,) = struct.unpack_from("<I", buf, pos)
    if unmask(stored) != c:
        raise FormatError(f"{what}: string length checksum mismatch (stored {unmask(stored):#010x}, "
                          f"computed over the lengths as uint32 {c:#010x}; over the varint bytes it "
                          f"would be {crc(buf[:pos]):#010x})")
    c = crc(buf[pos:pos + 4], c)
    pos += 4
    values = []
    for i, ln in enumerate(lengths):
        if pos + ln > len(buf):
            raise FormatError(f"{what}: string {i} ({ln} bytes) runs past the entry's size")
        values.append(bytes(buf[pos:pos + ln]))
        c = crc(buf[pos:pos + ln], c)
        pos += ln
    if pos != len(buf):
        raise FormatError(f"{what}: {len(buf) - pos} bytes left after the strings")
    return values, c


class Bundle:
    """What read_bundle() found: header (parsed), entries {name: entry
    message}, tensors {name: Tensor}, block_types (read_table's stats), raw
    {key bytes: value bytes} of the index table."""

    def __init__(self):
        self.raw = {}
        self.header = None
        self.entries = {}
        self.tensors = {}
        self.block_types = []


def read_bundle(prefix):
    """Reads and fully checks a TF V2 bundle; raises FormatError naming the
    file and variable on any problem."""
    ipath = index_path(prefix)
    try:
        with open(ipath, "rb") as f:
            index = f.read()
    except OSError as e:
        raise FormatError(f"{ipath}: cannot read: {e}") from None
    b = Bundle()
    kv = read_table(index, ipath, b.block_types)
    b.raw = dict(kv)
    if not kv or kv[0][0] != b"":
        raise FormatError(f"{ipath}: the first key is not the header key \"\"")
    b.header = parse_message("BundleHeaderProto", kv[0][1], f"{ipath}: header")
    h = b.header
    if h.num_shards < 1:
        raise FormatError(f"{ipath}: header num_shards = {h.num_shards}")
    if h.endianness != 0:
        raise FormatError(f"{ipath}: header endianness = {h.endianness} (not LITTLE)")
    if h.version.producer < 0 or h.version.min_consumer > 1 or 1 in h.version.bad_consumers:
        raise FormatError(f"{ipath}: header version {h.version} excludes consumer version 1")
    shards = {}
    for key, value in kv[1:]:
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{ipath}: key {key!r} is not UTF-8") from None
        what = f"{ipath}: entry '{name}'"
        e = parse_message("BundleEntryProto", value, what)
        b.entries[name] = e
        if e.slices:
            raise FormatError(f"{what}: partitioned (sliced) variables are not expected")
        if e.dtype not in DTYPE_BY_ENUM:
            raise FormatError(f"{what}: unsupported dtype {e.dtype}")
        dtype = DTYPE_BY_ENUM[e.dtype]
        if e.shape.unknown_rank:
            raise FormatError(f"{what}: unknown rank")
        shape = [d.size for d in e.shape.dim]
        if any(d < 0 for d in shape):
            raise FormatError(f"{what}: negative dimension in {shape}")
        if not 0 <= e.shard_id < h.num_shards:
            raise FormatError(f"{what}: shard_id {e.shard_id} outside [0, {h.num_shards})")
        dpath = data_path(prefix, e.shard_id, h.num_shards)
        what = f"{dpath}: variable '{name}'"
        if dpath not in shards:
            try:
                with open(dpath, "rb") as f:
                    shards[dpath] = f.read()
            except OSError as err:
                raise FormatError(f"{dpath}: cannot read: {err}") from None
        data = shards[dpath]
        if e.offset < 0 or e.size < 0 or e.offset + e.size > len(data):
            raise FormatError(f"{what}: bytes [{e.offset}, {e.offset + e.size}) outside the "
                              f"{len(data)}-byte file")
        buf = data[e.offset:e.offset + e.size]
        n = num_elements(shape)
        if dtype == "string":
            if e.size == 0 and n == 0:
                values, c = [], 0   # TF reads nothing for size 0
            else:
                values, c = _decode_string_tensor(buf, n, name, what)
        else:
            code, width = DTYPES[dtype][1], DTYPES[dtype][2]
            if e.size != n * width:
                raise FormatError(f"{what}: size {e.size}, expected {n} x {width} bytes")
            values = list(struct.unpack(f"<{n}{code}", buf))
            c = crc(buf)
        if unmask(e.crc32c) != c:
            raise FormatError(f"{what}: crc32c mismatch (entry says {unmask(e.crc32c):#010x}, "
                              f"data gives {c:#010x})")
        b.tensors[name] = Tensor(dtype, shape, values)
    return b


# -- comparing values -------------------------------------------------------------

def same_value(dtype, a, b):
    """Exact equality: bitwise for floats (so -0.0 != 0.0), any NaN == any NaN."""
    if dtype == "string":
        return bytes(a) == bytes(b)
    if dtype in ("float32", "float64"):
        a = float(a)
        b = float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        code = DTYPES[dtype][1]
        return struct.pack("<" + code, a) == struct.pack("<" + code, b)
    return int(a) == int(b)


def compare_tensor(name, expected, actual):
    """A list of human-readable differences (empty when equal)."""
    diffs = []
    if expected.dtype != actual.dtype:
        diffs.append(f"'{name}': dtype {actual.dtype}, expected {expected.dtype}")
        return diffs
    if expected.shape != actual.shape:
        diffs.append(f"'{name}': shape {actual.shape}, expected {expected.shape}")
        return diffs
    bad = [i for i, (x, y) in enumerate(zip(expected.values, actual.values))
           if not same_value(expected.dtype, x, y)]
    if bad:
        i = bad[0]
        diffs.append(f"'{name}': {len(bad)} of {len(expected.values)} values differ; first at flat "
                     f"index {i}: got {actual.values[i]!r}, expected {expected.values[i]!r}")
    return diffs


# -- expected.txt --------------------------------------------------------------------
# Line-oriented, for C++ tests to parse with an istringstream:
#   # comment
#   bundle <prefix, relative to the file's directory>
#   tensor <name> <dtype> <shape> <n> <v1> ... <vn>
# shape "[2,3]" or "[]"; numbers in decimal (floats: shortest round-trip form,
# nan / inf / -inf allowed); strings as "x" + lowercase hex of their bytes
# ("x" alone for the empty string). Names contain no whitespace.

def format_value(dtype, v):
    if dtype == "string":
        return "x" + bytes(v).hex()
    if dtype in ("float32", "float64"):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(int(v))


def parse_value(dtype, tok):
    if dtype == "string":
        if not tok.startswith("x"):
            raise ValueError(f"string value {tok!r} does not start with 'x'")
        return bytes.fromhex(tok[1:])
    if dtype in ("float32", "float64"):
        return float(tok)
    return int(tok)


def format_shape(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


def parse_shape(tok):
    if not (tok.startswith("[") and tok.endswith("]")):
        raise ValueError(f"bad shape {tok!r}")
    inner = tok[1:-1]
    return [int(x) for x in inner.split(",")] if inner else []


def format_tensor_line(name, t):
    if any(ch.isspace() for ch in name):
        raise ValueError(f"name {name!r} contains whitespace")
    vals = " ".join(format_value(t.dtype, v) for v in t.values)
    line = f"tensor {name} {t.dtype} {format_shape(t.shape)} {len(t.values)}"
    return line + (" " + vals if vals else "")


def parse_expected(path):
    """[(prefix or None, {name: Tensor})] in file order; tensors before any
    'bundle' line go to prefix None."""
    groups = [(None, {})]
    with open(path, "r", encoding="ascii") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            toks = line.split()
            try:
                if toks[0] == "bundle" and len(toks) == 2:
                    groups.append((toks[1], {}))
                elif toks[0] == "tensor" and len(toks) >= 5:
                    name, dtype, shape, n = toks[1], toks[2], parse_shape(toks[3]), int(toks[4])
                    vals = [parse_value(dtype, t) for t in toks[5:]]
                    if len(vals) != n:
                        raise ValueError(f"{n} values announced, {len(vals)} given")
                    groups[-1][1][name] = Tensor(dtype, shape, vals)
                else:
                    raise ValueError("unknown line")
            except (ValueError, KeyError, IndexError) as e:
                raise FormatError(f"{path}:{lineno}: {e}") from None
    if not groups[0][1]:
        groups.pop(0)
    return groups


def tensor_to_json(t):
    if t.dtype == "string":
        vals = [base64.b64encode(v).decode("ascii") for v in t.values]
    else:
        vals = list(t.values)
    return {"dtype": t.dtype, "shape": t.shape, "values": vals}


# -- TFRecord files ------------------------------------------------------------------

def read_records(data, what="records"):
    """[(offset, payload)]; each record is uint64 LE length, uint32 LE masked
    CRC32C of those 8 bytes, the payload, uint32 LE masked CRC32C of it."""
    out = []
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise FormatError(f"{what}: record at offset {pos}: header cut short "
                              f"({len(data) - pos} bytes)")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (lcrc,) = struct.unpack_from("<I", data, pos + 8)
        if unmask(lcrc) != crc(header):
            raise FormatError(f"{what}: record at offset {pos}: length crc mismatch")
        if pos + 12 + length + 4 > len(data):
            raise FormatError(f"{what}: record at offset {pos}: {length}-byte payload cut short")
        payload = data[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if unmask(dcrc) != crc(payload):
            raise FormatError(f"{what}: record at offset {pos}: data crc mismatch")
        out.append((pos, bytes(payload)))
        pos += 12 + length + 4
    return out


def frame_record(payload):
    header = struct.pack("<Q", len(payload))
    return (header + struct.pack("<I", masked_crc(header)) + payload
            + struct.pack("<I", masked_crc(payload)))


# -- TF's default histogram (tensorflow/core/lib/histogram) -----------------------------

_DEFAULT_LIMITS = None


def default_bucket_limits():
    """-DBL_MAX, ..., -1e-12, 0, 1e-12, ... (x1.1 while < 1e20), DBL_MAX."""
    global _DEFAULT_LIMITS
    if _DEFAULT_LIMITS is None:
        pos = []
        v = 1.0e-12
        while v < 1.0e20:
            pos.append(v)
            v *= 1.1
        dbl_max = 1.7976931348623157e308
        pos.append(dbl_max)
        _DEFAULT_LIMITS = [-x for x in reversed(pos)] + [0.0] + pos
    return _DEFAULT_LIMITS


def histogram(values):
    """What TF's Histogram + EncodeToProto(preserve_zero_buckets=false) give:
    dict(min, max, num, sum, sum_squares, bucket_limit, bucket)."""
    import bisect
    limits = default_bucket_limits()
    counts = [0.0] * len(limits)
    mn = limits[-1]
    mx = -limits[-1]
    s = 0.0
    ss = 0.0
    for v in values:
        v = float(v)
        counts[bisect.bisect_right(limits, v)] += 1.0   # first limit > v
        mn = min(mn, v)
        mx = max(mx, v)
        s += v
        ss += v * v
    out_limits = []
    out_counts = []
    i = 0
    while i < len(counts):
        end = limits[i]
        cnt = counts[i]
        i += 1
        if cnt <= 0.0:
            while i < len(counts) and counts[i] <= 0.0:
                end = limits[i]
                cnt = counts[i]
                i += 1
        out_limits.append(end)
        out_counts.append(cnt)
    if not out_counts:
        out_limits.append(limits[-1])
        out_counts.append(0.0)
    return dict(min=mn, max=mx, num=float(len(values)), sum=s, sum_squares=ss,
                bucket_limit=out_limits, bucket=out_counts)
