// Dataset: deterministic, resumable batches (include/foreman/dataset.hpp).
#include <algorithm>
#include <array>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/dataset.hpp"

namespace foreman::data {

namespace {

// Orders kept for GetBatch; two would do for one reader (the current epoch
// and the next), the rest absorbs an evaluation or a re-seek.
constexpr size_t kCachedOrders = 4;

/// splitmix64 (Steele, Lea, Flood 2014): fixed arithmetic, so every platform
/// and standard library draws the same numbers (std::uniform_int_distribution
/// does not).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Uniform in [0, n) without modulo bias (rejects the low 2^64 mod n values).
uint64_t Uniform(uint64_t& state, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = SplitMix64(state);
    if (r >= threshold) return r % n;
  }
}

std::vector<int32_t> Permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // The epoch's stream: the seed's stream mixed with the epoch, so nearby
  // (seed, epoch) pairs give unrelated permutations.
  uint64_t state = seed;
  state = SplitMix64(state) ^ (static_cast<uint64_t>(epoch) * 0xd1b54a32d192ed03ULL);
  (void)SplitMix64(state);
  for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = static_cast<int64_t>(Uniform(state, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace

std::string DatasetPosition::ToString() const { return absl::StrCat("epoch ", epoch, ", index ", index); }

StatusOr<std::shared_ptr<const Dataset>> Dataset::Create(LabeledImages data, DatasetOptions options) {
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset: batch_size must be >= 1, got ", options.batch_size));
  }
  if (options.epochs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dataset: epochs must be >= 0 (0: repeat forever), got ", options.epochs));
  }
  FOREMAN_RETURN_IF_ERROR(Annotate(data.images.CheckDataType(DataType::kUInt8), "Dataset images"));
  FOREMAN_RETURN_IF_ERROR(Annotate(data.labels.CheckDataType(DataType::kUInt8), "Dataset labels"));
  if (data.images.shape().rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset: expected images of shape [N, rows, cols], got ",
                                                   data.images.shape().ToString()));
  }
  if (data.labels.shape() != TensorShape({data.images.shape().dim(0)})) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset: expected labels of shape [",
                                                   data.images.shape().dim(0), "] for images of shape ",
                                                   data.images.shape().ToString(), ", got ",
                                                   data.labels.shape().ToString()));
  }
  const int64_t n = data.images.shape().dim(0);
  if (n == 0) return absl::InvalidArgumentError("Dataset: no examples");
  if (data.images.shape().dim(1) == 0 || data.images.shape().dim(2) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dataset: images of shape ", data.images.shape().ToString(), " have no pixels"));
  }
  if (n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset: ", n, " examples, more than 2^31 - 1"));
  }
  return std::shared_ptr<const Dataset>(new Dataset(std::move(data), options));
}

Dataset::Dataset(LabeledImages data, DatasetOptions options)
    : data_(std::move(data)),
      options_(options),
      num_examples_(data_.images.shape().dim(0)),
      rows_(data_.images.shape().dim(1)),
      cols_(data_.images.shape().dim(2)) {}

std::shared_ptr<const std::vector<int32_t>> Dataset::Order(int64_t epoch) const {
  // Unshuffled, every epoch has the same order.
  const int64_t key = options_.shuffle ? epoch : 0;
  {
    MutexLock l(mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->epoch == key) {
        CachedOrder hit = std::move(*it);
        cache_.erase(it);
        cache_.push_back(hit);
        return hit.order;
      }
    }
  }
  // Computed unlocked: two threads may both compute one epoch, and get equal
  // orders.
  std::shared_ptr<const std::vector<int32_t>> order;
  if (options_.shuffle) {
    order = std::make_shared<const std::vector<int32_t>>(Permutation(num_examples_, options_.seed, epoch));
  } else {
    auto identity = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(num_examples_));
    std::iota(identity->begin(), identity->end(), 0);
    order = std::move(identity);
  }
  MutexLock l(mu_);
  if (cache_.size() >= kCachedOrders) cache_.erase(cache_.begin());
  cache_.push_back(CachedOrder{key, order});
  return order;
}

StatusOr<Batch> Dataset::GetBatch(const DatasetPosition& position) const {
  if (position.epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset::GetBatch: negative epoch at ", position.ToString()));
  }
  if (options_.epochs > 0 && position.epoch >= options_.epochs) {
    return absl::OutOfRangeError("End of sequence");
  }
  if (position.index < 0 || position.index >= num_examples_) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset::GetBatch: index outside [0, ", num_examples_,
                                                   ") at ", position.ToString()));
  }
  const int64_t count = std::min(options_.batch_size, num_examples_ - position.index);
  std::shared_ptr<const std::vector<int32_t>> order = Order(position.epoch);
  FOREMAN_ASSIGN_OR_RETURN(Batch batch, Gather(order->data() + position.index, count));
  batch.position = position;
  batch.next = position.index + count < num_examples_ ? DatasetPosition{position.epoch, position.index + count}
                                                      : DatasetPosition{position.epoch + 1, 0};
  return batch;
}

StatusOr<Batch> Dataset::Slice(int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > num_examples_) {
    return absl::InvalidArgumentError(absl::StrCat("Dataset::Slice: [", begin, ", ", end,
                                                   ") is not a range within [0, ", num_examples_, ")"));
  }
  std::vector<int32_t> order(static_cast<size_t>(end - begin));
  std::iota(order.begin(), order.end(), static_cast<int32_t>(begin));
  FOREMAN_ASSIGN_OR_RETURN(Batch batch, Gather(order.data(), end - begin));
  batch.position = DatasetPosition{0, begin};
  batch.next = DatasetPosition{0, end};
  return batch;
}

StatusOr<Batch> Dataset::Gather(const int32_t* order, int64_t count) const {
  const int64_t dim = feature_dim();
  Batch batch;
  FOREMAN_ASSIGN_OR_RETURN(batch.features, Tensor::Create(DataType::kFloat, TensorShape({count, dim})));
  FOREMAN_ASSIGN_OR_RETURN(batch.labels, Tensor::Create(DataType::kInt32, TensorShape({count})));
  const uint8_t* images = data_.images.data<uint8_t>();
  const uint8_t* labels = data_.labels.data<uint8_t>();
  float* features = batch.features.data<float>();
  int32_t* out_labels = batch.labels.data<int32_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t example = order[i];
    const uint8_t* __restrict src = images + example * dim;
    float* __restrict dst = features + i * dim;
    // A division, not a multiplication by 1/255: exactly pixel / 255.0f.
    // The loop vectorises (cvtdq2ps + divps).
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(src[d]) / 255.0f;
    out_labels[i] = labels[example];
  }
  return batch;
}

}  // namespace foreman::data
