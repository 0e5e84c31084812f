// llm.c's CPU trainer timed as a benchmark peer (bench/train_vs_torch.py --llmc DIR).
// llm.c is not part of this repository: the bench compiles this driver with -I DIR, a checkout
// of github.com/karpathy/llm.c the user provides, so that `train_gpt2.c` and its `llmc/*.h`
// come from there. Its main() reads fixed paths and samples text, so this driver includes it
// with TESTING defined (as llm.c's own test_gpt2.c does) and runs only its training step:
// forward, zero_grad, backward, AdamW update, exactly the calls and order of llm.c's main loop.
//   bench_llmc CHECKPOINT TOKENS B T STEPS  ->  one JSON line: tokens/s from the median step
#define TESTING
#include "train_gpt2.c"

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s CHECKPOINT TOKENS B T STEPS\n", argv[0]);
        return 2;
    }
    int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 1);
    double* ms = (double*)mallocCheck(sizeof(double) * (size_t)steps);
    float first_loss = 0.0f;
    for (int step = 0; step < steps; step++) {
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        clock_gettime(CLOCK_MONOTONIC, &end);
        ms[step] = (end.tv_sec - start.tv_sec) * 1e3 + (end.tv_nsec - start.tv_nsec) / 1e6;
        if (step == 0) first_loss = model.mean_loss;
        fprintf(stderr, "step %d: loss %f (%.1f ms)\n", step, model.mean_loss, ms[step]);
    }
    // The first step allocates activations, gradients and moments: timed steps start at the second.
    int timed = steps > 1 ? steps - 1 : steps;
    qsort(ms + (steps - timed), (size_t)timed, sizeof(double), cmp_double);
    double median = ms[steps - timed + timed / 2];
    printf("{\"tokens_per_s\": %.3f, \"median_step_ms\": %.3f, \"first_loss\": %.4f, \"last_loss\": %.4f, \"threads\": %d}\n",
           B * T / (median / 1e3), median, first_loss, model.mean_loss, omp_get_max_threads());
    dataloader_free(&loader);
    gpt2_free(&model);
    free(ms);
    return 0;
}
