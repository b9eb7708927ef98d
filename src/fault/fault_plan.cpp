// FaultPlan: a seed and a list of faults, read from or written to JSON
// (nlohmann-json; kept out of the public headers), and the fired-fault record
// of a run directory.
#include <signal.h>

#include <cerrno>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "foreman/fault.hpp"
#include "fault/injected_fault.hpp"

namespace foreman {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

struct ErrnoName {
  int value;
  const char* name;
};

// The errnos a plan names; others are written and read as numbers.
constexpr ErrnoName kErrnos[] = {
    {EIO, "EIO"},         {ENOSPC, "ENOSPC"},       {EROFS, "EROFS"},   {EACCES, "EACCES"},
    {EPERM, "EPERM"},     {ENOENT, "ENOENT"},       {EEXIST, "EEXIST"}, {ENOTEMPTY, "ENOTEMPTY"},
    {EDQUOT, "EDQUOT"},   {EFBIG, "EFBIG"},         {EAGAIN, "EAGAIN"}, {EINTR, "EINTR"},
    {EBUSY, "EBUSY"},     {EMFILE, "EMFILE"},       {ENFILE, "ENFILE"}, {ENOTDIR, "ENOTDIR"},
    {EISDIR, "EISDIR"},   {ETIMEDOUT, "ETIMEDOUT"}, {ENOMEM, "ENOMEM"}, {EBADF, "EBADF"},
    {EINVAL, "EINVAL"},   {EXDEV, "EXDEV"},         {ESTALE, "ESTALE"}, {ENXIO, "ENXIO"},
};

constexpr std::pair<EnvFault::Kind, const char*> kEnvKinds[] = {
    {EnvFault::Kind::kError, "error"},           {EnvFault::Kind::kShortWrite, "short_write"},
    {EnvFault::Kind::kTornWrite, "torn_write"},   {EnvFault::Kind::kLatency, "latency"},
    {EnvFault::Kind::kCrash, "crash"},
};

const char* EnvKindName(EnvFault::Kind k) {
  for (const auto& [kind, name] : kEnvKinds) {
    if (kind == k) return name;
  }
  return "unknown";
}

bool ParseEnvOp(const std::string& name, EnvOp* op) {
  for (int i = 0; i < kNumEnvOps; ++i) {
    if (name == EnvOpName(static_cast<EnvOp>(i))) {
      *op = static_cast<EnvOp>(i);
      return true;
    }
  }
  return false;
}

bool ParseStatusCode(const std::string& name, absl::StatusCode* code) {
  for (int i = 1; i <= 16; ++i) {
    if (name == absl::StatusCodeToString(static_cast<absl::StatusCode>(i))) {
      *code = static_cast<absl::StatusCode>(i);
      return true;
    }
  }
  return false;
}

// A value as an error message shows it: a scalar as JSON text (bytes that are
// not UTF-8 as U+FFFD), cut at 80 characters; an object or array only by its
// kind and size (dumping it would recurse as deep as it nests, and a huge one
// would make a huge message).
std::string Describe(const json& v) {
  if (v.is_object()) return absl::StrCat("an object of size ", v.size());
  if (v.is_array()) return absl::StrCat("an array of size ", v.size());
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr std::size_t kMax = 80;
  if (text.size() > kMax) text = absl::StrCat(text.substr(0, kMax), "... (", text.size(), " bytes)");
  return text;
}

// Thrown by the parser callback of ParseJsonObjectKeysOnce.
struct DuplicateKey {
  std::string key;
};

// json::parse, refusing a key repeated within one object (nlohmann would
// keep the last silently: a plan that names "nth" twice must not run with
// either). Throws json::exception and DuplicateKey.
json ParseRefusingDuplicateKeys(absl::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  json::parser_callback_t cb = [&open_objects](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second) {
          throw DuplicateKey{parsed.get<std::string>()};
        }
        break;
      default: break;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), cb);
}

