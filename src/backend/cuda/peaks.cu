// cuBLASLt peak GEMMs (peaks.h). cuBLASLt is loaded at run time (dlopen) rather than linked: the
// toolkit here ships it only as a 540 MB shared library that cannot travel with the binaries, and a
// GPU machine without it must still run every other test and benchmark — there the peak reports why
// it is missing instead of the binary failing to start.
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/peaks.h"
#include "backend/cuda/stream.h"

namespace cedar::cuda {
namespace {

// The cuBLASLt entry points this file uses, resolved from the shared library.
struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// $CEDAR_CUBLASLT, then the loader's search path, then the toolkit's usual places.
Result<const LtApi*> lt_api() {
  static const Result<LtApi> api = []() -> Result<LtApi> {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("CEDAR_CUBLASLT")) candidates.push_back(env);
    candidates.push_back("libcublasLt.so.13");
    candidates.push_back("/usr/local/cuda/lib64/libcublasLt.so.13");
    candidates.push_back("/usr/local/cuda/lib/libcublasLt.so.13");
    std::string tried;
    void* lib = nullptr;
    for (const std::string& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* why = dlerror();
      tried += "\n  " + c + ": " + (why ? why : "not found");
    }
    if (!lib) return make_error("cuBLASLt is not available (set CEDAR_CUBLASLT to libcublasLt.so.13); tried:" + tried);
    LtApi a;
    std::string missing;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    sym(a.create, "cublasLtCreate");
    sym(a.destroy, "cublasLtDestroy");
    sym(a.status_string, "cublasLtGetStatusString");
    sym(a.desc_create, "cublasLtMatmulDescCreate");
    sym(a.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(a.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(a.layout_create, "cublasLtMatrixLayoutCreate");
    sym(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(a.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a.matmul, "cublasLtMatmul");
    if (!missing.empty()) return make_error("cuBLASLt library lacks " + missing);
    return a;  // the library stays loaded for the process
  }();
  if (!api.ok()) return api.error();
  return &*api;
}

Status lt_status(const LtApi& lt, cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error(std::string(call) + ": " + lt.status_string(s));
}
#define CEDAR_LT_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                           \
    const cublasStatus_t cedar_lt_s_ = (call);                                                   \
    if (cedar_lt_s_ != CUBLAS_STATUS_SUCCESS) return lt_status(api, cedar_lt_s_, #call).error(); \
  } while (0)

__device__ __forceinline__ uint32_t hash32(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// bf16 values ±[2^-4, 2^0) with random mantissas: products summed over k = 8192 stay far from overflow.
__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t r = hash32(static_cast<uint64_t>(i) ^ seed);
    p[i] = static_cast<uint16_t>(((r >> 31) << 15) | ((123u + (r >> 8) % 4u) << 7) | (r & 0x7Fu));
  }
}

// e4m3 codes with exponent field 3..6 (±[2^-4, 2^0) as well), never NaN.
__global__ void fill_e4m3_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t r = hash32(static_cast<uint64_t>(i) ^ seed);
    p[i] = static_cast<uint8_t>(((r >> 31) << 7) | ((3u + (r >> 8) % 4u) << 3) | (r & 0x7u));
  }
}

// RAII holders of the cuBLASLt descriptors.
struct LtObjects {
  const LtApi& api;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit LtObjects(const LtApi& x) : api(x) {}
  ~LtObjects() {
    if (pref) api.pref_destroy(pref);
    if (d) api.layout_destroy(d);
    if (b) api.layout_destroy(b);
    if (a) api.layout_destroy(a);
    if (op) api.desc_destroy(op);
    if (handle) api.destroy(handle);
  }
};

struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  cudaDataType_t in_type = CUDA_R_16BF;
};

