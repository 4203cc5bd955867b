// Whole training runs of ptrain_simulated (the real binary on the simulated device) that cover
// every axis at least once in a few dozen short runs instead of the cross product: each precision
// mode and FP8 recipe, CUDA graphs on and off, fused and fallback attention, GPT-2 and Llama
// blocks (cuDNN's grouped-query graph among them), one rank and two
// under mpirun (NCCL simulated over MPI) with ZeRO stages 0 to 3, and three with shards of uneven size. Each run
// asserts that the GPU-only path ran, not a fallback, twice over: the run's own log lines (what
// a user reads), and the simulated device's report of the operations it executed
// (PTRAIN_SIM_REPORT): native and block-scaled FP8 GEMMs, the fused attention graphs and their
// self-check, uploads through pinned staging, the loss summed on the device, graph replays,
// NCCL's collectives. Each run's `--dry-run` GPU memory plan is checked against the arena's
// measured peak, and its PTRAIN_LIBRARY_LOG (what gpu-check.sh brings back from a GPU) against
// the GEMMs and attention graphs the run asked for.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mpi_util.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

struct Axes {
  const char* name;
  const char* mode;       // precision.mode, or fp8:RECIPE
  const char* attention;  // model.attention: cudnn, fallback, or auto (fp32: the fallback)
  bool graphs;            // training.cuda_graph
  int ranks;
  int zero_stage;
  int seq_len = 64;
  const char* arch = "gpt2";  // llama: grouped-query attention, 2 K/V heads under 4 query heads
  const char* recompute = "none";  // training.recompute
  const char* grad_reduce = "fp32";  // distributed.grad_reduce_dtype
  bool primary_weights = false;      // precision.fp8.primary_weights
  bool mlp_input_codes = false;      // precision.fp8.mlp_input_codes
};

// The parameter count the run's log gives ("| 437,760 parameters").
int64_t logged_parameters(const std::string& log) {
  const size_t end = log.find(" parameters");
  size_t begin = log.rfind("| ", end);
  REQUIRE((end != std::string::npos && begin != std::string::npos));
  std::string digits;
  for (begin += 2; begin < end; ++begin)
    if (log[begin] != ',') digits += log[begin];
  return std::stoll(digits);
}

// Operations the simulated device executed, by name: one map per rank (per process report).
std::vector<std::map<std::string, long>> read_reports(const fs::path& dir) {
  std::vector<std::map<std::string, long>> ranks;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::map<std::string, long> ops;
    const nlohmann::json report = nlohmann::json::parse(read_file(entry.path()));
    for (auto it = report.begin(); it != report.end(); ++it) ops[it.key()] = it.value().get<long>();
    ranks.push_back(ops);
  }
  return ranks;
}

long ran(const std::map<std::string, long>& ops, const std::string& name) {
  const auto it = ops.find(name);
  return it == ops.end() ? 0 : it->second;
}

// Names in the report that start with `prefix`, times executed summed.
long ran_prefix(const std::map<std::string, long>& ops, const std::string& prefix) {
  long n = 0;
  for (const auto& [name, times] : ops)
    if (name.rfind(prefix, 0) == 0) n += times;
  return n;
}

