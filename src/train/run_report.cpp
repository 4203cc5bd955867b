#include "train/run_report.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "backend/device.h"
#include "core/format.h"
#include "core/output_file.h"
#include "train/run_plan.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {
std::string tflops(double v) { return format_number("%.1f", v / 1e12) + " TFLOP/s"; }
nlohmann::json collective_json(const CollectiveBytes& b) {
  return {{"all_reduce", b.all_reduced}, {"reduce_scatter", b.reduce_scattered}, {"all_gather", b.all_gathered}};
}
}  // namespace

std::vector<int64_t> RunReport::source_samples(int64_t step) const {
  return blend_->counts(step * (cfg_.training.batch_tokens / spec_.batch.seq_len));
}

void RunReport::announce_run(int64_t num_params, const DataPlan& data, int eval_batches) {
  if (data.sources.size() > 1) {
    sources_ = data.sources;
    std::vector<double> weights;
    for (const TrainSource& source : sources_) weights.push_back(source.weight);
    blend_.emplace(weights);
  }
  const ModelShape& shape = spec_.shape;
  const int B = spec_.batch.micro_batch, T = spec_.batch.seq_len;
  const bool llama = shape.arch == Arch::llama;
  const std::string llama_shape = " KV=" + std::to_string(shape.kv_heads()) + " F=" + std::to_string(shape.mlp_width()) +
                                  (shape.tied_head ? " tied head" : " untied head") + (shape.qk_norm ? " QK-norm" : "");
  log_.info(std::string("model: ") + (llama ? "Llama" : "GPT-2") + " L=" + std::to_string(shape.n_layer) +
            " H=" + std::to_string(shape.n_head) + (llama ? llama_shape : "") + " C=" + std::to_string(shape.n_embd) +
            " T=" + std::to_string(T) + " V=" + std::to_string(shape.vocab) + " (padded " +
            std::to_string(shape.padded_vocab) + ") | " + format_thousands(static_cast<double>(num_params)) +
            " parameters");
  log_.info("batch: " + format_thousands(static_cast<double>(cfg_.training.batch_tokens)) + " tokens/step = " +
            std::to_string(B) + " x " + std::to_string(T) + " x " + std::to_string(spec_.batch.accumulation) +
            " accumulation steps" +
            (comm_.world_size() > 1 ? " x " + std::to_string(comm_.world_size()) + " ranks" : std::string()) + " | " +
            std::to_string(cfg_.training.steps) + " steps");
  log_.info("data: train " + train_sources_text(data) + ", val " + format_thousands(static_cast<double>(data.val->size())) +
            " tokens (" + data.val->format().name + "); eval on " + std::to_string(eval_batches) + " batches");
  if (synthetic_)
    log_.info("synthetic source: vocab " + std::to_string(synthetic_->spec.vocab) + ", order " +
              std::to_string(synthetic_->spec.order) + ", branching " + std::to_string(synthetic_->spec.branching) +
              " | oracle val loss " + format_number("%.4f", synthetic_->oracle_loss_val) + " (the floor), ln(V) " +
              format_number("%.4f", std::log(shape.vocab)));
  log_.info("memory: " + plan_memory(spec_, cfg_.distributed).describe() +
            (spec_.recompute == Recompute::none
                 ? ""
                 : " (training.recompute: " + std::string(choice_name(spec_.recompute)) + ")"));
}

void RunReport::announce_peaks(int64_t native_fp8_weights) {
  if (!comm_.is_main()) return;  // one rank logs; the others need not measure a CPU's rate
  const std::string per_token =
      "model FLOPs 6N + 6LCT = " + format_number("%.4g", spec_.flops_per_token) + " per token";
  if (backend_.device() != Device::cuda) {
    // Ranks sharing the machine are busy while rank 0 measures: that figure is not cached.
    const int ranks = comm_.world_size();
    const CpuPeak cpu = cpu_sgemm_peak(ranks == 1 ? PeakCache::use : PeakCache::off);
    peaks_ = MfuPeaks{std::nullopt, cpu.flops * ranks};
    if (ranks == 1) cpu_ceiling_ = cpu;  // under mpirun the other ranks train meanwhile: no recheck
    log_.info("MFU: " + per_token + "; against this CPU's sgemm rate, " + format_number("%.1f", cpu.flops / 1e9) +
              " GFLOP/s" + (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : "") + " (" + cpu.describe() +
              (ranks > 1 ? "; not cached: the other ranks share the machine" : "") + "); a CPU has no BF16 peak");
    return;
  }
  const CudaProbe probe = probe_cuda();
  const PeakLookup lookup =
      probe.devices.empty() ? PeakLookup{std::nullopt, "the device's properties could not be read: " + probe.why_none}
                            : lookup_device_peaks(probe.devices[0]);
  if (!lookup.device) {
    log_.info("MFU: " + per_token + "; no MFU: " + lookup.why_none);
    return;
  }
  const GemmPeaks& p = lookup.device->peaks;
  gpu_peaks_ = p;
  const double ranks = comm_.world_size();
  log_.info("MFU: " + per_token + "; against " + lookup.device->part + "'s dense BF16 peak, " + tflops(p.bf16) +
            (ranks > 1 ? " (x " + format_number("%.0f", ranks) + " ranks in MFU)" : "") +
            ", and this run's precision mix's, " + phase_peak(native_fp8_weights) + "; " + lookup.device->source +
            ", dense");
}

