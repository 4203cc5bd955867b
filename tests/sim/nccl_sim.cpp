// The simulated NCCL (see sim.h): the communicator calls and collectives ptrain uses, over MPI on
// the host, since the simulated device's memory is host memory. Each rank is one process with one
// simulated GPU (PTRAIN_SIM_DEVICES of them, one per local rank).
//
// Where each behaviour is specified (nccl.h 2.28 and NCCL's user guide):
//  - A collective is enqueued on its CUDA stream and runs when the stream reaches it ("CUDA
//    Stream Semantics"): here the stream's earlier work runs when the collective is launched,
//    the ranks exchange their inputs then, and the write of the result is queued on the stream
//    (see launch() below), so a stream that reads the result without an event wait reads the
//    buffer before the sum lands.
//  - Between ncclGroupStart and ncclGroupEnd operations are only collected, and are launched
//    together at the outermost ncclGroupEnd ("Group Calls"). Here they are launched there in
//    issue order; every rank issues the same sequence (NCCL requires it), so the blocking MPI
//    calls that carry them meet.
//  - Buffers must be device memory (NCCL's argument check returns ncclInvalidArgument for a host
//    pointer); ncclReduce reads recvbuff only on the root and ncclBroadcast sendbuff only on
//    the root, so those may be null elsewhere. In-place operation (sendbuff == recvbuff, the
//    rank's slice of recvbuff for AllGather, recvbuff the rank's slice of sendbuff for
//    ReduceScatter) is allowed.
//  - Counts: ncclReduceScatter's is the per-rank count (sendbuff holds count * nranks);
//    ncclAllGather's the per-rank sendcount (recvbuff holds sendcount * nranks).
//  - NCCL sums in the element type: each addition of a reduction rounds to it (a bf16 sum lands
//    on bf16's grid at every step). Here the ranks' values are added in rank order, one rounding
//    per addition; NCCL's own order (rings, trees) differs, so this matches NCCL to rounding.
//
// What it does not model: NCCL's timing and topology, its own reduction order, a race between a
// collective and a later write to its input. The ranks meet in each collective's launch, so
// ranks that launch collectives and make host MPI calls in different orders (which NCCL and MPI
// allow) would hang here; ptrain's ranks do both in the same order, and a test that hung would
// end at its ctest timeout.
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD: never matches the host's own MPI calls
  int rank = 0, size = 1;
};

namespace {

constexpr char kIdMagic[] = "ptrain simulated NCCL";

std::string& last_error() {
  static std::string text;
  return text;
}

ncclResult_t refuse(ncclResult_t status, const std::string& why) {
  last_error() = why;
  return status;
}

size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32: return 4;
    case ncclBfloat16:
    case ncclFloat16: return 2;
    case ncclUint8: return 1;  // FP8 codes: gathered and broadcast, never summed (check_sum)
    default: return 0;  // types ptrain never sends: refused below
  }
}

