// Datasets of labelled images: IDX files (the MNIST / Fashion-MNIST format),
// and Dataset, which cuts them into shuffled batches.
//
// A Dataset is a pure function of (data, options, position): the batch at a
// DatasetPosition is always the same, so a run restored from a checkpoint
// that saved its position sees exactly the batches an uninterrupted run
// sees (TF: a tf.data iterator saved with the checkpoint).
//
// Usage:
//   ```cpp
//   auto mnist = foreman::data::LoadFashionMnist(nullptr, foreman::data::kFashionMnistDir);
//   if (!mnist.ok()) return mnist.status();           // NOT_FOUND: package missing
//   foreman::data::DatasetOptions options;
//   options.epochs = 1;
//   FOREMAN_ASSIGN_OR_RETURN(auto ds, foreman::data::Dataset::Create(std::move(mnist->train), options));
//   foreman::data::DatasetPosition pos;
//   for (;;) {
//     auto batch = ds->GetBatch(pos);
//     if (absl::IsOutOfRange(batch.status())) break;  // all epochs done
//     if (!batch.ok()) return batch.status();
//     // batch->features: float32 [B, 784], batch->labels: int32 [B]
//     pos = batch->next;
//   }
//   ```
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "foreman/env.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman::data {

// -- IDX files -------------------------------------------------------------------

/// Parses an IDX file's bytes (already decompressed): the magic 00 00 <type>
/// <ndims>, `ndims` big-endian int32 dims, then the elements, row-major.
/// Only type 0x08 (unsigned byte) is supported. Returns a kUInt8 Tensor with
/// those dims (a copy: `bytes` need not outlive the call).
///   INVALID_ARGUMENT  a bad magic ("found 50 4b 03 04; an IDX file starts
///                     with 00 00 08 <ndims>"), another element type, 0 dims,
///                     a negative dim, or dims whose product exceeds 2^62
///   DATA_LOSS         a truncated header or data ("expected N bytes of data,
///                     found M"), or bytes after the data
/// Every message starts with `source` (a path, for the user).
StatusOr<Tensor> ParseIdx(absl::string_view bytes, const std::string& source);

/// Reads the IDX file at `path` through `env` (nullptr: Env::Default()); when
/// it starts with the gzip magic 1f 8b it is gunzipped first (zlib; several
/// concatenated gzip members are read as one stream), then ParseIdx().
///   NOT_FOUND   no file at `path` (the message names it)
///   DATA_LOSS   a corrupt or truncated gzip stream, naming `path`
///   and ParseIdx()'s errors, naming `path`.
StatusOr<Tensor> ReadIdxFile(Env* env, const std::string& path);

/// Images with one class label each, as the IDX files hold them.
struct LabeledImages {
  Tensor images;  // uint8 [N, rows, cols], pixels 0 (background) .. 255
  Tensor labels;  // uint8 [N], each < the number of classes
};

/// Reads two IDX files (ReadIdxFile) and checks that they fit together.
///   INVALID_ARGUMENT  images not rank 3 or labels not rank 1 (naming the file
///                     and its shape); different N (naming both files and both
///                     counts); a label >= num_classes (naming the file, the
///                     index and the value); num_classes outside [1, 256]
///   and ReadIdxFile()'s errors.
StatusOr<LabeledImages> LoadLabeledImages(Env* env, const std::string& images_path,
                                          const std::string& labels_path, int num_classes = 10);

/// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST: 60 000 training and 10 000 test images of 28x28, 10 classes.
struct FashionMnist {
  LabeledImages train, test;
};

/// Loads <dir>/train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
/// t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz through `env`
/// (nullptr: Env::Default()); labels must be < 10.
///   NOT_FOUND         a missing file, naming it (and, for kFashionMnistDir,
///                     that Debian's dataset-fashion-mnist package provides it)
///   INVALID_ARGUMENT  train and test images of different sizes
///   and LoadLabeledImages()'s errors.
StatusOr<FashionMnist> LoadFashionMnist(Env* env, const std::string& dir);