// One JSON object being read: fields are taken one by one; Finish() rejects
// the ones never taken.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  bool Has(const char* key) const { return obj_.contains(key); }

  Status Error(const char* key, const std::string& expected) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": \"", key, "\" must be ", expected, ", got ", Describe(obj_.at(key))));
  }
  Status Missing(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": missing \"", key, "\" (", what, ")"));
  }
  Status Invalid(const std::string& what) const { return absl::InvalidArgumentError(absl::StrCat(where_, ": ", what)); }

  Status String(const char* key, std::string* out) {
    if (!Take(key)) return absl::OkStatus();
    const json& v = obj_.at(key);
    if (!v.is_string()) return Error(key, "a string");
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  Status Bool(const char* key, bool* out) {
    if (!Take(key)) return absl::OkStatus();
    const json& v = obj_.at(key);
    if (!v.is_boolean()) return Error(key, "true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  Status Int(const char* key, int64_t min, int64_t* out) {
    if (!Take(key)) return absl::OkStatus();
    const json& v = obj_.at(key);
    const std::string expected = absl::StrCat("an integer >= ", min);
    if (!v.is_number_integer()) return Error(key, expected);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Error(key, expected);
    const auto x = v.get<int64_t>();
    if (x < min) return Error(key, expected);
    *out = x;
    return absl::OkStatus();
  }
  Status Number(const char* key, double min, double max, const std::string& expected, double* out) {
    if (!Take(key)) return absl::OkStatus();
    const json& v = obj_.at(key);
    if (!v.is_number()) return Error(key, expected);
    const auto x = v.get<double>();
    if (!(x >= min && x <= max)) return Error(key, expected);
    *out = x;
    return absl::OkStatus();
  }
  Status Finish() const {
    for (const auto& item : obj_.items()) {
      if (taken_.count(item.key()) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": unknown field \"", item.key(), "\""));
      }
    }
    return absl::OkStatus();
  }
  bool Take(const char* key) {
    taken_.insert(key);
    return obj_.contains(key);
  }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> taken_;
};

// An hour: a longer delay is a hang, not a slow disk (FaultyEnv::AddFault
// refuses it too).
constexpr double kMaxLatencyMs = 3600.0 * 1000.0;

Status ParseEnvFault(Fields& f, EnvFault* out) {
  FOREMAN_RETURN_IF_ERROR(f.String("path", &out->path_pattern));
  if (f.Take("op")) {
    std::string op;
    FOREMAN_RETURN_IF_ERROR(f.String("op", &op));
    if (!ParseEnvOp(op, &out->op)) {
      return f.Error("op",
                     "one of any, new_writable, new_appendable, append, flush, sync, close, rename, delete, "
                     "create_dir, delete_dir, sync_dir, read, stat, lock");
    }
  }
  out->kind = f.Has("latency_ms") ? EnvFault::Kind::kLatency : EnvFault::Kind::kError;
  if (f.Take("kind")) {
    std::string kind;
    FOREMAN_RETURN_IF_ERROR(f.String("kind", &kind));
    bool known = false;
    for (const auto& [k, name] : kEnvKinds) {
      if (kind == name) {
        out->kind = k;
        known = true;
      }
    }
    if (!known) return f.Error("kind", "one of error, short_write, torn_write, latency, crash");
  }
  if (f.Has("error")) {
    const char* expected = "an errno name (EIO, ENOSPC, EROFS, EACCES, ...) or a positive number";
    std::string name;
    if (f.String("error", &name).ok()) {
      bool known = false;
      for (const ErrnoName& e : kErrnos) {
        if (name == e.name) {
          out->error = e.value;
          known = true;
        }
      }
      if (!known) return f.Error("error", expected);
    } else {
      int64_t n = 0;
      if (!f.Int("error", 1, &n).ok() || n > INT32_MAX) return f.Error("error", expected);
      out->error = static_cast<int>(n);
    }
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("prefix_bytes", -1, &out->prefix_bytes));
  if (f.Has("latency_ms")) {
    double ms = 0;
    FOREMAN_RETURN_IF_ERROR(
        f.Number("latency_ms", 0, kMaxLatencyMs, "a number of milliseconds in [0, 3600000] (an hour)", &ms));
    out->latency = absl::Milliseconds(ms);
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("nth", 1, &out->nth));
  FOREMAN_RETURN_IF_ERROR(f.Number("probability", 0, 1, "a number in [0, 1]", &out->probability));
  FOREMAN_RETURN_IF_ERROR(f.Bool("repeat", &out->repeat));
  if (f.Has("nth") == f.Has("probability")) {
    return f.Invalid("needs exactly one of \"nth\" (fire at the n-th matching operation) or \"probability\"");
  }
  // A field the kind ignores is a mistake in the plan, not a no-op.
  const EnvFault::Kind k = out->kind;
  if (f.Has("error") && k != EnvFault::Kind::kError && k != EnvFault::Kind::kShortWrite) {
    return f.Invalid(absl::StrCat("\"error\" applies only to kind error or short_write, not ", EnvKindName(k)));
  }
  if (f.Has("prefix_bytes") && k != EnvFault::Kind::kShortWrite && k != EnvFault::Kind::kTornWrite) {
    return f.Invalid(
        absl::StrCat("\"prefix_bytes\" applies only to kind short_write or torn_write, not ", EnvKindName(k)));
  }
  if (f.Has("latency_ms") && k != EnvFault::Kind::kLatency) {
    return f.Invalid(absl::StrCat("\"latency_ms\" applies only to kind latency, not ", EnvKindName(k)));
  }
  return absl::OkStatus();
}

