// BF16 / F32-weight GEMMs of the prefill (gemm_kernels.h, dense_gemm) through cuBLASLt.
//
// cuBLASLt is opened with dlopen at BlasContext::create rather than linked: the libraries are ~600 MB
// (no static archive in the toolkit here), and a binary linked against them would not even start on a
// GPU machine that lacks them — every CUDA test would fail instead of the few that need cuBLAS.
//
// Numerics vs cpu::linear (BF16 weights): x is converted to bf16 exactly (it holds bf16 values), every
// product of two bf16 values is exact in fp32, and cuBLAS accumulates in fp32 (CUBLAS_COMPUTE_32F) — so
// only the order of the fp32 additions differs (tensor-core blocks, possibly split-K), and then the same
// bf16 rounding of the output. F32 weights: fp32 FMAs (no TF32), again only the order differs.
#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_kernels.h"

namespace cedar::cuda {
namespace {

__global__ void f32_to_bf16_kernel(const float* x, int64_t count, uint16_t* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

// y[b·y_stride + t·ldy + c] ← bf16(·) for b < batch, t < n, c < out.
__global__ void round_bf16_kernel(float* y, int64_t batch, int64_t n, int64_t out, int64_t ldy, int64_t y_stride) {
  const int64_t total = batch * n * out;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % out, t = (i / out) % n, b = i / (out * n);
    float* p = y + b * y_stride + t * ldy + c;
    *p = detail::round_bf16(*p);
  }
}

unsigned grid_for(int64_t count) {
  return static_cast<unsigned>(std::clamp<int64_t>((count + 255) / 256, 1, 132 * 16));
}

// Largest power of two (<= 256) dividing the address and every batch offset.
uint32_t alignment_of(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) v |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(v & (~v + 1));
}

}  // namespace

// The cuBLASLt entry points this file uses, resolved from the shared library.
struct BlasApi {
  void* lib = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

struct BlasPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct BlasContext::Impl {
  BlasApi api;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer<uint8_t> workspace;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t,
                         uint32_t, uint32_t>;
  std::map<Key, BlasPlan> plans;

