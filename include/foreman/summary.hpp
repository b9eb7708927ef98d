// Summary helpers: build a serialized TensorBoard `Summary` proto for a step
// function to return as its "summaries" fetch (Graph::AddSummaryOp), or for an
// EventFileWriter. (TF: tf.compat.v1.summary.scalar / histogram / text.)
//
// Serialized Summaries concatenate: the bytes of two Summary messages one
// after the other parse as one Summary with both values (protobuf's merge
// rule for repeated fields), which is what MergeSummaries() does.
//
//   ```cpp
//   std::string s = foreman::MergeSummaries({foreman::ScalarSummary("loss", 0.25f),
//                                            foreman::TextSummary("note", "hello")});
//   ```
#pragma once

#include <string>
#include <vector>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman {

/// One value with `simple_value` (TensorBoard's scalars dashboard).
std::string ScalarSummary(const std::string& tag, float value);

/// One value with a `histo` HistogramProto over all elements of `values`
/// (float32, float64, int32, int64 or uint8; any shape): min, max, num, sum,
/// sum_squares, and TF's default bucket limits with runs of empty buckets
/// merged as TF does. INVALID_ARGUMENT for a string tensor; a NaN or Inf value
/// is INVALID_ARGUMENT naming the tag (TF: "Nan in summary histogram").
StatusOr<std::string> HistogramSummary(const std::string& tag, const Tensor& values);

/// One value holding a scalar string tensor with the "text" plugin's metadata
/// (TensorBoard's text dashboard).
std::string TextSummary(const std::string& tag, const std::string& text);

/// Concatenates serialized Summaries into one.
std::string MergeSummaries(const std::vector<std::string>& serialized_summaries);

/// TF's default histogram bucket limits (-DBL_MAX, ..., -1e-12, 0, 1e-12,
/// ..., 1e20 by factors of 1.1, DBL_MAX); a value v lands in the first bucket
/// whose limit is > v.
const std::vector<double>& DefaultHistogramBucketLimits();

}  // namespace foreman