// -- batches -----------------------------------------------------------------------

/// Where an input stream is: `index` is the next example within epoch
/// `epoch`'s order (not a file index when shuffling). A checkpoint saves it to
/// resume the stream.
struct DatasetPosition {
  int64_t epoch = 0;
  int64_t index = 0;

  /// "epoch 2, index 384"
  std::string ToString() const;
  friend bool operator==(const DatasetPosition& a, const DatasetPosition& b) {
    return a.epoch == b.epoch && a.index == b.index;
  }
  friend bool operator!=(const DatasetPosition& a, const DatasetPosition& b) { return !(a == b); }
};

struct Batch {
  Tensor features;            // float32 [B, rows*cols], pixel / 255.0f (0.0 .. 1.0)
  Tensor labels;              // int32 [B]
  DatasetPosition position;   // where this batch starts
  DatasetPosition next;       // where the following batch starts
};

struct DatasetOptions {
  int64_t batch_size = 128;  // >= 1
  int64_t epochs = 0;        // 0: repeat forever; else OUT_OF_RANGE after this many epochs (TF: repeat(epochs))
  bool shuffle = true;       // a fresh permutation per epoch (TF: shuffle(reshuffle_each_iteration=True))
  uint64_t seed = 0;         // the permutations' seed
};

/// Immutable after Create(); every method is thread-safe.
class Dataset {
 public:
  /// Takes `data` (moved in). INVALID_ARGUMENT for batch_size < 1, epochs < 0,
  /// no examples or more than 2^31 - 1, images not uint8 [N, rows, cols]
  /// with rows, cols >= 1,
  /// labels not uint8 [N].
  static StatusOr<std::shared_ptr<const Dataset>> Create(LabeledImages data, DatasetOptions options);

  /// The batch starting at `position`: a pure function of (data, options,
  /// position). Epoch e's order is a permutation computed from (seed, e) with
  /// a portable generator (splitmix64 + Fisher-Yates), the same on every
  /// platform and standard library; without shuffling it is file order.
  /// B = min(batch_size, num_examples - index): the last batch of an epoch
  /// holds the remainder and its `next` is {epoch + 1, 0}.
  ///   OUT_OF_RANGE      "End of sequence" when position.epoch >= epochs (epochs > 0)
  ///   INVALID_ARGUMENT  a negative epoch, or index outside [0, num_examples)
  /// Costs one permutation (~1 ms for 60 000 examples) the first time an
  /// epoch is seen (the last few are cached), then O(B * feature_dim).
  StatusOr<Batch> GetBatch(const DatasetPosition& position) const;

  /// Examples [begin, end) in file order (evaluation), laid out as a Batch,
  /// with position {0, begin} and next {0, end}.
  /// INVALID_ARGUMENT unless 0 <= begin <= end <= num_examples.
  StatusOr<Batch> Slice(int64_t begin, int64_t end) const;

  int64_t num_examples() const { return num_examples_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t feature_dim() const { return rows_ * cols_; }
  /// ceil(num_examples / batch_size)
  int64_t batches_per_epoch() const { return (num_examples_ + options_.batch_size - 1) / options_.batch_size; }
  const DatasetOptions& options() const { return options_; }

  /// Epoch `epoch`'s order: element i is the file index of the i-th example.
  /// REQUIRES: epoch >= 0.
  std::shared_ptr<const std::vector<int32_t>> Order(int64_t epoch) const;

 private:
  Dataset(LabeledImages data, DatasetOptions options);
  /// The examples whose file indices are order[0..count).
  StatusOr<Batch> Gather(const int32_t* order, int64_t count) const;

  const LabeledImages data_;
  const DatasetOptions options_;
  int64_t num_examples_ = 0, rows_ = 0, cols_ = 0;

  struct CachedOrder {
    int64_t epoch;
    std::shared_ptr<const std::vector<int32_t>> order;
  };
  mutable Mutex mu_;
  mutable std::vector<CachedOrder> cache_ ABSL_GUARDED_BY(mu_);  // most recent last
};

}  // namespace foreman::data
