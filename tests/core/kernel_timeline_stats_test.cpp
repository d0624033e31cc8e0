// The kernel-timeline analysis (core/kernel_timeline_stats.h) on hand-made intervals whose answers are worked
// out by hand in the comments: overlaps, nesting, gaps, touching ends, identical names on two streams,
// zero-length and timestamp-less records; the step split by host stamps, the per-layer cut, and the names.
#include "core/kernel_timeline_stats.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cedar {
namespace {

KernelRecord rec(std::string name, uint64_t start, uint64_t end, uint32_t stream = 7) {
  KernelRecord r;
  r.name = std::move(name);
  r.start_ns = start;
  r.end_ns = end;
  r.stream_id = stream;
  return r;
}

const KernelNameStats& by(const TimelineStats& s, const std::string& name) {
  for (const auto& k : s.by_name)
    if (k.name == name) return k;
  static const KernelNameStats none{"(missing)", -1, -1, -1};
  return none;
}

TEST(KernelTimelineStats, SerialChainWithGaps) {
  // a [100, 130), gap 10, b [140, 190), gap 5, a [195, 205): wall 105, busy 30 + 50 + 10 = 90, idle 15.
  const std::vector<KernelRecord> r = {rec("a", 100, 130), rec("b", 140, 190), rec("a", 195, 205)};
  const TimelineStats s = analyze_timeline(r);
  EXPECT_EQ(s.kernels, 3);
  EXPECT_EQ(s.first_start_ns, 100u);
  EXPECT_EQ(s.last_end_ns, 205u);
  EXPECT_EQ(s.wall_ns, 105);
  EXPECT_EQ(s.busy_ns, 90);
  EXPECT_EQ(s.idle_ns, 15);
  EXPECT_EQ(s.overlap_ns, 0);
  ASSERT_EQ(s.by_name.size(), 2u);
  EXPECT_EQ(s.by_name[0].name, "b");  // 50 > 40
  EXPECT_EQ(by(s, "a").calls, 2);
  EXPECT_EQ(by(s, "a").total_ns, 40);
  EXPECT_EQ(by(s, "a").exposed_ns, 40);
  EXPECT_EQ(by(s, "b").exposed_ns, 50);
  ASSERT_EQ(s.streams.size(), 1u);
  EXPECT_EQ(s.streams[0].busy_ns, 90);
  EXPECT_EQ(s.streams[0].kernels, 3);
}

TEST(KernelTimelineStats, OverlapNestingAndTwoStreams) {
  // Stream 1: long [0, 100), then tail [120, 150).  Stream 2: x [10, 40) inside long, y [30, 60) (overlaps x
  // on the same stream), z [90, 130) across long's end and tail's start.
  // Running count per segment: [0,10) 1 long; [10,30) 2; [30,40) 3; [40,60) 2; [60,90) 1 long; [90,100) 2;
  // [100,120) 1 z; [120,130) 2; [130,150) 1 tail.
  // busy = 150 (no gap), overlap = 20 + 10 + 20 + 10 + 10 = 70, wall 150, idle 0.
  // exposed: long 10 + 30 = 40, z 20, tail 20, x 0, y 0.
  // stream 1 busy: [0,100) + [120,150) = 130; stream 2: [10,60) + [90,130) = 90.
  const std::vector<KernelRecord> r = {rec("long", 0 + 1000, 100 + 1000, 1), rec("x", 10 + 1000, 40 + 1000, 2),
                                       rec("y", 30 + 1000, 60 + 1000, 2), rec("z", 90 + 1000, 130 + 1000, 2),
                                       rec("tail", 120 + 1000, 150 + 1000, 1)};
  const TimelineStats s = analyze_timeline(r);
  EXPECT_EQ(s.wall_ns, 150);
  EXPECT_EQ(s.busy_ns, 150);
  EXPECT_EQ(s.idle_ns, 0);
  EXPECT_EQ(s.overlap_ns, 70);
  EXPECT_EQ(by(s, "long").exposed_ns, 40);
  EXPECT_EQ(by(s, "z").exposed_ns, 20);
  EXPECT_EQ(by(s, "tail").exposed_ns, 20);
  EXPECT_EQ(by(s, "x").exposed_ns, 0);
  EXPECT_EQ(by(s, "y").exposed_ns, 0);
  EXPECT_EQ(by(s, "long").total_ns, 100);
  ASSERT_EQ(s.streams.size(), 2u);
  EXPECT_EQ(s.streams[0].stream_id, 1u);
  EXPECT_EQ(s.streams[0].busy_ns, 130);
  EXPECT_EQ(s.streams[1].stream_id, 2u);
  EXPECT_EQ(s.streams[1].busy_ns, 90);
  EXPECT_EQ(s.streams[1].kernels, 3);
  // Sorted by total: long 100, z 40, x 30 = tail 30 = y 30 (then by name).
  ASSERT_EQ(s.by_name.size(), 5u);
  EXPECT_EQ(s.by_name[0].name, "long");
  EXPECT_EQ(s.by_name[1].name, "z");
  EXPECT_EQ(s.by_name[2].name, "tail");
  EXPECT_EQ(s.by_name[3].name, "x");
  EXPECT_EQ(s.by_name[4].name, "y");
}

TEST(KernelTimelineStats, IdenticalNamesOnTwoStreamsAreNotExposedWhileTheyOverlap) {
  // g on stream 1 [0, 50), g on stream 2 [20, 80), h on stream 1 [80, 90) touching g's end (no overlap).
  // [0,20) 1 g; [20,50) 2 g's; [50,80) 1 g; [80,90) 1 h.
  // g: calls 2, total 110, exposed 20 + 30 = 50; h exposed 10; overlap 30; busy 90.
  const std::vector<KernelRecord> r = {rec("g", 0 + 5, 50 + 5, 1), rec("g", 20 + 5, 80 + 5, 2),
                                       rec("h", 80 + 5, 90 + 5, 1)};
  const TimelineStats s = analyze_timeline(r);
  EXPECT_EQ(by(s, "g").calls, 2);
  EXPECT_EQ(by(s, "g").total_ns, 110);
  EXPECT_EQ(by(s, "g").exposed_ns, 50);
  EXPECT_EQ(by(s, "h").exposed_ns, 10);
  EXPECT_EQ(s.overlap_ns, 30);
  EXPECT_EQ(s.busy_ns, 90);
  EXPECT_EQ(s.wall_ns, 90);
  EXPECT_EQ(s.streams[0].busy_ns, 60);  // [0,50) + [80,90)
  EXPECT_EQ(s.streams[1].busy_ns, 60);
}

TEST(KernelTimelineStats, ZeroLengthAndTimestamplessRecords) {
  // p [10, 20), a zero-length q at 15 (a call, no time, does not break p's exposure), one record without
  // timestamps and one with end < start (both skipped, not in wall).
  const std::vector<KernelRecord> r = {rec("p", 10, 20), rec("q", 15, 15), rec("none", 0, 0), rec("bad", 50, 40)};
  const TimelineStats s = analyze_timeline(r);
  EXPECT_EQ(s.kernels, 2);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.wall_ns, 10);
  EXPECT_EQ(s.busy_ns, 10);
  EXPECT_EQ(by(s, "p").exposed_ns, 10);
  EXPECT_EQ(by(s, "q").calls, 1);
  EXPECT_EQ(by(s, "q").total_ns, 0);
  EXPECT_EQ(by(s, "none").calls, -1);  // not counted
  const TimelineStats empty = analyze_timeline({});
  EXPECT_EQ(empty.kernels, 0);
  EXPECT_EQ(empty.wall_ns, 0);
  EXPECT_EQ(empty.busy_ns, 0);
}

