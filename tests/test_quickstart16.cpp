// A soak (three quickstart trainings at once, one thread each), run by .ci/run as its own
// step after the README's test command: the quickstart reaches >= 90% held-out accuracy in
// bf16 and in fp16 too, and the 16-bit loss curves track the fp32 one.
//
// The band. The quickstart's loss sits on a plateau near 1.38 and then falls; 16-bit rounding
// perturbs when. With the earlier quickstart (4 heads, init 0.02, 16 sequences a step) when it
// fell hinged on noise: on a Sapphire Rapids CPU fp32 fell at ~500 and bf16/fp16 at ~1000 (fp16
// last window 0.699 at 13% accuracy), and the fall moved by hundreds of steps with a loss scale
// of 2 instead of 1 or a GEMM kernel's summation order. So the recipe changed (16 heads, init
// 0.05, 32 sequences a step: recipes/quickstart.yaml says why), not this band. Measured on that
// CPU with the new recipe, window means differed from fp32's by at most 0.045 (bf16, seed 1234)
// and 0.072 (bf16, seed 7), last windows 0.002 and 0.064. The test allows 0.45 nats per window
// and requires the last window's mean below 0.15 and >= 90% accuracy.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/support/recipes.h"

using namespace test_support::quickstart;


TEST_CASE("quickstart in bf16 and fp16 learns too, and its loss curve tracks fp32's within the band") {
  const std::vector<Run> runs = train_at_once({"fp32", "bf16", "fp16"});
  const Run& f32 = runs[0];
  for (size_t i = 1; i < runs.size(); ++i) {
    const char* p = i == 1 ? "bf16" : "fp16";
    const Run& r = runs[i];
    CAPTURE(p);
    check_learns(r);
    for (size_t w = 0; w < r.window_means.size(); ++w) {
      CAPTURE(w);
      MESSAGE(std::string(p) << " steps " << w * 250 + 1 << "-" << (w + 1) * 250 << ": mean loss " << r.window_means[w]
                             << " (fp32 " << f32.window_means[w] << ")");
      CHECK(std::abs(r.window_means[w] - f32.window_means[w]) <= 0.45);
    }
    CHECK(r.window_means.back() < 0.15);
  }
}