void RunReport::announce_ranks(const std::vector<double>& state_bytes, bool master_shard) {
  if (comm_.world_size() == 1) return;
  const bool bf16_wire = cfg_.distributed.grad_reduce_dtype == GradReduceDtype::bf16;
  log_.info("data parallel: " + comm_.description() + " | ZeRO stage " + std::to_string(cfg_.distributed.zero_stage) +
            " | gradients reduced in " +
            (bf16_wire ? "bf16 (each rank's rounded, and each addition)" : "fp32"));
  std::string line = "optimizer state per rank (AdamW moments" +
                     std::string(master_shard ? " + FP32 master shard" : "") + "):";
  for (size_t r = 0; r < state_bytes.size(); ++r)
    line += (r ? ", " : " ") + std::string("rank ") + std::to_string(r) + " " +
            format_mib(static_cast<int64_t>(state_bytes[r]));
  log_.info(line);
  log_.metrics({{"ranks", comm_.world_size()},
                {"zero_stage", cfg_.distributed.zero_stage},
                {"grad_reduce_dtype", cfg_.distributed.grad_reduce_dtype},
                {"optimizer_state_bytes_per_rank", state_bytes}});
}

std::string RunReport::phase_peak(int64_t native_fp8_weights) {
  if (!gpu_peaks_) return "";
  const GemmPeaks& p = *gpu_peaks_;
  const double fp8_share = 6.0 * static_cast<double>(native_fp8_weights) / spec_.flops_per_token;
  const bool fp32 = cfg_.precision.mode == PrecisionMode::fp32;
  const double other = fp32 ? (cfg_.precision.tf32 ? p.tf32 : p.fp32) : p.bf16;
  const std::string other_name = fp32 ? (cfg_.precision.tf32 ? "tf32" : "fp32") : "bf16";
  // The step's FLOPs are the global batch's: the peaks are those of all the ranks' devices.
  const double ranks = comm_.world_size();
  peaks_ = MfuPeaks{p.bf16 * ranks, mixed_peak(fp8_share, p.fp8, other) * ranks};
  return tflops(peaks_->mix) + " (" + format_number("%.1f", 100 * fp8_share) + "% of the FLOPs in native FP8 GEMMs at " +
         tflops(p.fp8) + ", the rest at " + other_name + "'s " + tflops(other) + ")";
}

// A step faster than the CPU's sgemm ceiling means the ceiling was measured too low (cached from
// a busier moment, say): it is measured again, once per run, and the cache replaced. Under
// data parallelism the other ranks are training meanwhile, so the figure would be no better.
void RunReport::recheck_cpu_ceiling(double flops_per_s) {
  if (!cpu_ceiling_ || ceiling_rechecked_ || flops_per_s <= peaks_->mix) return;
  ceiling_rechecked_ = true;
  const double before = cpu_ceiling_->flops;
  const CpuPeak again = cpu_sgemm_peak(PeakCache::refresh);
  log_.info("MFU: this step's model FLOP/s (" + format_number("%.1f", flops_per_s / 1e9) +
            " G) exceed the sgemm ceiling of " + format_number("%.1f", before / 1e9) + " GFLOP/s (" +
            cpu_ceiling_->describe() + "); measured again: " + format_number("%.1f", again.flops / 1e9) +
            " GFLOP/s (" + again.describe() + ")");
  // A figure already known to be too low is not lowered further by a busier moment.
  const double ceiling = std::max(before, again.flops);
  mix_peak_seconds_ *= ceiling / before;  // the steps so far, quoted against the new figure too
  cpu_ceiling_ = again;
  cpu_ceiling_->flops = ceiling;
  peaks_->mix = ceiling;
}