// The library log: one record per cuBLASLt heuristic query and per cuDNN attention shape, from
// every rank. The GEMMs found algorithms; FP8 runs found them for e4m3 GEMMs (block-scaled ones
// for the block recipe, only there); fused runs logged the engines of both passes of their
// shape on every rank, and fallback runs asked cuDNN nothing.
void check_library_log(const fs::path& path, const Axes& run, bool fp8) {
  REQUIRE(fs::exists(path));
  long gemms = 0, fp8_gemms = 0, block_scaled = 0, attention_ok = 0, attention_records = 0;
  for (const auto& record : read_metrics(path)) {
    INFO(record.dump());
    if (record["library"] == "cuBLASLt") {
      // A query may be refused (an epilogue tried first, then the separate ops): only the
      // algorithms found count.
      if (record["status"] != "CUBLAS_STATUS_SUCCESS" || record["returned"].get<int>() == 0) continue;
      ++gemms;
      CHECK(record["algo"]["id"].get<int64_t>() >= 0);
      const auto& spec = record["spec"];
      if (spec["types"][0] == "e4m3" || spec["types"][1] == "e4m3") ++fp8_gemms;
      if (spec["scales"][0] != "unscaled" && spec["scales"][0] != "tensor") ++block_scaled;
    } else {
      REQUIRE(record["library"] == "cuDNN");
      ++attention_records;
      if (record["ok"].get<bool>()) {
        ++attention_ok;
        CHECK(record["forward"]["engine"].get<int64_t>() >= 0);
        CHECK(record["backward"]["engine"].get<int64_t>() >= 0);
      }
    }
  }
  CHECK(gemms > 0);
  CHECK((fp8_gemms > 0) == fp8);
  CHECK((block_scaled > 0) == (std::string(run.mode) == "fp8:block"));
  if (std::string(run.attention) == "cudnn") {
    CHECK(attention_ok >= run.ranks);
  } else {
    CHECK(attention_records == 0);
  }
}

