// The CUDA model's infrastructure (phase 1): device weights (plan and upload round trip, expert
// contiguity, the clean "does not fit" error), device KV (geometry equal to the host pool's accounting,
// block tables and record addressing, all-or-nothing growth, slot and block release), the CUDA-graph
// helper, the cuBLASLt peaks, and the CUDA model's load / memory plan / pending-kernel errors.
// References: the host views of BoundWeights, kv/kv_layout.h measure_kv_bytes (the host BlockPool in a
// dry run), model/roofline.h (bytes counted from the weight inventory by another rule).
// Tests without CEDAR_REQUIRE_GPU() need no device (planning only).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_kv.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/peaks.h"
#include "backend/cuda/stream.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"
#include "model/deepseek_v41.h"
#include "model/roofline.h"
#include "model/tiny_checkpoint.h"
#include "model/weights.h"

namespace cedar::cuda {
namespace {

namespace fs = std::filesystem;

// One tiny V4.1 checkpoint (make-tiny, seed 3) per process.
class CudaModelInfra : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("cedar-cuda-model-test-" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    TinyCheckpointOptions o;
    o.seed = 3;
    o.tokenizer_files = false;
    const Status st = make_tiny_checkpoint(o, *dir_, false);
    ASSERT_TRUE(st.ok()) << st.error().message;
    LoadOptions lo;
    lo.engram_map = testing::engram_map_path();
    auto m = DeepseekV41Model::load(*dir_, lo);
    ASSERT_TRUE(m.ok()) << m.error().message << " (Engram map " << lo.engram_map << ")";
    host_ = new DeepseekV41Model(std::move(*m));
  }
  static void TearDownTestSuite() {
    delete host_;
    host_ = nullptr;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static const DeepseekV41Model& host() { return *host_; }
  static fs::path* dir_;
  static DeepseekV41Model* host_;
};
fs::path* CudaModelInfra::dir_ = nullptr;
DeepseekV41Model* CudaModelInfra::host_ = nullptr;

template <typename T>
std::vector<T> download(const void* device, size_t count) {
  std::vector<T> v(count);
  EXPECT_EQ(cudaMemcpy(v.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// ---- device weights ------------------------------------------------------------------------

TEST_F(CudaModelInfra, WeightPlanAgreesWithTheRooflineBytes) {  // needs no GPU
  const ModelConfig& c = host().config();
  auto plan = DeviceWeights::plan(c, host().weights(), {});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto specs = expected_weights(c, host().plan());
  ASSERT_TRUE(specs.ok());
  DecodeTrafficOptions o;
  o.vectors_f32 = true;  // the device layout: fp32 norms and Engram q / k, BF16 wo_a and router
  const DecodeTraffic t = decode_traffic(c, host().plan(), *specs, o);
  // What every decode step reads, from the placed tensors vs from the inventory; the device keeps the
  // Engram gate's q ⊙ k (one fp32 [hc, d] array) instead of q and k (two).
  const auto engram_layers = static_cast<uint64_t>(c.engram_layer_ids.size());
  const uint64_t qk_bytes = static_cast<uint64_t>(c.hc_mult * c.hidden_size) * 4;
  EXPECT_EQ(plan->per_step_bytes(), t.layer_weight_bytes + t.head_bytes - engram_layers * qk_bytes) << plan->table();
  const MemoryPlanEntry* experts = plan->find("routed experts");
  ASSERT_NE(experts, nullptr);
  // The experts' bytes plus, per layer, the six device pointer tables (data and scales of w1, w3, w2).
  const auto layers = static_cast<uint64_t>(c.num_hidden_layers), e = static_cast<uint64_t>(c.n_routed_experts);
  EXPECT_EQ(experts->bytes, t.expert_bytes_each * e * layers + layers * 6 * e * sizeof(void*));
  const MemoryPlanEntry* tables = plan->find("engram tables");
  ASSERT_NE(tables, nullptr);
  uint64_t rows = 0;
  for (int64_t r : c.engram_num_embeddings) rows += static_cast<uint64_t>(r);
  EXPECT_EQ(tables->bytes, rows * static_cast<uint64_t>(c.engram_head_dim + c.engram_head_dim / 32));
  const MemoryPlanEntry* embed = plan->find("embedding");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->bytes, static_cast<uint64_t>(c.vocab_size * c.hidden_size * 2));
  // FP8 wo_a halves its bytes (minus its scales).
  DeviceWeightOptions fp8;
  fp8.wo_a_fp8 = true;
  auto plan8 = DeviceWeights::plan(c, host().weights(), fp8);
  ASSERT_TRUE(plan8.ok()) << plan8.error().message;
  const int64_t wo_a_params = c.o_groups * c.o_lora_rank * c.num_attention_heads * c.head_dim / c.o_groups;
  const int64_t wo_a_scales =
      (c.o_groups * c.o_lora_rank / 32) * (c.num_attention_heads * c.head_dim / c.o_groups / 32);
  EXPECT_EQ(plan->find("attention")->bytes - plan8->find("attention")->bytes,
            static_cast<uint64_t>(c.num_hidden_layers * (wo_a_params - wo_a_scales)));
}

TEST_F(CudaModelInfra, UploadRoundTripsEveryTensor) {
  CEDAR_REQUIRE_GPU();
  const ModelConfig& c = host().config();
  auto dw = DeviceWeights::upload(c, host().weights(), {}, {}, 0);
  ASSERT_TRUE(dw.ok()) << dw.error().message;
  const ModelWeights& hw = host().weights().tensors();
  auto same_matrix = [](const char* what, int64_t l, const DeviceMatrix& d, const cpu::LinearWeight& h) {
    SCOPED_TRACE(std::string(what) + " of layer " + std::to_string(l));
    ASSERT_TRUE(d.present());
    EXPECT_EQ(d.out, h.out);
    EXPECT_EQ(d.in, h.in);
    EXPECT_EQ(download<uint8_t>(d.data, d.data_bytes()), bytes_of(h.data, d.data_bytes()));
    if (d.scale_bytes() > 0) {
      EXPECT_EQ(download<uint8_t>(d.scales, d.scale_bytes()), bytes_of(h.scale, d.scale_bytes()));
    }
  };
  auto same_vector = [](const char* what, int64_t l, const DeviceVector& d, std::span<const float> h) {
    SCOPED_TRACE(std::string(what) + " of layer " + std::to_string(l));
    ASSERT_EQ(d.size, static_cast<int64_t>(h.size()));
    EXPECT_EQ(download<float>(d.data, h.size()), std::vector<float>(h.begin(), h.end()));
  };
  same_matrix("head", -1, dw->head(), hw.head);
  same_matrix("embed", -1, dw->embed(), hw.embed);
  same_vector("final norm", -1, dw->final_norm(), hw.final_norm);
  for (size_t l = 0; l < hw.layers.size(); ++l) {
    const LayerWeights& h = hw.layers[l];
    const DeviceLayer& d = dw->layers()[l];
    const auto L = static_cast<int64_t>(l);
    same_matrix("wq_a", L, d.wq_a, h.attn.wq_a);
    same_matrix("wq_b", L, d.wq_b, h.attn.wq_b);
    same_matrix("wkv", L, d.wkv, h.attn.wkv);
    same_matrix("wo_a (BF16 values)", L, d.wo_a, h.attn.wo_a);
    same_matrix("wo_b", L, d.wo_b, h.attn.wo_b);
    same_vector("attn_norm", L, d.attn_norm, h.attn_norm);
    same_vector("hc_attn_fn", L, d.hc_attn.fn, h.hc_attn.fn);
    same_vector("hc_ffn_base", L, d.hc_ffn.base, h.hc_ffn.base);
    same_vector("attn_sink", L, d.attn_sink, h.attn.attn_sink);
    if (h.attn.wkv_c.data) same_matrix("compressor wkv", L, d.wkv_c, h.attn.wkv_c);
    if (h.attn.wk.data) same_matrix("indexer wk", L, d.wk, h.attn.wk);
    if (h.attn.wq_b_i.data) same_matrix("indexer wq_b", L, d.wq_b_i, h.attn.wq_b_i);
    same_matrix("shared w2", L, d.shared_w2, h.ffn.shared.w2);
    // Router: BF16 bits of the bound fp32 values (exact: they are bf16 values).
    const auto gate = download<uint16_t>(d.gate.data, h.ffn.gate.size());
    for (size_t i = 0; i < gate.size(); ++i)
      ASSERT_EQ(bf16_to_f32(gate[i]), h.ffn.gate[i]) << "router " << l << " " << i;
    // Experts: expert e of each kind at first + e·stride, equal to the host expert's bytes.
    ASSERT_EQ(d.experts.count, static_cast<int64_t>(h.ffn.experts.size()));
    for (int64_t e = 0; e < d.experts.count; ++e) {
      const ExpertWeights& he = h.ffn.experts[static_cast<size_t>(e)];
      const DeviceMatrix w1 = d.experts.matrix(e, DeviceExperts::kW1), w2 = d.experts.matrix(e, DeviceExperts::kW2);
      EXPECT_EQ(w1.data - d.experts.first[DeviceExperts::kW1].data, e * d.experts.data_stride[DeviceExperts::kW1]);
      // The device pointer tables hold the same addresses.
      EXPECT_EQ(download<const uint8_t*>(d.experts.data_table[DeviceExperts::kW1] + e, 1)[0], w1.data);
      EXPECT_EQ(download<const uint8_t*>(d.experts.scale_table[DeviceExperts::kW2] + e, 1)[0], w2.scales);
      same_matrix("expert w1", L, w1, he.w1);
      same_matrix("expert w2", L, w2, he.w2);
    }
    ASSERT_EQ(d.engram.has_value(), h.engram.has_value());
    if (h.engram) {
      const uint64_t n = static_cast<uint64_t>(h.engram->rows * h.engram->head_dim);
      EXPECT_EQ(download<uint8_t>(d.engram->table, n), bytes_of(h.engram->table, n));
      same_matrix("engram wkv", L, d.engram->wkv, h.engram->wkv);
      const auto qk = download<float>(d.engram->qk.data, h.engram->q_weight.size());
      for (size_t i = 0; i < qk.size(); ++i) ASSERT_EQ(qk[i], h.engram->q_weight[i] * h.engram->k_weight[i]);
    }
  }
}

TEST_F(CudaModelInfra, UploadOptionsFp8WoAAndHostEngramTables) {
  CEDAR_REQUIRE_GPU();
  const ModelConfig& c = host().config();
  DeviceWeightOptions o;
  o.wo_a_fp8 = true;
  o.engram_tables_in_host = true;
  auto dw = DeviceWeights::upload(c, host().weights(), o, {}, 0);
  ASSERT_TRUE(dw.ok()) << dw.error().message;
  const io::Checkpoint& ckpt = host().weights().checkpoint();
  for (size_t l = 0; l < dw->layers().size(); ++l) {
    const DeviceMatrix& m = dw->layers()[l].wo_a;
    ASSERT_EQ(m.format, DeviceFormat::Fp8Block);
    auto w = ckpt.tensor("layers." + std::to_string(l) + ".attn.wo_a.weight");
    auto s = ckpt.tensor("layers." + std::to_string(l) + ".attn.wo_a.scale");
    ASSERT_TRUE(w.ok() && s.ok());
    EXPECT_EQ(download<uint8_t>(m.data, w->bytes.size()), std::vector<uint8_t>(w->bytes.begin(), w->bytes.end()));
    EXPECT_EQ(download<uint8_t>(m.scales, s->bytes.size()), std::vector<uint8_t>(s->bytes.begin(), s->bytes.end()));
    if (const auto& g = dw->layers()[l].engram) {  // a device-accessible pointer to pinned host memory
      EXPECT_TRUE(g->table_in_host);
      const LayerWeights& h = host().weights().tensors().layers[l];
      const uint64_t n = static_cast<uint64_t>(g->rows * g->head_dim);
      EXPECT_EQ(download<uint8_t>(g->table, n), bytes_of(h.engram->table, n));
    }
  }
  EXPECT_GT(dw->memory_plan().host_bytes(), 0u);
}

TEST_F(CudaModelInfra, UploadRepacksExpertsThroughTheHook) {
  CEDAR_REQUIRE_GPU();
  // A stand-in permutation (reversed bytes per row) for ffn_kernels.h repack_mxfp4: the hook sees every
  // MXFP4 expert matrix with its logical shape, and the device holds what it returned — one expert at a time
  // and several at a time on a pool (DeviceWeightOptions::pool), with the same bytes in the same places.
  ThreadPool pool(4);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const std::string how = p ? "on a pool of 4" : "one by one";
    std::atomic<int64_t> calls = 0;
    DeviceWeightOptions o;
    o.pool = p;
    o.repack_mxfp4 = [&calls](const uint8_t* plain, int64_t out, int64_t in, uint8_t* packed) {
      ++calls;
      for (int64_t r = 0; r < out; ++r)
        for (int64_t b = 0; b < in / 2; ++b) packed[r * (in / 2) + b] = plain[r * (in / 2) + (in / 2 - 1 - b)];
      return Status::Ok();
    };
    auto dw = DeviceWeights::upload(host().config(), host().weights(), o, {}, 0);
    ASSERT_TRUE(dw.ok()) << how << ": " << dw.error().message;
    const ModelConfig& c = host().config();
    EXPECT_EQ(calls.load(), 3 * c.n_routed_experts * c.num_hidden_layers) << how;
    const DeviceExperts& d = dw->layers()[2].experts;
    EXPECT_TRUE(d.repacked) << how;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const cpu::LinearWeight& h = host().weights().tensors().layers[2].ffn.experts[static_cast<size_t>(e)].w3;
      const DeviceMatrix m = d.matrix(e, DeviceExperts::kW3);
      const auto got = download<uint8_t>(m.data, m.data_bytes());
      const int64_t row = h.in / 2;
      for (int64_t r = 0; r < h.out; ++r)
        for (int64_t b = 0; b < row; ++b)
          ASSERT_EQ(got[static_cast<size_t>(r * row + b)], h.data[r * row + row - 1 - b]) << how << ", expert " << e;
      EXPECT_EQ(download<uint8_t>(m.scales, m.scale_bytes()), bytes_of(h.scale, m.scale_bytes()))
          << how << ", expert " << e;  // scales as stored
    }
  }
}

// A failing conversion names the expert and stops the upload.
TEST_F(CudaModelInfra, UploadNamesTheExpertWhoseConversionFailed) {
  CEDAR_REQUIRE_GPU();
  ThreadPool pool(4);
  DeviceWeightOptions o;
  o.pool = &pool;
  std::atomic<int64_t> calls = 0;
  o.tile_mxfp4 = [&calls](const uint8_t*, const uint8_t*, int64_t, int64_t, uint8_t*) {
    return ++calls == 2 ? make_error("stand-in failure") : Status::Ok();
  };
  auto dw = DeviceWeights::upload(host().config(), host().weights(), o, {}, 0);
  ASSERT_FALSE(dw.ok());
  EXPECT_NE(dw.error().message.find("tiling routed expert "), std::string::npos) << dw.error().message;
  EXPECT_NE(dw.error().message.find("stand-in failure"), std::string::npos) << dw.error().message;
}

TEST_F(CudaModelInfra, UploadThatDoesNotFitFailsWithThePlanAndAllocatesNothing) {
  CEDAR_REQUIRE_GPU();
  DeviceMemoryPlan huge;
  huge.add("kv pools", uint64_t{1} << 50, false, "top-k");  // 1 PiB of KV next to the weights
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  auto dw = DeviceWeights::upload(host().config(), host().weights(), {}, huge, 0);
  ASSERT_FALSE(dw.ok());
  const std::string& msg = dw.error().message;
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv pools"), std::string::npos) << msg;
  EXPECT_NE(msg.find("routed experts"), std::string::npos) << msg;
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after + (size_t{16} << 20), free_before);  // no weights left behind (16 MiB slack)
}

// ---- device KV -----------------------------------------------------------------------------

TEST(DeviceKvGeometry, BytesEqualTheHostPoolsAccounting) {  // needs no GPU
  for (const char* profile : {"tiny", "small", "perf"}) {
    auto c = tiny_model_config(Arch::DeepseekV41, profile, false);
    ASSERT_TRUE(c.ok());
    auto plan = build_layer_plan(*c);
    ASSERT_TRUE(plan.ok());
    DeviceKvOptions o;
    o.max_sequences = 3;
    o.max_context = 70000;
    auto g = DeviceKvGeometry::create(*c, *plan, o);
    ASSERT_TRUE(g.ok()) << g.error().message;
    for (int64_t n : {1, 2, 63, 64, 65, 127, 1000, 65536}) {
      auto host = measure_kv_bytes(*c, *plan, n);
      ASSERT_TRUE(host.ok());
      EXPECT_EQ(g->bytes_for(n), host->allocated_bytes) << profile << " at " << n << " positions";
    }
    // V4.1: main KV and indexer keys at ratio 2 and 1 → four block sizes; 288 B / 68 B records.
    EXPECT_EQ(g->arenas.size(), 4u) << profile;
    EXPECT_EQ(g->swa_record_bytes, c->head_dim + c->head_dim / 32);
    EXPECT_EQ(g->swa_slots, c->sliding_window);
    const DeviceMemoryPlan mp = g->memory_plan();
    EXPECT_GT(mp.device_bytes(), static_cast<uint64_t>(g->bytes_for(3 * 70000)));
  }
}

TEST_F(CudaModelInfra, KvPoolTablesAddressingAndRelease) {
  CEDAR_REQUIRE_GPU();
  const ModelConfig& c = host().config();
  DeviceKvOptions o;
  o.max_sequences = 2;
  o.max_context = 1024;
  o.token_capacity = 512;
  auto pool = DeviceKvPool::create(c, host().plan(), o);
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  const DeviceKvGeometry& g = pool->geometry();
  {
    auto seq = pool->new_sequence(stream->get());
    ASSERT_TRUE(seq.ok()) << seq.error().message;
    ASSERT_TRUE(seq->ensure(200).ok());
    ASSERT_TRUE(seq->upload_tables(stream->get()).ok());
    ASSERT_TRUE(stream->synchronize().ok());
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const auto si = static_cast<int64_t>(s);
      ASSERT_EQ(static_cast<int64_t>(seq->blocks(si).size()), g.blocks_for(si, 200));
      const KvStreamView v = seq->stream_view(si);
      EXPECT_EQ(download<int32_t>(v.block_table, seq->blocks(si).size()), seq->blocks(si)) << "stream " << s;
      // A record written at the address of entry j reads back from the same address, and entries of
      // different blocks do not overlap.
      const int64_t j = 200 / v.ratio - 1;
      const int32_t block = seq->blocks(si)[static_cast<size_t>(j / v.entries_per_block)];
      std::vector<uint8_t> rec(static_cast<size_t>(v.record_bytes));
      for (size_t i = 0; i < rec.size(); ++i) rec[i] = static_cast<uint8_t>(i * 13 + s);
      uint8_t* at = v.pool + kv_record_offset(block, j, v);
      ASSERT_EQ(cudaMemcpy(at, rec.data(), rec.size(), cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(download<uint8_t>(at, rec.size()), rec);
      EXPECT_EQ(v.record_bytes, g.streams[s].format.record_bytes());
    }
    const SwaRingView ring = seq->ring_view(c.num_hidden_layers - 1);
    EXPECT_EQ(download<int64_t>(ring.positions, static_cast<size_t>(ring.slots)),
              std::vector<int64_t>(static_cast<size_t>(ring.slots), -1));
    // Growing past the capacity fails as a whole and names the arena; the tables stay as they were.
    const auto before = seq->blocks(0);
    const Status big = seq->ensure(1024);
    EXPECT_FALSE(big.ok());
    EXPECT_NE(big.error().message.find("free blocks"), std::string::npos) << big.error().message;
    EXPECT_EQ(seq->blocks(0), before);
    EXPECT_EQ(seq->positions(), 200);
    auto second = pool->new_sequence(stream->get());
    ASSERT_TRUE(second.ok());
    auto third = pool->new_sequence(stream->get());
    EXPECT_FALSE(third.ok());  // two slots
    EXPECT_GT(pool->stats().used_blocks, 0);
    EXPECT_EQ(pool->stats().live_sequences, 2);
  }
  EXPECT_EQ(pool->stats().used_blocks, 0);  // destroyed sequences give their blocks and slots back
  EXPECT_EQ(pool->stats().live_sequences, 0);
}

// ---- CUDA graph, peaks ---------------------------------------------------------------------

TEST(CudaGraph, CapturesReplaysAndRecoversFromAFailedCapture) {
  CEDAR_REQUIRE_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  auto a = DeviceBuffer<uint32_t>::allocate(1024), b = DeviceBuffer<uint32_t>::allocate(1024);
  ASSERT_TRUE(a.ok() && b.ok());
  uint32_t* pa = a->get();
  uint32_t* pb = b->get();
  auto g = CudaGraph::capture(stream->get(), [&](cudaStream_t s) -> Status {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pa, 0x11, 1024 * 4, s));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pb, pa, 1024 * 4, cudaMemcpyDeviceToDevice, s));
    return Status::Ok();
  });
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->nodes(), 2u);
  ASSERT_TRUE(b->zero().ok());
  EXPECT_EQ(b->to_host()->at(7), 0u);  // capturing executed nothing
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(g->launch(stream->get()).ok());
  ASSERT_TRUE(stream->synchronize().ok());
  EXPECT_EQ(b->to_host()->at(1023), 0x11111111u);
  // A failing record ends the capture: the error comes back and the stream works again.
  auto bad = CudaGraph::capture(stream->get(), [&](cudaStream_t s) -> Status {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pa, 0, 16, s));
    return Status(make_error("pending: a kernel"));
  });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("pending: a kernel"), std::string::npos);
  cudaStreamCaptureStatus cs;
  ASSERT_EQ(cudaStreamIsCapturing(stream->get(), &cs), cudaSuccess);
  EXPECT_EQ(cs, cudaStreamCaptureStatusNone);
  // Recapture with other arguments (same topology) updates the graph in place.
  ASSERT_TRUE(g->recapture(stream->get(), [&](cudaStream_t s) -> Status {
                 CEDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pa, 0x22, 1024 * 4, s));
                 CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pb, pa, 1024 * 4, cudaMemcpyDeviceToDevice, s));
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(g->launch(stream->get()).ok());
  ASSERT_TRUE(stream->synchronize().ok());
  EXPECT_EQ(b->to_host()->at(0), 0x22222222u);
}