float load(const void* base, size_t i, ncclDataType_t type) {
  switch (type) {
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case ncclFloat16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store(void* base, size_t i, ncclDataType_t type, float v) {
  switch (type) {
    case ncclBfloat16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    case ncclFloat16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// sum over ranks r of parts[r * stride + offset + i] for i < count, added in rank order, each
// addition rounded to the element type.
std::vector<char> sum_in_type(const std::vector<char>& parts, size_t stride, size_t offset, size_t count,
                              ncclDataType_t type, int ranks) {
  const size_t bytes = element_bytes(type);
  std::vector<char> out(count * bytes);
  for (size_t i = 0; i < count; ++i) {
    store(out.data(), i, type, load(parts.data(), offset + i, type));
    for (int r = 1; r < ranks; ++r) {
      const float next = load(parts.data() + static_cast<size_t>(r) * stride * bytes, offset + i, type);
      store(out.data(), i, type, load(out.data(), i, type) + next);
    }
  }
  return out;
}

// Every rank's `bytes` bytes at `send`, concatenated in rank order (MPI_Allgather takes int counts).
std::vector<char> gather_all(const ncclComm* comm, const void* send, size_t bytes) {
  std::vector<char> all(bytes * static_cast<size_t>(comm->size));
  std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
  if (bytes > size_t(INT32_MAX)) throw std::runtime_error("simulated NCCL: a message over 2 GiB");
  MPI_Allgather(mine.data(), static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE,
                comm->mpi);
  return all;
}

// A collective in two parts: the exchange between ranks, which returns the write of this
// rank's result into its buffers.
using Exchange = std::function<std::function<void()>()>;

// Operations collected inside a group, launched at its outermost end.
struct Pending {
  cudaStream_t stream;
  const char* what;
  size_t payload;  // bytes, as ptrain's Communicator counts them (CollectiveBytes)
  Exchange exchange;
};
int group_depth = 0;
std::vector<Pending> group;

// Launches a collective. A GPU runs it when its stream gets there, whatever the host threads
// are doing; here the host thread must carry it, and a rank whose host waits in another MPI
// call (a rank with no validation batch of its own, say) would never get there. So the ranks
// meet when the collective is launched, which every rank does in the same order: the work its
// stream waits for so far runs, the inputs are exchanged, and only the write of the result is
// queued on the stream. A stream that reads the result without waiting for that write reads
// the buffer as it was; an input written after the launch, which on a GPU would race with the
// collective, is not seen.
// The report counts the bytes each kind of collective moved ("ncclAllReduce bytes").
ncclResult_t launch(cudaStream_t stream, const char* what, size_t payload, const Exchange& exchange) {
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return refuse(ncclUnhandledCudaError, std::string(what) + ": its stream cannot run (" + cudaGetErrorString(e) +
                                              "; a capture cannot record a simulated collective)");
  std::function<void()> result;
  try {
    result = exchange();
  } catch (const std::exception& e) {  // nothing may leave a C interface
    return refuse(ncclSystemError, std::string(what) + ": " + e.what());
  }
  const cudaError_t status = ptrain::sim::enqueue(stream, what, std::move(result));
  if (status != cudaSuccess)
    return refuse(ncclUnhandledCudaError, std::string(what) + ": " + cudaGetErrorString(status));
  ptrain::sim::add_to_report(std::string(what) + " bytes", payload);
  return ncclSuccess;
}

// The report counts the bytes gathered or broadcast as u8 too: FP8 codes, a byte each.
void count_codes(ncclDataType_t type, size_t bytes) {
  if (type == ncclUint8) ptrain::sim::add_to_report("nccl u8 bytes gathered", bytes);
}

// A call that fails inside a group ends the group: ptrain throws, and nothing it collected
// must be launched later with another group's operations.
ncclResult_t abandon_group(ncclResult_t status) {
  group_depth = 0;
  group.clear();
  return status;
}

ncclResult_t submit(cudaStream_t stream, const char* what, size_t payload, Exchange exchange) {
  if (group_depth > 0) {
    group.push_back(Pending{stream, what, payload, std::move(exchange)});
    return ncclSuccess;
  }
  return launch(stream, what, payload, exchange);
}

// The write of `result` to dst, queued on the collective's stream.
std::function<void()> write(void* dst, std::vector<char> result) {
  auto bytes = std::make_shared<std::vector<char>>(std::move(result));
  return [dst, bytes]() { std::memcpy(dst, bytes->data(), bytes->size()); };
}

// NCCL's argument check: a live communicator, a type it can send, device buffers.
ncclResult_t check_call(const char* what, ncclComm_t comm, ncclDataType_t type) {
  if (!comm) return refuse(ncclInvalidArgument, std::string(what) + ": comm is null");
  if (element_bytes(type) == 0)
    return refuse(ncclInvalidArgument,
                  std::string(what) + ": datatype " + std::to_string(int(type)) + " is not simulated (f32, bf16, f16, u8)");
  return ncclSuccess;
}

// The reductions' checks: a float type, which load() and store() read and write.
ncclResult_t check_sum(const char* what, ncclComm_t comm, ncclDataType_t type) {
  if (type == ncclUint8) return refuse(ncclInvalidArgument, std::string(what) + ": ncclUint8 sums are not simulated");
  return check_call(what, comm, type);
}

ncclResult_t check_buffer(const char* what, const char* name, const void* p, size_t bytes) {
  if (bytes == 0 || ptrain::sim::is_device_range(p, bytes)) return ncclSuccess;
  return refuse(ncclInvalidArgument, std::string(what) + ": " + name + " is not " + std::to_string(bytes) +
                                         " bytes of device memory");
}

#define SIM_NCCL_TRY(expr)                                   \
  do {                                                       \
    if (const ncclResult_t s = (expr); s != ncclSuccess)      \
      return group_depth > 0 ? abandon_group(s) : s;          \
  } while (0)

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;  // the simulated library matches the header it was built against
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error().c_str(); }

// A unique id names the communicator ranks join; here it only has to be the same on every rank.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int made = 0;
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "%s %d %d", kIdMagic, static_cast<int>(getpid()), made++);
  return ncclSuccess;
}

// Collective over all nranks ranks (nccl.h: "rank must be between 0 and nranks-1 and unique").
ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (const int injected = ptrain::sim::injected_failure(__func__))
    return refuse(static_cast<ncclResult_t>(injected), "ncclCommInitRank: injected failure");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return refuse(ncclInvalidUsage, "the simulated NCCL runs over MPI: MPI_Init must come first");
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (nranks != world || rank != me)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + ", but MPI has rank " + std::to_string(me) +
                                           " of " + std::to_string(world) + " (the simulation maps them 1:1)");
  auto* comm = new ncclComm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm->mpi);
  comm->rank = me;
  comm->size = world;
  // Ranks given different ids would never meet in real NCCL; here they are told so.
  const std::vector<char> ids = gather_all(comm, id.internal, sizeof(id.internal));
  for (int r = 0; r < world; ++r)
    if (std::memcmp(ids.data() + r * sizeof(id.internal), ids.data(), sizeof(id.internal)) != 0 ||
        std::strncmp(ids.data(), kIdMagic, sizeof(kIdMagic) - 1) != 0) {
      MPI_Comm_free(&comm->mpi);
      delete comm;
      return refuse(ncclInvalidArgument, "ncclCommInitRank: the ranks were given different unique ids");
    }
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommDestroy: comm is null");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Abort is local: no peer is waited for.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