Status ParseStepFault(Fields& f, StepFault* out) {
  bool nan = false;
  FOREMAN_RETURN_IF_ERROR(f.Bool("nan_loss", &nan));
  if (f.Has("status") == nan) {
    return f.Invalid("needs exactly one of \"status\" (a status code name) or \"nan_loss\": true");
  }
  out->kind = nan ? StepFault::Kind::kNanLoss : StepFault::Kind::kStatus;
  if (f.Take("status")) {
    std::string name;
    FOREMAN_RETURN_IF_ERROR(f.String("status", &name));
    if (!ParseStatusCode(name, &out->code)) {
      return f.Error("status", "a status code name other than OK (ABORTED, UNAVAILABLE, INTERNAL, ...)");
    }
  }
  if (nan && f.Has("message")) return f.Invalid("\"message\" applies only to a \"status\" fault, not nan_loss");
  if (!nan && f.Has("loss_tensor")) {
    return f.Invalid("\"loss_tensor\" applies only to a nan_loss fault, not a \"status\" one");
  }
  FOREMAN_RETURN_IF_ERROR(f.String("message", &out->message));
  FOREMAN_RETURN_IF_ERROR(f.String("loss_tensor", &out->loss_tensor));
  if (out->loss_tensor.empty()) return f.Error("loss_tensor", "a fetch name (not empty)");
  FOREMAN_RETURN_IF_ERROR(f.Int("at_step", 0, &out->at_step));
  FOREMAN_RETURN_IF_ERROR(f.Number("probability", 0, 1, "a number in [0, 1]", &out->probability));
  FOREMAN_RETURN_IF_ERROR(f.Bool("repeat", &out->repeat));
  if (f.Has("at_step") == f.Has("probability")) {
    return f.Invalid("needs exactly one of \"at_step\" (a global_step) or \"probability\"");
  }
  return absl::OkStatus();
}

