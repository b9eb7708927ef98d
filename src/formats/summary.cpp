// Summary helpers (include/foreman/summary.hpp). The histogram follows TF's
// tensorflow/core/lib/histogram/histogram.cc: default bucket limits, Add()
// and EncodeToProto(preserve_zero_buckets=false).
#include "foreman/summary.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "histogram.hpp"
#include "summary.pb.h"

namespace foreman {

namespace {

std::string Serialize(const proto::Summary& summary) {
  std::string out;
  summary.SerializeToString(&out);
  return out;
}

/// TF's Histogram: bucket counts over DefaultHistogramBucketLimits() and the
/// running statistics, as doubles.
class Histogram {
 public:
  Histogram() : buckets_(DefaultHistogramBucketLimits().size(), 0.0) {}

  void Add(double value) {
    buckets_[internal::HistogramBucketIndex(value)] += 1;
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
    num_ += 1;
    sum_ += value;
    sum_squares_ += value * value;
  }

  /// Each run of empty buckets becomes one entry with the limit of its last
  /// bucket and count 0 (TF's preserve_zero_buckets=false). The buckets are
  /// never empty, so neither is the output.
  void Encode(proto::HistogramProto* out) const {
    const std::vector<double>& limits = DefaultHistogramBucketLimits();
    out->set_min(min_);
    out->set_max(max_);
    out->set_num(num_);
    out->set_sum(sum_);
    out->set_sum_squares(sum_squares_);
    for (std::size_t i = 0; i < buckets_.size();) {
      std::size_t last = i++;
      if (buckets_[last] <= 0) {
        while (i < buckets_.size() && buckets_[i] <= 0) last = i++;
      }
      out->add_bucket_limit(limits[last]);
      out->add_bucket(buckets_[last]);
    }
  }

 private:
  std::vector<double> buckets_;
  double min_ = DBL_MAX;  // TF's initial values, kept for an empty histogram
  double max_ = -DBL_MAX;
  double num_ = 0;
  double sum_ = 0;
  double sum_squares_ = 0;
};

/// Adds every element of `values` (element type T) to *histogram; stops at
/// the first NaN or Inf and returns INVALID_ARGUMENT naming `tag`.
template <class T>
Status AddAll(const Tensor& values, const std::string& tag, Histogram* histogram) {
  const T* data = values.data<T>();
  for (int64_t i = 0; i < values.num_elements(); ++i) {
    const auto value = static_cast<double>(data[i]);
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat("Nan in summary histogram for: ", tag));
    }
    histogram->Add(value);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ScalarSummary(const std::string& tag, float value) {
  proto::Summary summary;
  proto::Summary::Value* v = summary.add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  return Serialize(summary);
}

StatusOr<std::string> HistogramSummary(const std::string& tag, const Tensor& values) {
  Histogram histogram;
  switch (values.dtype()) {
    case DataType::kFloat: FOREMAN_RETURN_IF_ERROR(AddAll<float>(values, tag, &histogram)); break;
    case DataType::kDouble: FOREMAN_RETURN_IF_ERROR(AddAll<double>(values, tag, &histogram)); break;
    case DataType::kInt32: FOREMAN_RETURN_IF_ERROR(AddAll<int32_t>(values, tag, &histogram)); break;
    case DataType::kInt64: FOREMAN_RETURN_IF_ERROR(AddAll<int64_t>(values, tag, &histogram)); break;
    case DataType::kUInt8: FOREMAN_RETURN_IF_ERROR(AddAll<uint8_t>(values, tag, &histogram)); break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("histogram summary ", tag, ": unsupported dtype ",
                                                     DataTypeName(values.dtype())));
  }
  proto::Summary summary;
  proto::Summary::Value* v = summary.add_value();
  v->set_tag(tag);
  histogram.Encode(v->mutable_histo());
  return Serialize(summary);
}

std::string TextSummary(const std::string& tag, const std::string& text) {
  proto::Summary summary;
  proto::Summary::Value* v = summary.add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  proto::TensorProto* tensor = v->mutable_tensor();
  tensor->set_dtype(proto::DT_STRING);
  tensor->mutable_tensor_shape();  // present and empty: a scalar
  tensor->add_string_val(text);
  return Serialize(summary);
}

std::string MergeSummaries(const std::vector<std::string>& serialized_summaries) {
  std::string out;
  for (const std::string& s : serialized_summaries) out += s;
  return out;
}

const std::vector<double>& DefaultHistogramBucketLimits() {
  static const std::vector<double>* const limits = [] {
    std::vector<double> positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) positive.push_back(v);
    positive.push_back(DBL_MAX);
    auto* all = new std::vector<double>();
    all->reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all->push_back(-*it);
    all->push_back(0.0);
    all->insert(all->end(), positive.begin(), positive.end());
    return all;
  }();
  return *limits;
}