Status run_gemm(const LtApi& api, const GemmOperands& g, int64_t size, int iterations, void* workspace,
                size_t workspace_bytes, cudaStream_t stream, GemmPeak& out) {
  LtObjects lt(api);
  CEDAR_LT_RETURN_IF_ERROR(api.create(&lt.handle));
  CEDAR_LT_RETURN_IF_ERROR(api.desc_create(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CEDAR_LT_RETURN_IF_ERROR(api.desc_set(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  CEDAR_LT_RETURN_IF_ERROR(api.desc_set(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  const auto n = static_cast<uint64_t>(size);
  CEDAR_LT_RETURN_IF_ERROR(api.layout_create(&lt.a, g.in_type, n, n, static_cast<int64_t>(n)));
  CEDAR_LT_RETURN_IF_ERROR(api.layout_create(&lt.b, g.in_type, n, n, static_cast<int64_t>(n)));
  CEDAR_LT_RETURN_IF_ERROR(api.layout_create(&lt.d, CUDA_R_16BF, n, n, static_cast<int64_t>(n)));
  CEDAR_LT_RETURN_IF_ERROR(api.pref_create(&lt.pref));
  CEDAR_LT_RETURN_IF_ERROR(
      api.pref_set(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  CEDAR_LT_RETURN_IF_ERROR(api.heuristic(lt.handle, lt.op, lt.a, lt.b, lt.d, lt.d, lt.pref, 1, &heuristic, &found));
  if (found == 0) return make_error("cublasLtMatmulAlgoGetHeuristic: no algorithm for this GEMM on this device");
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&]() {
    return lt_status(api,
                     api.matmul(lt.handle, lt.op, &alpha, g.a, lt.a, g.b, lt.b, &beta, g.d, lt.d, g.d, lt.d,
                                &heuristic.algo, workspace, workspace_bytes, stream),
                     "cublasLtMatmul");
  };
  for (int i = 0; i < 3; ++i) CEDAR_RETURN_IF_ERROR(launch());  // warm-up (clocks, caches)
  EventTimer timer;
  CEDAR_RETURN_IF_ERROR(timer.init());
  CEDAR_RETURN_IF_ERROR(timer.start(stream));
  for (int i = 0; i < iterations; ++i) CEDAR_RETURN_IF_ERROR(launch());
  CEDAR_ASSIGN_OR_RETURN(const float ms, timer.stop_ms(stream));
  out.m = out.n = out.k = size;
  out.iterations = iterations;
  out.ms_per_gemm = static_cast<double>(ms) / iterations;
  out.tflops = 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) /
               (out.ms_per_gemm * 1e-3) / 1e12;
  return Status::Ok();
}

}  // namespace

Result<GemmPeaks> measure_gemm_peaks(int64_t size, int iterations) {
  if (size < 16 || size % 16 != 0 || size > 32768 || iterations < 1)
    return make_error("measure_gemm_peaks: size must be a multiple of 16 in [16, 32768] and iterations >= 1, got " +
                      std::to_string(size) + " and " + std::to_string(iterations));
  const auto elems = static_cast<size_t>(size) * static_cast<size_t>(size);
  CEDAR_ASSIGN_OR_RETURN(const LtApi* api, lt_api());
  CEDAR_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  constexpr size_t kWorkspace = size_t{64} << 20;
  CEDAR_ASSIGN_OR_RETURN(auto workspace, DeviceBuffer<uint8_t>::allocate(kWorkspace));
  CEDAR_ASSIGN_OR_RETURN(auto d, DeviceBuffer<uint16_t>::allocate(elems));
  GemmPeaks peaks;
  peaks.bf16.dtype = "bf16";
  peaks.fp8.dtype = "fp8_e4m3";
  {
    CEDAR_ASSIGN_OR_RETURN(auto a, DeviceBuffer<uint16_t>::allocate(elems));
    CEDAR_ASSIGN_OR_RETURN(auto b, DeviceBuffer<uint16_t>::allocate(elems));
    fill_bf16_kernel<<<1024, 256, 0, stream.get()>>>(a.get(), static_cast<int64_t>(elems), 1);
    fill_bf16_kernel<<<1024, 256, 0, stream.get()>>>(b.get(), static_cast<int64_t>(elems), 2);
    CEDAR_RETURN_IF_ERROR(launch_status("fill_bf16_kernel"));
    CEDAR_RETURN_IF_ERROR(run_gemm(*api, {a.get(), b.get(), d.get(), CUDA_R_16BF}, size, iterations, workspace.get(),
                                   kWorkspace, stream.get(), peaks.bf16));
  }
  {
    CEDAR_ASSIGN_OR_RETURN(auto a, DeviceBuffer<uint8_t>::allocate(elems));
    CEDAR_ASSIGN_OR_RETURN(auto b, DeviceBuffer<uint8_t>::allocate(elems));
    fill_e4m3_kernel<<<1024, 256, 0, stream.get()>>>(a.get(), static_cast<int64_t>(elems), 3);
    fill_e4m3_kernel<<<1024, 256, 0, stream.get()>>>(b.get(), static_cast<int64_t>(elems), 4);
    CEDAR_RETURN_IF_ERROR(launch_status("fill_e4m3_kernel"));
    const Status st = run_gemm(*api, {a.get(), b.get(), d.get(), CUDA_R_8F_E4M3}, size, iterations, workspace.get(),
                               kWorkspace, stream.get(), peaks.fp8);
    if (!st.ok()) peaks.fp8.error = st.error().message;
  }
  CEDAR_RETURN_IF_ERROR(stream.synchronize());
  return peaks;
}

}  // namespace cedar::cuda
