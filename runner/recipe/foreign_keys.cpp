// The names other training tools give our recipe keys (nanoGPT's train.py and model.py,
// Megatron-LM's arguments, torchtitan's job config, Hugging Face config.json and
// TrainingArguments), for the hint on an unknown key: a user porting a config types
// `block_size` or `num_attention_heads` and is told the key path it is called here.
//
// Design: one flat table, searched by exact name (lower case: the tools' own spelling). A
// name that is also one of ours (lr, dropout, n_layers...) is not listed: the schema's own
// "belongs under" hint answers it. Where the meaning differs (a ratio against an absolute
// value, a flag against a word), the note says how to convert.
#include <algorithm>
#include <array>
#include <string_view>

#include "runner/recipe/document.h"

namespace runner::recipe_detail {

namespace {

constexpr std::string_view kNano = "nanoGPT";
constexpr std::string_view kMeg = "Megatron-LM";
constexpr std::string_view kTitan = "torchtitan";
constexpr std::string_view kHf = "Hugging Face config.json";
constexpr std::string_view kHfTrain = "Hugging Face TrainingArguments";
constexpr std::string_view kMany = "nanoGPT and Hugging Face";
constexpr std::string_view kDs = "DeepSpeed";
constexpr std::string_view kFsdp = "PyTorch FSDP";

constexpr std::array kTable = {
    // model shape
    ForeignKey{"block_size", kNano, "model.seq_len", ""},
    ForeignKey{"n_embd", kMany, "model.d_model", ""},
    ForeignKey{"n_layer", kMany, "model.n_layers", ""},
    ForeignKey{"n_head", kMany, "model.n_heads", ""},
    ForeignKey{"n_positions", kHf, "model.seq_len", ""},
    ForeignKey{"n_ctx", kHf, "model.seq_len", ""},
    ForeignKey{"num_layers", kMeg, "model.n_layers", ""},
    ForeignKey{"num_hidden_layers", kHf, "model.n_layers", ""},
    ForeignKey{"hidden_size", "Megatron-LM and Hugging Face", "model.d_model", ""},
    ForeignKey{"dim", kTitan, "model.d_model", ""},
    ForeignKey{"num_attention_heads", "Megatron-LM and Hugging Face", "model.n_heads", ""},
    ForeignKey{"num_key_value_heads", kHf, "model.n_kv_heads", ""},
    ForeignKey{"num_query_groups", kMeg, "model.n_kv_heads", "with group_query_attention; 0 or n_heads here is no grouping"},
    ForeignKey{"seq_length", kMeg, "model.seq_len", ""},
    ForeignKey{"max_seq_len", kTitan, "model.seq_len", ""},
    ForeignKey{"max_position_embeddings", "Megatron-LM and Hugging Face", "model.seq_len", ""},
    ForeignKey{"padded_vocab_size", kMeg, "model.vocab_size", ""},
    ForeignKey{"ffn_hidden_size", kMeg, "model.mlp_ratio", "as a ratio: mlp_ratio = ffn_hidden_size / d_model"},
    ForeignKey{"intermediate_size", kHf, "model.mlp_ratio", "as a ratio: mlp_ratio = intermediate_size / d_model"},
    ForeignKey{"ffn_dim_multiplier", kTitan, "model.mlp_ratio", "as the MLP width over d_model"},
    ForeignKey{"multiple_of", kTitan, "model.mlp_ratio", "the MLP width is round(mlp_ratio x d_model)"},
    ForeignKey{"hidden_dropout", kMeg, "model.dropout", ""},
    ForeignKey{"attention_dropout", kMeg, "model.dropout", "one dropout probability for the whole model"},
    ForeignKey{"resid_pdrop", kHf, "model.dropout", "one dropout probability for the whole model"},
    ForeignKey{"embd_pdrop", kHf, "model.dropout", "one dropout probability for the whole model"},
    ForeignKey{"attn_pdrop", kHf, "model.dropout", "one dropout probability for the whole model"},
    ForeignKey{"hidden_dropout_prob", kHf, "model.dropout", ""},
    ForeignKey{"init_method_std", kMeg, "model.init_std", ""},
    ForeignKey{"initializer_range", kHf, "model.init_std", ""},
    ForeignKey{"layernorm_epsilon", kMeg, "model.norm_eps", ""},
    ForeignKey{"norm_epsilon", kMeg, "model.norm_eps", ""},
    ForeignKey{"layer_norm_eps", kHf, "model.norm_eps", ""},
    ForeignKey{"layer_norm_epsilon", kHf, "model.norm_eps", ""},
    ForeignKey{"rms_norm_eps", kHf, "model.norm_eps", "with norm: rmsnorm"},
    ForeignKey{"normalization", kMeg, "model.norm", "layernorm or rmsnorm"},
    ForeignKey{"norm_type", kTitan, "model.norm", "layernorm or rmsnorm"},
    ForeignKey{"swiglu", kMeg, "model.activation", "write activation: swiglu"},
    ForeignKey{"squared_relu", kMeg, "model.activation", "write activation: relu2"},
    ForeignKey{"hidden_act", kHf, "model.activation", "gelu, relu2 or swiglu (Llama's silu MLP is swiglu)"},
    ForeignKey{"position_embedding_type", kMeg, "model.position", "learned or rope"},
    ForeignKey{"rotary_base", kMeg, "model.rope_theta", ""},
    ForeignKey{"tie_word_embeddings", kHf, "model.tie_embeddings", ""},
    ForeignKey{"untie_embeddings_and_output_weights", kMeg, "model.tie_embeddings", "the opposite flag"},
    ForeignKey{"model_type", kHf, "model.family", "gpt covers GPT-2 and Llama-style models"},
    // batch
    ForeignKey{"batch_size", "nanoGPT and torchtitan", "batch.micro", "sequences per micro-batch on each data-parallel rank"},
    ForeignKey{"micro_batch_size", kMeg, "batch.micro", ""},
    ForeignKey{"local_batch_size", kTitan, "batch.micro", ""},
    ForeignKey{"per_device_train_batch_size", kHfTrain, "batch.micro", ""},
    ForeignKey{"global_batch_size", "Megatron-LM and torchtitan", "batch.global", ""},
    ForeignKey{"gradient_accumulation_steps", "nanoGPT and Hugging Face", "batch.accum", ""},
    // parallel
    ForeignKey{"tensor_model_parallel_size", kMeg, "parallel.tp", ""},
    ForeignKey{"pipeline_model_parallel_size", kMeg, "parallel.pp", ""},
    ForeignKey{"data_parallel_size", kMeg, "parallel.dp", ""},
    ForeignKey{"virtual_pipeline_model_parallel_size", kMeg, "parallel.virtual_stages", "with schedule: interleaved"},
    ForeignKey{"tensor_parallel_degree", kTitan, "parallel.tp", ""},
    ForeignKey{"pipeline_parallel_degree", kTitan, "parallel.pp", ""},
    ForeignKey{"data_parallel_shard_degree", kTitan, "parallel.dp", "with zero: 3, as torchtitan shards (FSDP) over it"},
    ForeignKey{"data_parallel_replicate_degree", kTitan, "parallel.dp", ""},
    ForeignKey{"use_distributed_optimizer", kMeg, "parallel.zero", "zero: 1 shards the optimizer state over dp"},
    ForeignKey{"zero_optimization", kDs, "parallel.zero", "its stage is our zero: 0, 1, 2 or 3"},
    ForeignKey{"stage", kDs, "parallel.zero", "zero_optimization.stage 2 is zero: 2, stage 3 is zero: 3"},
    ForeignKey{"sharding_strategy", kFsdp, "parallel.zero", "FULL_SHARD is zero: 3, SHARD_GRAD_OP is zero: 2, NO_SHARD zero: 0"},
    ForeignKey{"fsdp", kHfTrain, "parallel.zero", "full_shard is zero: 3, shard_grad_op is zero: 2"},
    ForeignKey{"fsdp_reshard_after_forward", kTitan, "parallel.reshard_after_forward", "with zero: 3; always is true, never false"},
    // optimizer and schedule
    ForeignKey{"learning_rate", "nanoGPT and Hugging Face", "optimizer.lr", ""},
    ForeignKey{"max_lr", kNano, "optimizer.lr", ""},
    ForeignKey{"min_lr", "nanoGPT and Megatron-LM", "optimizer.schedule.min_lr_ratio", "as a fraction of lr: min_lr / lr"},
    ForeignKey{"warmup", "several tools", "optimizer.schedule.warmup_steps", ""},
    ForeignKey{"warmup_iters", kNano, "optimizer.schedule.warmup_steps", ""},
    ForeignKey{"lr_warmup_iters", kMeg, "optimizer.schedule.warmup_steps", ""},
    ForeignKey{"lr_decay_style", kMeg, "optimizer.schedule.kind", "cosine, linear or constant"},
    ForeignKey{"lr_scheduler_type", kHfTrain, "optimizer.schedule.kind", "cosine, linear or constant"},
    ForeignKey{"decay_lr", kNano, "optimizer.schedule.kind", "decay_lr: false is kind: constant"},
    ForeignKey{"lr_decay_iters", kNano, "train.steps", "the schedule decays to min_lr_ratio x lr at train.steps"},
    ForeignKey{"clip_grad", kMeg, "optimizer.grad_clip", ""},
    ForeignKey{"max_norm", kTitan, "optimizer.grad_clip", ""},
    ForeignKey{"max_grad_norm", kHfTrain, "optimizer.grad_clip", ""},
    ForeignKey{"adam_beta1", "Megatron-LM and Hugging Face", "optimizer.beta1", ""},
    ForeignKey{"adam_beta2", "Megatron-LM and Hugging Face", "optimizer.beta2", ""},
    ForeignKey{"adam_eps", kMeg, "optimizer.eps", ""},
    ForeignKey{"adam_epsilon", kHfTrain, "optimizer.eps", ""},
    // the training loop
    ForeignKey{"max_iters", kNano, "train.steps", ""},
    ForeignKey{"train_iters", kMeg, "train.steps", ""},
    ForeignKey{"max_steps", kHfTrain, "train.steps", ""},
    ForeignKey{"eval_interval", "nanoGPT and Megatron-LM", "train.eval_every", ""},
    ForeignKey{"eval_steps", kHfTrain, "train.eval_every", ""},
    ForeignKey{"eval_iters", "nanoGPT and Megatron-LM", "train.eval_batches", ""},
    ForeignKey{"log_interval", "nanoGPT and Megatron-LM", "train.log_every", ""},
    ForeignKey{"logging_steps", kHfTrain, "train.log_every", ""},
    ForeignKey{"out_dir", kNano, "train.run_dir", ""},
    ForeignKey{"output_dir", kHfTrain, "train.run_dir", ""},
    // precision and recompute
    ForeignKey{"dtype", kNano, "precision.compute", "fp32, bf16 or fp16"},
    ForeignKey{"torch_dtype", kHf, "precision.compute", "fp32, bf16 or fp16"},
    ForeignKey{"mixed_precision_param", kTitan, "precision.compute", "fp32, bf16 or fp16"},
    ForeignKey{"bf16", "Megatron-LM and Hugging Face", "precision.compute", "write compute: bf16"},
    ForeignKey{"fp16", "Megatron-LM and Hugging Face", "precision.compute", "write compute: fp16"},
    ForeignKey{"recompute_granularity", kMeg, "recompute.mode", "full or selective"},
    ForeignKey{"recompute_activations", kMeg, "recompute.mode", "write mode: selective (or full)"},
    ForeignKey{"gradient_checkpointing", kHfTrain, "recompute.mode", "write mode: full"},
    ForeignKey{"activation_checkpoint", kTitan, "recompute.mode", "none, full, selective or auto"},
    // checkpoints and data
    ForeignKey{"save_interval", kMeg, "checkpoint.every_steps", ""},
    ForeignKey{"save_steps", kHfTrain, "checkpoint.every_steps", ""},
    ForeignKey{"save_total_limit", kHfTrain, "checkpoint.keep_last", ""},
    ForeignKey{"data_path", kMeg, "data.path", ""},
};

}  // namespace

const ForeignKey* foreign_key(const std::string& name) {
  const std::string key = lower(name);
  const auto it = std::find_if(kTable.begin(), kTable.end(), [&](const ForeignKey& f) { return f.name == key; });
  return it == kTable.end() ? nullptr : &*it;
}

}  // namespace runner::recipe_detail