// GraphOptions::smem_carveout is set on every kernel node of the captured graph (read back from the graph),
// none of the other nodes is touched, and the replay computes what the direct launch does; a value outside
// 0..100 is refused with the capture ended.
TEST(CudaGraph, SetsTheSharedMemoryCarveoutOnEveryKernelNode) {
  CEDAR_REQUIRE_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  constexpr int64_t kRows = 4, kDim = 256;
  std::vector<float> x(kRows * kDim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 17) - 8) / 8.0f;
  auto dx = DeviceBuffer<float>::from_host(x);
  auto y_direct = DeviceBuffer<float>::allocate(x.size()), y_graph = DeviceBuffer<float>::allocate(x.size());
  ASSERT_TRUE(dx.ok() && y_direct.ok() && y_graph.ok());
  ASSERT_TRUE(rms_norm(dx->get(), kRows, kDim, nullptr, 1e-6f, y_direct->get(), stream->get()).ok());
  const auto record = [&](cudaStream_t s) -> Status {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(y_graph->get(), 0, x.size() * sizeof(float), s));
    CEDAR_RETURN_IF_ERROR(rms_norm(dx->get(), kRows, kDim, nullptr, 1e-6f, y_graph->get(), s));
    return rms_norm(dx->get(), kRows, kDim, nullptr, 1e-6f, y_graph->get(), s);
  };
  auto g = CudaGraph::capture(stream->get(), record, GraphOptions{37});
  ASSERT_TRUE(g.ok()) << g.error().message;
  size_t n = 0;
  ASSERT_EQ(cudaGraphGetNodes(g->graph(), nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  ASSERT_EQ(cudaGraphGetNodes(g->graph(), nodes.data(), &n), cudaSuccess);
  int kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    if (type != cudaGraphNodeTypeKernel) continue;
    ++kernels;
    cudaLaunchAttributeValue v{};
    ASSERT_EQ(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePreferredSharedMemoryCarveout, &v),
              cudaSuccess);
    EXPECT_EQ(v.sharedMemCarveout, 37u) << "kernel node " << kernels;
  }
  EXPECT_EQ(kernels, 2);
  EXPECT_EQ(n, 3u);  // and the memset
  ASSERT_TRUE(g->launch(stream->get()).ok());
  ASSERT_TRUE(stream->synchronize().ok());
  const auto want = y_direct->to_host(), got = y_graph->to_host();
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(std::memcmp(want->data(), got->data(), x.size() * sizeof(float)), 0);
  auto bad = CudaGraph::capture(stream->get(), record, GraphOptions{101});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("smem_carveout 101"), std::string::npos) << bad.error().message;
  cudaStreamCaptureStatus cs;
  ASSERT_EQ(cudaStreamIsCapturing(stream->get(), &cs), cudaSuccess);
  EXPECT_EQ(cs, cudaStreamCaptureStatusNone);
}

