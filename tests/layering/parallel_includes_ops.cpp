// Control for the layering tests: a parallel/ file that includes parallel/ and ops/ headers
// compiles with the parallel layer's include roots.
#include "ops/tensor.h"
#include "parallel/grid.h"

int main() { return parallel::GridShape{}.world() == 1 ? 0 : 1; }
