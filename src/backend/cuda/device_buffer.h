// RAII device memory: a typed, move-only owner of one cudaMalloc allocation, with checked host
// transfers. C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  // `count` elements (uninitialized); count 0 gives an empty buffer.
  static Result<DeviceBuffer> allocate(size_t count) {
    DeviceBuffer b;
    if (count == 0) return Result<DeviceBuffer>(std::move(b));
    void* p = nullptr;
    if (cudaError_t err = cudaMalloc(&p, count * sizeof(T)); err != cudaSuccess)
      return cuda_status(err, ("cudaMalloc(" + std::to_string(count * sizeof(T)) + " bytes)").c_str()).error();
    b.ptr_ = static_cast<T*>(p);
    b.size_ = count;
    return Result<DeviceBuffer>(std::move(b));
  }
  // A buffer holding a copy of host data.
  static Result<DeviceBuffer> from_host(const T* data, size_t count) {
    auto b = allocate(count);
    if (!b.ok()) return b;
    if (Status s = b->upload(data, count); !s.ok()) return s.error();
    return b;
  }
  static Result<DeviceBuffer> from_host(const std::vector<T>& v) { return from_host(v.data(), v.size()); }

  Status upload(const T* data, size_t count, size_t offset = 0) {
    if (offset + count > size_) return bounds_error("upload", offset, count);
    if (count == 0) return Status::Ok();
    return cuda_status(cudaMemcpy(ptr_ + offset, data, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(H2D)");
  }
  Status download(T* data, size_t count, size_t offset = 0) const {
    if (offset + count > size_) return bounds_error("download", offset, count);
    if (count == 0) return Status::Ok();
    return cuda_status(cudaMemcpy(data, ptr_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy(D2H)");
  }
  Result<std::vector<T>> to_host() const {
    std::vector<T> v(size_);
    if (Status s = download(v.data(), v.size()); !s.ok()) return s.error();
    return v;
  }
  Status zero() { return size_ == 0 ? Status::Ok() : cuda_status(cudaMemset(ptr_, 0, bytes()), "cudaMemset"); }

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  void reset() {
    if (ptr_) cudaFree(ptr_);  // cudaFree cannot fail for a pointer cudaMalloc returned, barring a dead context
    ptr_ = nullptr;
    size_ = 0;
  }

 private:
  Status bounds_error(const char* what, size_t offset, size_t count) const {
    return make_error(std::string("DeviceBuffer::") + what + ": elements [" + std::to_string(offset) + ", " +
                      std::to_string(offset + count) + ") outside a buffer of " + std::to_string(size_));
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cedar::cuda