void RunReport::step(const Step& s) {
  const int64_t steps = cfg_.training.steps;
  train_seconds_ += s.seconds;
  if (peaks_) mix_peak_seconds_ += s.seconds * peaks_->mix;
  step_seconds_.push_back(s.seconds);
  if (s.step > 1 || steps == 1) {  // the first step warms caches and thread pools
    timed_seconds_ += s.seconds;
    ++timed_steps_;
  }
  const double mean_seconds = timed_steps_ ? timed_seconds_ / static_cast<double>(timed_steps_) : s.seconds;
  const double tokens = static_cast<double>(cfg_.training.batch_tokens);
  const double tok_s = tokens / s.seconds;
  const int64_t rss = current_rss_bytes();
  const double flops_per_s = spec_.flops_per_token * tok_s;
  recheck_cpu_ceiling(flops_per_s);
  std::optional<double> mfu, mfu_mix;  // null without a known peak
  if (peaks_ && peaks_->bf16) mfu = flops_per_s / *peaks_->bf16;
  if (peaks_) mfu_mix = flops_per_s / peaks_->mix;
  nlohmann::json record = {{"step", s.step},
                           {"tokens", tokens_at(s.step)},
                           {"loss", s.loss},
                           {"lr", s.lr},
                           {"grad_norm", s.grad_norm},
                           {"loss_scale", s.loss_scale},
                           {"skipped", s.skipped},
                           {"guard_skipped", s.guard_skipped},
                           {"tokens_per_s", tok_s},
                           {"model_flops_per_s", flops_per_s},
                           {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json()},
                           {"mfu_mix", mfu_mix ? nlohmann::json(*mfu_mix) : nlohmann::json()},
                           {"ms", s.seconds * 1000.0},
                           {"memory_mib", static_cast<double>(rss) / (1024.0 * 1024.0)}};
  const Backend::MemoryUse device_memory = backend_.memory_use();
  if (device_memory.capacity > 0) record["device_memory_peak_mib"] = static_cast<double>(device_memory.peak) / (1 << 20);
  if (mfu_mix && *mfu_mix > 1) record["ceiling_stale"] = true;
  if (blend_) record["source_samples"] = source_samples(s.step);
  if (comm_.world_size() > 1) {  // since the step before: an evaluation's or a load's gather counts too
    const CollectiveBytes now = comm_.collective_bytes();
    record["comm_bytes"] = collective_json(now - reported_bytes_);
    reported_bytes_ = now;
  }
  log_.metrics(record);
  if (s.step % cfg_.logging.every != 0 && s.step != steps) return;
  char line[256];
  const int width = static_cast<int>(std::to_string(steps).size());
  std::snprintf(line, sizeof line, "step %*lld/%lld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %s tok/s | ETA %s | mem %s",
                width, static_cast<long long>(s.step), static_cast<long long>(steps), s.loss, s.grad_norm, s.lr,
                s.seconds * 1000.0, format_thousands(tok_s).c_str(),
                format_duration(mean_seconds * static_cast<double>(steps - s.step)).c_str(), format_mib(rss).c_str());
  std::string text = line;
  if (device_memory.capacity > 0) text += " | gpu mem " + format_mib(static_cast<int64_t>(device_memory.peak));
  text += " | " + format_number("%.3g", flops_per_s / 1e9) + " GFLOP/s";
  // An FP8 run may pass the BF16 peak: only the mix's peak bounds it.
  if (mfu) text += " | MFU " + format_number("%.1f%%", 100.0 * *mfu) + " (mix " + format_utilisation(*mfu_mix) + ")";
  else if (mfu_mix) text += " | MFU " + format_utilisation(*mfu_mix) + " of sgemm";
  // Megatron's convention: loss scale and skipped steps appear when loss scaling is on.
  if (s.loss_scaling)
    text += " | loss scale " + format_number("%g", s.loss_scale) + " | skipped " + std::to_string(s.skipped);
  log_.info(text);
}

