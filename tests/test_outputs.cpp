// Every output the runner writes besides checkpoints (runner/atomic_output.h): built beside the
// target and put in place whole, an existing one replaced only with --force and only once the
// new one is complete, one writer per output, a failed or interrupted write leaving the previous
// output byte for byte and no temporary behind (a killed writer's temporary removed by the next
// command). The library first, then the commands: data prepare, export, tokenizer training.
// Interrupts at random moments are the soak's (tests/soak/outputs.py); here each failure is
// made to happen at a known point: a file-size limit (ENOSPC's stand-in), a held lock, a signal
// once the command's temporary exists.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "runner/atomic_output.h"
#include "runner/errors.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;
using test_support::Result;
using test_support::runner_cmd;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// Every file under `dir` (relative path -> bytes): what "byte-identical" compares.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = test_support::slurp(e.path());
  return out;
}

// Names in `dir` other than the expected outputs: temporaries and lock files left behind.
std::vector<std::string> leftovers(const fs::path& dir, const std::vector<std::string>& expected) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (std::find(expected.begin(), expected.end(), n) == expected.end()) out.push_back(n);
  }
  return out;
}

// A PID that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// Waits (up to 60 s) until `dir` holds an entry starting with `prefix`; false when `pid` ended first.
bool wait_for_entry(const fs::path& dir, const std::string& prefix, pid_t pid) {
  for (int i = 0; i < 60000; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

int wait_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("StagedDir: built beside, swapped in whole, --force only, no temporary left") {
  test_support::TempDir dir("outputs");
  const fs::path out = dir / "out";
  {
    StagedDir s(out.string(), false, "test");
    write(fs::path(s.path()) / "a.txt", "new");
    CHECK(!fs::exists(out));  // nothing at the target before commit
    s.commit();
  }
  CHECK(test_support::slurp(out / "a.txt") == "new");
  CHECK(leftovers(dir, {"out"}).empty());

  // An existing output: refused without force, before anything is made.
  const std::string refused = user_error([&] { StagedDir s(out.string(), false, "test", "--force"); });
  CHECK(refused.find("is not empty") != std::string::npos);
  CHECK(refused.find("--force") != std::string::npos);
  CHECK(leftovers(dir, {"out"}).empty());

  // With force: the old output stays whole until commit; an uncommitted one changes nothing.
  const auto before = tree(out);
  {
    StagedDir s(out.string(), true, "test");
    write(fs::path(s.path()) / "b.txt", "half");
    CHECK(tree(out) == before);
  }  // not committed: as if interrupted
  CHECK(tree(out) == before);
  CHECK(leftovers(dir, {"out"}).empty());
  {
    StagedDir s(out.string(), true, "test");
    write(fs::path(s.path()) / "b.txt", "whole");
    s.commit();
  }
  CHECK(tree(out) == std::map<std::string, std::string>{{"b.txt", "whole"}});
  CHECK(leftovers(dir, {"out"}).empty());
}

TEST_CASE("one output, one writer: a second writer is refused while the first holds it") {
  test_support::TempDir dir("outputs");
  const fs::path out = dir / "out";
  StagedDir first(out.string(), false, "data prepare");
  const std::string second = user_error([&] { StagedDir s(out.string(), false, "data prepare"); });
  CHECK(second.find("being written by another runner") != std::string::npos);
  CHECK(second.find("pid " + std::to_string(::getpid())) != std::string::npos);
  // A file output has the same rule.
  StagedFile f((dir / "r.yaml").string(), false, "import --recipe-out");
  CHECK(user_error([&] { StagedFile g((dir / "r.yaml").string(), true, "import --recipe-out"); })
            .find("being written by another runner") != std::string::npos);
}

TEST_CASE("a dead writer's temporaries are swept by the next writer; a live one's are kept") {
  test_support::TempDir dir("outputs");
  const pid_t dead = dead_pid();
  const fs::path stale = dir / (".out.tmp." + std::to_string(dead));
  const fs::path old_style = dir / ("out.tmp-" + std::to_string(dead));
  const fs::path single = dir / ("out.tmp." + std::to_string(dead));  // `data prepare TEXT OUT.h5`'s
  const fs::path live = dir / (".out.tmp." + std::to_string(::getppid()));
  const fs::path other = dir / (".other.tmp." + std::to_string(dead));  // another output's
  for (const fs::path& p : {stale, old_style, live, other}) write(p / "shard.h5", "partial");
  write(single, "partial");
  {
    StagedDir s((dir / "out").string(), false, "test");
    s.commit();
  }
  CHECK(!fs::exists(stale));
  CHECK(!fs::exists(old_style));
  CHECK(!fs::exists(single));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
}

TEST_CASE("write_file_atomic: a write the file system refuses keeps the previous file and leaves no temporary") {
  test_support::TempDir dir("outputs");
  const fs::path f = dir / "report.html";
  write_file_atomic(f.string(), "previous");
  // A file-size limit stands in for a full disk: the write fails part way (EFBIG), in a child
  // so the limit does not reach the test.
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      write_file_atomic(f.string(), std::string(1 << 20, 'x'));
    } catch (const UserError& e) {
      ::_exit(std::string(e.what()).find("cannot write the file") != std::string::npos ? 2 : 1);
    }
    ::_exit(0);
  }
  CHECK(wait_code(child) == 2);
  CHECK(test_support::slurp(f) == "previous");
  CHECK(leftovers(dir, {"report.html"}).empty());
}

