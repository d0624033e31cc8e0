// cuda_kernels_bench: decode sparse attention and the indexer's selection (kbench_common.h).
#include "kbench_common.h"

namespace cedar::cuda::kbench {

// Sparse attention at the released decode shape (64 heads × 512, window 128 + top-k 512 = 640 keys per
// row, sink, inverse RoPE on 64 channels): the tiled kernel (16 heads per block) against the decode
// kernel (split-K, 64 heads per block; _hsplit: its head-split plan, SparseAttnArgs::decode_head_split),
// and an SWA-only layer's 128 keys (decode kernel, both plans). Rows are distinct sequences; bytes =
// the rows' key records (528-B SWA + 288-B main KV), q and out. The records of one call (≤ 14 MB) stay in L2 across replays, as a
// layer's would not: read the GB/s as a latency figure, not an HBM rate.
void bench_sparse_attention(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t H = 64, hd = 512, W = 128, K = 512, rope_dim = 64, entries = 8192, epb = 64;
  const int64_t rb = swa_record_bytes(hd), mb = main_kv_record_bytes(hd), positions = entries + 256;
  std::mt19937 rng(7);
  auto rope = random_floats(positions * rope_dim, 101, 0.5f);
  auto sink = random_floats(H, 102, 1.0f);
  // One KV pool for every sequence (valid FP4 codes, e4m3 scales without NaN), identity block table.
  std::vector<uint8_t> pool(entries * mb);
  for (int64_t j = 0; j < entries; ++j) {
    uint8_t* r = pool.data() + j * mb;
    for (int64_t i = 0; i < hd / 2; ++i) r[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < hd / 16; ++i) r[hd / 2 + i] = static_cast<uint8_t>(40 + rng() % 16);
  }
  auto dpool = must(DeviceBuffer<uint8_t>::from_host(pool));
  std::vector<int32_t> table(entries / epb);
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  auto dtable = must(DeviceBuffer<int32_t>::from_host(table));
  auto swa_bytes = [&](int64_t count) {
    std::vector<uint8_t> v(count * rb);
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t i = 0; i < hd; ++i) {
        uint8_t b = static_cast<uint8_t>(rng());
        v[r * rb + i] = (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
      }
      for (int64_t i = 0; i < hd / 32; ++i) v[r * rb + hd + i] = static_cast<uint8_t>(118 + rng() % 8);
    }
    return v;
  };
  for (int64_t n : {1, 8, 64}) {
    std::vector<AttnToken> tokens;
    std::vector<SwaRingDesc> rings;
    std::vector<KvSourceSeq> seqs;
    std::vector<int32_t> topk(n * K);
    std::vector<DeviceBuffer<uint8_t>> ring_rec;
    std::vector<DeviceBuffer<int64_t>> ring_pos;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t pos = 6000 + 13 * s;
      append_chunk_tokens(tokens, static_cast<int32_t>(s), pos, 1);
      std::vector<int64_t> rp(W);
      for (int64_t k = pos - W; k < pos; ++k) rp[k % W] = k;
      ring_rec.push_back(must(DeviceBuffer<uint8_t>::from_host(swa_bytes(W))));
      ring_pos.push_back(must(DeviceBuffer<int64_t>::from_host(rp)));
      rings.push_back(SwaRingDesc{ring_rec.back().get(), ring_pos.back().get()});
      seqs.push_back(KvSourceSeq{PagedRecords{dpool.get(), dtable.get(), epb * mb, epb, mb}, {}});
      std::vector<int32_t> ids(entries);
      for (int64_t j = 0; j < entries; ++j) ids[j] = static_cast<int32_t>(j);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::sort(ids.begin(), ids.begin() + K);
      std::copy_n(ids.begin(), K, topk.begin() + s * K);
    }
    auto dtok = must(DeviceBuffer<AttnToken>::from_host(tokens));
    auto drings = must(DeviceBuffer<SwaRingDesc>::from_host(rings));
    auto dseqs = must(DeviceBuffer<KvSourceSeq>::from_host(seqs));
    auto dtopk = must(DeviceBuffer<int32_t>::from_host(topk));
    auto dchunk = must(DeviceBuffer<uint8_t>::from_host(swa_bytes(n)));
    auto q = random_floats(n * H * hd, 103, 1.0f);
    auto out = must(DeviceBuffer<float>::allocate(n * H * hd));
    const SparseAttnWorkspaceSize wsz = sparse_attention_workspace_size(n, H, hd, W, K);
    auto wf = must(DeviceBuffer<float>::allocate(std::max<int64_t>(1, wsz.floats)));
    auto wc = must(DeviceBuffer<unsigned>::allocate(std::max<int64_t>(1, wsz.counters)));
    must(cuda_status(cudaMemset(wc.get(), 0, sizeof(unsigned) * std::max<int64_t>(1, wsz.counters)), "cudaMemset"));
    const SparseAttnWorkspace ws{wf.get(), wc.get(), wsz.floats, wsz.counters};
    SparseAttnArgs a;
    a.n = n;
    a.heads = H;
    a.head_dim = hd;
    a.window = W;
    a.q = q.get();
    a.sink = sink.get();
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.tokens = dtok.get();
    a.chunk_records = dchunk.get();
    a.rings = drings.get();
    a.topk = dtopk.get();
    a.topk_width = K;
    a.kv_seqs = dseqs.get();
    a.rope = RopeTableView{rope.get(), positions, rope_dim};
    a.out = out.get();
    const double bytes = n * (W * rb + K * mb + 2.0 * 4 * H * hd);
    const double old_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_tiled(a, stream, ws)); });
    rows.push_back(make_row("sparse_attn_tiled", "64x512 640 keys", n, old_us, bytes, copy_gbps));
    const double new_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(a, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode", "64x512 640 keys", n, new_us, bytes, copy_gbps));
    SparseAttnArgs la = a;  // the first merge (serial loads, plain launch): the session-4 run's row
    la.legacy_decode_merge = true;
    const double leg_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(la, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode_oldmerge", "64x512 640 keys", n, leg_us, bytes, copy_gbps));
    SparseAttnArgs ha = a;  // the head-split plan (16 heads per block at b1/b8; b64: 64, balanced ranges)
    ha.decode_head_split = true;
    const double hs_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(ha, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode_hsplit", "64x512 640 keys", n, hs_us, bytes, copy_gbps));
    // An SWA-only layer (window 128, no compressed entries): 4 ranges at b1 in the legacy plan (4 blocks),
    // 4 ranges × 4 head groups in the head-split plan. (Its workspace is within the 640-key one's.)
    SparseAttnArgs sa = a;
    sa.topk = nullptr;
    sa.topk_width = 0;
    sa.kv_seqs = nullptr;
    const double swa_bytes_total = n * (W * rb + 2.0 * 4 * H * hd);
    const double swa_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode", "64x512 swa 128 keys", n, swa_us, swa_bytes_total, copy_gbps));
    sa.decode_head_split = true;
    const double swa_hs_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(
        make_row("sparse_attn_decode_hsplit", "64x512 swa 128 keys", n, swa_hs_us, swa_bytes_total, copy_gbps));
    sa.decode_max_splits = 1;  // one key range per head group: no merge launch (attn_swa_one_range)
    const double swa_one_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(
        make_row("sparse_attn_decode_hsplit_1r", "64x512 swa 128 keys", n, swa_one_us, swa_bytes_total, copy_gbps));
  }
}

// Indexer selection at decode (top-512 of a row's scores, the perf profile's shapes): the full scan of a
// candidate source at 4096 visible entries (+ top-2048 blocks of 8), and a restricted layer's 16384
// candidate slots (two select segments). Scores of one binade range, as the indexer's are (most share
// the sign and exponent). indexer_select = one shared atomic per value (the default); _warpagg = one per
// bin and warp (warp_aggregated_histogram), measured slower; same selection.
// The head of a decode layer without the compressor: q_norm (rms_norm with its FP8 codes, 1 536 channels),
// the SWA KV encode (512), the two launches back to back, and q_norm_swa_kv_encode (one launch, the model's
// path since s21); _pdl: each launch under PDL after the one before, as in the model's graph. Which of the
// two halves is the fused kernel's long pole shows in the first two rows.
void bench_q_norm_kv(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t q_dim = 1536, hd = 512, rope_dim = 64, positions = 4096;
  for (const int64_t n : {1, 8}) {
    auto q = random_floats(n * q_dim, 111, 1.0f);
    auto qw = random_floats(q_dim, 112, 1.0f);
    auto kv = random_floats(n * hd, 113, 1.0f);
    auto kvw = random_floats(hd, 114, 1.0f);
    auto rope = random_floats(positions * rope_dim, 115, 1.0f);
    auto codes = must(DeviceBuffer<uint16_t>::allocate(n * q_dim));
    auto scales = must(DeviceBuffer<float>::allocate(n * q_dim / 32));
    auto records = must(DeviceBuffer<uint8_t>::allocate(n * swa_record_bytes(hd)));
    std::vector<AttnToken> tokens;
    append_chunk_tokens(tokens, 0, positions - 8, n);
    auto dtokens = must(DeviceBuffer<AttnToken>::from_host(tokens));
    SwaKvArgs a;
    a.kv = kv.get();
    a.norm_weight = kvw.get();
    a.n = n;
    a.head_dim = hd;
    a.tokens = dtokens.get();
    a.rope = RopeTableView{rope.get(), positions, rope_dim};
    a.records = records.get();
    QNormArgs qa;
    qa.x = qa.y = q.get();
    qa.dim = q_dim;
    qa.weight = qw.get();
    qa.quant = ActQuantOut{codes.get(), scales.get()};
    const double q_bytes = 4.0 * (2 * n * q_dim + q_dim) + 2.0 * n * q_dim + 4.0 * n * q_dim / 32;
    const double kv_bytes = 4.0 * (n * hd + hd + n * rope_dim) + 1.0 * n * swa_record_bytes(hd);
    const std::pair<const char*, std::function<Status(bool)>> cases[] = {
        {"q_norm_q",
         [&](bool pdl) { return rms_norm(q.get(), n, q_dim, qw.get(), 1e-6f, q.get(), stream, pdl, qa.quant); }},
        {"swa_kv_encode", [&](bool) { return swa_kv_encode(a, stream); }},
        {"q_norm_q+swa_kv_encode",
         [&](bool pdl) {
           const Status st = rms_norm(q.get(), n, q_dim, qw.get(), 1e-6f, q.get(), stream, pdl, qa.quant);
           return st.ok() ? swa_kv_encode(a, stream) : st;
         }},
        {"q_norm_swa_kv_encode", [&](bool pdl) { return q_norm_swa_kv_encode(qa, a, stream, pdl); }},
    };
    for (const auto& [name, launch] : cases) {
      for (const bool pdl : {false, true}) {
        if (pdl && std::string(name) == "swa_kv_encode") continue;  // its launcher has no PDL form
        const double us = try_time_graph_us(stream, 8, [&](int) { return launch(pdl); });
        if (us < 0) {
          std::printf("%s with programmatic dependent launch: not supported here (skipped)\n", name);
          continue;
        }
        const std::string kernel = std::string(name) + (pdl ? "_pdl" : "");
        const bool has_q = kernel.rfind("q_norm", 0) == 0, has_kv = kernel.find("swa_kv") != std::string::npos;
        rows.push_back(make_row(kernel, "1536 / 512", n, us, (has_q ? q_bytes : 0) + (has_kv ? kv_bytes : 0),
                                copy_gbps));
      }
    }
  }
}

void bench_indexer_select(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  struct Shape {
    const char* name;
    int64_t visible;
    bool blocks;
  };
  for (const Shape sh : {Shape{"4096 +blocks", 4096, true}, Shape{"16384", 16384, false}}) {
    for (int64_t n : {1, 8}) {
      std::vector<AttnToken> tokens;
      for (int64_t r = 0; r < n; ++r) append_chunk_tokens(tokens, static_cast<int32_t>(r), sh.visible - 1, 1);
      auto dtok = must(DeviceBuffer<AttnToken>::from_host(tokens));
      std::mt19937 rng(11);
      std::vector<float> sc(n * sh.visible);
      for (auto& v : sc) v = 1.0f + static_cast<float>(rng() % 65536) / 65536.0f;  // one binade
      auto dsc = must(DeviceBuffer<float>::from_host(sc));
      const int64_t topk = 512, ctopk = 2048, bs = 8;
      const int64_t wsb = indexer_select_workspace_bytes(n, sh.visible, topk, sh.blocks ? ctopk : 0, bs);
      auto dws = must(DeviceBuffer<uint8_t>::allocate(std::max<int64_t>(1, wsb)));
      auto dout = must(DeviceBuffer<int32_t>::allocate(n * topk));
      auto dblk = must(DeviceBuffer<int32_t>::allocate(n * ctopk));
      IndexerSelectArgs a;
      a.n = n;
      a.ratio = 1;
      a.tokens = dtok.get();
      a.scores = dsc.get();
      a.max_slots = sh.visible;
      a.candidate_topk_blocks = ctopk;
      a.candidate_block_size = bs;
      a.topk = topk;
      a.topk_out = dout.get();
      a.blocks_out = sh.blocks ? dblk.get() : nullptr;
      a.workspace = dws.get();
      a.workspace_bytes = wsb;
      const double bytes = 4.0 * n * sh.visible;
      IndexerSelectArgs agg = a;
      agg.warp_aggregated_histogram = true;
      const double agg_us = time_graph_us(stream, 1, [&](int) { must(indexer_select(agg, stream)); });
      rows.push_back(make_row("indexer_select_warpagg", sh.name, n, agg_us, bytes, copy_gbps));
      const double def_us = time_graph_us(stream, 1, [&](int) { must(indexer_select(a, stream)); });
      rows.push_back(make_row("indexer_select", sh.name, n, def_us, bytes, copy_gbps));
    }
  }
}

}  // namespace cedar::cuda::kbench
