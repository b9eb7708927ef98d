// `foreman events <file or logdir>`: the values in TensorBoard event files,
// one line per summary value or other event:
//
//   step 100  wall 1700000000.123  scalar  loss = 0.25
//   step 100  wall 1700000000.123  histogram  weights  num 5  min -3  max 2  mean 0.2
//   step 100  wall 1700000000.123  text  note = "hello"
//   step 101  wall 1700000000.456  session_log  START
//
// --json prints one JSON object per line instead (NaN and infinities as the
// strings "NaN", "Infinity", "-Infinity").
//
// A log directory is read as TensorBoard reads one: every directory in it,
// the directory itself included, that holds event files (names containing
// "tfevents") is a run, named by its path relative to the log directory
// ("." for the directory's own files). With more than one run, or one in a
// subdirectory, each run's lines follow a "# run <name>" header, runs in
// sorted order ("." first); JSON lines then carry "run". Within a run, files
// go in name order, each after a "# <file>" header when there are several.
//
// A cut last record (a writer still appending) is ignored. A damaged record
// (checksum mismatch, or not an Event) ends that file as TF's
// summary_iterator does: what was read before it is printed, then an error
// naming the file and the damaged record's offset; the other files are
// still read, and the exit status is 2.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {

namespace {

struct EventsFlags {
  std::string path;
  bool json = false;
  std::string tag;
};

// -- formatting ---------------------------------------------------------------------

/// The shortest text that reads back as `v` ("0.25", "1e-07", "nan", "inf").
/// A float formats as a float: 0.1f is "0.1", not "0.10000000149011612".
template <class T>
std::string Number(T v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

/// `s` in C's quoted form; bytes that are not UTF-8 and invisible format
/// characters escaped too (EscapeForTerminal).
std::string QuotedText(absl::string_view s) {
  return absl::StrCat("\"", EscapeForTerminal(absl::Utf8SafeCEscape(s)), "\"");
}

/// Length of the valid UTF-8 sequence starting at s[i], or 0 if there is none.
std::size_t Utf8SequenceLength(absl::string_view s, std::size_t i) {
  static constexpr uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) return 1;
  const std::size_t n = (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0) return 0;
  uint32_t cp = lead & (0x7Fu >> n);  // the lead byte's payload bits
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (c & 0x3Fu);
  }
  if (cp < kMinCodePoint[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

/// `run` (valid UTF-8) escaped by nlohmann-json, without the quotes, with
/// this command's three escapes where nlohmann's differ: U+0008 and U+000C
/// as "\u0008" and "\u000c" (nlohmann: "\b", "\f"), and U+007F as
/// "\u007f" (nlohmann: the byte itself).
void AppendEscaped(absl::string_view run, std::string* out) {
  const std::string dumped = nlohmann::json(std::string(run)).dump();
  for (std::size_t i = 1; i + 1 < dumped.size(); ++i) {  // inside the quotes
    const char c = dumped[i];
    if (c == 0x7f) {
      *out += "\\u007f";
    } else if (c != '\\') {
      out->push_back(c);
    } else {
      const char next = dumped[++i];  // an escape: its second character
      *out += next == 'b' ? "\\u0008" : next == 'f' ? "\\u000c" : std::string{'\\', next};
    }
  }
}

/// `s` as a JSON string; bytes that are not valid UTF-8 become U+FFFD
/// ("\ufffd"), one per byte.
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  std::size_t run = 0;  // where the current valid run began
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = Utf8SequenceLength(s, i);
    if (n != 0) {
      i += n;
      continue;
    }
    AppendEscaped(s.substr(run, i - run), &out);
    out += "\\ufffd";
    run = ++i;
  }
  AppendEscaped(s.substr(run), &out);
  return out + "\"";
}

template <class T>
std::string JsonNumber(T v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return Number(v);
}

/// Seconds since the epoch in plain notation ("1700000000.5", not "1.7000000005e+09").
std::string JsonWallTime(double v) {
  char buf[400];  // enough for any finite double in fixed notation
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  return std::isfinite(v) && r.ec == std::errc() ? std::string(buf, r.ptr) : JsonNumber(v);
}

/// One JSON object, built field by field.
class JsonObject {
 public:
  JsonObject& Raw(absl::string_view key, absl::string_view json) {
    absl::StrAppend(&out_, out_.empty() ? "{" : ",", JsonString(key), ":", json);
    return *this;
  }
  JsonObject& Str(absl::string_view key, absl::string_view value) { return Raw(key, JsonString(value)); }
  template <class T>
  JsonObject& Num(absl::string_view key, T value) { return Raw(key, JsonNumber(value)); }
  std::string Finish() const { return out_ + "}"; }