Status ParseHookFault(Fields& f, HookFault* out) {
  if (!f.Has("callback")) return f.Missing("callback", "begin, after_create_session, before_run, after_run or end");
  FOREMAN_RETURN_IF_ERROR(f.String("callback", &out->callback));
  if (out->callback != "begin" && out->callback != "after_create_session" && out->callback != "before_run" &&
      out->callback != "after_run" && out->callback != "end") {
    return f.Error("callback", "one of begin, after_create_session, before_run, after_run, end");
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("at_step", 0, &out->at_step));
  if (out->callback == "begin" && out->at_step != -1) {
    return f.Error("at_step", "absent for callback begin (it runs before any session)");
  }
  FOREMAN_RETURN_IF_ERROR(f.Bool("repeat", &out->repeat));
  return absl::OkStatus();
}

// 30 days: a process fault later than that is a mistake, not a plan
// (FaultInjectionHook::Create refuses it too).
constexpr double kMaxProcessTimeMs = 30.0 * 24 * 3600 * 1000;

Status ParseProcessFault(Fields& f, ProcessFault* out) {
  if (!f.Has("signal")) return f.Missing("signal", "SIGKILL or SIGTERM");
  std::string signal;
  FOREMAN_RETURN_IF_ERROR(f.String("signal", &signal));
  if (signal == "SIGKILL") {
    out->signal = SIGKILL;
  } else if (signal == "SIGTERM") {
    out->signal = SIGTERM;
  } else {
    return f.Error("signal", "\"SIGKILL\" or \"SIGTERM\"");
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("at_step", 0, &out->at_step));
  if (f.Has("at_time_ms")) {
    double ms = 0;
    FOREMAN_RETURN_IF_ERROR(f.Number("at_time_ms", 0, kMaxProcessTimeMs,
                                     "a number of milliseconds in [0, 2592000000] (30 days)", &ms));
    out->at_time = absl::Milliseconds(ms);
  }
  FOREMAN_RETURN_IF_ERROR(f.Bool("repeat", &out->repeat));
  if (f.Has("at_step") == f.Has("at_time_ms")) {
    return f.Invalid(
        "needs exactly one of \"at_step\" (a global_step) or \"at_time_ms\" (since the session started)");
  }
  return absl::OkStatus();
}

const char* ActorKindName(ActorFault::Kind k) {
  switch (k) {
    case ActorFault::Kind::kKill:
      return "kill";
    case ActorFault::Kind::kDelay:
      return "delay";
    case ActorFault::Kind::kDrop:
      return "drop";
  }
  return "unknown";
}

Status ParseActorFault(Fields& f, ActorFault* out) {
  if (!f.Has("service")) return f.Missing("service", "summary_writer, checkpoint_saver, step_counter or input_pipeline");
  FOREMAN_RETURN_IF_ERROR(f.String("service", &out->service));
  if (out->service != "summary_writer" && out->service != "checkpoint_saver" && out->service != "step_counter" &&
      out->service != "input_pipeline") {
    return f.Error("service", "one of summary_writer, checkpoint_saver, step_counter, input_pipeline");
  }
  if (f.Take("kind")) {
    std::string kind;
    FOREMAN_RETURN_IF_ERROR(f.String("kind", &kind));
    if (kind == "kill") {
      out->kind = ActorFault::Kind::kKill;
    } else if (kind == "delay") {
      out->kind = ActorFault::Kind::kDelay;
    } else if (kind == "drop") {
      out->kind = ActorFault::Kind::kDrop;
    } else {
      return f.Error("kind", "one of kill, delay, drop");
    }
  }
  const ActorFault::Kind k = out->kind;
  if (f.Has("at_step") == f.Has("at_time_ms")) {
    return f.Invalid("needs exactly one of \"at_step\" (a global_step) or \"at_time_ms\" (on the session's Clock)");
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("at_step", 0, &out->at_step));
  if (f.Has("at_time_ms")) {
    double ms = 0;
    FOREMAN_RETURN_IF_ERROR(
        f.Number("at_time_ms", 0, 1e15, "a number of milliseconds >= 0 (since the services started)", &ms));
    out->at_time = absl::Milliseconds(ms);
  }
  if (k == ActorFault::Kind::kDelay) {
    if (!f.Has("delay_ms")) return f.Missing("delay_ms", "how long each message waits, in milliseconds");
    double ms = 0;
    FOREMAN_RETURN_IF_ERROR(
        f.Number("delay_ms", 0, kMaxLatencyMs, "a number of milliseconds in [0, 3600000] (an hour)", &ms));
    out->delay = absl::Milliseconds(ms);
  } else if (f.Has("delay_ms")) {
    return f.Invalid(absl::StrCat("\"delay_ms\" applies only to kind delay, not ", ActorKindName(k)));
  }
  if (k == ActorFault::Kind::kKill && f.Has("count")) {
    return f.Invalid("\"count\" applies only to kinds delay and drop, not kill");
  }
  FOREMAN_RETURN_IF_ERROR(f.Int("count", 1, &out->count));
  if (k != ActorFault::Kind::kKill && f.Has("exit_normally")) {
    return f.Invalid(absl::StrCat("\"exit_normally\" applies only to kind kill, not ", ActorKindName(k)));
  }
  FOREMAN_RETURN_IF_ERROR(f.Bool("exit_normally", &out->exit_normally));
  FOREMAN_RETURN_IF_ERROR(f.Bool("repeat", &out->repeat));
  return absl::OkStatus();
}