  ~Impl() {
    for (auto& [key, plan] : plans) {
      if (plan.a) api.layout_destroy(plan.a);
      if (plan.b) api.layout_destroy(plan.b);
      if (plan.c) api.layout_destroy(plan.c);
      if (plan.desc) api.desc_destroy(plan.desc);
    }
    if (handle) api.destroy(handle);
    if (api.lib) dlclose(api.lib);
  }
};

namespace {

Status blas_status(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error(std::string("cuBLASLt ") + call + " failed: status " + std::to_string(static_cast<int>(s)));
}
#define CEDAR_BLAS_RETURN_IF_ERROR(call) CEDAR_RETURN_IF_ERROR(blas_status((call), #call))

// The library: $CEDAR_CUBLASLT if set (a path, e.g. the copy inside a PyTorch wheel), else the loader's
// search path, then the toolkit's default location.
Status load_api(BlasApi& api) {
  const char* env = std::getenv("CEDAR_CUBLASLT");
  const char* names[] = {env != nullptr && *env != '\0' ? env : "libcublasLt.so.13",
                         "/usr/local/cuda/lib64/libcublasLt.so.13", "libcublasLt.so"};
  std::string tried;
  for (const char* name : names) {
    api.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (api.lib) break;
    const char* err = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (err ? err : name);
  }
  if (!api.lib) return make_error("cuBLASLt unavailable: " + tried);
  bool ok = true;
  std::string missing;
  auto get = [&](auto& fn, const char* sym) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.lib, sym));
    if (!fn) {
      ok = false;
      missing += std::string(missing.empty() ? "" : ", ") + sym;
    }
  };
  get(api.create, "cublasLtCreate");
  get(api.destroy, "cublasLtDestroy");
  get(api.get_version, "cublasLtGetVersion");
  get(api.desc_create, "cublasLtMatmulDescCreate");
  get(api.desc_destroy, "cublasLtMatmulDescDestroy");
  get(api.desc_set, "cublasLtMatmulDescSetAttribute");
  get(api.layout_create, "cublasLtMatrixLayoutCreate");
  get(api.layout_destroy, "cublasLtMatrixLayoutDestroy");
  get(api.layout_set, "cublasLtMatrixLayoutSetAttribute");
  get(api.pref_create, "cublasLtMatmulPreferenceCreate");
  get(api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  get(api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  get(api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(api.matmul, "cublasLtMatmul");
  if (!ok) {
    dlclose(api.lib);
    api.lib = nullptr;
    return make_error("cuBLASLt unavailable: missing symbols " + missing);
  }
  return Status::Ok();
}

// Owns a plan's descriptors until it is handed over (released) to the context's cache.
struct PlanGuard {
  const BlasApi& api;
  BlasPlan plan;
  cublasLtMatmulPreference_t pref = nullptr;
  bool released = false;
  ~PlanGuard() {
    if (pref) api.pref_destroy(pref);
    if (released) return;
    if (plan.a) api.layout_destroy(plan.a);
    if (plan.b) api.layout_destroy(plan.b);
    if (plan.c) api.layout_destroy(plan.c);
    if (plan.desc) api.desc_destroy(plan.desc);
  }
};

// Column-major view: Yᵀ[out, n] = (W as col-major [in, out])ᵀ · (x as col-major [in, n]).
Result<BlasPlan> make_plan(BlasContext::Impl& ctx, const DenseGemmArgs& a, int64_t ldx, int64_t ldy, uint32_t align_a,
                           uint32_t align_b, uint32_t align_c) {
  const BlasApi& api = ctx.api;
  const bool bf16 = a.type == DenseWeightType::BF16;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  PlanGuard g{api, BlasPlan{}};
  BlasPlan& plan = g.plan;
  CEDAR_BLAS_RETURN_IF_ERROR(api.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CEDAR_BLAS_RETURN_IF_ERROR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  CEDAR_BLAS_RETURN_IF_ERROR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  CEDAR_BLAS_RETURN_IF_ERROR(api.layout_create(&plan.a, in_type, a.in, a.out, a.in));
  CEDAR_BLAS_RETURN_IF_ERROR(api.layout_create(&plan.b, in_type, a.in, a.n, ldx));
  CEDAR_BLAS_RETURN_IF_ERROR(api.layout_create(&plan.c, CUDA_R_32F, a.out, a.n, ldy));
  if (a.batch > 1) {
    const int32_t count = static_cast<int32_t>(a.batch);
    const int64_t strides[3] = {a.w_stride, a.x_stride, a.y_stride};
    const cublasLtMatrixLayout_t layouts[3] = {plan.a, plan.b, plan.c};
    for (int i = 0; i < 3; ++i) {
      CEDAR_BLAS_RETURN_IF_ERROR(api.layout_set(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      CEDAR_BLAS_RETURN_IF_ERROR(
          api.layout_set(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(strides[i])));
    }
  }
  CEDAR_BLAS_RETURN_IF_ERROR(api.pref_create(&g.pref));
  const uint64_t ws_bytes = ctx.workspace.bytes();
  CEDAR_BLAS_RETURN_IF_ERROR(
      api.pref_set(g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
  for (const auto& [attr, v] : aligns) CEDAR_BLAS_RETURN_IF_ERROR(api.pref_set(g.pref, attr, &v, sizeof(v)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CEDAR_BLAS_RETURN_IF_ERROR(
      api.heuristic(ctx.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, g.pref, 1, &result, &found));
  if (found == 0)
    return make_error("cuBLASLt has no algorithm for " + std::string(bf16 ? "bf16" : "f32") + " " +
                      std::to_string(a.out) + "x" + std::to_string(a.in) + " n=" + std::to_string(a.n) +
                      " batch=" + std::to_string(a.batch));
  plan.algo = result.algo;
  g.released = true;
  return plan;
}

}  // namespace

BlasContext::BlasContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlasContext::~BlasContext() = default;

Result<std::unique_ptr<BlasContext>> BlasContext::create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  CEDAR_RETURN_IF_ERROR(load_api(impl->api));
  CEDAR_BLAS_RETURN_IF_ERROR(impl->api.create(&impl->handle));
  if (workspace_bytes > 0) {
    auto ws = DeviceBuffer<uint8_t>::allocate(workspace_bytes);
    if (!ws.ok()) return ws.error();
    impl->workspace = std::move(*ws);
  }
  return std::unique_ptr<BlasContext>(new BlasContext(std::move(impl)));
}

std::string BlasContext::version() const { return "cuBLASLt " + std::to_string(impl_->api.get_version()); }

int64_t dense_gemm_workspace_elems(const DenseGemmArgs& a) {
  if (a.type != DenseWeightType::BF16 || a.n <= 0 || a.x_bf16 != nullptr) return 0;
  const int64_t ldx = a.ldx == 0 ? a.in : a.ldx;
  return (a.batch - 1) * a.x_stride + (a.n - 1) * ldx + a.in;
}

Status dense_gemm(BlasContext& ctx, const DenseGemmArgs& a, uint16_t* x_bf16_workspace, int64_t workspace_elems,
                  cudaStream_t stream) {
  const int64_t ldx = a.ldx == 0 ? a.in : a.ldx, ldy = a.ldy == 0 ? a.out : a.ldy;
  const std::string shape = std::to_string(a.out) + "x" + std::to_string(a.in) + " n=" + std::to_string(a.n) +
                            " batch=" + std::to_string(a.batch);
  if (a.out <= 0 || a.in <= 0 || a.n < 0 || a.batch < 1 || ldx < a.in || ldy < a.out || a.w == nullptr ||
      a.n > 0x7FFFFFFF || a.batch > 0x7FFFFFFF || (a.batch > 1 && (a.w_stride < 0 || a.x_stride < 0 || a.y_stride < 0)))
    return make_error("cuda::dense_gemm: bad shape " + shape + " (ldx=" + std::to_string(ldx) +
                      ", ldy=" + std::to_string(ldy) + ")");
  if (a.n == 0) return Status::Ok();
  const bool bf16 = a.type == DenseWeightType::BF16;
  if ((a.x == nullptr && !(bf16 && a.x_bf16 != nullptr)) || a.y == nullptr)
    return make_error("cuda::dense_gemm: null x or y (" + shape + ")");
  const void* b_ptr = a.x;
  if (bf16 && a.x_bf16 != nullptr) {
    b_ptr = a.x_bf16;
  } else if (bf16) {
    const int64_t need = dense_gemm_workspace_elems(a);
    if (x_bf16_workspace == nullptr || workspace_elems < need)
      return make_error("cuda::dense_gemm: bf16 workspace of " + std::to_string(workspace_elems) + " elements, need " +
                        std::to_string(need) + " (" + shape + ")");
    f32_to_bf16_kernel<<<grid_for(need), 256, 0, stream>>>(a.x, need, x_bf16_workspace);
    CEDAR_RETURN_IF_ERROR(launch_status("f32_to_bf16_kernel"));
    b_ptr = x_bf16_workspace;
  }
  const int64_t elem = bf16 ? 2 : 4;
  const uint32_t align_a = alignment_of(a.w, a.w_stride * elem, a.batch);
  const uint32_t align_b = alignment_of(b_ptr, a.x_stride * elem, a.batch);
  const uint32_t align_c = alignment_of(a.y, a.y_stride * 4, a.batch);
  BlasContext::Impl& impl = ctx.impl();
  const BlasContext::Impl::Key key{static_cast<int>(a.type),
                                   a.out,
                                   a.in,
                                   a.n,
                                   ldx,
                                   ldy,
                                   a.batch,
                                   a.batch > 1 ? a.w_stride : 0,
                                   a.batch > 1 ? a.x_stride : 0,
                                   a.batch > 1 ? a.y_stride : 0,
                                   align_a,
                                   align_b,
                                   align_c};
  auto it = impl.plans.find(key);
  if (it == impl.plans.end()) {
    auto plan = make_plan(impl, a, ldx, ldy, align_a, align_b, align_c);
    if (!plan.ok()) return plan.error().with_context("cuda::dense_gemm " + shape);
    it = impl.plans.emplace(key, *plan).first;
  }
  const BlasPlan& plan = it->second;
  const float alpha = 1.0f, beta = 0.0f;
  CEDAR_RETURN_IF_ERROR(
      blas_status(impl.api.matmul(impl.handle, plan.desc, &alpha, a.w, plan.a, b_ptr, plan.b, &beta, a.y, plan.c, a.y,
                                  plan.c, &plan.algo, impl.workspace.get(), impl.workspace.bytes(), stream),
                  ("cublasLtMatmul " + shape).c_str()));
  if (a.bf16_output) {
    const int64_t total = a.batch * a.n * a.out;
    round_bf16_kernel<<<grid_for(total), 256, 0, stream>>>(a.y, a.batch, a.n, a.out, ldy, a.y_stride);
    CEDAR_RETURN_IF_ERROR(launch_status("round_bf16_kernel"));
  }
  return Status::Ok();
}

}  // namespace cedar::cuda
