// CUDA infrastructure: errors become Status naming the call; DeviceBuffer round trips and reports
// failed allocations; the copy-bandwidth probe returns plausible numbers.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"
#include "cuda_test_util.h"

namespace cedar::cuda {
namespace {

cudaError_t fake_cuda_call(int) { return cudaErrorInvalidValue; }

Status failing_call() {
  CEDAR_CUDA_RETURN_IF_ERROR(fake_cuda_call(7));
  return Status::Ok();
}

TEST(CudaStatus, NamesTheCallAndTheError) {  // needs no GPU
  const Status s = failing_call();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("cudaErrorInvalidValue"), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.rfind("fake_cuda_call(7): ", 0), 0u) << s.error().message;
  EXPECT_TRUE(cuda_status(cudaSuccess, "x").ok());
}

TEST(DeviceBuffer, RoundTripAndBounds) {
  CEDAR_REQUIRE_GPU();
  std::vector<int> host(1000);
  std::iota(host.begin(), host.end(), -500);
  auto buf = DeviceBuffer<int>::from_host(host);
  ASSERT_TRUE(buf.ok()) << buf.error().message;
  EXPECT_EQ(buf->size(), host.size());
  auto back = buf->to_host();
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, host);
  std::vector<int> small(10);
  const Status oob = buf->download(small.data(), 10, 995);
  ASSERT_FALSE(oob.ok());
  EXPECT_NE(oob.error().message.find("outside a buffer of 1000"), std::string::npos) << oob.error().message;
  DeviceBuffer<int> moved = std::move(*buf);
  EXPECT_EQ(moved.size(), 1000u);
  EXPECT_EQ(buf->size(), 0u);
}

TEST(DeviceBuffer, FailedAllocationIsAnError) {
  CEDAR_REQUIRE_GPU();
  auto huge = DeviceBuffer<uint8_t>::allocate(size_t{1} << 60);  // 1 EiB
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("cudaMalloc"), std::string::npos) << huge.error().message;
  cudaGetLastError();  // the failed cudaMalloc is not sticky, but leave no state behind
}

TEST(Stream, TimerMeasuresEnqueuedWork) {
  CEDAR_REQUIRE_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  EventTimer timer;
  ASSERT_TRUE(timer.init().ok());
  ASSERT_TRUE(timer.start(stream->get()).ok());
  auto ms = timer.stop_ms(stream->get());
  ASSERT_TRUE(ms.ok()) << ms.error().message;
  EXPECT_GE(*ms, 0.0f);
}

TEST(CopyBandwidth, MeasuresAPlausibleRate) {
  CEDAR_REQUIRE_GPU();
  auto bw = measure_copy_bandwidth(size_t{64} << 20, 5);
  ASSERT_TRUE(bw.ok()) << bw.error().message;
  std::printf("copy bandwidth (64 MiB): memcpy %.0f GB/s, kernel %.0f GB/s\n", bw->memcpy_gbps, bw->kernel_gbps);
  EXPECT_GT(bw->memcpy_gbps, 10.0);  // any real GPU moves more than PCIe speed on the device
  EXPECT_GT(bw->kernel_gbps, 10.0);
  EXPECT_LT(bw->kernel_gbps, 100000.0);
}

TEST(KernelCatalog, EveryKernelLoads) {
  CEDAR_REQUIRE_GPU();
  EXPECT_GE(kernel_catalog().size(), 5u);
  const Status s = check_kernels_loadable();
  EXPECT_TRUE(s.ok()) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