TEST_CASE("data prepare: a second prepare into an OUT being written is refused, and writes nothing") {
  test_support::TempDir dir("outputs");
  write(dir / "corpus.txt", "some text\nand more\n");
  const fs::path out = dir / "data";
  {
    OutputLock held(out.string(), "data prepare");  // another prepare, mid-way
    Result r = runner_cmd("data prepare " + (dir / "corpus.txt").string() + " " + out.string());
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("being written by another runner") != std::string::npos);
    CHECK(!fs::exists(out));
  }
  Result ok = runner_cmd("data prepare " + (dir / "corpus.txt").string() + " " + out.string());
  INFO(ok.out);
  CHECK(ok.code == 0);
  // Replaced only with --force; the refused attempt leaves it byte for byte.
  const auto before = tree(out);
  write(dir / "other.txt", "other text entirely\n");
  Result again = runner_cmd("data prepare " + (dir / "other.txt").string() + " " + out.string());
  CHECK(again.code == 2);
  CHECK(tree(out) == before);
  Result forced = runner_cmd("data prepare " + (dir / "other.txt").string() + " " + out.string() + " --force");
  CHECK(forced.code == 0);
  CHECK(tree(out) != before);
  CHECK(leftovers(dir, {"corpus.txt", "other.txt", "data"}).empty());
}

TEST_CASE("export: an existing export is replaced only with --force, and a killed export leaves it byte for byte") {
  const test_support::TinyQuickstartRun& t = test_support::tiny_quickstart("outputs_export", 2, "1e-3");
  test_support::TempDir dir("outputs");
  const fs::path out = dir / "exp";
  const std::string exp = "export " + t.run.string() + " --out " + out.string();
  REQUIRE(runner_cmd(exp).code == 0);
  const auto before = tree(out);
  Result again = runner_cmd(exp);
  CHECK(again.code == 2);
  CHECK(again.out.find("--force") != std::string::npos);
  CHECK(tree(out) == before);
  // A file-size limit kills the export (SIGXFSZ) while it writes the weights: the previous
  // export is untouched, its temporary stays (the process died), and the next export sweeps it.
  Result killed = test_support::sh("ulimit -f 8; exec " + test_support::binary() + " " + exp + " --force --dtype bf16");
  INFO(killed.out);
  CHECK(killed.code == 128 + SIGXFSZ);
  CHECK(tree(out) == before);
  CHECK(!leftovers(dir, {"exp"}).empty());
  Result forced = runner_cmd(exp + " --force --dtype bf16");
  INFO(forced.out);
  CHECK(forced.code == 0);
  CHECK(tree(out) != before);  // the bf16 export replaced the fp32 one
  CHECK(leftovers(dir, {"exp"}).empty());
}

TEST_CASE("tokenizer training: SIGTERM stops it at once with exit 3, the previous tokenizer untouched") {
  test_support::TempDir dir("outputs");
  // A corpus large enough that training is still running when the signal comes.
  std::string corpus;
  for (int i = 0; i < 40000; ++i)
    corpus += "line " + std::to_string(i * 7919 % 100003) + " of the corpus, word" + std::to_string(i % 977) + " more\n";
  write(dir / "corpus.txt", corpus);
  const fs::path out = dir / "tok";
  write(out / "tokenizer.model", "the previous tokenizer");
  const pid_t pid = test_support::spawn_runner(
      {"data", "tokenizer", "train", (dir / "corpus.txt").string(), "--vocab", "1000", "--threads", "1", "--out",
       out.string(), "--force"},
      {}, dir / "log.txt");
  REQUIRE(wait_for_entry(dir, ".tok.tmp.", pid));
  ::kill(pid, SIGTERM);
  const int code = wait_code(pid);
  INFO(test_support::slurp(dir / "log.txt"));
  CHECK(code == 3);
  CHECK(test_support::slurp(out / "tokenizer.model") == "the previous tokenizer");
  CHECK(leftovers(dir, {"corpus.txt", "tok", "log.txt"}).empty());
}

TEST_CASE("--force never replaces a directory holding the command's input or the working directory") {
  test_support::TempDir dir("outputs");
  write(dir / "data" / "corpus.txt", "text to keep\n");
  const std::string inside = user_error([&] {
    StagedDir s((dir / "data").string(), true, "data prepare", "--force", {(dir / "data" / "corpus.txt").string()});
  });
  CHECK(inside.find("corpus.txt, which data prepare would delete") != std::string::npos);
  const std::string cwd = user_error([&] { StagedDir s(fs::current_path().parent_path().string(), true, "export"); });
  CHECK(cwd.find("the working directory") != std::string::npos);
  // Through the binary: exporting over the run being exported.
  const test_support::TinyQuickstartRun& t = test_support::tiny_quickstart("outputs_export", 2, "1e-3");
  Result r = runner_cmd("export " + t.run.string() + " --out " + t.run.string() + " --force");
  CHECK(r.code == 2);
  CHECK(fs::exists(t.run / "checkpoints"));
  CHECK(test_support::slurp(dir / "data" / "corpus.txt") == "text to keep\n");
}
