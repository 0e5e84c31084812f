// Bitwise resume (invariant 3) and preemption, through the real binary.
//
// One recipe (the quickstart, 30 steps, a checkpoint every 10) is trained three ways:
// straight through; killed with SIGKILL mid-step after the step-20 checkpoint and resumed
// with `runner resume`; stopped with SIGTERM and restarted with the same `runner train`
// command line. The final checkpoints must hold byte-identical tensors and the per-step
// losses after the resume must equal the straight run's exactly.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kArgs = std::string(RUNNER_SOURCE_DIR) +
                          "/recipes/quickstart.yaml --quiet --set train.steps=30 --set checkpoint.every_steps=10 "
                          "--set checkpoint.keep_last=10 --set train.eval_every=0 --set model.dropout=0.1";

pid_t spawn(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    std::string bin = RUNNER_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string w; in >> w;) v.push_back(w);
  return v;
}

int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int train(const std::string& run_dir) {
  auto args = split("train " + kArgs);
  args.push_back("--run-dir");
  args.push_back(run_dir);
  return wait_exit(spawn(args));
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every dataset under /params and /optimizer, as raw bytes.
std::map<std::string, std::vector<char>> tensors(const fs::path& file) {
  std::map<std::string, std::vector<char>> out;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  struct Ctx { hid_t f; std::string prefix; std::map<std::string, std::vector<char>>* out; };
  auto visit = [](hid_t obj, const char* name, const H5O_info_t* info, void* op) -> herr_t {
    auto* c = static_cast<Ctx*>(op);
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    hid_t s = H5Dget_space(d);
    size_t n = static_cast<size_t>(H5Sget_simple_extent_npoints(s)) * H5Tget_size(t);
    std::vector<char> buf(n);
    H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    (*c->out)[c->prefix + name] = std::move(buf);
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    return 0;
  };
  for (const char* g : {"/params", "/optimizer"}) {
    Ctx c{f, std::string(g) + "/", &out};
    hid_t grp = H5Gopen2(f, g, H5P_DEFAULT);
    REQUIRE(grp >= 0);
    H5Ovisit(grp, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &c);
    H5Gclose(grp);
  }
  H5Fclose(f);
  return out;
}

std::map<int64_t, double> losses(const fs::path& run_dir) {
  std::map<int64_t, double> out;
  std::ifstream m(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("eval") && !j.contains("rollback")) out[j["step"].get<int64_t>()] = j["loss"];
  }
  return out;
}

void require_same_final(const fs::path& a, const fs::path& b) {
  auto fa = a / "checkpoints" / "step_00000030.h5", fb = b / "checkpoints" / "step_00000030.h5";
  REQUIRE(fs::exists(fa));
  REQUIRE(fs::exists(fb));
  auto ta = tensors(fa), tb = tensors(fb);
  REQUIRE(ta.size() == tb.size());
  REQUIRE(ta.size() > 10);
  for (auto& [name, bytes] : ta) {
    CAPTURE(name);
    REQUIRE(tb.count(name));
    CHECK(bytes == tb[name]);
  }
  auto la = losses(a), lb = losses(b);
  REQUIRE(la.size() == 30);
  REQUIRE(lb.size() == 30);
  for (auto& [step, loss] : la) {
    CAPTURE(step);
    CHECK(lb[step] == loss);  // exact, bit for bit
  }
}

bool losses_count_at_least(const fs::path& run_dir, size_t n) {
  std::ifstream m(run_dir / "metrics.jsonl");
  size_t count = 0;
  for (std::string line; std::getline(m, line);) count += line.find("\"loss\"") != std::string::npos;
  return count >= n;
}

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("runner_resume_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

fs::path straight_run() {
  static fs::path dir;
  if (dir.empty()) {
    dir = fresh("straight");
    REQUIRE(train(dir.string()) == 0);
  }
  return dir;
}

}  // namespace

TEST_CASE("SIGKILL mid-step after the step-20 checkpoint, then `runner resume`: bit-identical") {
  fs::path ref = straight_run();
  fs::path dir = fresh("killed");
  auto args = split("train " + kArgs);
  args.push_back("--run-dir");
  args.push_back(dir.string());
  pid_t pid = spawn(args);
  fs::path latest = dir / "checkpoints" / "LATEST";
  bool killed = false;
  for (int i = 0; i < 200000 && !killed; ++i) {
    if (fs::exists(latest) && read_file(latest).find("step_00000020") != std::string::npos) {
      kill(pid, SIGKILL);
      killed = true;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  REQUIRE(killed);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  CHECK_FALSE(fs::exists(dir / "checkpoints" / "step_00000030.h5"));
  auto resume = split("resume " + dir.string() + " --quiet");
  REQUIRE(wait_exit(spawn(resume)) == 0);
  require_same_final(ref, dir);
}

TEST_CASE("SIGTERM: checkpoint at the next step boundary, exit code 3, the same command resumes bit-exact") {
  fs::path ref = straight_run();
  fs::path dir = fresh("term");
  auto args = split("train " + kArgs);
  args.push_back("--run-dir");
  args.push_back(dir.string());
  pid_t pid = spawn(args);
  // Wait until a few steps are logged, past the step-10 checkpoint, then ask it to stop.
  for (int i = 0; i < 600000; ++i) {
    if (losses_count_at_least(dir, 13)) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  kill(pid, SIGTERM);
  int code = wait_exit(pid);
  REQUIRE(code == 3);
  // A checkpoint beyond step 10 was written at a step boundary.
  std::string latest = read_file(dir / "checkpoints" / "LATEST");
  CHECK(latest.find("step_00000010") == std::string::npos);
  REQUIRE(train(dir.string()) == 0);
  require_same_final(ref, dir);
}

TEST_CASE("in-memory snapshot tier: a non-finite loss rolls back and skips the batch, without touching disk") {
  fs::path dir = fresh("rollback");
  std::string cmd = std::string("RUNNER_FAULT_NAN_STEP=13 ") + RUNNER_BINARY + " train " + std::string(RUNNER_SOURCE_DIR) +
                    "/recipes/quickstart.yaml --quiet --set train.steps=20 --set checkpoint.every_steps=100 "
                    "--set checkpoint.snapshot_every=5 --set train.eval_every=0 --run-dir " + dir.string();
  int st = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  std::ifstream m(dir / "metrics.jsonl");
  int rollbacks = 0;
  std::vector<int64_t> steps;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("rollback")) {
      rollbacks++;
      CHECK(j["step"] == 13);
      CHECK(j["to_step"] == 10);
    } else if (j.contains("loss") && !j.contains("eval")) {
      CHECK(std::isfinite(j["loss"].get<double>()));
      steps.push_back(j["step"]);
    }
  }
  CHECK(rollbacks == 1);
  // Steps 11 and 12 ran twice (before and after the rollback); the run still ends at 20.
  CHECK(steps.back() == 20);
  CHECK(std::count(steps.begin(), steps.end(), 11) == 2);
  // Only the final checkpoint was written: the rollback never touched disk.
  auto files = std::distance(fs::directory_iterator(dir / "checkpoints"), fs::directory_iterator{});
  CHECK(files == 2);  // step_00000020.h5 and LATEST
  std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("rolling back to the in-memory snapshot of step 10") != std::string::npos);
  CHECK(log.find("skipping the batch") != std::string::npos);
}
