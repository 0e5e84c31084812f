// Every recipe key, written once: which struct field it fills.
//
// visit(v, section) calls v(key, field) for each field of one recipe section and
// v.section(key, sub) for each nested section (a std::optional<Config> section exists only
// when written) and v.list(key, items) for a list of sections (data.mix), in the order recipe_to_yaml writes them. Reading a validated recipe
// (fill), writing it back (recipe_to_yaml) and the schema consistency test
// (tests/test_recipe.cpp) are visitors over this one list; the defaults are the struct
// initialisers in recipe.h. Adding a field: the struct member with its default, one line
// here, and the property in schemas/recipe.schema.json (the test fails until all agree).
//
// Each visit() takes the struct const or not (Self), so one list serves readers and writers.
#pragma once
#include <type_traits>

#include "runner/recipe/recipe.h"

namespace runner {

template <class Self, class Config>
concept Section = std::is_same_v<std::remove_const_t<Self>, Config>;

template <class V, Section<ModelConfig> Self>
void visit(V& v, Self& m) {
  v("family", m.family);
  v("vocab_size", m.vocab_size);
  v("seq_len", m.seq_len);
  v("d_model", m.d_model);
  v("n_layers", m.n_layers);
  v("n_heads", m.n_heads);
  v("n_kv_heads", m.n_kv_heads);
  v("mlp_ratio", m.mlp_ratio);
  v("norm", m.norm);
  v("activation", m.activation);
  v("position", m.position);
  v("tie_embeddings", m.tie_embeddings);
  v("bias", m.bias);
  v("dropout", m.dropout);
  v("norm_eps", m.norm_eps);
  v("rope_theta", m.rope_theta);
  v("init_std", m.init_std);
  v("init_from", m.init_from);
  v("fuse", m.fuse);
}

template <class V, Section<DataConfig> Self>
void visit(V& v, Self& d) {
  v("kind", d.kind);
  v("path", d.path);
  v("val_path", d.val_path);
  v("val_fraction", d.val_fraction);
  v("dataset", d.dataset);
  v("tokenizer", d.tokenizer);
  v("digits", d.digits);
  v("workers", d.workers);
  v("prefetch", d.prefetch);
  v.list("mix", d.mix);
}

template <class V, Section<DataMixEntry> Self>
void visit(V& v, Self& e) {
  v("path", e.path);
  v("weight", e.weight);
}

template <class V, Section<ParallelConfig> Self>
void visit(V& v, Self& p) {
  v("dp", p.dp);
  v("tp", p.tp);
  v("pp", p.pp);
  v("schedule", p.schedule);
  v("virtual_stages", p.virtual_stages);
  v("zero", p.zero);
  v("reshard_after_forward", p.reshard_after_forward);
  v("sequence_parallel", p.sequence_parallel);
  v("stage_layers", p.stage_layers);
  v("bucket_mb", p.bucket_mb);
  v("auto", p.search);
}

template <class V, Section<BatchConfig> Self>
void visit(V& v, Self& b) {
  v("global", b.global);
  v("micro", b.micro);
  v("accum", b.accum);
}

template <class V, Section<LossScaleConfig> Self>
void visit(V& v, Self& l) {
  v("mode", l.mode);
  v("init", l.init);
  v("growth_factor", l.growth_factor);
  v("backoff_factor", l.backoff_factor);
  v("growth_interval", l.growth_interval);
  v("min_scale", l.min_scale);
  v("max_consecutive_skips", l.max_consecutive_skips);
}

template <class V, Section<PrecisionConfig> Self>
void visit(V& v, Self& p) {
  v("compute", p.compute);
  v("master_weights", p.master_weights);
  v("grad_accum", p.grad_accum);
  v("logits_grad", p.logits_grad);
  v.section("loss_scale", p.loss_scale);
  v("diagnostics", p.diagnostics);
}

template <class V, Section<RecomputeConfig> Self>
void visit(V& v, Self& r) {
  v("mode", r.mode);
  v("layers", r.layers);
  v("modules", r.modules);
}

template <class V, Section<ScheduleConfig> Self>
void visit(V& v, Self& s) {
  v("kind", s.kind);
  v("warmup_steps", s.warmup_steps);
  v("min_lr_ratio", s.min_lr_ratio);
}

template <class V, Section<OptimizerConfig> Self>
void visit(V& v, Self& o) {
  v("name", o.name);
  v("lr", o.lr);
  v("beta1", o.beta1);
  v("beta2", o.beta2);
  v("eps", o.eps);
  v("weight_decay", o.weight_decay);
  v("grad_clip", o.grad_clip);
  v.section("schedule", o.schedule);
}

template <class V, Section<CheckpointConfig> Self>
void visit(V& v, Self& c) {
  v("dir", c.dir);
  v("cadence", c.cadence);
  v("every_steps", c.every_steps);
  v("every_minutes", c.every_minutes);
  v("keep_last", c.keep_last);
  v("keep_every", c.keep_every);
  v("async", c.async);
  v("optimizer_dtype", c.optimizer_dtype);
  v("snapshot_every", c.snapshot_every);
  v("spike_threshold", c.spike_threshold);
}

template <class V, Section<HardwareConfig> Self>
void visit(V& v, Self& h) {
  v("device", h.device);  // a string: a kind of the device table (runner/device/devices.cpp; test_device_select)
  v("memory_gb", h.memory_gb);
  v("devices_per_node", h.devices_per_node);
  v("nodes", h.nodes);
  v("peak_tflops", h.peak_tflops);
  v("intra_node_gbps", h.intra_node_gbps);
  v("inter_node_gbps", h.inter_node_gbps);
  v("intra_node_latency_us", h.intra_node_latency_us);
  v("inter_node_latency_us", h.inter_node_latency_us);
  v("profile", h.profile);
}

template <class V, Section<TrainConfig> Self>
void visit(V& v, Self& t) {
  v("steps", t.steps);
  v("seed", t.seed);
  v("log_every", t.log_every);
  v("monitor_every", t.monitor_every);
  v("eval_every", t.eval_every);
  v("eval_batches", t.eval_batches);
  v("threads", t.threads);
  v("run_dir", t.run_dir);
  v("elastic", t.elastic);
  v("max_restarts", t.max_restarts);
  v("restart_backoff", t.restart_backoff);
  v("collective_timeout", t.collective_timeout);
}

template <class V, Section<InferenceConfig> Self>
void visit(V& v, Self& i) {
  v("batch", i.batch);
  v("context", i.context);
  v("kv_dtype", i.kv_dtype);
}

template <class V, Section<ProfileConfig> Self>
void visit(V& v, Self& p) {
  v("steps", p.steps);
}

// The whole recipe: the top-level keys (source_file, source_text and locs are not keys).
template <class V, Section<Recipe> Self>
void visit(V& v, Self& r) {
  v("name", r.name);
  v.section("model", r.model);
  v.section("data", r.data);
  v.section("parallel", r.parallel);
  v.section("batch", r.batch);
  v.section("precision", r.precision);
  v.section("recompute", r.recompute);
  v.section("optimizer", r.optimizer);
  v.section("checkpoint", r.checkpoint);
  v.section("hardware", r.hardware);
  v.section("train", r.train);
  v.section("inference", r.inference);
  v.section("profile", r.profile);
}

}  // namespace runner
