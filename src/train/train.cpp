// train(): plan, choose the device, make the run directory, and run the Trainer.
#include <filesystem>

#include "backend/device.h"
#include "core/error.h"
#include "core/output_file.h"
#include "data/synthetic.h"
#include "train/capacity_plan.h"
#include "train/gpu_memory_plan.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

// Rank 0's part of prepare_run.
void prepare_directories(const RunPlan& plan) {
  const fs::path run_dir = plan.run_dir;
  const bool fresh = plan.run_dir_action != RunDirAction::continue_run;
  std::error_code ec;
  if (plan.run_dir_action == RunDirAction::replace) {
    fs::remove_all(run_dir, ec);
    if (ec) throw EnvironmentError("run.overwrite: cannot delete " + run_dir.string() + ": " + ec.message());
  }
  try {
    fs::create_directories(run_dir, ec);
    if (ec) throw EnvironmentError("cannot create run directory " + run_dir.string() + ": " + ec.message());
    if (fresh) write_file_atomic((run_dir / kRunMarker).string(), "made by ptrain " PTRAIN_VERSION "\n");
    fs::create_directories(plan.checkpoint_dir, ec);
    if (ec) throw EnvironmentError("checkpoint.dir: cannot create \"" + plan.checkpoint_dir + "\": " + ec.message());
    if (plan.clear_checkpoint_dir) remove_checkpoints(plan.checkpoint_dir);
    claim_checkpoint_dir(plan.checkpoint_dir, plan.run_dir);
    if (plan.data.synthetic) generate_synthetic(*plan.data.synthetic, (run_dir / "data").string());
    // Last, so that a continued run's config.yaml is replaced only once everything else worked.
    write_file_atomic((run_dir / "config.yaml").string(), config_to_yaml(plan.config));
  } catch (...) {
    if (fresh) fs::remove_all(run_dir, ec);
    throw;
  }
}

}  // namespace

void prepare_run(RunPlan& plan, Communicator& comm) {
  // Rank 0 makes the run directory (and the synthetic data); the others wait for it.
  if (comm.is_main()) prepare_directories(plan);
  comm.barrier();
  DataPlan& data = plan.data;
  if (data.synthetic) {  // generated just now by rank 0
    const int vocab = plan.config.model.vocab_size;
    data.info = read_synthetic_info((fs::path(plan.run_dir) / "data").string());
    data.open_train(vocab);
    data.val.emplace(data.val_files, "data.val", vocab);
  }
}

AttentionChoice choose_attention(const RunPlan& plan, Backend& backend) {
  const ModelShape& shape = plan.spec.shape;
  // The first phase's activations: a precision schedule's phases store them alike (bf16).
  const PrecisionPolicy& policy = plan.spec.precision.phases.front().policy;
  return backend.choose_attention(plan.config.model.attention, backend.storage_for(policy.activations, DType::f32),
                                  plan.spec.batch.micro_batch, plan.spec.batch.seq_len, shape.n_head,
                                  shape.kv_heads(), shape.head_size());
}

TrainResult train(const Config& config, const TrainOptions& options) {
  PTRAIN_CHECK(options.planned_ranks == 0 || options.dry_run, "--ranks plans a dry run only");
  PTRAIN_CHECK(options.fit.empty() || options.dry_run, "--fit plans a dry run only");
  if (!options.fit.empty() && config.run.device != DeviceRequest::cuda)
    throw UserError("--fit " + options.fit + ": run.device is " + choice_name(config.run.device) +
                    "; expected run.device cuda (--fit plans a GPU run's memory, on a machine without a GPU too)");
  RunPlan plan = plan_run(config, options.planned_ranks);
  if (options.stop_at > 0 && plan.resume && options.stop_at <= plan.resume->state.step)
    throw UserError("--stop-at " + std::to_string(options.stop_at) + ": the checkpoint resumed from (" +
                    plan.resume->path + ") is at step " + std::to_string(plan.resume->state.step) +
                    "; expected a step after " + std::to_string(plan.resume->state.step));
  const bool main_rank = launcher_rank() == 0;
  {
    RunLog console = main_rank ? RunLog() : RunLog::silent();
    for (const auto& w : plan.warnings) console.warn(w);
    for (const auto& w : plan.resume_warnings) console.warn(w);
  }
  // The device, the attention path and the ranks are checks too: a dry run makes them. A dry
  // run of a GPU config on a machine without a GPU plans the GPU's memory instead: what a user
  // asks before renting one.
  const bool cuda = config.run.device == DeviceRequest::cuda;
  const CudaProbe probe = options.dry_run && cuda ? probe_cuda() : CudaProbe{};
  const bool gpu_planned_here = options.dry_run && cuda && probe.devices.empty();
  TrainerDevices devices;
  if (!gpu_planned_here)
    devices.backend =
        make_backend(config.run.device, plan.threads, config.precision.tf32, local_rank(), &devices.device_choice);
  AttentionChoice& attention = devices.attention;
  if (devices.backend) {
    attention = choose_attention(plan, *devices.backend);
  } else {
    devices.device_choice = "device cuda: none on this machine (" + probe.why_none +
                            "): `ptrain train` would stop here; below, what a GPU run would take";
    attention.path = expected_gpu_attention(plan.spec, config.model.attention);
    attention.reason = std::string(attention.path == AttentionPath::fused ? "cudnn" : "fallback") +
                       " expected (cuDNN accepts or refuses the shape on the GPU)";
  }
  if (options.dry_run) {
    if (main_rank) {
      RunLog log;
      log.info("# resolved config");
      log.info(config_to_yaml(config));
      log.info(describe_plan(plan) + devices.device_choice + "\nattention: " + attention.reason);
      if (!devices.backend || devices.backend->device() == Device::cuda) {
        const GpuMemoryPlan gpu = plan_gpu_memory(plan.spec, config.distributed, attention.path);
        const CudaProbe gpus = devices.backend ? probe_cuda() : probe;  // run.device: auto may have taken one
        const CudaDeviceInfo* here = gpus.devices.empty() ? nullptr : &gpus.devices.front();
        log.info("GPU memory plan per rank: " + gpu.describe() + "\n  " + gpu.describe_per_parameter() + "\n" +
                 describe_gpu_fit(gpu, here ? "this " + here->name : "", here ? int64_t(here->memory_bytes) : 0));
        for (const GpuKind& kind : known_gpus())
          if (kind.key == options.fit) log.info(describe_capacity(plan.spec, config.distributed, attention.path, kind,
                                                                          config.training.guard.action == GuardAction::rollback));
      }
      log.info("dry run: nothing written");
    }
    return {};
  }
  devices.comm = make_communicator(devices.backend->device());
  return run_planned(plan, std::move(devices), options);
}

TrainResult run_planned(RunPlan& plan, TrainerDevices devices, const TrainOptions& options) {
  prepare_run(plan, *devices.comm);
  const bool restarted_in_place = devices.comm->is_main() && !plan.resume && plan.config.checkpoint.resume_auto() &&
                                  fs::exists(fs::path(plan.run_dir) / "metrics.jsonl");
  Trainer trainer(plan, std::move(devices), options);
  for (const auto& w : plan.warnings) trainer.log_only(w);
  for (const auto& w : plan.resume_warnings) trainer.log_only(w);
  if (restarted_in_place)
    trainer.warn("no valid checkpoint in " + plan.checkpoint_dir + ": training starts from step 0 in " + plan.run_dir);
  return trainer.run();
}

}  // namespace ptrain