void check_run(const Axes& run) {
  const TempDir tmp(std::string("sim-run-") + run.name);
  const fs::path dir = tmp.dir, report = dir / "report";
  fs::create_directories(report);
  const std::string mode = run.mode;
  const size_t colon = mode.find(':');
  const std::string precision = colon == std::string::npos
                                    ? "{mode: " + mode + "}"
                                    : "{mode: " + mode.substr(0, colon) + ", fp8: {recipe: " + mode.substr(colon + 1) +
                                          (run.primary_weights ? ", primary_weights: true" : "") +
                                          (run.mlp_input_codes ? ", mlp_input_codes: true" : "") + "}}";
  const bool fp8 = mode.rfind("fp8", 0) == 0;
  // Two steps of two micro-batches per rank: every kind of micro-batch runs once as called and
  // once more, which a recording replays (with two ranks the step's last micro-batch always
  // runs as called, beside its all-reduces).
  write_file(dir / "run.yaml",
             std::string("run: {name: r, out_dir: runs, seed: 3, device: cuda}\n") +
                 "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: " + std::to_string(run.seq_len) +
                 ", vocab_size: 256, attention: " + run.attention +
                 (std::string(run.arch) == "llama" ? ", arch: llama, n_kv_head: 2" : "") + "}\n"
                 "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 200000, seed: 5}}\n"
                 "training: {steps: 2, batch_tokens: " + std::to_string(8 * run.seq_len * run.ranks) +
                 ", micro_batch: 4, eval_every: 0, eval_batches: 1, recompute: " + run.recompute + ", "
                 "cuda_graph: " + (run.graphs ? "true" : "false") + "}\n"
                 "precision: " + precision + "\n"
                 "distributed: {zero_stage: " + std::to_string(run.zero_stage) + ", grad_reduce_dtype: " +
                 run.grad_reduce + "}\n"
                 "checkpoint: {save_final: false}\n");
  const std::string env = "PTRAIN_SIM_REPORT='" + report.string() + "' PTRAIN_SIM_DEVICES=" + std::to_string(run.ranks);
  const fs::path library_log = dir / "library.jsonl";
  const std::string train_env = env + " PTRAIN_LIBRARY_LOG='" + library_log.string() + "'";
  const CommandResult r = run.ranks == 1 ? run_ptrain("train run.yaml", dir, train_env)
                                         : run_shell("cd '" + dir.string() + "' && " + train_env + " " +
                                                     mpi_command(run.ranks, "train run.yaml"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("device cuda:0 ptrain simulated device") != std::string::npos);

  std::vector<double> losses;
  for (const auto& m : read_metrics(dir / "runs" / "r" / "metrics.jsonl"))
    if (m.contains("step") && m.contains("loss")) losses.push_back(m["loss"].get<double>());
  REQUIRE(losses.size() == 2);
  for (double loss : losses) CHECK((std::isfinite(loss) && loss > 0 && loss < 6.0));  // ln(256) = 5.55

  const auto reports = read_reports(report);
  REQUIRE(reports.size() == size_t(run.ranks));
  for (const auto& ops : reports) {
    INFO(nlohmann::json(ops).dump());
    // Tokens go up through pinned staging, never from pageable memory on the training path, and
    // the loss is summed on the device (two-stage double-precision sum) before it comes down.
    CHECK(ran(ops, "cudaMemcpyAsync pinned host to device") > 0);
    CHECK(ran_prefix(ops, "double_sum_final_kernel") > 0);

    const bool fused = std::string(run.attention) == "cudnn";
    if (fused) {
      // The fused graphs ran, and so did the fallback they were checked against.
      CHECK(r.output.find("attention: cudnn (fused flash attention, checked against the fallback") !=
            std::string::npos);
      CHECK(ran(ops, "cudnnBackendExecute") > 0);
      CHECK(ran_prefix(ops, "softmax_causal_forward_kernel") > 0);
    } else {
      CHECK(r.output.find("attention: fallback") != std::string::npos);
      CHECK(ran(ops, "cudnnBackendExecute") == 0);
      CHECK(ran_prefix(ops, "softmax_causal_backward_kernel") > 0);
    }

    if (fp8) {
      CHECK(r.output.find("fp8: 8 of 8 FP8 linear layers run native FP8 GEMMs") != std::string::npos);
      const bool blocks = mode == "fp8:block";
      CHECK(ran(ops, blocks ? "cublasLtMatmul e4m3 x e4m3, block scales" : "cublasLtMatmul e4m3 x e4m3, tensor scales") >
            0);
      CHECK(ran(ops, blocks ? "cublasLtMatmul e4m3 x e4m3, tensor scales" : "cublasLtMatmul e4m3 x e4m3, block scales") ==
            0);
      // The weights' transposes are made for the dgrad GEMMs, not kept beside their codes.
      CHECK(ran_prefix(ops, "fp8_transpose_kernel") > 0);
      CHECK((r.output.find("the block linears' weights are FP8 codes only") != std::string::npos) ==
            run.primary_weights);
      // The MLP's pre-activation went through the FP8 store: its codes read back by the block
      // dequantiser, which native FP8 GEMMs never run.
      CHECK((ran_prefix(ops, "fp8_dequantize_blocks_kernel") > 0) == run.mlp_input_codes);
      CHECK((r.output.find("the MLP's input is kept for the backward pass as E4M3 codes") != std::string::npos) ==
            run.mlp_input_codes);
    } else {
      CHECK(r.output.find("native FP8 GEMMs") == std::string::npos);
      CHECK(ran_prefix(ops, "cublasLtMatmul e4m3") + ran_prefix(ops, "cublasLtMatmul e5m2") == 0);
    }

    const long launches = ran(ops, "cudaGraphLaunch");
    if (run.graphs) {
      CHECK(r.output.find("replayed as one CUDA graph") != std::string::npos);
      CHECK(launches > 0);
    } else {
      CHECK(launches == 0);
    }

    if (run.ranks > 1) {
      // ZeRO-0 sums gradients with all-reduces; ZeRO-1 reduce-scatters them and all-gathers the
      // updated weights, or, when the parameters do not split evenly, reduces and broadcasts
      // each rank's shard. A bf16 exchange reduce-scatters chunks of equal pieces either way.
      CHECK(r.output.find("data parallel: NCCL") != std::string::npos);
      const bool bf16_exchange = std::string(run.grad_reduce) == "bf16";
      CHECK(r.output.find(std::string("gradients reduced in ") + run.grad_reduce) != std::string::npos);
      const bool even = logged_parameters(r.output) % run.ranks == 0;
      // The bytes ptrain's communicator counted (summary.json) are those the simulated NCCL moved.
      const auto summary = nlohmann::json::parse(read_file(dir / "runs" / "r" / "summary.json"));
      const auto& counted = summary["comm_bytes"];
      CHECK(counted["all_reduce"].get<long>() == ran(ops, "ncclAllReduce bytes"));
      CHECK(counted["reduce_scatter"].get<long>() == ran(ops, "ncclReduceScatter bytes") + ran(ops, "ncclReduce bytes"));
      CHECK(counted["all_gather"].get<long>() == ran(ops, "ncclAllGather bytes") + ran(ops, "ncclBroadcast bytes"));
      CHECK(counted["all_reduce"].get<long>() + counted["reduce_scatter"].get<long>() > 0);
      // Primary FP8 weights' codes are gathered as bytes, as nothing else is.
      CHECK((ran(ops, "nccl u8 bytes gathered") > 0) == (run.primary_weights && run.zero_stage > 0));
      if (run.zero_stage == 0) {
        CHECK(ran(ops, "ncclAllReduce") > 0);
      } else if (run.zero_stage == 2) {
        // Each gradient bucket goes to the ranks owning its elements, in parts of any length:
        // one reduce per owner. The updated weights are all-gathered as under ZeRO-1.
        CHECK(ran(ops, "ncclReduce") > 0);
        CHECK(ran(ops, "ncclAllReduce") == 0);
        CHECK((ran(ops, "ncclAllGather") > 0) == even);
        CHECK((ran(ops, "ncclBroadcast") > 0) == !even);
      } else if (run.zero_stage == 3) {
        // As ZeRO-2's gradients, each block's weights are gathered from the ranks' parts of it,
        // one broadcast per owner (a block's primary FP8 weights as their codes, each linear's
        // apart); nothing is all-gathered whole.
        CHECK(ran(ops, "ncclReduce") > 0);
        CHECK(ran(ops, "ncclAllReduce") == 0);
        CHECK(ran(ops, "ncclBroadcast") > 0);
      } else {
        // Primary FP8 weights' codes are gathered a layer at a time, from the ranks' parts of
        // it (which the shards cut anywhere): one broadcast per owner, in place of ZeRO-1's
        // all-gather of the updated weights.
        CHECK((ran(ops, "ncclReduceScatter") > 0) == (even || bf16_exchange));
        CHECK((ran(ops, "ncclAllGather") > 0) == (even && !run.primary_weights));
        CHECK((ran(ops, "ncclReduce") > 0) == (!even && !bf16_exchange));
        CHECK((ran(ops, "ncclBroadcast") > 0) == (!even || run.primary_weights));
      }
    } else {
      CHECK(ran_prefix(ops, "nccl") == 0);
    }
  }
  check_library_log(library_log, run, fp8);

  if (run.graphs) {
    const auto summary = nlohmann::json::parse(read_file(dir / "runs" / "r" / "summary.json"));
    CHECK(summary["cuda_graph_replays"].get<long>() > 0);
  }

  // The dry run's GPU memory plan (computed from the config; only the attention path comes from
  // the device) against the arena's measured peak: never below it, and above it by at most 3%
  // of what is not the backend's fixed 32 MiB. cuDNN's workspace is the one part only the device
  // knows; the run's attention line gives it.
  double peak_mib = 0;
  for (const auto& m : read_metrics(dir / "runs" / "r" / "metrics.jsonl"))
    if (m.contains("device_memory_peak_mib")) peak_mib = std::max(peak_mib, m["device_memory_peak_mib"].get<double>());
  const std::string dry_args = "train run.yaml --dry-run --set run.name=dry";
  const CommandResult dry = run.ranks == 1 ? run_ptrain(dry_args, dir, env)
                                           : run_shell("cd '" + dir.string() + "' && " + env + " " +
                                                       mpi_command(run.ranks, dry_args));
  INFO(dry.output);
  REQUIRE(dry.exit_code == 0);
  const std::string plan_key = "GPU memory plan per rank: ";
  const size_t at = dry.output.find(plan_key);
  REQUIRE(at != std::string::npos);
  double planned_mib = std::stod(dry.output.substr(at + plan_key.size()));
  const std::string workspace_key = "total workspace ";
  if (const size_t w = r.output.find(workspace_key); w != std::string::npos)
    planned_mib += std::stod(r.output.substr(w + workspace_key.size())) / (1 << 20);
  INFO("planned " << planned_mib << " MiB, measured peak " << peak_mib << " MiB");
  CHECK(planned_mib >= peak_mib - 0.1);  // the plan prints one decimal
  const double fixed_mib = 32;  // cuBLASLt's workspace
  CHECK(planned_mib - fixed_mib <= 1.03 * (peak_mib - fixed_mib));
}

// The runs: every value of every axis at least once, ZeRO-1's uneven shards, Llama blocks and
// each recompute setting. fp32 has no fused attention; delayed-scaling FP8 is never recorded (its
// scales move on the host between micro-batches).
const Axes kRuns[] = {
    {"fp32", "fp32", "auto", false, 1, 0},
    {"fp32-graphs", "fp32", "fallback", true, 1, 0},
    {"bf16-fused-graphs", "bf16", "cudnn", true, 1, 0},
    {"bf16-fallback", "bf16", "fallback", false, 1, 0},
    {"fp16-fused", "fp16", "cudnn", false, 1, 0},
    {"fp16-fallback-graphs", "fp16", "fallback", true, 1, 0},
    {"fp8-delayed-fused", "fp8:delayed", "cudnn", false, 1, 0},
    {"fp8-current-fused-graphs", "fp8:current", "cudnn", true, 1, 0},
    {"fp8-block-fallback-graphs", "fp8:block", "fallback", true, 1, 0},
    {"bf16-2-ranks-fused-graphs", "bf16", "cudnn", true, 2, 0},
    {"fp8-current-2-ranks-zero1", "fp8:current", "fallback", false, 2, 1},
    {"fp16-2-ranks-fused-zero1", "fp16", "cudnn", false, 2, 1},
    // Three ranks and 32 positions: 433,664 parameters do not split in three (uneven shards).
    {"bf16-3-ranks-fallback-zero1-uneven", "bf16", "fallback", false, 3, 1, 32},
    // Llama blocks: cuDNN's grouped-query graph (checked against the fallback), FP8 on the
    // fallback, and two ranks.
    {"llama-bf16-fused-gqa-graphs", "bf16", "cudnn", true, 1, 0, 64, "llama"},
    {"llama-fp8-current-fallback", "fp8:current", "fallback", false, 1, 0, 64, "llama"},
    {"llama-fp16-2-ranks-fused-zero1", "fp16", "cudnn", false, 2, 1, 64, "llama"},
    // Recomputation: the activations it keeps are what the plan counts.
    {"fp8-current-fused-recompute-block", "fp8:current", "cudnn", false, 1, 0, 64, "gpt2", "block"},
    {"fp8-block-2-ranks-zero1-recompute-block", "fp8:block", "fallback", false, 2, 1, 64, "gpt2", "block"},
    {"fp8-current-2-ranks-zero1-recompute-mlp", "fp8:current", "fallback", false, 2, 1, 64, "gpt2", "mlp"},
    {"llama-bf16-fused-recompute-mlp", "bf16", "cudnn", false, 1, 0, 64, "llama", "mlp"},
    {"llama-fp32-recompute-block", "fp32", "auto", false, 1, 0, 64, "llama", "block"},
    // Gradients exchanged in bf16: the staging blocks are what the plan counts, the ZeRO-0 sums
    // come after the backward pass, and uneven ZeRO-1 shards pad their pieces.
    {"bf16-2-ranks-fused-graphs-bf16-exchange", "bf16", "cudnn", true, 2, 0, 64, "gpt2", "none", "bf16"},
    {"fp8-current-3-ranks-zero1-uneven-bf16-exchange", "fp8:current", "fallback", false, 3, 1, 32, "gpt2", "none",
     "bf16"},
    // Primary FP8 weights: no bf16 copy of the block linears' weights, which the plan leaves out.
    {"fp8-delayed-fused-2-ranks-primary-weights", "fp8:delayed", "cudnn", false, 2, 0, 64, "gpt2", "none", "fp32",
     true},
    {"llama-fp8-current-graphs-recompute-block-primary-weights", "fp8:current", "fallback", true, 1, 0, 64, "llama",
     "block", "fp32", true},
    // ZeRO-1's ranks cast a part of each layer and gather the codes: no block of their own.
    {"fp8-block-2-ranks-zero1-graphs-primary-weights", "fp8:block", "fallback", true, 2, 1, 64, "gpt2", "none", "fp32",
     true},
    // ZeRO-2: grad buckets in place of the gradient block, and a gradient shard per rank; two
    // micro-batches per rank add into it. Its micro-batches hand buckets on, so run as called.
    // Primary FP8 weights' codes are gathered straight into each layer's; a bf16 exchange
    // stages at most a bucket.
    {"bf16-2-ranks-fused-zero2-bf16-exchange", "bf16", "cudnn", false, 2, 2, 64, "gpt2", "none", "bf16"},
    {"fp8-current-3-ranks-zero2-uneven-recompute-block-primary-weights", "fp8:current", "fallback", false, 3, 2, 32,
     "gpt2", "block", "fp32", true},
    // ZeRO-3: the weights' range and the rooms each block's are gathered into, in place of the
    // whole copy; every pass gathers. Llama's untied head and embeddings take block rooms' turns.
    {"bf16-2-ranks-fused-zero3", "bf16", "cudnn", false, 2, 3},
    {"llama-bf16-2-ranks-zero3", "bf16", "fallback", false, 2, 3, 64, "llama"},
    {"fp16-3-ranks-zero3-uneven-recompute-block", "fp16", "fallback", false, 3, 3, 32, "gpt2", "block"},
    // FP8 layers under ZeRO-3 cast their weights from the gathered room before each pass, into
    // codes the layers of a shape share; primary FP8 weights are cast a part per rank into codes
    // each rank keeps for its part, which the passes gather into code rooms.
    {"fp8-delayed-2-ranks-fused-zero3", "fp8:delayed", "cudnn", false, 2, 3},
    {"fp8-block-2-ranks-zero3-recompute-block", "fp8:block", "fallback", false, 2, 3, 64, "gpt2", "block"},
    {"llama-fp8-current-3-ranks-zero3-recompute-block-primary-weights", "fp8:current", "fallback", false, 3, 3, 32,
     "llama", "block", "fp32", true},
    // The MLP's pre-activation kept as FP8 codes: one layer of its bf16 room, the codes beside,
    // stored and read back inside recorded micro-batches too.
    {"llama-fp8-current-graphs-mlp-input-codes", "fp8:current", "fallback", true, 1, 0, 64, "llama", "none", "fp32",
     false, true},
    {"fp8-block-2-ranks-fused-zero1-mlp-input-codes", "fp8:block", "cudnn", false, 2, 1, 64, "gpt2", "none", "fp32",
     false, true},
};

// Two ranks whose NCCL fails, as injected on both (PTRAIN_SIM_FAIL): when the communicator
// starts, in a collective, or asynchronously (a peer or the network) as found after one. The run
// stops with NCCL's status and call named by the failing rank, and takes the other rank down
// instead of leaving it waiting in a collective.
TEST_CASE("simulated device: a run whose NCCL fails stops on every rank with NCCL's error", "[sim]") {
  const TempDir tmp("sim-run-nccl-faults");
  write_file(tmp.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 3, device: cuda}\n"
             "model: {n_layer: 1, n_head: 2, n_embd: 64, seq_len: 32, vocab_size: 256, attention: fallback}\n"
             "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 50000, seed: 5}}\n"
             "training: {steps: 2, batch_tokens: 256, micro_batch: 2, eval_every: 0, eval_batches: 1}\n"
             "precision: {mode: bf16}\n"
             "checkpoint: {save_final: false}\n");
  const struct {
    const char* fault;  // function:nth:status (nccl.h: 2 ncclSystemError, 3 ncclInternalError, 6 ncclRemoteError)
    std::vector<std::string> said;
  } faults[] = {
      {"ncclCommInitRank:1:2", {"NCCL error ncclSystemError", "ncclCommInitRank", "NCCL_DEBUG=WARN says which"}},
      {"ncclAllReduce:1:6", {"NCCL error ncclRemoteError", "ncclAllReduce", "another rank or the network failed"}},
      {"ncclCommGetAsyncError:1:3",
       {"NCCL error ncclInternalError", "an earlier collective (ncclCommGetAsyncError)", "simulated network"}},
  };
  int run_number = 0;
  for (const auto& f : faults) {
    INFO(f.fault);
    const std::string args = "train run.yaml --set run.name=r" + std::to_string(++run_number);
    const CommandResult r = run_shell("cd '" + tmp.dir.string() + "' && PTRAIN_SIM_DEVICES=2 PTRAIN_SIM_FAIL=" +
                                      f.fault + " " + mpi_command(2, args));
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("ptrain: error on rank ") != std::string::npos);
    for (const std::string& text : f.said) CHECK(r.output.find(text) != std::string::npos);
  }
}