 private:
  std::string out_;
};

const char* KindName(SummaryValue::Kind kind) {
  switch (kind) {
    case SummaryValue::Kind::kScalar: return "scalar";
    case SummaryValue::Kind::kHistogram: return "histogram";
    case SummaryValue::Kind::kText: return "text";
    case SummaryValue::Kind::kTensor: return "tensor";
    case SummaryValue::Kind::kOther: break;
  }
  return "other";
}

const char* KindName(Event::Kind kind) {
  switch (kind) {
    case Event::Kind::kNone: return "none";
    case Event::Kind::kFileVersion: return "file_version";
    case Event::Kind::kSummary: return "summary";
    case Event::Kind::kSessionLog: return "session_log";
    case Event::Kind::kLogMessage: return "log_message";
    case Event::Kind::kGraph: return "graph";
    case Event::Kind::kOther: break;
  }
  return "other";
}

std::string StatusName(SessionLogStatus status) {
  switch (status) {
    case SessionLogStatus::kUnspecified: return "STATUS_UNSPECIFIED";
    case SessionLogStatus::kStart: return "START";
    case SessionLogStatus::kStop: return "STOP";
    case SessionLogStatus::kCheckpoint: return "CHECKPOINT";
  }
  return absl::StrCat("STATUS_", static_cast<int>(status));
}

double Mean(const HistogramValue& h) { return h.sum / h.num; }  // NaN for an empty histogram

/// The text line for `value` of a summary event, or for a non-summary event
/// when `value` is null.
std::string TextLine(const Event& e, const SummaryValue* value) {
  std::string line = absl::StrFormat("step %d  wall %.3f  ", e.step, e.wall_time);
  if (value == nullptr) {
    absl::StrAppend(&line, KindName(e.kind));
    switch (e.kind) {
      case Event::Kind::kFileVersion: absl::StrAppend(&line, "  ", EscapeForTerminal(e.file_version)); break;
      case Event::Kind::kSessionLog:
        absl::StrAppend(&line, "  ", StatusName(e.session_status));
        if (!e.checkpoint_path.empty()) absl::StrAppend(&line, "  checkpoint_path ", EscapeForTerminal(e.checkpoint_path));
        if (!e.message.empty()) absl::StrAppend(&line, "  msg ", QuotedText(e.message));
        break;
      case Event::Kind::kLogMessage: absl::StrAppend(&line, "  ", QuotedText(e.message)); break;
      default: break;
    }
    return line;
  }
  absl::StrAppend(&line, KindName(value->kind), "  ", EscapeForTerminal(value->tag));
  switch (value->kind) {
    case SummaryValue::Kind::kScalar:  // simple_value is a float
      absl::StrAppend(&line, " = ", Number(static_cast<float>(value->scalar)));
      break;
    case SummaryValue::Kind::kTensor: absl::StrAppend(&line, " = ", Number(value->scalar)); break;
    case SummaryValue::Kind::kText: absl::StrAppend(&line, " = ", QuotedText(value->text)); break;
    case SummaryValue::Kind::kHistogram: {
      const HistogramValue& h = value->histogram;
      absl::StrAppend(&line, "  num ", Number(h.num), "  min ", Number(h.min), "  max ", Number(h.max),
                      "  mean ", Number(Mean(h)));
      break;
    }
    case SummaryValue::Kind::kOther:
      if (!value->plugin_name.empty()) absl::StrAppend(&line, "  plugin ", EscapeForTerminal(value->plugin_name));
      break;
  }
  return line;
}

/// TextLine() as a JSON object, with the file's path and, when not null,
/// the run's name.
std::string JsonLine(const std::string& file, const std::string* run, const Event& e, const SummaryValue* value) {
  JsonObject o;
  o.Str("file", file);
  if (run != nullptr) o.Str("run", *run);
  o.Raw("wall_time", JsonWallTime(e.wall_time)).Raw("step", absl::StrCat(e.step));
  if (value == nullptr) {
    o.Str("kind", KindName(e.kind));
    switch (e.kind) {
      case Event::Kind::kFileVersion: o.Str("file_version", e.file_version); break;
      case Event::Kind::kSessionLog:
        o.Str("status", StatusName(e.session_status))
            .Str("checkpoint_path", e.checkpoint_path)
            .Str("msg", e.message);
        break;
      case Event::Kind::kLogMessage: o.Str("message", e.message); break;
      default: break;
    }
    return o.Finish();
  }
  o.Str("kind", KindName(value->kind)).Str("tag", value->tag);
  if (!value->plugin_name.empty()) o.Str("plugin", value->plugin_name);
  switch (value->kind) {
    case SummaryValue::Kind::kScalar: o.Num("value", static_cast<float>(value->scalar)); break;
    case SummaryValue::Kind::kTensor: o.Num("value", value->scalar); break;
    case SummaryValue::Kind::kText: o.Str("value", value->text); break;
    case SummaryValue::Kind::kHistogram: {
      const HistogramValue& h = value->histogram;
      o.Num("num", h.num).Num("min", h.min).Num("max", h.max).Num("mean", Mean(h)).Num("sum", h.sum);
      break;
    }
    case SummaryValue::Kind::kOther: break;
  }
  return o.Finish();
}

// -- the command --------------------------------------------------------------------

/// Prints `s` and returns the exit code for it: bad input (a missing, corrupt
/// or foreign file) is kExitUsage, anything else kExitFailed.
int Fail(const Status& s) {
  std::fprintf(stderr, "foreman events: %s\n", EscapeForTerminal(s.message()).c_str());
  const bool bad_input = absl::IsNotFound(s) || absl::IsDataLoss(s) || absl::IsInvalidArgument(s);
  return bad_input ? kExitUsage : kExitFailed;
}

/// One run: a directory's event files, by name.
struct Run {
  std::string name;  // relative to the log directory; "." for itself
  std::vector<std::string> files;
};

/// The runs under `logdir` (TensorBoard's run discovery): every directory
/// in it, itself included, holding event files; symbolic links to
/// directories are not followed, unreadable directories are skipped (as
/// os.walk does). Sorted by name, "." first.
StatusOr<std::vector<Run>> FindRuns(Env* env, const std::string& logdir) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs = {logdir};
  std::error_code ec;
  fs::recursive_directory_iterator it(logdir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec) && !it->is_symlink(type_ec)) dirs.push_back(it->path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("listing the runs in ", logdir, ": ", ec.message()));
  std::vector<Run> runs;
  for (const std::string& dir : dirs) {
    FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> files, ListEventFiles(env, dir));
    if (files.empty()) continue;
    std::string name = dir == logdir ? "." : fs::path(dir).lexically_relative(logdir).string();
    runs.push_back(Run{std::move(name), std::move(files)});
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    return (a.name == ".") != (b.name == ".") ? a.name == "." : a.name < b.name;
  });
  if (runs.empty()) {
    return absl::NotFoundError(absl::StrCat("no event files in ", logdir, " or its subdirectories"));
  }
  return runs;
}

