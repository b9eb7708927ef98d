// The bucket of a value in TF's default histogram (summary.hpp's
// DefaultHistogramBucketLimits), found in O(1) (issue 29 point 2). Internal.
#pragma once

#include <cstddef>

namespace foreman::internal {

/// The index std::upper_bound(limits, value) gives over
/// DefaultHistogramBucketLimits(), clamped to the last bucket (TF's Add
/// indexes past the end for DBL_MAX; the last bucket holds it): the first
/// limit greater than `value`. Bit-identical to that search for every
/// double, NaN (the last bucket, as the search's end clamped) and ±Inf
/// included. A guess from the value's exponent and mantissa bits (the
/// limits are 1e-12 * 1.1^k, mirrored, with 0 in the middle), then at most
/// a few steps against the limits themselves. Thread-safe.
std::size_t HistogramBucketIndex(double value);

}  // namespace foreman::internal
