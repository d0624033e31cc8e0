// Device copy bandwidth: the reference every kernel's achieved GB/s is compared with.
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"

namespace cedar::cuda {
namespace {

__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

__global__ void empty_kernel() {}

}  // namespace

const void* copy_kernel_ptr() { return reinterpret_cast<const void*>(&copy_kernel); }

Result<CopyBandwidth> measure_copy_bandwidth(size_t bytes, int iterations) {
  if (bytes < 16 || iterations < 1)
    return make_error("measure_copy_bandwidth: bytes=" + std::to_string(bytes) +
                      ", iterations=" + std::to_string(iterations));
  bytes -= bytes % 16;
  CEDAR_ASSIGN_OR_RETURN(auto src, DeviceBuffer<uint8_t>::allocate(bytes));
  CEDAR_ASSIGN_OR_RETURN(auto dst, DeviceBuffer<uint8_t>::allocate(bytes));
  CEDAR_RETURN_IF_ERROR(src.zero());
  CEDAR_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  EventTimer timer;
  CEDAR_RETURN_IF_ERROR(timer.init());
  int device = 0, sms = 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t n4 = static_cast<int64_t>(bytes / 16);
  const unsigned grid = static_cast<unsigned>(sms * 8);

  CopyBandwidth out;
  out.bytes = bytes;
  const double moved = 2.0 * static_cast<double>(bytes) * iterations;
  // Warm-up of both paths, then timed loops.
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  copy_kernel<<<grid, 256, 0, stream.get()>>>(reinterpret_cast<const float4*>(src.get()),
                                              reinterpret_cast<float4*>(dst.get()), n4);
  CEDAR_RETURN_IF_ERROR(launch_status("copy_kernel"));
  CEDAR_RETURN_IF_ERROR(stream.synchronize());

  CEDAR_RETURN_IF_ERROR(timer.start(stream.get()));
  for (int i = 0; i < iterations; ++i)
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  CEDAR_ASSIGN_OR_RETURN(const float memcpy_ms, timer.stop_ms(stream.get()));
  out.memcpy_gbps = moved / (memcpy_ms * 1e-3) / 1e9;

  CEDAR_RETURN_IF_ERROR(timer.start(stream.get()));
  for (int i = 0; i < iterations; ++i)
    copy_kernel<<<grid, 256, 0, stream.get()>>>(reinterpret_cast<const float4*>(src.get()),
                                                reinterpret_cast<float4*>(dst.get()), n4);
  CEDAR_RETURN_IF_ERROR(launch_status("copy_kernel"));
  CEDAR_ASSIGN_OR_RETURN(const float kernel_ms, timer.stop_ms(stream.get()));
  out.kernel_gbps = moved / (kernel_ms * 1e-3) / 1e9;
  return out;
}

Result<double> measure_launch_floor_us(int nodes, int replays) {
  if (nodes < 1 || replays < 1)
    return make_error("measure_launch_floor_us: nodes=" + std::to_string(nodes) + ", replays=" + std::to_string(replays));
  CEDAR_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < nodes; ++i) empty_kernel<<<1, 32, 0, stream.get()>>>();
  CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream.get(), &graph));
  float ms = 0.0f;
  const Status s = [&]() -> Status {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream.get()));  // warm-up
    CEDAR_RETURN_IF_ERROR(stream.synchronize());
    EventTimer timer;
    CEDAR_RETURN_IF_ERROR(timer.init());
    CEDAR_RETURN_IF_ERROR(timer.start(stream.get()));
    for (int r = 0; r < replays; ++r) CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream.get()));
    CEDAR_ASSIGN_OR_RETURN(ms, timer.stop_ms(stream.get()));
    return Status::Ok();
  }();
  if (exec) cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!s.ok()) return s.error();
  return static_cast<double>(ms) * 1e3 / (static_cast<double>(nodes) * replays);
}

}  // namespace cedar::cuda