TEST(KernelTimelineStats, AverageOverStepsCountsMissingNamesAsZero) {
  // Step 1: a [0,10), b [10,40) on stream 1.  Step 2: a [100,120) on stream 1, c [100,110) on stream 2.
  // Step 1: wall 40 busy 40 overlap 0; step 2: wall 20 busy 20 overlap 10.
  // Means: wall 30, busy 30, overlap 5; a: calls 1, total 15, exposed (10 + 10) / 2 = 10;
  // b: calls 0.5, total 15, mean 30; c: calls 0.5, total 5, exposed 0; stream 2 busy 5.
  const std::vector<KernelRecord> s1 = {rec("a", 0 + 1, 10 + 1, 1), rec("b", 10 + 1, 40 + 1, 1)};
  const std::vector<KernelRecord> s2 = {rec("a", 100, 120, 1), rec("c", 100, 110, 2)};
  const std::vector<TimelineStats> steps = {analyze_timeline(s1), analyze_timeline(s2)};
  const MeanTimelineStats m = average_timelines(steps);
  EXPECT_EQ(m.steps, 2);
  EXPECT_DOUBLE_EQ(m.wall_ns, 30);
  EXPECT_DOUBLE_EQ(m.busy_ns, 30);
  EXPECT_DOUBLE_EQ(m.overlap_ns, 5);
  EXPECT_DOUBLE_EQ(m.kernels, 2);
  ASSERT_EQ(m.by_name.size(), 3u);
  EXPECT_EQ(m.by_name[0].name, "a");  // 15 = 15: by name
  EXPECT_DOUBLE_EQ(m.by_name[0].calls, 1);
  EXPECT_DOUBLE_EQ(m.by_name[0].exposed_ns, 10);
  EXPECT_EQ(m.by_name[1].name, "b");
  EXPECT_DOUBLE_EQ(m.by_name[1].calls, 0.5);
  EXPECT_DOUBLE_EQ(m.by_name[1].mean_ns(), 30);
  EXPECT_EQ(m.by_name[2].name, "c");
  EXPECT_DOUBLE_EQ(m.by_name[2].exposed_ns, 0);
  ASSERT_EQ(m.streams.size(), 2u);
  EXPECT_DOUBLE_EQ(m.streams[0].busy_ns, 30);  // (40 + 20) / 2
  EXPECT_DOUBLE_EQ(m.streams[1].busy_ns, 5);
  EXPECT_EQ(average_timelines({}).steps, 0);
}

