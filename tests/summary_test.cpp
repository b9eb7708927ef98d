// Tests for the summary helpers: scalar, histogram (TF's buckets and
// encoding), text, and concatenation.

#include "foreman/summary.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "formats/histogram.hpp"
#include "summary.pb.h"

namespace foreman {
namespace {

proto::Summary Parse(const std::string& serialized) {
  proto::Summary summary;
  REQUIRE(summary.ParseFromString(serialized));
  return summary;
}

/// The histogram of `values` (any element type) as parsed HistogramProto.
template <class T>
proto::HistogramProto Histo(const std::vector<T>& values) {
  auto tensor = Tensor::FromVector<T>(values, TensorShape{static_cast<int64_t>(values.size())});
  REQUIRE(tensor.ok());
  auto serialized = HistogramSummary("h", *tensor);
  REQUIRE(serialized.ok());
  proto::Summary summary = Parse(*serialized);
  REQUIRE(summary.value_size() == 1);
  REQUIRE(summary.value(0).has_histo());
  return summary.value(0).histo();
}

std::vector<double> Limits(const proto::HistogramProto& h) {
  return {h.bucket_limit().begin(), h.bucket_limit().end()};
}
std::vector<double> Counts(const proto::HistogramProto& h) { return {h.bucket().begin(), h.bucket().end()}; }

// -- scalar and text -----------------------------------------------------------------

TEST_CASE("a scalar summary is one value with the tag and simple_value") {
  proto::Summary summary = Parse(ScalarSummary("loss", 0.25f));
  REQUIRE(summary.value_size() == 1);
  CHECK(summary.value(0).tag() == "loss");
  CHECK(summary.value(0).value_case() == proto::Summary::Value::kSimpleValue);
  CHECK(summary.value(0).simple_value() == 0.25f);
  CHECK_FALSE(summary.value(0).has_metadata());
}

TEST_CASE("a text summary is a DT_STRING scalar tensor with the text plugin's metadata") {
  const std::string text("line 1\nline 2 \xe2\x9c\x93 \0 end", 21);
  proto::Summary summary = Parse(TextSummary("notes", text));
  REQUIRE(summary.value_size() == 1);
  const proto::Summary::Value& v = summary.value(0);
  CHECK(v.tag() == "notes");
  CHECK(v.metadata().plugin_data().plugin_name() == "text");
  CHECK(v.metadata().plugin_data().content().empty());
  REQUIRE(v.value_case() == proto::Summary::Value::kTensor);
  CHECK(v.tensor().dtype() == proto::DT_STRING);
  CHECK(v.tensor().has_tensor_shape());
  CHECK(v.tensor().tensor_shape().dim_size() == 0);  // a scalar
  REQUIRE(v.tensor().string_val_size() == 1);
  CHECK(v.tensor().string_val(0) == text);
}

TEST_CASE("merged summaries parse as one Summary with every value in order") {
  auto histogram = HistogramSummary("w", Tensor::Scalar(1.5));
  REQUIRE(histogram.ok());
  const std::vector<std::string> parts = {ScalarSummary("a", 1), *histogram, TextSummary("t", "x"),
                                          ScalarSummary("b", 2)};
  const std::string merged = MergeSummaries(parts);
  CHECK(merged == parts[0] + parts[1] + parts[2] + parts[3]);
  proto::Summary summary = Parse(merged);
  REQUIRE(summary.value_size() == 4);
  CHECK(summary.value(0).tag() == "a");
  CHECK(summary.value(1).tag() == "w");
  CHECK(summary.value(1).has_histo());
  CHECK(summary.value(2).tag() == "t");
  CHECK(summary.value(3).simple_value() == 2.0f);
  CHECK(MergeSummaries({}).empty());
}

// -- histograms ------------------------------------------------------------------------

TEST_CASE("the default bucket limits are TF's: 1e-12 growing by 1.1 below 1e20, mirrored, 0 and +-DBL_MAX") {
  const std::vector<double>& limits = DefaultHistogramBucketLimits();
  REQUIRE(limits.size() == 1551);  // 774 powers, DBL_MAX, mirrored, and 0
  const std::size_t zero = limits.size() / 2;
  CHECK(limits[zero] == 0.0);
  CHECK(limits[zero + 1] == 1e-12);
  CHECK(limits[zero + 2] == 1.1000000000000002e-12);
  CHECK(limits[limits.size() - 2] == 9.920775621859783e+19);
  CHECK(limits.back() == DBL_MAX);
  CHECK(limits.front() == -DBL_MAX);
  for (std::size_t i = 1; i < limits.size(); ++i) {
    REQUIRE(limits[i - 1] < limits[i]);
    REQUIRE(limits[i] == -limits[limits.size() - 1 - i]);
  }
  CHECK(&DefaultHistogramBucketLimits() == &limits);  // built once
}

// Issue 29 point 2: the O(1) bucket index is the binary search's, bit for
// bit, on every edge: 0 and -0, each limit and its two neighbours,
// subnormals, the extremes, the infinities and NaN, and random values of
// every magnitude.
TEST_CASE("HistogramBucketIndex equals upper_bound over the limits (clamped to the last bucket) for every value") {
  const std::vector<double>& limits = DefaultHistogramBucketLimits();
  const auto by_search = [&](double v) {
    return std::min<std::size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin(),
                                 limits.size() - 1);
  };
  std::vector<double> values = {0.0,
                                -0.0,
                                1e-12,
                                -1e-12,
                                1e-13,
                                -1e-13,
                                1e20,
                                -1e20,
                                1.0,
                                -1.0,
                                DBL_MAX,
                                -DBL_MAX,
                                DBL_MIN,
                                -DBL_MIN,
                                std::numeric_limits<double>::denorm_min(),
                                -std::numeric_limits<double>::denorm_min(),
                                1e-310,
                                -1e-310,
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN(),
                                -std::numeric_limits<double>::quiet_NaN()};
  for (double limit : limits) {
    values.push_back(limit);
    values.push_back(std::nextafter(limit, std::numeric_limits<double>::infinity()));
    values.push_back(std::nextafter(limit, -std::numeric_limits<double>::infinity()));
  }
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> exponent(-330, 310);
  for (int i = 0; i < 200000; ++i) {
    const double v = std::pow(10.0, exponent(rng));
    values.push_back(i % 2 == 0 ? v : -v);
    values.push_back(static_cast<double>(static_cast<float>(i % 2 == 0 ? v : -v)));  // float32 values, as summaries get them
  }
  std::size_t mismatches = 0;
  for (double v : values) {
    const std::size_t want = by_search(v);
    const std::size_t got = internal::HistogramBucketIndex(v);
    if (got != want && ++mismatches <= 5) {
      FAIL_CHECK("value ", v, ": bucket ", got, ", the search's ", want);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("a histogram of {0, 1, 1, 2, -3} has TF's statistics, bucket counts and collapsed empty runs") {
  const proto::HistogramProto h = Histo<float>({0, 1, 1, 2, -3});
  CHECK(h.min() == -3);
  CHECK(h.max() == 2);
  CHECK(h.num() == 5);
  CHECK(h.sum() == 1);
  CHECK(h.sum_squares() == 15);
  // Computed independently (Python's bisect.bisect_right over the limits and
  // TF's EncodeToProto loop): a value lands in the first bucket whose limit
  // is greater; each run of empty buckets is one entry with the limit of its
  // last bucket and count 0.
  CHECK(Limits(h) == std::vector<double>{-3.1665833053880363, -2.8787120958073054, 0.0, 1e-12,
                                         0.917246389039776, 1.0089710279437536, 1.9661990955585713,
                                         2.1628190051144287, DBL_MAX});
  CHECK(Counts(h) == std::vector<double>{0, 1, 0, 1, 0, 2, 0, 1, 0});
}

TEST_CASE("an empty histogram is one (DBL_MAX, 0) bucket with TF's initial min and max") {
  const proto::HistogramProto h = Histo<float>({});
  CHECK(h.min() == DBL_MAX);
  CHECK(h.max() == -DBL_MAX);
  CHECK(h.num() == 0);
  CHECK(h.sum() == 0);
  CHECK(h.sum_squares() == 0);
  CHECK(Limits(h) == std::vector<double>{DBL_MAX});
  CHECK(Counts(h) == std::vector<double>{0});
}

TEST_CASE("the extreme buckets hold -DBL_MAX and DBL_MAX; a lone empty bucket is an entry of its own") {
  const proto::HistogramProto h = Histo<double>({-DBL_MAX, 1e-12, 1.05e-12, DBL_MAX});
  // -DBL_MAX lands in the bucket of limit -9.92e19 (the first limit above it),
  // so the first bucket is an empty run of one; 1e-12 and 1.05e-12 land in
  // the bucket of 1.1e-12; DBL_MAX in the last bucket.
  CHECK(Limits(h) == std::vector<double>{-DBL_MAX, -9.920775621859783e+19, 1e-12, 1.1000000000000002e-12,
                                         9.920775621859783e+19, DBL_MAX});
  CHECK(Counts(h) == std::vector<double>{0, 1, 0, 2, 0, 1});
}

TEST_CASE("every numeric dtype and shape gives the same histogram of the same values") {
  const std::string expected = *HistogramSummary("h", *Tensor::FromVector<float>({0, 1, 1, 2, 3}, {5}));
  CHECK(*HistogramSummary("h", *Tensor::FromVector<double>({0, 1, 1, 2, 3}, {5})) == expected);
  CHECK(*HistogramSummary("h", *Tensor::FromVector<int32_t>({0, 1, 1, 2, 3}, {5})) == expected);
  CHECK(*HistogramSummary("h", *Tensor::FromVector<int64_t>({0, 1, 1, 2, 3}, {5})) == expected);
  CHECK(*HistogramSummary("h", *Tensor::FromVector<uint8_t>({0, 1, 1, 2, 3}, {5})) == expected);
  CHECK(*HistogramSummary("h", *Tensor::FromVector<float>({0, 1, 1, 2, 3}, {1, 5, 1})) == expected);
  CHECK(*HistogramSummary("h", *Tensor::FromVector<float>({0, 1, 1, 2, 4}, {5})) != expected);
}

TEST_CASE("a NaN or an infinity in a histogram is INVALID_ARGUMENT naming the tag") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const Tensor& t : {*Tensor::FromVector<float>({1, nan}, {2}), *Tensor::FromVector<double>({-inf}, {1}),
                          *Tensor::FromVector<double>({inf, 2}, {2})}) {
    auto s = HistogramSummary("weights/layer1", t);
    CHECK(absl::IsInvalidArgument(s.status()));
    CHECK_MESSAGE(absl::StrContains(s.status().message(), "Nan in summary histogram for: weights/layer1"),
                  s.status().message());
  }
}

TEST_CASE("a histogram of strings or of an invalid tensor is INVALID_ARGUMENT") {
  CHECK(absl::IsInvalidArgument(HistogramSummary("h", Tensor::Scalar(std::string("x"))).status()));
  CHECK(absl::IsInvalidArgument(HistogramSummary("h", Tensor()).status()));
}

}  // namespace
}  // namespace foreman
