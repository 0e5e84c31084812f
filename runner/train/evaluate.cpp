// Evaluation on every layout (see evaluate.h).
#include "runner/train/evaluate.h"

#include <algorithm>
#include <limits>

#include "runner/signals.h"
#include "runner/train/watchdog.h"

namespace runner {

namespace {

// Exact-match accuracy of greedy completions of the addition task's held-out problems: one
// forward pass through the pipeline per answer digit. The last stage picks each row's most
// likely token (over tensor-parallel vocabulary shards: the largest logit, the smallest id
// among equals, as one rank's argmax would) and sends the choices back to every stage, which
// all append them to their copy of the prompts.
void addition_accuracy(const Plan& plan, parallel::Grid& grid, RankModel& model, EvalResult& er) {
  const Recipe& r = plan.recipe;
  const bool multi = grid.world_size() > 1;
  auto problems = addition_eval_problems(r.data.digits, 256, static_cast<uint64_t>(r.train.seed));
  int64_t correct = 0;
  int64_t B = plan.micro, T = r.model.seq_len;
  const int tp_rank = grid.coords().tp;
  std::vector<float> logits_host;  // host memory, outside the ledger's accounts
  for (size_t start = 0; start < problems.size() && (multi || !stop_requested()); start += static_cast<size_t>(B)) {
    size_t n = std::min(problems.size() - start, static_cast<size_t>(B));
    std::vector<int32_t> tokens(static_cast<size_t>(B * T), '\n');
    std::vector<std::vector<int32_t>> pred(n);
    size_t max_answer = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& pr = problems[start + i];
      std::copy(pr.prompt.begin(), pr.prompt.end(), tokens.begin() + static_cast<int64_t>(i) * T);
      max_answer = std::max(max_answer, pr.answer.size());
    }
    progress_tick();  // the watchdog: each batch of the accuracy check is progress
    for (size_t j = 0; j < max_answer; ++j) {
      std::vector<float> best_val(n, -std::numeric_limits<float>::infinity());
      std::vector<int64_t> best_id(n, std::numeric_limits<int64_t>::max());
      if (const ops::Tensor* lt = model.pipe().forward_logits(tokens.data())) {  // the last stage
        const ops::Tensor& logits = *lt;
        logits_host.resize(static_cast<size_t>(logits.numel()));
        logits.read_to_host(logits_host.data());  // the logits crossing out
        const float* L = logits_host.data();
        const int64_t V = logits.shape().back(), vstart = tp_rank * V;
        const int64_t real = std::clamp<int64_t>(r.model.vocab_size - vstart, 0, V);
        for (size_t i = 0; i < n; ++i) {
          int64_t pos = static_cast<int64_t>(problems[start + i].prompt.size() + j) - 1;
          if (j >= problems[start + i].answer.size() || pos + 1 >= T || real == 0) continue;
          const float* row = L + (static_cast<int64_t>(i) * T + pos) * V;
          int64_t k = std::max_element(row, row + real) - row;
          best_val[i] = row[k];
          best_id[i] = vstart + k;
        }
        if (plan.tp > 1) {
          std::vector<float> mx = best_val;
          grid.tp().allreduce_max(mx.data(), static_cast<int64_t>(n));
          for (size_t i = 0; i < n; ++i)
            if (best_val[i] != mx[i]) best_id[i] = std::numeric_limits<int64_t>::max();
          grid.tp().allreduce_min(best_id.data(), static_cast<int64_t>(n));
        }
      }
      if (plan.pp > 1) grid.pp().broadcast(best_id.data(), n * sizeof(int64_t), static_cast<int>(plan.pp) - 1);
      for (size_t i = 0; i < n; ++i) {
        const auto& pr = problems[start + i];
        int64_t pos = static_cast<int64_t>(pr.prompt.size() + j) - 1;
        if (j >= pr.answer.size() || pos + 1 >= T) continue;
        int32_t best = static_cast<int32_t>(best_id[i]);
        pred[i].push_back(best);
        tokens[static_cast<size_t>(static_cast<int64_t>(i) * T + pos + 1)] = best;
      }
    }
    for (size_t i = 0; i < n; ++i) correct += pred[i] == problems[start + i].answer;
  }
  er.problems = static_cast<int64_t>(problems.size());
  er.accuracy = static_cast<double>(correct) / static_cast<double>(problems.size());
}

}  // namespace

EvalResult evaluate(const Plan& plan, parallel::Grid& grid, RankModel& model, std::shared_ptr<const DataSource> val,
                    uint64_t data_seed) {
  const Recipe& r = plan.recipe;
  const bool multi = grid.world_size() > 1;
  EvalResult er;
  LoaderConfig lc;
  lc.global_batch = plan.micro;
  lc.micro = plan.micro;
  lc.shuffle = false;
  lc.workers = 1;
  lc.prefetch = 2;
  DataLoader vl(std::move(val), lc, data_seed);
  double sum = 0;
  int64_t count = 0;
  // The number of batches is fixed before the loop: every rank must run the same passes (a
  // stop request is acted on after evaluation).
  for (int64_t i = 0; i < r.train.eval_batches && (multi || !stop_requested()); ++i) {
    Batch b = vl.next();
    auto ls = model.pipe().forward({b.tokens.data(), b.targets.data(), 0});
    sum += ls.sum;
    count += ls.count;
    progress_tick();  // the watchdog: an evaluation batch is progress, as a step is
  }
  if (multi) {  // the last stage's tensor- and data-parallel rank 0 holds the loss
    double v[2] = {0, 0};
    if (grid.last_stage() && grid.coords().tp == 0 && grid.coords().dp == 0) v[0] = sum, v[1] = static_cast<double>(count);
    grid.world().allreduce_sum(v, 2);
    sum = v[0];
    count = static_cast<int64_t>(v[1]);
  }
  er.loss = count ? sum / static_cast<double>(count) : 0.0;
  if (r.data.kind == DataKind::addition) addition_accuracy(plan, grid, model, er);
  return er;
}

}  // namespace runner
