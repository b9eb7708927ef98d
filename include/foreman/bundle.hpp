// TensorFlow V2 checkpoints ("tensor bundles"): what tf.compat.v1.train.Saver
// and tf.train.Checkpoint write, read and written here byte-compatibly.
// (TF: tensorflow/core/util/tensor_bundle/tensor_bundle.h.)
//
// A bundle with prefix P is two files:
//   P.index                  a LevelDB-format table (sorted keys, prefix-
//                            compressed blocks, optionally snappy-compressed):
//                              ""      -> BundleHeaderProto{num_shards, endianness, version}
//                              <name>  -> BundleEntryProto{dtype, shape, shard_id,
//                                         offset, size, crc32c}
//   P.data-00000-of-00001    the tensors' bytes, back to back: numbers in
//                            little-endian row-major order; a string tensor as
//                            varint64 lengths, the masked CRC32C (uint32 LE) of
//                            those lengths, then the strings' bytes.
// Every entry's crc32c is the masked CRC32C of its bytes; for strings, of the
// lengths (each as a uint32 LE, as a uint64 LE if over 4 GiB, never the varint),
// the 4 stored CRC bytes, then the strings' bytes. Checked on every read.
//
//   ```cpp
//   FOREMAN_RETURN_IF_ERROR(env->RecursivelyCreateDir("ckpt"));
//   FOREMAN_ASSIGN_OR_RETURN(auto w, foreman::BundleWriter::Create(env, "ckpt/model.ckpt-100"));
//   FOREMAN_RETURN_IF_ERROR(w->Add("dense/kernel", kernel));
//   FOREMAN_RETURN_IF_ERROR(w->Finish());
//   FOREMAN_ASSIGN_OR_RETURN(auto r, foreman::BundleReader::Open(env, "ckpt/model.ckpt-100"));
//   FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor k, r->Lookup("dense/kernel"));
//   ```
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman {

/// "<prefix>.index"
std::string BundleIndexPath(const std::string& prefix);
/// "<prefix>.data-<shard:05d>-of-<num_shards:05d>"
std::string BundleDataPath(const std::string& prefix, int shard = 0, int num_shards = 1);

/// Writes one bundle. Files are written under temporary names and renamed
/// into place by Finish() (data first, then index), then the directory is
/// synced: until Finish() returns OK, no file named P.index or P.data-* is
/// created or changed. One thread at a time.
class BundleWriter {
 public:
  /// NOT_FOUND when the prefix's directory is missing; Env errors naming paths.
  static StatusOr<std::unique_ptr<BundleWriter>> Create(Env* env, const std::string& prefix);
  /// Removes the temporary files unless Finish() succeeded.
  ~BundleWriter();
  BundleWriter(const BundleWriter&) = delete;
  BundleWriter& operator=(const BundleWriter&) = delete;

  /// Appends the tensor's bytes to the data file. INVALID_ARGUMENT for an
  /// empty name, the reserved name "", a duplicate name or a kInvalid tensor.
  Status Add(const std::string& name, const Tensor& tensor);

  /// Writes the index (entries sorted by name), syncs and renames both files,
  /// syncs the directory. Later calls return FAILED_PRECONDITION.
  Status Finish();

  /// Bytes written to the data file so far.
  uint64_t data_bytes() const;

 private:
  struct Impl;
  explicit BundleWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// What the index says about one tensor.
struct BundleEntry {
  std::string name;
  DataType dtype = DataType::kInvalid;
  TensorShape shape;
  int shard_id = 0;
  int64_t offset = 0;   // bytes into the data file
  int64_t size = 0;     // bytes
  uint32_t masked_crc32c = 0;
};

/// Reads one bundle (any TF V2 checkpoint with one or more data shards).
/// Thread-safe after Open().
class BundleReader {
 public:
  /// Opens and parses the index and checks the header.
  ///   NOT_FOUND        "<prefix>.index" missing (not a valid checkpoint)
  ///   DATA_LOSS        the index table is corrupt, or its keys are not
  ///                    strictly increasing (a duplicate key) (names the file)
  ///   UNIMPLEMENTED    big-endian bundles, partitioned (sliced) variables
  ///   FAILED_PRECONDITION  a data shard named by the header is missing
  static StatusOr<std::unique_ptr<BundleReader>> Open(Env* env, const std::string& prefix);
  ~BundleReader();

  /// Every entry, sorted by name (the header is not an entry).
  const std::vector<BundleEntry>& entries() const;
  /// NOT_FOUND "<index path>: no variable '<name>' in checkpoint".
  StatusOr<BundleEntry> GetEntry(const std::string& name) const;
  bool Contains(const std::string& name) const;

  /// Reads, checks and decodes one tensor.
  ///   NOT_FOUND   as GetEntry()
  ///   DATA_LOSS   "<data path>: variable '<name>': crc32c mismatch ..." or a
  ///               short read / bad string lengths (names file and variable)
  ///   INVALID_ARGUMENT / UNIMPLEMENTED  an unsupported dtype (names it)
  ///   RESOURCE_EXHAUSTED  the tensor cannot be allocated (names file and
  ///               variable; the entry is consistent but too big for memory)
  StatusOr<Tensor> Lookup(const std::string& name) const;

  /// Checks one entry: Lookup() for the supported dtypes; for TF's other
  /// fixed-size dtypes (float16, bool, ...) the CRC32C of the raw bytes
  /// (DATA_LOSS naming file and variable); DT_VARIANT is not checked.
  /// NOT_FOUND / DATA_LOSS / RESOURCE_EXHAUSTED as Lookup().
  Status Verify(const std::string& name) const;

  /// Verify() of every entry: OK when the whole bundle verifies
  /// (LatestCheckpoint uses this to pick a checkpoint to restore).
  Status VerifyAll() const;

  const std::string& prefix() const;

 private:
  struct Impl;
  explicit BundleReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