TEST(KernelTimelineStats, SplitStepsByStamps) {
  // Windows [100, 200) and [200, 300): 50 before, 300 at the end and 400 after are dropped; 200 opens step 2.
  const std::vector<KernelRecord> r = {rec("late", 250, 260), rec("early", 50, 60), rec("first", 100, 150),
                                       rec("edge", 200, 210), rec("end", 300, 310), rec("x", 199, 400)};
  const std::vector<uint64_t> stamps = {100, 200, 300};
  auto steps = split_steps(r, stamps);
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  ASSERT_EQ(steps->size(), 2u);
  ASSERT_EQ((*steps)[0].size(), 2u);
  EXPECT_EQ((*steps)[0][0].name, "first");
  EXPECT_EQ((*steps)[0][1].name, "x");
  ASSERT_EQ((*steps)[1].size(), 2u);
  EXPECT_EQ((*steps)[1][0].name, "edge");  // sorted by start
  EXPECT_EQ((*steps)[1][1].name, "late");
  const std::vector<uint64_t> backwards = {100, 90};
  auto bad = split_steps(r, backwards);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("stamp 1"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(split_steps(r, std::span<const uint64_t>(stamps).first(1)).ok());
}

TEST(KernelTimelineStats, CutLayerAtThePerLayerAnchor) {
  // 3 layers. "site" and "ffn" run 3 times each, "embed" once and "head" once; "site" starts first of the
  // two per-layer names, so it is the anchor: layer 1 = records starting in [site#2, site#3).
  // "aux" of layer 0 starts before site#2 but ends after it: it belongs to layer 0.
  const std::vector<KernelRecord> r = {
      rec("embed", 0, 5), rec("site", 10, 20),     rec("ffn", 25, 40),  rec("aux", 30, 60),   rec("site", 50, 58),
      rec("ffn", 62, 80), rec("extra", 70, 75, 2), rec("site", 90, 99), rec("ffn", 100, 120), rec("head", 125, 130),
  };
  auto cut = cut_layer(r, 3, 1);
  ASSERT_TRUE(cut.ok()) << cut.error().message;
  EXPECT_EQ(cut->anchor, "site");
  ASSERT_EQ(cut->records.size(), 3u);
  EXPECT_EQ(cut->records[0].name, "site");
  EXPECT_EQ(cut->records[0].start_ns, 50u);
  EXPECT_EQ(cut->records[1].name, "ffn");
  EXPECT_EQ(cut->records[2].name, "extra");
  auto last = cut_layer(r, 3, 2);  // up to the step's end
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->records.size(), 3u);
  EXPECT_EQ(last->records[2].name, "head");
  auto none = cut_layer(r, 4, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("exactly 4 times"), std::string::npos) << none.error().message;
  EXPECT_FALSE(cut_layer(r, 3, 3).ok());
}

