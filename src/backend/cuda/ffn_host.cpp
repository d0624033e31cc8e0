// Host-side helpers of the cuda-ffn kernels that need the C++20 model headers.
#include "backend/cuda/ffn_kernels.h"
#include "model/engram.h"

namespace cedar::cuda {

EngramHashTablesHost engram_hash_tables(const EngramLayout& layout) {
  EngramHashTablesHost h;
  h.view.n_slots = layout.n_slots();
  h.view.max_ngram = layout.max_ngram();
  h.view.n_heads = layout.n_heads();
  for (int64_t s = 0; s < layout.n_slots(); ++s)
    for (int64_t v : layout.multipliers(s)) h.values.push_back(v);
  for (int64_t s = 0; s < layout.n_slots(); ++s)
    for (int64_t v : layout.primes(s)) h.values.push_back(v);
  for (int64_t s = 0; s < layout.n_slots(); ++s)
    for (int64_t v : layout.offsets(s)) h.values.push_back(v);
  return h;
}

}  // namespace cedar::cuda