TEST(GemmPeaks, RejectsBadShapesAndMeasuresPlausibleRates) {
  EXPECT_FALSE(measure_gemm_peaks(100, 1).ok());  // not a multiple of 16 (checked before any GPU call)
  CEDAR_REQUIRE_GPU();
  auto p = measure_gemm_peaks(2048, 3);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::printf("GEMM 2048^3: bf16 %.1f TFLOP/s, fp8 %.1f TFLOP/s %s\n", p->bf16.tflops, p->fp8.tflops,
              p->fp8.error.c_str());
  EXPECT_GT(p->bf16.tflops, 1.0);
  EXPECT_LT(p->bf16.tflops, 5000.0);  // above any GPU's bf16 peak: the timing is broken
  if (p->fp8.error.empty()) {
    EXPECT_GT(p->fp8.tflops, 1.0);
  }
}

// ---- the CUDA model -------------------------------------------------------------------------

TEST_F(CudaModelInfra, ModelLoadsWithItsPlanPrefillsAndDecodes) {
  CEDAR_REQUIRE_GPU();
  CudaModelOptions o;
  o.max_batch = 2;
  o.max_chunk = 32;
  o.kv.max_sequences = 3;
  o.kv.max_context = 256;
  o.kv.token_capacity = 512;
  o.engram_map = testing::engram_map_path();
  auto m = CudaModel::load(*dir_, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const DeviceMemoryPlan& plan = (*m)->memory_plan();
  std::printf("%s", plan.table().c_str());
  for (const char* component : {"head", "attention", "routed experts", "kv pools", "swa rings", "activations",
                                "indexer scratch", "rope tables"})
    EXPECT_NE(plan.find(component), nullptr) << component;
  auto seq = (*m)->new_sequence({});
  ASSERT_TRUE(seq.ok()) << seq.error().message;
  CudaStepOutput out;
  const std::vector<int64_t> prompt = {0, 15, 27};
  const Status st = (*m)->prefill(*seq, prompt, LogitRows::Last, out);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(seq->length, 3);
  ASSERT_EQ(out.rows, 1);
  EXPECT_EQ(out.positions, std::vector<int64_t>{2});
  CudaSequence* batch[] = {&*seq};
  const int64_t token = 5;
  const Status dec = (*m)->decode_step(batch, std::span<const int64_t>(&token, 1), out);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  EXPECT_EQ(seq->length, 4);
  ASSERT_EQ(out.argmax.size(), 1u);
  EXPECT_GE(out.argmax[0], 0);
  // Argument errors come first, name the problem and leave the sequence usable.
  const int64_t bad = -1;
  EXPECT_NE((*m)->decode_step(batch, std::span<const int64_t>(&bad, 1), out).error().message.find("vocabulary"),
            std::string::npos);
  EXPECT_FALSE(seq->failed);
  EXPECT_EQ(seq->length, 4);
}

}  // namespace
}  // namespace cedar::cuda