TEST(KernelTimelineStats, CutLayerAtTheHeadsThatOpenTheLayers) {
  // 3 layers opened by "norm" (layers 0 and 2) or "norm+kv" (layer 1); "attn" runs 3 times and would be
  // the single-name anchor. With the heads given, layer 1 = [norm+kv, norm#2).
  const std::vector<KernelRecord> r = {
      rec("norm", 0, 5),     rec("attn", 6, 9),   rec("ffn", 10, 20), rec("norm+kv", 21, 25), rec("attn", 26, 30),
      rec("ffn", 31, 40),    rec("norm", 41, 45), rec("attn", 46, 50), rec("ffn", 51, 60),
  };
  const std::string heads[] = {"norm", "norm+kv", "absent"};
  auto cut = cut_layer(r, 3, 1, heads);
  ASSERT_TRUE(cut.ok()) << cut.error().message;
  EXPECT_EQ(cut->anchor, "norm | norm+kv");
  ASSERT_EQ(cut->records.size(), 3u);
  EXPECT_EQ(cut->records[0].name, "norm+kv");
  EXPECT_EQ(cut->records[2].name, "ffn");
  EXPECT_EQ(cut->records[2].start_ns, 31u);
  // Heads whose calls are not one per layer: the single-name rule ("norm" runs twice, "attn" 3 times).
  const std::string one_head[] = {"norm"};
  auto fallback = cut_layer(r, 3, 1, one_head);
  ASSERT_TRUE(fallback.ok()) << fallback.error().message;
  EXPECT_EQ(fallback->anchor, "attn");
  EXPECT_EQ(fallback->records.front().start_ns, 26u);
}

TEST(KernelTimelineStats, KernelNames) {
  // nvcc's symbol of `template <int W, bool P> __global__ void cedar::cuda::(anon)::gemv_kernel(GemvArgs, int)`
  // demangles to "void cedar::cuda::(anonymous namespace)::gemv_kernel<4, true>(cedar::cuda::GemvArgs, int)".
  EXPECT_EQ(demangle_kernel_name("_ZN5cedar4cuda12_GLOBAL__N_111gemv_kernelILi4ELb1EEEvNS0_8GemvArgsEi"),
            "gemv_kernel<4, true>");
  EXPECT_EQ(demangle_kernel_name("_ZN5cedar4cuda8rms_normEPKfi"), "rms_norm");
  EXPECT_EQ(demangle_kernel_name("plain_c_kernel"), "plain_c_kernel");
  EXPECT_EQ(demangle_kernel_name(nullptr), "(unnamed)");
  EXPECT_EQ(tidy_kernel_name("void cedar::cuda::detail::k<(short)3>(float const*)"), "detail::k<(short)3>");
  EXPECT_EQ(tidy_kernel_name("void cutlass::Kernel<cedar::cuda::Op>(cutlass::Params)"), "cutlass::Kernel<Op>");
  EXPECT_EQ(tidy_kernel_name("no_params"), "no_params");
}

}  // namespace
}  // namespace cedar
