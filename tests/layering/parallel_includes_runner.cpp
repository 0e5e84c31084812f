// Must NOT compile with the parallel layer's include roots: parallel/ may not see runner/.
#include "parallel/grid.h"
#include "runner/errors.h"

int main() { return 0; }
