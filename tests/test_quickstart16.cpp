// A soak (about 4 minutes on 2 cores: three quickstart trainings), run by .ci/run as its own
// step after the README's test command: the quickstart reaches >= 90% held-out accuracy in
// bf16 and in fp16 too, and the 16-bit loss curves track the fp32 one.
//
// The band. The quickstart's loss sits on a plateau near 1.38 and then falls; when it falls is
// sensitive to any perturbation, and 16-bit rounding is such a perturbation. Measured here:
// the mean training loss over each 250-step window differed from fp32's by at most 0.061
// (bf16) and 0.053 (fp16) nats; one earlier bf16 run fell off the plateau ~250 steps later
// than fp32 and differed by 0.30 during the fall (steps 1000-1250). The test allows 0.45 nats
// per window (1.5x the largest seen) and requires the last window's mean below 0.15 (fp32:
// ~0.01) and >= 90% accuracy.
//
// Known failure (2026-12-03, a 2-core Sapphire Rapids with AMX, OMP_NUM_THREADS=2): bf16 and fp16
// both leave the plateau ~500 steps after fp32, so the band and the 90% fail (bf16 last window
// 0.485, fp16 0.699 at 13% accuracy; fp32 0.005). The code before and after the issue-23
// restructuring gives the same numbers to six digits, so it predates it. What moves the fall is
// chaotic, not a format's precision: fp16 with a static loss scale of 2 (a power of two, exact
// but for subnormal gradients) falls ~400 steps later than with scale 1; bf16 falls with fp32
// through the sgemm GEMM path (RUNNER_GEMM_PATH=sgemm: 0.035) and late through oneDNN's AMX
// kernel, which the automatic choice takes on this CPU. Not loosened: the quickstart's plateau
// needs a recipe (or a test over several seeds) whose fall does not hinge on one ulp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "tests/support/recipes.h"

using namespace test_support::quickstart;


TEST_CASE("quickstart in bf16 and fp16 learns too, and its loss curve tracks fp32's within the band") {
  for (const char* p : {"bf16", "fp16"}) {
    CAPTURE(p);
    const Run r = train(p);
    check_learns(r);
    for (size_t w = 0; w < r.window_means.size(); ++w) {
      CAPTURE(w);
      MESSAGE(std::string(p) << " steps " << w * 250 + 1 << "-" << (w + 1) * 250 << ": mean loss " << r.window_means[w] << " (fp32 "
                << fp32().window_means[w] << ")");
      CHECK(std::abs(r.window_means[w] - fp32().window_means[w]) <= 0.45);
    }
    CHECK(r.window_means.back() < 0.15);
  }
}
