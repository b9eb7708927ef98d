// Tests for ConfigureLogging, ParseLogLevel, GetLogLevel
// (include/foreman/logging.hpp) and the internal macros (src/log.hpp).
//
// The logger is process-wide: every test that reconfigures it restores the
// default configuration when it ends, and logs to files in its own temporary
// directory, not to stderr.
#include "foreman/logging.hpp"
#include "support/test_util.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "platform/log.hpp"

namespace foreman {
namespace {

// -- helpers -------------------------------------------------------------------

using foreman::testing::TempDir;

/// Restores the default logging configuration at the end of a test.
struct RestoreLogging {
  ~RestoreLogging() { (void)ConfigureLogging(LogOptions{}); }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// The message of a line "[YYYY-MM-DD HH:MM:SS.mmm] [<letter>] <message>",
/// or "<malformed>" when the line has another shape or level letter.
std::string MessageOf(const std::string& line, char letter) {
  const std::string shape = "[dddd-dd-dd dd:dd:dd.ddd] [L] ";
  if (line.size() < shape.size()) return "<malformed>";
  for (size_t i = 0; i < shape.size(); ++i) {
    const char c = line[i];
    const bool ok = shape[i] == 'd'   ? std::isdigit(static_cast<unsigned char>(c)) != 0
                    : shape[i] == 'L' ? c == letter
                                      : c == shape[i];
    if (!ok) return "<malformed>";
  }
  return line.substr(shape.size());
}

/// Options that log to `path` only.
LogOptions FileOnly(const std::string& path, LogLevel level) {
  LogOptions o;
  o.level = level;
  o.to_stderr = false;
  o.file_path = path;
  return o;
}

/// One message at each level, tagged so a test can look for it.
void LogOneOfEach(const std::string& tag) {
  FOREMAN_LOG_TRACE("trace {} {}", tag, 1);
  FOREMAN_LOG_DEBUG("debug {} {}", tag, 2);
  FOREMAN_LOG_INFO("info {} {}", tag, 3);
  FOREMAN_LOG_WARN("warn {} {}", tag, 4);
  FOREMAN_LOG_ERROR("error {} {}", tag, 5);
}

// -- configuration -------------------------------------------------------------

TEST_CASE("The default options log at info to stderr only") {
  RestoreLogging restore;
  const LogOptions defaults;
  CHECK(defaults.level == LogLevel::kInfo);
  CHECK(defaults.to_stderr);
  CHECK(defaults.file_path.empty());
  CHECK(ConfigureLogging(defaults).ok());
  CHECK(GetLogLevel() == LogLevel::kInfo);
  CHECK(internal::Logger().name() == "foreman");
}

TEST_CASE("A log file gets the messages at or above the level, and none below") {
  RestoreLogging restore;
  TempDir dir;
  const std::string path = (dir / "foreman.log");
  const Status s = ConfigureLogging(FileOnly(path, LogLevel::kWarning));
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  CHECK(GetLogLevel() == LogLevel::kWarning);

  LogOneOfEach("A");
  const std::vector<std::string> lines = ReadLines(path);
  REQUIRE(lines.size() == 2);
  CHECK_MESSAGE(MessageOf(lines[0], 'W') == "warn A 4", lines[0]);
  CHECK_MESSAGE(MessageOf(lines[1], 'E') == "error A 5", lines[1]);
}

TEST_CASE("stderr_level keeps lower messages off stderr while the file gets them all") {
  RestoreLogging restore;
  TempDir dir;
  const std::string path = (dir / "foreman.log");
  const std::string err_path = (dir / "stderr.txt");
  LogOptions o;
  o.level = LogLevel::kInfo;
  o.stderr_level = LogLevel::kWarning;
  o.file_path = path;
  // stderr goes to a file for the duration of the test.
  std::fflush(stderr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  std::FILE* err = std::fopen(err_path.c_str(), "w");
  REQUIRE(err != nullptr);
  REQUIRE(::dup2(::fileno(err), 2) >= 0);
  const Status s = ConfigureLogging(o);
  LogOneOfEach("S");
  (void)ConfigureLogging(FileOnly(path, LogLevel::kInfo));  // flushes and drops the stderr sink
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(err);
  REQUIRE_MESSAGE(s.ok(), s.ToString());

  const std::string on_stderr = ReadFile(err_path);
  CHECK_FALSE(Contains(on_stderr, "info S 3"));
  CHECK(Contains(on_stderr, "warn S 4"));
  CHECK(Contains(on_stderr, "error S 5"));
  const std::string in_file = ReadFile(path);
  CHECK(Contains(in_file, "info S 3"));
  CHECK(Contains(in_file, "warn S 4"));
  CHECK_FALSE(Contains(in_file, "debug S 2"));
}

TEST_CASE("Level trace lets every message through and level off none") {
  RestoreLogging restore;
  TempDir dir;
  const std::string all = (dir / "all.log");
  REQUIRE(ConfigureLogging(FileOnly(all, LogLevel::kTrace)).ok());
  CHECK(GetLogLevel() == LogLevel::kTrace);
  LogOneOfEach("B");
  const std::string text = ReadFile(all);
  CHECK(Contains(text, "[T] trace B 1"));
  CHECK(Contains(text, "[D] debug B 2"));
  CHECK(Contains(text, "[I] info B 3"));
  CHECK(Contains(text, "[W] warn B 4"));
  CHECK(Contains(text, "[E] error B 5"));

  const std::string none = (dir / "none.log");
  REQUIRE(ConfigureLogging(FileOnly(none, LogLevel::kOff)).ok());
  CHECK(GetLogLevel() == LogLevel::kOff);
  LogOneOfEach("C");
  CHECK(ReadFile(none).empty());
  CHECK_FALSE(Contains(ReadFile(all), " C "));  // the old file no longer gets messages
}

TEST_CASE("A disabled level does not evaluate the message arguments") {
  RestoreLogging restore;
  TempDir dir;
  REQUIRE(ConfigureLogging(FileOnly((dir / "x.log"), LogLevel::kInfo)).ok());
  int evaluated = 0;
  FOREMAN_LOG_DEBUG("{}", ++evaluated);
  CHECK(evaluated == 0);
  FOREMAN_LOG_INFO("{}", ++evaluated);
  CHECK(evaluated == 1);
}

TEST_CASE("ConfigureLogging appends to an existing log file") {
  RestoreLogging restore;
  TempDir dir;
  const std::string path = (dir / "existing.log");
  std::ofstream(path) << "an earlier line\n";
  REQUIRE(ConfigureLogging(FileOnly(path, LogLevel::kInfo)).ok());
  FOREMAN_LOG_INFO("a new line");
  const std::vector<std::string> lines = ReadLines(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "an earlier line");
  CHECK(Contains(lines[1], "[I] a new line"));
}

// -- errors --------------------------------------------------------------------

TEST_CASE("A log file in a missing directory is NOT_FOUND, names the path, and keeps the old setup") {
  RestoreLogging restore;
  TempDir dir;
  const std::string good = (dir / "good.log");
  REQUIRE(ConfigureLogging(FileOnly(good, LogLevel::kInfo)).ok());

  const std::string missing_dir = (dir / "missing");
  const std::string bad = missing_dir + "/foreman.log";
  const Status s = ConfigureLogging(FileOnly(bad, LogLevel::kDebug));
  CHECK_MESSAGE(s.code() == absl::StatusCode::kNotFound, s.ToString());
  CHECK_MESSAGE(Contains(std::string(s.message()), bad), s.ToString());
  CHECK_FALSE(std::filesystem::exists(missing_dir));  // not created behind our back

  CHECK(GetLogLevel() == LogLevel::kInfo);
  FOREMAN_LOG_DEBUG("debug after the failure");
  FOREMAN_LOG_INFO("info after the failure");
  const std::string text = ReadFile(good);
  CHECK(Contains(text, "[I] info after the failure"));
  CHECK_FALSE(Contains(text, "debug after the failure"));
}

TEST_CASE("A log file path under a regular file is NOT_FOUND") {
  RestoreLogging restore;
  TempDir dir;
  const std::string file = (dir / "plain");
  std::ofstream(file) << "x";
  const Status s = ConfigureLogging(FileOnly(file + "/foreman.log", LogLevel::kInfo));
  CHECK_MESSAGE(s.code() == absl::StatusCode::kNotFound, s.ToString());
}

TEST_CASE("A directory given as the log file is INTERNAL and names the path") {
  RestoreLogging restore;
  TempDir dir;
  const Status s = ConfigureLogging(FileOnly(dir.path(), LogLevel::kInfo));
  CHECK_MESSAGE(s.code() == absl::StatusCode::kInternal, s.ToString());
  CHECK_MESSAGE(Contains(std::string(s.message()), dir.path()), s.ToString());
}

TEST_CASE("An unwritable log file is PERMISSION_DENIED") {
  if (::geteuid() == 0) {
    MESSAGE("skipped: running as root, which may write anywhere");
    return;
  }
  RestoreLogging restore;
  TempDir dir;
  const std::string path = (dir / "read-only.log");
  std::ofstream(path) << "x";
  REQUIRE(::chmod(path.c_str(), 0444) == 0);
  const Status s = ConfigureLogging(FileOnly(path, LogLevel::kInfo));
  CHECK_MESSAGE(s.code() == absl::StatusCode::kPermissionDenied, s.ToString());
  CHECK_MESSAGE(Contains(std::string(s.message()), path), s.ToString());
}

// -- concurrency ---------------------------------------------------------------

TEST_CASE("Reconfiguring while another thread logs loses and duplicates no message") {
  RestoreLogging restore;
  TempDir dir;
  const std::string a = (dir / "a.log");
  const std::string b = (dir / "b.log");
  REQUIRE(ConfigureLogging(FileOnly(a, LogLevel::kInfo)).ok());

  constexpr int kMessages = 2000;
  std::thread logger([] {
    for (int i = 0; i < kMessages; ++i) FOREMAN_LOG_INFO("message {}", i);
  });
  for (int i = 0; i < 50; ++i) {
    CHECK(ConfigureLogging(FileOnly(i % 2 == 0 ? b : a, LogLevel::kInfo)).ok());
  }
  logger.join();

  std::multiset<int> seen;
  const std::string prefix = "message ";
  for (const std::string& path : {a, b}) {
    for (const std::string& line : ReadLines(path)) {
      const std::string message = MessageOf(line, 'I');
      REQUIRE_MESSAGE(message.rfind(prefix, 0) == 0, line);
      seen.insert(std::stoi(message.substr(prefix.size())));
    }
  }
  CHECK(seen.size() == kMessages);
  CHECK(std::set<int>(seen.begin(), seen.end()).size() == kMessages);
}

// -- levels --------------------------------------------------------------------

// -- escaping (issue 30 point 6) -------------------------------------------------

TEST_CASE("EscapeForTerminal keeps printable text and escapes what breaks a line or drives the terminal") {
  using namespace std::string_literals;
  // Printable ASCII and valid UTF-8 that prints come back unchanged, a
  // backslash included.
  for (const std::string& plain : {""s, "loss/total"s, "C:\\runs\\x"s, "précision 日本 😀"s, "a  b"s}) {
    CHECK(EscapeForTerminal(plain) == plain);
  }
  CHECK(EscapeForTerminal("two\nlines\r\tand a tab") == "two\\nlines\\r\\tand a tab");
  CHECK(EscapeForTerminal("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m");
  CHECK(EscapeForTerminal("nul\0bell\a del\x7f"s) == "nul\\x00bell\\x07 del\\x7f");
  // Bytes that are not UTF-8: each alone; a cut sequence; an overlong one;
  // a surrogate.
  CHECK(EscapeForTerminal("\xff\xfe") == "\\xff\\xfe");
  CHECK(EscapeForTerminal("cut \xe2\x82") == "cut \\xe2\\x82");
  CHECK(EscapeForTerminal("\xc0\xaf") == "\\xc0\\xaf");
  CHECK(EscapeForTerminal("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  // C1 controls (U+009B is CSI), line separators, bidi overrides, zero
  // width and BOM: valid UTF-8, escaped as code points.
  CHECK(EscapeForTerminal("\xc2\x9b" "31m") == "\\u009b31m");
  CHECK(EscapeForTerminal("a\xe2\x80\xa8" "b") == "a\\u2028b");
  CHECK(EscapeForTerminal("txt.\xe2\x80\xae" "exe") == "txt.\\u202eexe");
  CHECK(EscapeForTerminal("\xe2\x80\x8bhidden\xef\xbb\xbf") == "\\u200bhidden\\ufeff");
  CHECK(EscapeForTerminal("\xe2\x81\xa6" "x") == "\\u2066x");
  // Just outside the ranges: printed.
  CHECK(EscapeForTerminal("\xc2\xa0\xe2\x80\x90\xe2\x81\xb0") == "\xc2\xa0\xe2\x80\x90\xe2\x81\xb0");
  // Escaping twice changes nothing.
  for (const std::string& s : {"\x1b]0;title\a"s, "a\nb\xff"s, "\xe2\x80\xae"s}) {
    CHECK(EscapeForTerminal(EscapeForTerminal(s)) == EscapeForTerminal(s));
  }
}

TEST_CASE("A log line holds one message on one line: control characters in it are escaped") {
  RestoreLogging restore;
  TempDir dir;
  const std::string path = (dir / "foreman.log");
  REQUIRE(ConfigureLogging(FileOnly(path, LogLevel::kInfo)).ok());
  const std::string from_a_file = "tag\nforged [I] line\x1b[2J";
  FOREMAN_LOG_WARN("bad tag {} in {}", from_a_file, "events.out");
  const std::vector<std::string> lines = ReadLines(path);
  REQUIRE(lines.size() == 1);
  CHECK_MESSAGE(MessageOf(lines[0], 'W') == "bad tag tag\\nforged [I] line\\x1b[2J in events.out", lines[0]);
}

TEST_CASE("ParseLogLevel reads every level name") {
  const std::pair<const char*, LogLevel> cases[] = {
      {"trace", LogLevel::kTrace},   {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning}, {"error", LogLevel::kError},
      {"off", LogLevel::kOff},       {"INFO", LogLevel::kInfo},
  };
  for (const auto& c : cases) {
    const char* const text = c.first;
    const LogLevel level = c.second;
    CAPTURE(text);
    const StatusOr<LogLevel> parsed = ParseLogLevel(text);
    REQUIRE(parsed.ok());
    CHECK(*parsed == level);
  }
}

TEST_CASE("ParseLogLevel rejects other text as INVALID_ARGUMENT naming it") {
  for (const char* text : {"verbose", "", "inf", "info "}) {
    CAPTURE(text);
    const StatusOr<LogLevel> parsed = ParseLogLevel(text);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(std::string(parsed.status().message()), "\"" + std::string(text) + "\""));
  }
}

TEST_CASE("Each level set by ConfigureLogging reads back from GetLogLevel") {
  RestoreLogging restore;
  for (LogLevel level : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning,
                         LogLevel::kError, LogLevel::kOff}) {
    LogOptions o;
    o.level = level;
    o.to_stderr = false;
    REQUIRE(ConfigureLogging(o).ok());
    CHECK(GetLogLevel() == level);
  }
}

}  // namespace
}  // namespace foreman