StatusOr<FaultPlan> ParsePlanDocument(const json& doc, const std::string& source) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": a plan must be a JSON object, got ", Describe(doc)));
  }
  FaultPlan plan;
  Fields top(doc, source);
  if (top.Take("seed")) {
    const json& v = doc.at("seed");
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      return top.Error("seed", "an integer >= 0");
    }
    plan.seed = v.get<uint64_t>();
  }
  if (top.Take("faults")) {
    const json& faults = doc.at("faults");
    if (!faults.is_array()) return top.Error("faults", "an array of faults");
    std::set<std::string> ids;
    for (std::size_t i = 0; i < faults.size(); ++i) {
      const json& item = faults[i];
      std::string where = absl::StrCat(source, ": faults[", i, "]");
      if (!item.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a fault must be an object, got ", Describe(item)));
      }
      Fields f(item, where);
      std::string id;
      if (!f.Has("id")) return f.Missing("id", "a name for the fault, unique in the plan");
      FOREMAN_RETURN_IF_ERROR(f.String("id", &id));
      if (id.empty()) return f.Error("id", "a non-empty string");
      if (!CheckFaultIdCharacters(id).ok()) {
        return f.Error("id", "a string without control characters (newline, tab, ...: ids are logged as they are)");
      }
      where = absl::StrCat(where, " (\"", id, "\")");
      Fields g(item, where);
      g.Take("id");
      if (!ids.insert(id).second) return g.Invalid("duplicate id: another fault has it");
      if (!g.Has("type")) return g.Missing("type", "env, step, hook, process or actor");
      std::string type;
      FOREMAN_RETURN_IF_ERROR(g.String("type", &type));
      if (type == "env") {
        EnvFault e;
        e.id = id;
        FOREMAN_RETURN_IF_ERROR(ParseEnvFault(g, &e));
        plan.env.push_back(std::move(e));
      } else if (type == "step") {
        StepFault s;
        s.id = id;
        FOREMAN_RETURN_IF_ERROR(ParseStepFault(g, &s));
        plan.steps.push_back(std::move(s));
      } else if (type == "hook") {
        HookFault h;
        h.id = id;
        FOREMAN_RETURN_IF_ERROR(ParseHookFault(g, &h));
        plan.hooks.push_back(std::move(h));
      } else if (type == "process") {
        ProcessFault p;
        p.id = id;
        FOREMAN_RETURN_IF_ERROR(ParseProcessFault(g, &p));
        plan.processes.push_back(std::move(p));
      } else if (type == "actor") {
        ActorFault a;
        a.id = id;
        FOREMAN_RETURN_IF_ERROR(ParseActorFault(g, &a));
        plan.actors.push_back(std::move(a));
      } else {
        return g.Error("type", "one of env, step, hook, process, actor");
      }
      FOREMAN_RETURN_IF_ERROR(g.Finish());
    }
  }
  FOREMAN_RETURN_IF_ERROR(top.Finish());
  return plan;
}

}  // namespace

