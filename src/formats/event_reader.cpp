// Event file reading (include/foreman/event_reader.hpp).
#include "foreman/event_reader.hpp"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "summary.pb.h"

namespace foreman {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensor_content is little-endian; a big-endian host would need byte swaps");

/// The first element of a numeric tensor as a double: from tensor_content
/// (T is the element type there) or else from the typed *_val field
/// `values`; both empty means zeros (TF's convention).
template <class T, class Repeated>
double FirstElement(const proto::TensorProto& tensor, const Repeated& values) {
  if (tensor.tensor_content().size() >= sizeof(T)) {
    T value;
    std::memcpy(&value, tensor.tensor_content().data(), sizeof(T));
    return static_cast<double>(value);
  }
  return values.empty() ? 0.0 : static_cast<double>(values[0]);
}

/// Fills v->kind and the matching field from the value's payload.
void ParseValuePayload(const proto::Summary::Value& value, SummaryValue* v) {
  switch (value.value_case()) {
    case proto::Summary::Value::kSimpleValue:
      v->kind = SummaryValue::Kind::kScalar;
      v->scalar = value.simple_value();
      return;
    case proto::Summary::Value::kHisto: {
      const proto::HistogramProto& h = value.histo();
      v->kind = SummaryValue::Kind::kHistogram;
      v->histogram = {h.min(), h.max(), h.num(), h.sum(), h.sum_squares(),
                      {h.bucket_limit().begin(), h.bucket_limit().end()},
                      {h.bucket().begin(), h.bucket().end()}};
      return;
    }
    case proto::Summary::Value::kTensor: {
      const proto::TensorProto& t = value.tensor();
      if (t.dtype() == proto::DT_STRING) {
        v->kind = SummaryValue::Kind::kText;
        if (!t.string_val().empty()) v->text = t.string_val(0);
        return;
      }
      if (t.tensor_shape().dim_size() != 0 || t.tensor_shape().unknown_rank()) return;  // not a scalar
      switch (t.dtype()) {
        case proto::DT_FLOAT: v->scalar = FirstElement<float>(t, t.float_val()); break;
        case proto::DT_DOUBLE: v->scalar = FirstElement<double>(t, t.double_val()); break;
        case proto::DT_INT32: v->scalar = FirstElement<int32_t>(t, t.int_val()); break;
        case proto::DT_UINT8: v->scalar = FirstElement<uint8_t>(t, t.int_val()); break;
        case proto::DT_INT64: v->scalar = FirstElement<int64_t>(t, t.int64_val()); break;
        default: return;
      }
      v->kind = SummaryValue::Kind::kTensor;
      return;
    }
    default:
      return;
  }
}

}  // namespace

StatusOr<Event> ParseEvent(absl::string_view serialized) {
  proto::Event pe;
  if (!pe.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return absl::InvalidArgumentError("not a serialized Event");
  }
  Event e;
  e.wall_time = pe.wall_time();
  e.step = pe.step();
  switch (pe.what_case()) {
    case proto::Event::kFileVersion:
      e.kind = Event::Kind::kFileVersion;
      e.file_version = pe.file_version();
      break;
    case proto::Event::kSummary:
      e.kind = Event::Kind::kSummary;
      for (const proto::Summary::Value& value : pe.summary().value()) {
        SummaryValue& v = e.values.emplace_back();
        v.tag = value.tag();
        v.plugin_name = value.metadata().plugin_data().plugin_name();
        ParseValuePayload(value, &v);
      }
      break;
    case proto::Event::kSessionLog:
      e.kind = Event::Kind::kSessionLog;
      e.session_status = static_cast<SessionLogStatus>(pe.session_log().status());
      e.checkpoint_path = pe.session_log().checkpoint_path();
      e.message = pe.session_log().msg();
      break;
    case proto::Event::kLogMessage:
      e.kind = Event::Kind::kLogMessage;
      e.message = pe.log_message().message();
      break;
    case proto::Event::kGraphDef:
      e.kind = Event::Kind::kGraph;
      break;
    case proto::Event::kMetaGraphDef:
      e.kind = Event::Kind::kOther;
      break;
    case proto::Event::WHAT_NOT_SET:
      // Fields this proto does not declare (tagged_run_metadata, ...).
      e.kind = pe.GetReflection()->GetUnknownFields(pe).empty() ? Event::Kind::kNone : Event::Kind::kOther;
      break;
  }
  return e;
}

Status ReadEventFileInto(Env* env, const std::string& path, std::vector<Event>* events,
                         bool allow_truncated_tail) {
  RecordReaderOptions options;
  options.allow_truncated_tail = allow_truncated_tail;
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(env, path, options));
  std::string record;
  for (;;) {
    const uint64_t offset = reader->offset();
    Status s = reader->ReadRecord(&record);
    if (absl::IsOutOfRange(s)) return absl::OkStatus();
    FOREMAN_RETURN_IF_ERROR(s);
    StatusOr<Event> event = ParseEvent(record);
    if (!event.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": record at offset ", offset, " is not an Event"));
    }
    events->push_back(*std::move(event));
  }
}

StatusOr<std::vector<Event>> ReadEventFile(Env* env, const std::string& path, bool allow_truncated_tail) {
  std::vector<Event> events;
  FOREMAN_RETURN_IF_ERROR(ReadEventFileInto(env, path, &events, allow_truncated_tail));
  return events;
}

StatusOr<std::vector<std::string>> ListEventFiles(Env* env, const std::string& logdir) {
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(logdir));
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    if (absl::StrContains(name, "tfevents")) paths.push_back(JoinPath(logdir, name));
  }
  return paths;  // GetChildren's names are sorted
}

std::vector<std::size_t> EventsKeptAfterPurge(const std::vector<Event>& events) {
  std::vector<std::size_t> kept;
  kept.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == Event::Kind::kSessionLog && e.session_status == SessionLogStatus::kStart) {
      kept.erase(std::remove_if(kept.begin(), kept.end(), [&](std::size_t k) { return events[k].step >= e.step; }),
                 kept.end());
    }
    kept.push_back(i);
  }
  return kept;
}

}  // namespace foreman
