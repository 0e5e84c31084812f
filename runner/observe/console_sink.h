// The console half of a run's log: stdout (colours on a terminal), which may die under the run.
//
// `runner train r.yaml | tee log` and Ctrl-C to the process group: tee exits first, and the
// run's next write to stdout fails. A run must not die of that (SIGPIPE is ignored while it
// trains, runner/signals.h) nor keep writing into a dead stream: on the first failed write
// this sink stops for good and says so once in the run's log file, which keeps every line.
#pragma once
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/sink.h>

namespace runner {

class ConsoleSink final : public spdlog::sinks::sink {
 public:
  // Writes through `inner` (a sink on `stream`); `keeper` (the run's log file) gets the one line
  // that says the console is gone.
  ConsoleSink(std::shared_ptr<spdlog::sinks::sink> inner, std::FILE* stream, std::shared_ptr<spdlog::sinks::sink> keeper,
              std::string keeper_path);
  void log(const spdlog::details::log_msg& msg) override;
  void flush() override;
  void set_pattern(const std::string& pattern) override;
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override;
  bool closed() const;

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_, keeper_;
  std::FILE* stream_;
  std::string keeper_path_;
  mutable std::mutex mu_;
  bool closed_ = false;
  void close_after_error(int err);
};

// A console sink on stdout for a run whose log file is `file_sink` at `file_path`.
std::shared_ptr<ConsoleSink> stdout_console_sink(std::shared_ptr<spdlog::sinks::sink> file_sink, const std::string& file_path);

// fputs that tolerates a closed stream (fmt::print throws when its write fails).
void console_write(std::FILE* stream, const std::string& text);

}  // namespace runner
