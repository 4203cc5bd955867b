// cuBLASLt's functions that ptrain calls, each loading the library on its first call instead of
// at start-up: libcublasLt's initialisers take about 0.3 s of CPU in every process that links
// it (measured with LD_DEBUG=libs), which every ptrain command paid, on the CPU backend too.
// The declarations are cublasLt.h's, so a signature that differs from the toolkit's does not
// compile. The simulated device defines these functions itself (tests/sim/cublaslt_sim.cpp),
// so its build leaves this file out.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace {

#define PTRAIN_STRINGIFY_(x) #x
#define PTRAIN_STRINGIFY(x) PTRAIN_STRINGIFY_(x)
// The major version's soname, the one the link against the toolkit would have recorded.
constexpr const char* kLibrary = "libcublasLt.so." PTRAIN_STRINGIFY(CUBLAS_VER_MAJOR);

void* library() {
  static void* const handle = [] {
    void* h = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!h)
      throw ptrain::EnvironmentError(std::string("the CUDA backend needs cuBLASLt, and ") + kLibrary +
                                     " could not be loaded (" + dlerror() +
                                     "); expected the CUDA toolkit's libraries on the loader's path (LD_LIBRARY_PATH)");
    return h;
  }();
  return handle;
}

template <typename Function>
Function resolve(const char* name) {
  void* symbol = dlsym(library(), name);
  if (!symbol)
    throw ptrain::EnvironmentError(std::string(kLibrary) + " has no " + name +
                                   "; expected cuBLASLt " PTRAIN_STRINGIFY(CUBLAS_VER_MAJOR) ".x");
  return reinterpret_cast<Function>(symbol);
}

}  // namespace

// Defines `name` to call the library's own, resolved once.
#define PTRAIN_CUBLASLT(result, name, parameters, ...)                       \
  result CUBLASWINAPI name parameters {                                      \
    static const auto function = resolve<decltype(&name)>(#name);            \
    return function(__VA_ARGS__);                                            \
  }

extern "C" {
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), handle)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), handle)
PTRAIN_CUBLASLT(size_t, cublasLtGetVersion, (void))
PTRAIN_CUBLASLT(const char*, cublasLtGetStatusName, (cublasStatus_t status), status)
PTRAIN_CUBLASLT(const char*, cublasLtGetStatusString, (cublasStatus_t status), status)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulDescCreate,
                (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale), desc, compute, scale)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), desc)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulDescSetAttribute,
                (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes), desc,
                attr, buf, bytes)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulDescGetAttribute,
                (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf, size_t bytes,
                 size_t* written),
                desc, attr, buf, bytes, written)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutCreate,
                (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld), layout,
                type, rows, cols, ld)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), layout)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
                (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t bytes),
                layout, attr, buf, bytes)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutGetAttribute,
                (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, void* buf, size_t bytes,
                 size_t* written),
                layout, attr, buf, bytes, written)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), pref)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), pref)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                 size_t bytes),
                pref, attr, buf, bytes)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                 cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                 cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                 int* returned),
                handle, desc, a, b, c, d, pref, requested, results, returned)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute,
                (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                 size_t bytes, size_t* written),
                algo, attr, buf, bytes, written)
PTRAIN_CUBLASLT(cublasStatus_t, cublasLtMatmul,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                 cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta, const void* C,
                 cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream),
                handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace, workspace_bytes, stream)
}