namespace internal {

namespace {

// log2(a), a >= 1e-12 and finite, to within 0.01: the exponent plus
// log2(1 + f) of the mantissa's fraction f, as f + 0.3466 f (1 - f). Enough
// for a guess: a bucket is log2(1.1) = 0.1375 wide.
double ApproxLog2(double a) {
  uint64_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  const auto exponent = static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023;
  const double f = static_cast<double>(bits & ((uint64_t{1} << 52) - 1)) * 0x1p-52;
  return static_cast<double>(exponent) + f + 0.3466 * f * (1.0 - f);
}

struct Layout {
  const std::vector<double>* limits;
  std::size_t zero;      // the index of the limit 0.0
  std::size_t positive;  // how many limits 1e-12 * 1.1^k there are (DBL_MAX not counted)
};

const Layout& GetLayout() {
  static const Layout layout = [] {
    const std::vector<double>& limits = DefaultHistogramBucketLimits();
    const auto zero = static_cast<std::size_t>(std::find(limits.begin(), limits.end(), 0.0) - limits.begin());
    return Layout{&limits, zero, limits.size() - zero - 2};
  }();
  return layout;
}

}  // namespace

std::size_t HistogramBucketIndex(double value) {
  const Layout& layout = GetLayout();
  const std::vector<double>& limits = *layout.limits;
  const std::size_t n = limits.size();
  if (std::isnan(value)) return n - 1;  // no limit is greater: the search's end, clamped
  // The guess: limits[zero + 1 + k] ~ 1e-12 * 1.1^k, limits[zero - 1 - k] ~ -1e-12 * 1.1^k.
  constexpr double kLog2Smallest = -39.863137138648348;  // log2(1e-12)
  constexpr double kInvLog2Step = 7.272540897341713;    // 1 / log2(1.1)
  const double a = std::fabs(value);
  std::size_t k = 0;
  if (a >= 1e-12) {
    const double steps = (a < 1e20 ? ApproxLog2(a) - kLog2Smallest : 200.0) * kInvLog2Step;
    k = std::min(static_cast<std::size_t>(steps), layout.positive);
  }
  const std::size_t guess = value >= 0 ? layout.zero + 1 + k : layout.zero - std::min(k + 1, layout.zero);
  // The first limit greater than `value` is the guess or one of its two
  // neighbours (the guess is off only for a value within 0.07 bucket of a
  // limit): from one below it, count the two limits not above the value
  // (two independent compares, no branch).
  std::size_t g = std::min(guess >= 1 ? guess - 1 : 0, n - 2);
  g += static_cast<std::size_t>(limits[g] <= value) + static_cast<std::size_t>(limits[g + 1] <= value);
  // Exact whatever the guess: no step taken here when it was right.
  while (g < n && limits[g] <= value) ++g;
  while (g > 0 && limits[g - 1] > value) --g;
  return std::min(g, n - 1);
}

}  // namespace internal

}  // namespace foreman
