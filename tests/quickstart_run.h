// The quickstart recipe trained through the real binary, and what its metrics say: the held-out
// loss and accuracy, and the mean training loss per 250-step window (test_quickstart.cpp and
// the 16-bit soak, test_quickstart16.cpp).
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quickstart_run {

namespace fs = std::filesystem;

struct Run {
  double first_val = -1, last_val = -1, accuracy = -1;
  std::vector<double> window_means;  // mean training loss per 250 steps
};

inline Run train(const std::string& precision) {
  fs::path dir = fs::temp_directory_path() / ("runner_quickstart_" + precision + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::string cmd = std::string(RUNNER_BINARY) + " train " + RUNNER_SOURCE_DIR + "/recipes/quickstart.yaml --quiet --run-dir " +
                    dir.string() + " --set precision.compute=" + precision;
  int st = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  std::ifstream m(dir / "metrics.jsonl");
  Run r;
  std::map<int64_t, double> loss;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) {
      if (r.first_val < 0) r.first_val = j["val_loss"];
      r.last_val = j["val_loss"];
      r.accuracy = j["accuracy"];
    } else if (j.contains("loss") && !j.contains("summary") && !j.contains("rollback")) {
      loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  for (int64_t w = 0; w < 6; ++w) {
    double s = 0;
    int n = 0;
    for (int64_t k = w * 250 + 1; k <= (w + 1) * 250; ++k)
      if (loss.count(k) && std::isfinite(loss[k])) { s += loss[k]; ++n; }
    r.window_means.push_back(n ? s / n : NAN);
  }
  fs::remove_all(dir);
  return r;
}

inline const Run& fp32() {
  static Run r = train("fp32");
  return r;
}

inline void check_learns(const Run& r) {
  CHECK(r.first_val > 0);
  CHECK(r.last_val < 0.5 * r.first_val);  // held-out loss falls
  CHECK(r.accuracy >= 0.9);
}

}  // namespace quickstart_run