void RunReport::numerics(int64_t step, Format grads, const std::vector<Fp8TensorState*>& fp8) {
  const GradNumerics g = backend_.take_grad_numerics();
  if (g.elements == 0 && fp8.empty()) return;  // nothing reduced-precision to report
  auto fraction = [](int64_t part, int64_t whole) { return whole ? static_cast<double>(part) / whole : 0.0; };
  const double grad_underflow = fraction(g.underflow, g.nonzero);
  nlohmann::json record = {{"step", step},
                           {"numerics", {{"grad_format", format_name(grads)}, {"grad_underflow", grad_underflow}}}};
  std::string line = "numerics step " + std::to_string(step) + " | " + format_name(grads) + " grad underflow " +
                     format_number("%.4f%%", 100.0 * grad_underflow);
  const Fp8TensorState* worst_underflow = nullptr;
  const Fp8TensorState* worst_saturation = nullptr;
  for (const Fp8TensorState* t : fp8) {
    const double under = fraction(t->stats.underflow, t->stats.nonzero);
    const double sat = fraction(t->stats.saturated, t->stats.nonzero);
    record["numerics"]["fp8"].push_back({{"tensor", t->name},
                                         {"format", format_name(t->format)},
                                         {"amax", t->stats.amax},
                                         {"scale", t->scale},
                                         {"underflow", under},
                                         {"saturated", sat}});
    if (!worst_underflow || under > fraction(worst_underflow->stats.underflow, worst_underflow->stats.nonzero))
      worst_underflow = t;
    if (!worst_saturation || sat > fraction(worst_saturation->stats.saturated, worst_saturation->stats.nonzero))
      worst_saturation = t;
  }
  if (worst_underflow) {
    line += " | fp8 worst underflow " +
            format_number("%.3f%%", 100.0 * fraction(worst_underflow->stats.underflow, worst_underflow->stats.nonzero)) +
            " (" + worst_underflow->name + "), worst saturation " +
            format_number("%.3f%%", 100.0 * fraction(worst_saturation->stats.saturated, worst_saturation->stats.nonzero)) +
            " (" + worst_saturation->name + ")";
  }
  for (Fp8TensorState* t : fp8) t->reset_stats();
  log_.metrics(record);
  log_.info(line);
}

void RunReport::validation(int64_t step, double val_loss) {
  if (!best_val_ || val_loss < *best_val_) {
    best_val_ = val_loss;
    best_val_step_ = step;
  }
  last_val_ = val_loss;
  nlohmann::json record = {{"step", step}, {"tokens", tokens_at(step)}, {"val_loss", val_loss}};
  std::string line = "val  step " + std::to_string(step) + " | val_loss " + format_number("%.6f", val_loss);
  if (synthetic_) {
    const double gap = val_loss - synthetic_->oracle_loss_val;
    record["oracle_gap"] = gap;
    line += " | oracle " + format_number("%.4f", synthetic_->oracle_loss_val) + " | gap " + format_number("%.4f", gap);
  }
  log_.metrics(record);
  log_.info(line);
}

void RunReport::restore_best(double best_val_loss, int64_t best_val_step) {
  if (best_val_step >= 0) {
    best_val_ = best_val_loss;
    best_val_step_ = best_val_step;
  } else {
    best_val_.reset();
    best_val_step_ = 0;
  }
}

