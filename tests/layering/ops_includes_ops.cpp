// Control for the layering tests (CMakeLists.txt, "layers"): an ops/ file that includes only
// ops/ headers compiles with the ops layer's include root.
#include "ops/graph.h"
#include "ops/tensor.h"

int main() { return ops::Graph{}.param_count() == 0 ? 0 : 1; }