StatusOr<FaultPlan> ParseFaultPlan(absl::string_view json_text, absl::string_view source_name) {
  const std::string source(source_name);
  json doc;
  try {
    doc = ParseRefusingDuplicateKeys(json_text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const json::exception& e) {  // e.g. out_of_range: a number beyond a double (1e400)
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a usable JSON plan: ", e.what()));
  } catch (const DuplicateKey& d) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the key \"", d.key, "\" appears twice in one object (which one was meant?)"));
  }
  try {
    return ParsePlanDocument(doc, source);
  } catch (const json::exception& e) {  // a conversion the checks above missed: an error, never a crash
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a usable JSON plan: ", e.what()));
  }
}


StatusOr<FaultPlan> ReadFaultPlan(Env* env, const std::string& path) {
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(path));
  return ParseFaultPlan(text, path);
}

std::string FaultPlanToJson(const FaultPlan& plan) {
  ojson faults = ojson::array();
  for (const EnvFault& e : plan.env) {
    ojson j;
    j["id"] = e.id;
    j["type"] = "env";
    if (!e.path_pattern.empty()) j["path"] = e.path_pattern;
    j["op"] = EnvOpName(e.op);
    j["kind"] = EnvKindName(e.kind);
    if (e.error != 0) {
      const char* name = nullptr;
      for (const ErrnoName& n : kErrnos) {
        if (n.value == e.error) name = n.name;
      }
      if (name != nullptr) {
        j["error"] = name;
      } else {
        j["error"] = e.error;
      }
    }
    if (e.prefix_bytes != -1) j["prefix_bytes"] = e.prefix_bytes;
    if (e.kind == EnvFault::Kind::kLatency || e.latency != absl::ZeroDuration()) {
      j["latency_ms"] = absl::ToDoubleMilliseconds(e.latency);
    }
    if (e.nth != 0) {
      j["nth"] = e.nth;
    } else {
      j["probability"] = e.probability;
    }
    j["repeat"] = e.repeat;
    faults.push_back(std::move(j));
  }
  for (const StepFault& s : plan.steps) {
    ojson j;
    j["id"] = s.id;
    j["type"] = "step";
    if (s.kind == StepFault::Kind::kNanLoss) {
      j["nan_loss"] = true;
      j["loss_tensor"] = s.loss_tensor;
    } else {
      j["status"] = absl::StatusCodeToString(s.code);
      if (!s.message.empty()) j["message"] = s.message;
    }
    if (s.at_step >= 0) {
      j["at_step"] = s.at_step;
    } else {
      j["probability"] = s.probability;
    }
    j["repeat"] = s.repeat;
    faults.push_back(std::move(j));
  }
  for (const HookFault& h : plan.hooks) {
    ojson j;
    j["id"] = h.id;
    j["type"] = "hook";
    j["callback"] = h.callback;
    if (h.at_step >= 0) j["at_step"] = h.at_step;
    j["repeat"] = h.repeat;
    faults.push_back(std::move(j));
  }
  for (const ProcessFault& p : plan.processes) {
    ojson j;
    j["id"] = p.id;
    j["type"] = "process";
    // A signal that has no name in a plan (a FaultPlan built in code) is
    // written as its number, which ParseFaultPlan refuses, as Create does.
    if (p.signal == SIGKILL || p.signal == SIGTERM) {
      j["signal"] = SignalName(p.signal);
    } else {
      j["signal"] = p.signal;
    }
    // Both, or neither ("at_step": -1), as given: ParseFaultPlan refuses them as Create does.
    if (p.at_step >= 0 || p.at_time == absl::InfiniteDuration()) j["at_step"] = p.at_step;
    if (p.at_time != absl::InfiniteDuration()) j["at_time_ms"] = absl::ToDoubleMilliseconds(p.at_time);
    j["repeat"] = p.repeat;
    faults.push_back(std::move(j));
  }
  for (const ActorFault& a : plan.actors) {
    ojson j;
    j["id"] = a.id;
    j["type"] = "actor";
    j["service"] = a.service;
    j["kind"] = ActorKindName(a.kind);
    if (a.at_step >= 0) {
      j["at_step"] = a.at_step;
    } else {
      j["at_time_ms"] = absl::ToDoubleMilliseconds(a.at_time);
    }
    if (a.kind == ActorFault::Kind::kDelay) j["delay_ms"] = absl::ToDoubleMilliseconds(a.delay);
    if (a.kind != ActorFault::Kind::kKill) j["count"] = a.count;
    if (a.kind == ActorFault::Kind::kKill) j["exit_normally"] = a.exit_normally;
    j["repeat"] = a.repeat;
    faults.push_back(std::move(j));
  }
  ojson doc;
  doc["seed"] = plan.seed;
  doc["faults"] = std::move(faults);
  // Text that is not UTF-8 (an id built in code) is written as U+FFFD rather
  // than thrown about; a plan parsed from JSON never has any.
  return doc.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

// -- the fired-fault record ------------------------------------------------------

Status WriteFiredFaults(Env* env, const std::string& run_dir, const std::vector<FiredFault>& fired) {
  ojson list = ojson::array();
  for (const FiredFault& f : fired) {
    ojson j;
    j["id"] = f.id;
    j["path"] = f.path;
    j["op"] = EnvOpName(f.op);
    j["op_index"] = f.op_index;
    list.push_back(std::move(j));
  }
  ojson doc;
  doc["fired"] = std::move(list);
  // A path is bytes, not necessarily UTF-8 (a Latin-1 directory name): such
  // bytes are written as U+FFFD. MarkFired matches ids, not paths.
  return WriteFileAtomic(env, JoinPath(run_dir, kFaultRecordFile),
                         doc.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n");
}

StatusOr<std::vector<FiredFault>> ReadFiredFaults(Env* env, const std::string& run_dir) {
  const std::string path = JoinPath(run_dir, kFaultRecordFile);
  Status exists = env->FileExists(path);
  if (absl::IsNotFound(exists)) return std::vector<FiredFault>{};
  FOREMAN_RETURN_IF_ERROR(exists);
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(path));
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid fault record: ", what));
  };
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    return corrupt(absl::StrCat("JSON error at byte ", e.byte));
  } catch (const json::exception& e) {  // e.g. a number beyond a double
    return corrupt(e.what());
  }
  if (!doc.is_object() || doc.size() != 1 || !doc.contains("fired") || !doc["fired"].is_array()) {
    return corrupt("expected {\"fired\": [...]}");
  }
  std::vector<FiredFault> out;
  const json& list = doc["fired"];
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& j = list[i];
    const std::string where = absl::StrCat("fired[", i, "]");
    if (!j.is_object() || j.size() != 4 || !j.contains("id") || !j["id"].is_string() || !j.contains("path") ||
        !j["path"].is_string() || !j.contains("op") || !j["op"].is_string() || !j.contains("op_index") ||
        !j["op_index"].is_number_integer() ||
        (j["op_index"].is_number_unsigned() && j["op_index"].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
        (!j["op_index"].is_number_unsigned() && j["op_index"].get<int64_t>() < 0)) {
      return corrupt(
          absl::StrCat(where, ": expected {\"id\", \"path\", \"op\", \"op_index\" (an integer >= 0)}"));
    }
    FiredFault f;
    f.id = j["id"].get<std::string>();
    f.path = j["path"].get<std::string>();
    if (!ParseEnvOp(j["op"].get<std::string>(), &f.op)) return corrupt(absl::StrCat(where, ": unknown op"));
    f.op_index = j["op_index"].get<int64_t>();
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace foreman
