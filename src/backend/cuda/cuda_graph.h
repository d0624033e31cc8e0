// RAII CUDA graph for the decode step: capture the work a function enqueues on a stream once, replay it
// with one launch per step (the per-kernel launch cost of ~40 layers × a dozen kernels would otherwise
// dominate a batch-1 step). Kernels captured here must be graph-capturable: no host synchronization, no
// allocation, device pointers fixed for the graph's lifetime — the decode step's inputs (token ids,
// positions, block tables) live in device buffers the step rewrites before each replay.
// C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

// Set on a captured graph before it is instantiated.
struct GraphOptions {
  // The preferred shared-memory carveout (percent of the maximum shared memory, 1..100) of every kernel node,
  // or 0: each kernel's own (the driver's choice). An SM changes its L1 / shared split only when it is idle,
  // so kernels whose splits differ cannot share an SM; one split for the whole graph removes that
  // (CudaKernelPaths::graph_carveout).
  int smem_carveout = 0;
};

class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  CudaGraph(CudaGraph&& o) noexcept
      : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)), nodes_(o.nodes_) {}
  CudaGraph& operator=(CudaGraph&& o) noexcept {
    if (this != &o) {
      reset();
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
      nodes_ = o.nodes_;
    }
    return *this;
  }
  ~CudaGraph() { reset(); }

  // Captures what `record(stream)` (returning Status) enqueues on `stream` — a non-default stream, not
  // already capturing — and instantiates it. If `record` fails, or a call it makes is not capturable,
  // the capture is ended (the stream is usable again) and the error returned; nothing was executed.
  template <typename Record>
  static Result<CudaGraph> capture(cudaStream_t stream, Record&& record, const GraphOptions& options = {}) {
    CudaGraph g;
    CEDAR_RETURN_IF_ERROR(g.capture_into(stream, record, options));
    return Result<CudaGraph>(std::move(g));
  }

  // Re-captures `record` and updates the instantiated graph in place when the topology is unchanged
  // (cudaGraphExecUpdate: new kernel arguments, e.g. another batch's pointers), else re-instantiates.
  template <typename Record>
  Status recapture(cudaStream_t stream, Record&& record, const GraphOptions& options = {}) {
    if (!exec_) return capture_into(stream, record, options);
    cudaGraph_t fresh = nullptr;
    CEDAR_RETURN_IF_ERROR(record_graph(stream, record, options, &fresh));
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec_, fresh, &info) == cudaSuccess) {
      cudaGraphDestroy(graph_);
      graph_ = fresh;
      CEDAR_RETURN_IF_ERROR(count_nodes());
      return Status::Ok();
    }
    (void)cudaGetLastError();  // a refused update is not an error: instantiate the new topology
    reset();
    graph_ = fresh;
    CEDAR_RETURN_IF_ERROR(count_nodes());
    return cuda_status(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }

  // Enqueues one replay on `stream`.
  Status launch(cudaStream_t stream) const {
    if (!exec_) return make_error("CudaGraph::launch: no graph captured");
    return cuda_status(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

  bool empty() const { return exec_ == nullptr; }
  size_t nodes() const { return nodes_; }  // nodes of the captured graph (kernels, copies, memsets)
  cudaGraph_t graph() const { return graph_; }  // the captured graph, for inspection (tests)

 private:
  template <typename Record>
  static Status record_graph(cudaStream_t stream, Record& record, const GraphOptions& options, cudaGraph_t* out) {
    if (stream == nullptr) return make_error("CudaGraph: capture needs a non-default stream");
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) return make_error("CudaGraph: the stream is already capturing");
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status recorded = record(stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);  // always: leaves the stream usable
    if (!recorded.ok() || ended != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      if (!recorded.ok()) return recorded.error().with_context("CudaGraph capture");
      return cuda_status(ended, "cudaStreamEndCapture (a captured call was not capturable)");
    }
    if (const Status applied = apply(options, graph); !applied.ok()) {
      cudaGraphDestroy(graph);
      return applied;
    }
    *out = graph;
    return Status::Ok();
  }

  static Status apply(const GraphOptions& options, cudaGraph_t graph) {
    if (options.smem_carveout == 0) return Status::Ok();
    if (options.smem_carveout < 0 || options.smem_carveout > 100)
      return make_error("CudaGraph: smem_carveout " + std::to_string(options.smem_carveout) + " is not 0..100");
    size_t n = 0;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    if (n > 0) CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nodes.data(), &n));
    cudaLaunchAttributeValue value{};
    value.sharedMemCarveout = static_cast<unsigned>(options.smem_carveout);
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeKernel) continue;
      CEDAR_RETURN_IF_ERROR(cuda_status(
          cudaGraphKernelNodeSetAttribute(node, cudaLaunchAttributePreferredSharedMemoryCarveout, &value),
          "cudaGraphKernelNodeSetAttribute(PreferredSharedMemoryCarveout)"));
    }
    return Status::Ok();
  }

  template <typename Record>
  Status capture_into(cudaStream_t stream, Record& record, const GraphOptions& options) {
    cudaGraph_t graph = nullptr;
    CEDAR_RETURN_IF_ERROR(record_graph(stream, record, options, &graph));
    reset();
    graph_ = graph;
    CEDAR_RETURN_IF_ERROR(count_nodes());
    return cuda_status(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }

  Status count_nodes() {
    size_t n = 0;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph_, nullptr, &n));
    nodes_ = n;
    return Status::Ok();
  }

  void reset() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    nodes_ = 0;
  }

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace cedar::cuda