int RunEvents(const EventsFlags& flags) {
  Env* env = Env::Default();
  StatusOr<bool> is_dir = env->IsDirectory(flags.path);
  if (!is_dir.ok()) return Fail(is_dir.status());
  std::vector<Run> runs;
  if (*is_dir) {
    StatusOr<std::vector<Run>> found = FindRuns(env, flags.path);
    if (!found.ok()) return Fail(found.status());
    runs = *std::move(found);
  } else {
    runs.push_back(Run{"", {flags.path}});
  }
  // Run headers (and JSON's "run") when the runs are more than the log
  // directory's own files.
  const bool name_runs = runs.size() > 1 || (runs.size() == 1 && runs[0].name != "." && !runs[0].name.empty());
  int exit_code = kExitOk;
  for (const Run& run : runs) {
    if (!flags.json && name_runs) std::printf("# run %s\n", EscapeForTerminal(run.name).c_str());
    const std::string* run_name = name_runs ? &run.name : nullptr;
    for (const std::string& file : run.files) {
      if (!flags.json && run.files.size() > 1) std::printf("# %s\n", EscapeForTerminal(file).c_str());
      std::vector<Event> events;
      // Everything before a damaged record is printed, then the error.
      const Status read = ReadEventFileInto(env, file, &events, /*allow_truncated_tail=*/true);
      const auto print = [&](const Event& e, const SummaryValue* v) {
        const std::string line =
            absl::StrCat(flags.json ? JsonLine(file, run_name, e, v) : TextLine(e, v), "\n");
        std::fwrite(line.data(), 1, line.size(), stdout);
      };
      for (const Event& e : events) {
        if (e.kind != Event::Kind::kSummary) {
          if (flags.tag.empty()) print(e, nullptr);
          continue;
        }
        for (const SummaryValue& v : e.values) {
          if (flags.tag.empty() || v.tag == flags.tag) print(e, &v);
        }
      }
      if (!read.ok()) {
        std::fflush(stdout);  // the lines read come before the error
        const int code = Fail(read);
        if (exit_code == kExitOk) exit_code = code;
      }
    }
  }
  return exit_code;
}

}  // namespace

void AddEventsCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<EventsFlags>();
  auto* cmd = app.add_subcommand("events", "Print the events of TensorBoard event files");
  cmd->add_option("path", flags->path, "An event file, or a log directory (each directory in it with event files is a run)")
      ->required();
  cmd->add_flag("--json", flags->json, "One JSON object per line");
  cmd->add_option("--tag", flags->tag, "Only the summary values with this tag");
  cmd->callback([flags, exit_code] { *exit_code = RunEvents(*flags); });
}

}  // namespace foreman::cli
