// The CUPTI kernel timeline (backend/cuda/kernel_timeline.h): a chain of known kernels on two streams, launched
// directly and then as a captured graph with a fork / join, is recorded — every kernel appears with its
// demangled short name, inside the host-stamped window it was launched in, on the two streams it was launched
// on; the graph's nodes are recorded with their graph ids. Skips (printing why) without a GPU or CUPTI.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernel_timeline.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"
#include "cuda_test_util.h"

namespace cedar::cuda {
namespace {

TEST(KernelTimeline, LoadsCuptiOrNamesThePathsItTried) {
  auto v = cupti_version();
  if (v.ok()) {
    std::printf("CUPTI API version %u\n", *v);
    EXPECT_GT(*v, 0u);
  } else {
    std::printf("CUPTI not loadable here: %s\n", v.error().message.c_str());
    EXPECT_NE(v.error().message.find("CUPTI"), std::string::npos) << v.error().message;
  }
}

bool is_rms_norm(const KernelRecord& r) { return r.name.rfind("rms_norm_kernel", 0) == 0; }
bool is_quantize(const KernelRecord& r) { return r.name.rfind("quantize_act_fp8", 0) == 0; }

TEST(KernelTimeline, RecordsKernelsOfTwoStreamsAndOfAGraphReplay) {
  CEDAR_REQUIRE_GPU();
  constexpr int64_t kRows = 64, kDim = 5120;
  auto x = DeviceBuffer<float>::from_host(std::vector<float>(kRows * kDim, 0.5f));
  auto y = DeviceBuffer<float>::allocate(kRows * kDim);
  auto codes = DeviceBuffer<uint16_t>::allocate(kRows * kDim);
  auto scales = DeviceBuffer<float>::allocate(kRows * kDim / 32);
  auto a = Stream::create();
  auto b = Stream::create();
  ASSERT_TRUE(x.ok() && y.ok() && codes.ok() && scales.ok() && a.ok() && b.ok());
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  // Warm-up outside the recording: module loading is not what the test is about.
  ASSERT_TRUE(rms_norm(x->get(), kRows, kDim, nullptr, 1e-6f, y->get(), a->get()).ok());
  ASSERT_TRUE(quantize_act_fp8(x->get(), kRows, kDim, codes->get(), scales->get(), b->get()).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto timeline = KernelTimeline::start();
  if (!timeline.ok()) {
    std::printf("[  SKIP    ] CUPTI cannot record: %s\n", timeline.error().message.c_str());
    GTEST_SKIP() << timeline.error().message;
  }
  auto second = KernelTimeline::start();  // one recording at a time
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("another kernel timeline"), std::string::npos) << second.error().message;

  auto t0 = timeline->synchronize_and_stamp();
  ASSERT_TRUE(t0.ok()) << t0.error().message;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rms_norm(x->get(), kRows, kDim, nullptr, 1e-6f, y->get(), a->get()).ok());
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(quantize_act_fp8(x->get(), kRows, kDim, codes->get(), scales->get(), b->get()).ok());
  auto t1 = timeline->synchronize_and_stamp();
  ASSERT_TRUE(t1.ok()) << t1.error().message;

  // The graph: rms_norm on a, quantize on b between a fork and a join (two branches, as the decode step).
  auto graph = CudaGraph::capture(a->get(), [&](cudaStream_t s) -> Status {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork, s));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b->get(), fork, 0));
    CEDAR_RETURN_IF_ERROR(rms_norm(x->get(), kRows, kDim, nullptr, 1e-6f, y->get(), s));
    CEDAR_RETURN_IF_ERROR(quantize_act_fp8(x->get(), kRows, kDim, codes->get(), scales->get(), b->get()));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(join, b->get()));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, join, 0));
    return Status::Ok();
  });
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(graph->launch(a->get()).ok());
  auto t2 = timeline->synchronize_and_stamp();
  ASSERT_TRUE(t2.ok()) << t2.error().message;
  auto records = timeline->stop_and_collect();
  ASSERT_TRUE(records.ok()) << records.error().message;
  EXPECT_FALSE(timeline->stop_and_collect().ok());  // stopped once
  cudaEventDestroy(fork);
  cudaEventDestroy(join);

  const std::vector<uint64_t> stamps = {*t0, *t1, *t2};
  auto steps = split_steps(*records, stamps);
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  std::printf("%zu records: %zu direct, %zu from the graph\n", records->size(), (*steps)[0].size(), (*steps)[1].size());
  for (const KernelRecord& r : *records)
    std::printf("  %-40s %8.2f us  stream %u  channel %u  graph %u node %llu\n", r.name.c_str(),
                static_cast<double>(r.end_ns - r.start_ns) / 1e3, r.stream_id, r.channel_id, r.graph_id,
                static_cast<unsigned long long>(r.graph_node_id));

  // Direct launches: 3 rms_norm on one stream, 2 quantize on another, inside [t0, t1].
  const std::vector<KernelRecord>& direct = (*steps)[0];
  ASSERT_EQ(direct.size(), 5u);
  std::set<uint32_t> norm_streams, quant_streams;
  for (const KernelRecord& r : direct) {
    EXPECT_TRUE(is_rms_norm(r) || is_quantize(r)) << r.name;
    EXPECT_EQ(r.name.find('('), std::string::npos) << r.name;  // demangled, parameters dropped
    EXPECT_EQ(r.name.find("cedar::"), std::string::npos) << r.name;
    EXPECT_EQ(r.name.find("_Z"), std::string::npos) << r.name;
    EXPECT_GE(r.start_ns, *t0);
    EXPECT_LT(r.start_ns, r.end_ns);
    EXPECT_LE(r.end_ns, *t1);
    EXPECT_EQ(r.graph_id, 0u);
    (is_rms_norm(r) ? norm_streams : quant_streams).insert(r.stream_id);
    if (is_rms_norm(r)) {
      EXPECT_EQ(r.grid[0], kRows);  // one block per row
    }
  }
  EXPECT_EQ(norm_streams.size(), 1u);
  EXPECT_EQ(quant_streams.size(), 1u);
  EXPECT_NE(norm_streams, quant_streams);  // two streams seen

  // Graph replays: 2 × (rms_norm, quantize), graph nodes, inside [t1, t2].
  const std::vector<KernelRecord>& replay = (*steps)[1];
  ASSERT_EQ(replay.size(), 4u);
  int norms = 0;
  for (const KernelRecord& r : replay) {
    EXPECT_TRUE(is_rms_norm(r) || is_quantize(r)) << r.name;
    norms += is_rms_norm(r) ? 1 : 0;
    EXPECT_GE(r.start_ns, *t1);
    EXPECT_LT(r.start_ns, r.end_ns);
    EXPECT_LE(r.end_ns, *t2);
    EXPECT_NE(r.graph_id, 0u);
    EXPECT_NE(r.graph_node_id, 0u);
  }
  EXPECT_EQ(norms, 2);
  const TimelineStats s = analyze_timeline(replay);
  EXPECT_EQ(s.kernels, 4);
  EXPECT_LE(s.busy_ns, s.wall_ns);
}

}  // namespace
}  // namespace cedar::cuda
