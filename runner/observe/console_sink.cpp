// The console sink that stops when its stream dies (console_sink.h).
#include "runner/observe/console_sink.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace runner {

ConsoleSink::ConsoleSink(std::shared_ptr<spdlog::sinks::sink> inner, std::FILE* stream,
                         std::shared_ptr<spdlog::sinks::sink> keeper, std::string keeper_path)
    : inner_(std::move(inner)), keeper_(std::move(keeper)), stream_(stream), keeper_path_(std::move(keeper_path)) {}

void ConsoleSink::log(const spdlog::details::log_msg& msg) {
  std::lock_guard<std::mutex> g(mu_);
  if (closed_ || !should_log(msg.level)) return;
  errno = 0;
  inner_->log(msg);  // writes and flushes: a dead reader shows as the stream's error at once
  if (std::ferror(stream_)) close_after_error(errno);
}

void ConsoleSink::flush() {
  std::lock_guard<std::mutex> g(mu_);
  if (closed_) return;
  errno = 0;
  inner_->flush();
  if (std::ferror(stream_)) close_after_error(errno);
}

void ConsoleSink::set_pattern(const std::string& pattern) { inner_->set_pattern(pattern); }
void ConsoleSink::set_formatter(std::unique_ptr<spdlog::formatter> f) { inner_->set_formatter(std::move(f)); }

bool ConsoleSink::closed() const {
  std::lock_guard<std::mutex> g(mu_);
  return closed_;
}

// Called with mu_ held. The note goes to the file alone: the console is what failed.
void ConsoleSink::close_after_error(int err) {
  closed_ = true;
  const std::string why = err != 0 ? std::strerror(err) : std::string("write error");
  const std::string note = fmt::format("the console's output stream is closed ({}; a pipe whose reader exited, such as "
                                       "`| tee`): console lines stop here, the run goes on and {} keeps every line",
                                       why, keeper_path_.empty() ? std::string("the log file") : keeper_path_);
  if (keeper_) {
    keeper_->log(spdlog::details::log_msg("runner", spdlog::level::warn, note));
    keeper_->flush();
  }
}

std::shared_ptr<ConsoleSink> stdout_console_sink(std::shared_ptr<spdlog::sinks::sink> file_sink, const std::string& file_path) {
  return std::make_shared<ConsoleSink>(std::make_shared<spdlog::sinks::stdout_color_sink_mt>(), stdout, std::move(file_sink),
                                       file_path);
}

void console_write(std::FILE* stream, const std::string& text) {
  std::fputs(text.c_str(), stream);
  std::fflush(stream);
}

}  // namespace runner