// The simulated collectives fail synchronously (the sticky device error); an asynchronous error
// (a peer or the network failing during a collective) is only ever an injected one.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: comm is null");
  const int injected = ptrain::sim::injected_failure(__func__);
  if (injected) last_error() = "a collective failed on the simulated network (injected)";
  *async_error = static_cast<ncclResult_t>(injected);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Pending> ops;
  ops.swap(group);
  // Every rank launches the same operations; one that fails here has its job aborted by ptrain
  // (abort_other_ranks), so the others do not wait for the rest of the group forever.
  for (const Pending& op : ops)
    if (const ncclResult_t s = launch(op.stream, op.what, op.payload, op.exchange); s != ncclSuccess) return s;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  SIM_NCCL_TRY(check_sum("ncclAllReduce", comm, type));
  if (const int injected = ptrain::sim::injected_failure(__func__))
    return abandon_group(refuse(static_cast<ncclResult_t>(injected), "ncclAllReduce: injected failure"));
  if (op != ncclSum) return refuse(ncclInvalidArgument, "ncclAllReduce: only ncclSum is simulated");
  const size_t bytes = count * element_bytes(type);
  SIM_NCCL_TRY(check_buffer("ncclAllReduce", "sendbuff", sendbuff, bytes));
  SIM_NCCL_TRY(check_buffer("ncclAllReduce", "recvbuff", recvbuff, bytes));
  return submit(stream, "ncclAllReduce", bytes, [=]() {
    return write(recvbuff, sum_in_type(gather_all(comm, sendbuff, bytes), count, 0, count, type, comm->size));
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  SIM_NCCL_TRY(check_sum("ncclReduceScatter", comm, type));
  if (op != ncclSum) return refuse(ncclInvalidArgument, "ncclReduceScatter: only ncclSum is simulated");
  const size_t bytes = recvcount * element_bytes(type);
  SIM_NCCL_TRY(check_buffer("ncclReduceScatter", "sendbuff", sendbuff, bytes * comm->size));
  SIM_NCCL_TRY(check_buffer("ncclReduceScatter", "recvbuff", recvbuff, bytes));
  return submit(stream, "ncclReduceScatter", bytes * comm->size, [=]() {
    const size_t total = recvcount * comm->size;
    const std::vector<char> parts = gather_all(comm, sendbuff, total * element_bytes(type));
    return write(recvbuff, sum_in_type(parts, total, recvcount * comm->rank, recvcount, type, comm->size));
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  SIM_NCCL_TRY(check_call("ncclAllGather", comm, type));
  const size_t bytes = sendcount * element_bytes(type);
  SIM_NCCL_TRY(check_buffer("ncclAllGather", "sendbuff", sendbuff, bytes));
  SIM_NCCL_TRY(check_buffer("ncclAllGather", "recvbuff", recvbuff, bytes * comm->size));
  count_codes(type, bytes * comm->size);
  return submit(stream, "ncclAllGather", bytes * comm->size,
                [=]() { return write(recvbuff, gather_all(comm, sendbuff, bytes)); });
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  SIM_NCCL_TRY(check_sum("ncclReduce", comm, type));
  if (op != ncclSum) return refuse(ncclInvalidArgument, "ncclReduce: only ncclSum is simulated");
  if (root < 0 || root >= comm->size) return refuse(ncclInvalidArgument, "ncclReduce: root out of range");
  const size_t bytes = count * element_bytes(type);
  SIM_NCCL_TRY(check_buffer("ncclReduce", "sendbuff", sendbuff, bytes));
  if (comm->rank == root) SIM_NCCL_TRY(check_buffer("ncclReduce", "recvbuff", recvbuff, bytes));
  return submit(stream, "ncclReduce", bytes, [=]() -> std::function<void()> {
    const std::vector<char> parts = gather_all(comm, sendbuff, bytes);
    if (comm->rank != root) return [] {};
    return write(recvbuff, sum_in_type(parts, count, 0, count, type, comm->size));
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  SIM_NCCL_TRY(check_call("ncclBroadcast", comm, type));
  if (root < 0 || root >= comm->size) return refuse(ncclInvalidArgument, "ncclBroadcast: root out of range");
  const size_t bytes = count * element_bytes(type);
  if (comm->rank == root) SIM_NCCL_TRY(check_buffer("ncclBroadcast", "sendbuff", sendbuff, bytes));
  SIM_NCCL_TRY(check_buffer("ncclBroadcast", "recvbuff", recvbuff, bytes));
  count_codes(type, bytes);
  return submit(stream, "ncclBroadcast", bytes, [=]() {
    const std::vector<char> all = gather_all(comm, comm->rank == root ? sendbuff : recvbuff, bytes);
    return write(recvbuff, std::vector<char>(all.begin() + root * bytes, all.begin() + (root + 1) * bytes));
  });
}

}  // extern "C"