// The steps of this invocation (fewer than training.steps after a resume, more after a
// rollback): throughput and times are this invocation's.
size_t RunReport::summarize(double wall_seconds, const Totals& totals) {
  const int64_t steps_here = static_cast<int64_t>(step_seconds_.size());
  const double tokens = static_cast<double>(tokens_at(cfg_.training.steps));
  const double tokens_here = static_cast<double>(cfg_.training.batch_tokens * steps_here);
  const double flops_per_s = spec_.flops_per_token * tokens_here / train_seconds_;
  const size_t device_peak = backend_.memory_use().peak;
  nlohmann::json summary = {{"steps", cfg_.training.steps},
                            {"tokens", static_cast<int64_t>(tokens)},
                            {"steps_this_run", steps_here},
                            {"wall_s", wall_seconds},
                            {"train_s", train_seconds_},
                            {"tokens_per_s", tokens_here / train_seconds_},
                            {"model_flops_per_s", flops_per_s},
                            {"mfu", nullptr},  // null without a known peak
                            {"mfu_mix", nullptr},
                            {"peak_bf16_flops", nullptr},
                            {"peak_mix_flops", nullptr},
                            {"final_val_loss", last_val_},
                            {"best_val_loss", best_val_ ? *best_val_ : NAN},
                            {"best_val_step", best_val_step_},
                            {"ranks", comm_.world_size()},
                            {"peak_memory_mib", static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0)},
                            {"peak_device_memory_mib", static_cast<double>(device_peak) / (1024.0 * 1024.0)},
                            {"precision", totals.precision},
                            {"skipped_steps", totals.skipped},
                            {"guard_skipped_steps", totals.guard_skipped},
                            {"guard_rollbacks", totals.guard_rollbacks},
                            {"num_params", totals.num_params}};
  if (peaks_) {
    // A precision schedule's phases (and a rollback's bf16 fallback) have their own mixed peaks:
    // their mean over the time trained.
    const bool mixed = totals.scheduled || totals.guard_rollbacks > 0;
    const double mix = mixed && train_seconds_ > 0 ? mix_peak_seconds_ / train_seconds_ : peaks_->mix;
    summary["mfu_mix"] = flops_per_s / mix;
    summary["peak_mix_flops"] = mix;
    if (flops_per_s > mix) summary["ceiling_stale"] = true;
    if (peaks_->bf16) {
      summary["mfu"] = flops_per_s / *peaks_->bf16;
      summary["peak_bf16_flops"] = *peaks_->bf16;
    }
  }
  std::string line = "done: " + std::to_string(cfg_.training.steps) + " steps, " + format_thousands(tokens) +
                     " tokens" +
                     (steps_here < cfg_.training.steps ? " (" + std::to_string(steps_here) + " steps in this run)" : "") +
                     " in " + format_duration(wall_seconds) + " | mean " + format_thousands(tokens_here / train_seconds_) +
                     " tok/s | best val_loss " + format_number("%.4f", summary["best_val_loss"].get<double>()) +
                     " at step " + std::to_string(best_val_step_);
  if (synthetic_) {
    const double oracle = synthetic_->oracle_loss_val;
    const double start_gap = std::log(spec_.shape.vocab) - oracle;
    const double gap = *best_val_ - oracle;
    summary["oracle_loss"] = oracle;
    summary["oracle_gap"] = gap;
    line += " | oracle " + format_number("%.4f", oracle) + ", gap " + format_number("%.4f", gap) + " (closed " +
            format_number("%.1f", 100.0 * (1.0 - gap / start_gap)) + "% of the gap from ln(V))";
  }
  log_.info(line);
  if (blend_) {
    const std::vector<int64_t> counts = source_samples(cfg_.training.steps);
    const int64_t samples = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    std::string shares;
    summary["sources"] = nlohmann::json::array();
    for (size_t k = 0; k < sources_.size(); ++k) {
      const double share = static_cast<double>(counts[k]) / static_cast<double>(samples);
      summary["sources"].push_back(
          {{"train", sources_[k].pattern}, {"weight", sources_[k].weight}, {"samples", counts[k]}, {"share", share}});
      shares += std::string(k ? "; " : "") + "\"" + sources_[k].pattern + "\" " +
                format_number("%.1f", 100 * share) + "% (" + format_thousands(static_cast<double>(counts[k])) + ")";
    }
    log_.info("data sources, samples drawn over the run's " + format_thousands(static_cast<double>(samples)) +
              ": " + shares);
  }
  if (comm_.world_size() > 1 && steps_here > 0) {
    const CollectiveBytes total = comm_.collective_bytes();
    const CollectiveBytes per_step{total.all_reduced / steps_here, total.reduce_scattered / steps_here,
                                   total.all_gathered / steps_here};
    summary["comm_bytes"] = collective_json(total);  // this invocation's, its evaluations' included
    summary["comm_bytes_per_step"] = collective_json(per_step);
    log_.info("communication per rank and step (the tensor collectives' payload, mean of " +
              std::to_string(steps_here) + " steps): all-reduce " + format_mib(per_step.all_reduced) +
              ", reduce-scatter " + format_mib(per_step.reduce_scattered) + ", all-gather " +
              format_mib(per_step.all_gathered));
  }
  if (totals.cuda_graph_replays) {
    const int64_t micro_batches = steps_here * spec_.batch.accumulation;
    summary["cuda_graph_replays"] = *totals.cuda_graph_replays;
    log_.info("cuda graph: " + std::to_string(*totals.cuda_graph_replays) + " of " + std::to_string(micro_batches) +
              " micro-batches replayed a recording");
  }
  if (comm_.is_main())
    write_file_atomic((fs::path(cfg_.run.out_dir) / cfg_.run.name / "summary.json").string(), summary.dump(2) + "\n");
  return device_peak;
}

}  // namespace ptrain