// Primary FP8 weights under ZeRO-1 and 3, on two ranks of which one finds no cuBLASLt algorithm
// for the QKV layers' FP8 GEMMs (injected on rank 1 only: the first heuristic a run with the
// fallback attention asks for is the first QKV layer's forward GEMM) and emulates them: its codes
// would be floats where rank 0's are bytes, and the ranks gather one another's. The run stops
// before training, every rank naming the layer and what each rank runs (rank 1 says why it
// emulates too).
TEST_CASE("simulated device: ranks that would keep a primary FP8 weight's codes unlike refuse to train", "[sim]") {
  const TempDir tmp("sim-run-unlike-codes");
  write_file(tmp.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 3, device: cuda}\n"
             "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256, attention: fallback}\n"
             "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 50000, seed: 5}}\n"
             "training: {steps: 1, batch_tokens: 1024, micro_batch: 8, eval_every: 0, eval_batches: 1}\n"
             "precision: {mode: fp8, fp8: {recipe: current, primary_weights: true}}\n"
             "checkpoint: {save_final: false}\n");
  for (const int stage : {1, 3}) {
    const std::string args = "train run.yaml --set distributed.zero_stage=" + std::to_string(stage) +
                             " --set run.name=zero" + std::to_string(stage);
    // One rank as usual, and after ':' (a second application context) one with the fault.
    const std::string rank1 = " : -np 1 env PTRAIN_SIM_FAIL=cublasLtMatmulAlgoGetHeuristic:1:15 '" +
                              ptrain_binary() + "' " + args;
    const CommandResult r =
        run_shell("cd '" + tmp.dir.string() + "' && PTRAIN_SIM_DEVICES=2 " + mpi_command(1, args + rank1));
    INFO(r.output);
    CHECK(r.exit_code != 0);
    // Either rank's error may be the one printed before mpirun stops the other: what both say.
    CHECK(r.output.find("precision.fp8.primary_weights: the ranks keep the codes of h0.qkv.weight unlike: on rank 0 "
                        "it runs its FP8 GEMMs natively (a byte per code), on rank 1 it emulates its FP8 GEMMs (a "
                        "float per code); under ZeRO-" +
                        std::to_string(stage) + " the ranks gather one another's codes") != std::string::npos);
    const fs::path metrics = tmp.dir / "runs" / ("zero" + std::to_string(stage)) / "metrics.jsonl";
    if (fs::exists(metrics))
      for (const auto& m : read_metrics(metrics)) CHECK(!m.contains("loss"));  // no step trained
  }
}

