// A caching CPU allocator, installed while denoiser samples (`denoiser.kernels.cached_cpu_allocations`).
//
// Why: eager PyTorch allocates every activation afresh, and glibc hands large freed blocks back to the
// system (mmap'd chunks are unmapped, the top of the heap is trimmed), so every UNet call faults its
// memory in again: ~3,500 page faults per step for the shipped model at batch 8, 15-20% of a sampling
// step on a 2-core CPU. A sampling loop allocates the same sizes at every step, so freed blocks are
// kept by size and handed out again, as PyTorch's CUDA caching allocator does. The idle blocks go back
// to the system when the last sampler ends (or past a cap).
//
// Thread-safe (one mutex: OpenMP workers and other Python threads allocate while it is installed).
// Nested or concurrent samplers share it, counted; the allocator it replaced returns after the last.
// While installed, CPU allocations are not reported to torch.profiler's memory view.
// Blocks it handed out stay valid after it is uninstalled and are freed normally then. Blocks move
// between it and the allocator it replaced in both directions (oneDNN raw-allocates through whichever
// is current and frees the same way); both sides use c10's alloc_cpu/free_cpu, so either frees them.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <cstddef>
#include <mutex>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kMaxIdleBytes = size_t(2) << 30;  // idle blocks kept at most (2 GiB)

struct Cache {
  std::mutex mutex;
  std::unordered_map<void*, size_t> live;               // every block handed out and not yet freed -> size
  std::unordered_map<size_t, std::vector<void*>> idle;  // blocks freed while installed, by size
  size_t idle_bytes = 0;
  int users = 0;                      // installs not yet matched by an uninstall
  at::Allocator* replaced = nullptr;  // the CPU allocator ours replaced, when it is installed
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may still be freed during exit
  return *c;
}

void release_idle(Cache& c) {  // lock held
  for (auto& [size, blocks] : c.idle) {
    for (void* p : blocks) {
      c.live.erase(p);
      c10::free_cpu(p);
    }
  }
  c.idle.clear();
  c.idle_bytes = 0;
}

// Whether the block at ptr can hold `size` bytes. An entry in `live` goes stale when a block this cache
// raw-allocated is raw-freed through the replaced allocator (after uninstalling); if glibc later hands
// the same address to a smaller allocation that is raw-freed through us, the stale size must not be
// believed, or the block would be handed out for more bytes than it has.
bool really_holds(void* ptr, size_t size) {
#ifdef __GLIBC__
  return malloc_usable_size(ptr) >= size;  // c10::alloc_cpu is posix_memalign: glibc knows the block
#else
  (void)ptr;
  (void)size;
  return false;  // cannot tell: free instead of caching
#endif
}

void free_block(void* ptr) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.live.find(ptr);
  if (it == c.live.end()) {  // raw_deallocate of a block the replaced allocator handed out (oneDNN does this)
    c10::free_cpu(ptr);
    return;
  }
  const size_t size = it->second;
  if (c.users > 0 && c.idle_bytes + size <= kMaxIdleBytes && really_holds(ptr, size)) {
    c.idle[size].push_back(ptr);
    c.idle_bytes += size;
    return;
  }
  c.live.erase(it);
  c10::free_cpu(ptr);
}

struct CachingCPUAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    const at::Device cpu(at::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, &free_block, cpu};
    Cache& c = cache();
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      auto it = c.idle.find(nbytes);
      if (it != c.idle.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        c.idle_bytes -= nbytes;
        return {p, p, &free_block, cpu};
      }
    }
    void* p = c10::alloc_cpu(nbytes);  // outside the lock: the system call and page zeroing are the slow part
    std::lock_guard<std::mutex> lock(c.mutex);
    c.live.insert_or_assign(p, nbytes);  // an entry left by a block freed through the replaced allocator
    return {p, p, &free_block, cpu};
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CachingCPUAllocator g_allocator;

// Install (enable) or uninstall (disable) the cache; calls nest.
void set_allocation_cache(bool enable) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (enable) {
    if (c.users++ == 0) {
      at::Allocator* current = c10::GetCPUAllocator();
      c10::SetCPUAllocator(&g_allocator);  // priority 0, torch's default: a higher-priority allocator stays
      c.replaced = c10::GetCPUAllocator() == &g_allocator ? current : nullptr;
    }
    return;
  }
  TORCH_CHECK(c.users > 0, "set_allocation_cache(False) without a matching set_allocation_cache(True)");
  if (--c.users == 0) {
    if (c.replaced != nullptr) c10::SetCPUAllocator(c.replaced);
    c.replaced = nullptr;
    release_idle(c);
  }
}

// (installs now, idle bytes) for tests and diagnostics
std::tuple<int64_t, int64_t> allocation_cache_state() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.users, static_cast<int64_t>(c.idle_bytes)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(denoiser, m) {
  m.def("set_allocation_cache(bool enable) -> ()", &set_allocation_cache);
  m.def("allocation_cache_state() -> (int, int)", &allocation_cache_state);
}