// precision.schedule on the GPU path: 4 steps with CUDA graphs, the switch after step 2. The
// switch drops or makes the FP8 layers inside the arena the run started with (sized for its
// widest phase), so the run calls cudaMalloc exactly as often as the plain run of its first
// mode; the FP8 GEMMs ran natively in the FP8 phase, and the graphs were recorded again.
TEST_CASE("simulated device: a precision schedule switches in place, with no more cudaMalloc than the plain run",
          "[sim]") {
  const TempDir tmp("sim-schedule");
  const auto run = [&](const std::string& name, const std::string& precision) {
    const fs::path dir = tmp.dir / name, report = dir / "report";
    fs::create_directories(report);
    write_file(dir / "run.yaml",
               "run: {name: r, out_dir: runs, seed: 3, device: cuda}\n"
               "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256, attention: fallback}\n"
               "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 200000, seed: 5}}\n"
               "training: {steps: 4, batch_tokens: 512, micro_batch: 4, eval_every: 0, eval_batches: 1, "
               "cuda_graph: true}\n"
               "precision: " + precision + "\n"
               "checkpoint: {save_final: false}\n");
    const CommandResult r = run_ptrain("train run.yaml", dir, "PTRAIN_SIM_REPORT='" + report.string() + "'");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<double> losses;
    for (const auto& m : read_metrics(dir / "runs" / "r" / "metrics.jsonl"))
      if (m.contains("loss")) losses.push_back(m["loss"].get<double>());
    REQUIRE(losses.size() == 4);
    for (double loss : losses) CHECK((std::isfinite(loss) && loss > 0 && loss < 6.0));
    const auto reports = read_reports(report);
    REQUIRE(reports.size() == 1);
    return std::pair{r.output, reports[0]};
  };
  const std::string fp8 = "{recipe: current}";
  for (const auto& [first, then] : {std::pair{"fp8", "bf16"}, std::pair{"bf16", "fp8"}}) {
    SECTION(std::string(first) + " then " + then) {
      const auto plain = run("plain", std::string("{mode: ") + first + ", fp8: " + fp8 + "}");
      const auto scheduled = run("scheduled", std::string("{schedule: [{until_step: 2, mode: ") + first + ", fp8: " + fp8 +
                                                  "}, {mode: " + then + ", fp8: " + fp8 + "}]}");
      const std::string from = std::string(first) == "fp8" ? "fp8:current" : "bf16";
      const std::string to = std::string(then) == "fp8" ? "fp8:current" : "bf16";
      const std::vector<nlohmann::json> switches =
          records_with(tmp.dir / "scheduled" / "runs" / "r" / "metrics.jsonl", "precision_phase");
      REQUIRE(switches.size() == 1);
      const nlohmann::json& phase = switches[0]["precision_phase"];
      CHECK(switches[0]["step"] == 3);
      CHECK(phase["from"] == from);
      CHECK(phase["to"] == to);
      CHECK(scheduled.first.find("precision: step " + std::to_string(switches[0]["step"].get<int64_t>()) +
                                 " starts phase " + std::to_string(phase["phase"].get<int64_t>()) + " of 2, " + from +
                                 " -> " + to) != std::string::npos);
      CHECK(scheduled.first.find("fp8: 8 of 8 FP8 linear layers run native FP8 GEMMs") != std::string::npos);
      const auto& ops = scheduled.second;
      INFO(nlohmann::json(ops).dump());
      CHECK(ran(ops, "cublasLtMatmul e4m3 x e4m3, tensor scales") > 0);
      CHECK(ran(ops, "cudaGraphLaunch") > 0);
      CHECK(scheduled.first.find("training.cuda_graph: micro-batches run as called") == std::string::npos);
      REQUIRE(ran(plain.second, "cudaMalloc") > 0);
      CHECK(ran(ops, "cudaMalloc") == ran(plain.second, "cudaMalloc"));
    }
  }
}

TEST_CASE("simulated device: short runs of ptrain_simulated cover every axis on the GPU paths, Llama blocks included", "[sim]") {
  for (const Axes& run : kRuns) {
    SECTION(run.name) { check_run(run); }
  }
}

}  // namespace
}  // namespace ptrain::test
