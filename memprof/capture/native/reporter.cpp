// memprof's allocator reporter: receives every allocation and free that PyTorch's CPU and CUDA
// allocators report to the profiler slot (c10::reportMemoryUsageToProfiler) and keeps them in a
// buffer that Python drains at each record_stats(). Draining needs no profiler restart.
//
// C ABI only (loaded with ctypes); no C++ exception crosses it: every entry point catches and
// returns an error code.
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

namespace {

// c10's CPU allocator logs "Memory block of unknown size was allocated before the profiling started" at the first
// free, while memory profiling is on, of a block it did not see allocated, and at every 1000th after that
// (ProfiledCPUMemoryReporter::Delete: `if (log_cnt_++ % 1000 == 0)`). memprof expects such frees (blocks older than
// profiling: it watches their deaths with finalizers), so while it records it keeps that counter, and only that
// one, off a multiple of 1000: set to 1 when it starts, at every drain and at every 64th CPU event it records (the
// line then shows only where 999 such blocks are freed with fewer than 64 allocations or frees of known blocks
// between them). The counter is private; an explicit instantiation may name it ([temp.spec.general]/6).
// Only where its name is known (torch 2.x, which has the version header): elsewhere the line may show, nothing else.
// A torch whose allocator no longer has these members fails this part to compile: the build then compiles again
// with MEMPROF_NO_QUIET_FREES (memprof/capture/native/build.py), and only the line comes back.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR == 2 && !defined(MEMPROF_NO_QUIET_FREES)
template <typename Tag, typename Tag::type Member>
struct Expose {
  friend typename Tag::type member(Tag) { return Member; }
};
struct LogCount {
  using type = size_t c10::ProfiledCPUMemoryReporter::*;
  friend type member(LogCount);
};
struct LogMutex {
  using type = std::mutex c10::ProfiledCPUMemoryReporter::*;
  friend type member(LogMutex);
};
template struct Expose<LogCount, &c10::ProfiledCPUMemoryReporter::log_cnt_>;
template struct Expose<LogMutex, &c10::ProfiledCPUMemoryReporter::mutex_>;

void quiet_unknown_frees() {
  auto& reporter = c10::profiledCPUMemoryReporter();
  std::lock_guard<std::mutex> guard(reporter.*member(LogMutex{}));
  reporter.*member(LogCount{}) = 1;
}
#else
void quiet_unknown_frees() {}
#endif

using torch::profiler::impl::ActiveProfilerType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;
using torch::profiler::impl::ProfilerStateBase;

constexpr int kColumns = 7;  // time_ns, ptr, size, total_allocated, total_reserved, device_type, device_index
using Row = std::array<int64_t, kColumns>;
constexpr int64_t kOtherDevice = 1;  // drain's flags (info[0])
constexpr int64_t kUnordered = 2;

int64_t now_ns() {
  // The clock of Python's time.time_ns(), which the hooks use.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Reporter final : public ProfilerStateBase {
 public:
  // The state is not Disabled so that torch.profiler sees the slot taken ("already enabled")
  // instead of silently stealing it; memory profiling is forced on below.
  Reporter() : ProfilerStateBase(ProfilerConfig(ProfilerState::CPU, false, true)) {}

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!enabled_.load(std::memory_order_relaxed)) {
      return;
    }
    // c10 reports after releasing its own lock, so taking it here cannot deadlock; every 64th CPU event keeps
    // the unknown-free counter off 1000 between drains, where a long step frees many blocks older than profiling.
    if (device.is_cpu() && (cpu_events_.fetch_add(1, std::memory_order_relaxed) & 63) == 0) {
      try {
        quiet_unknown_frees();
      } catch (...) {  // (the line may show; the event is recorded all the same)
      }
    }
    const int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(mutex_);
    rows_.push_back(Row{t, static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr)), alloc_size,
                        static_cast<int64_t>(total_allocated), static_cast<int64_t>(total_reserved),
                        static_cast<int64_t>(device.type()), static_cast<int64_t>(device.index())});
    net_bytes_[device.is_cpu() ? 0 : 1] += alloc_size;
  }

  // A free made on a thread whose slot does not hold this reporter (a communication library's own thread drops a
  // tensor's last reference): c10 reports it to that thread's slot, i.e. to nobody. Its size is left -1, "the
  // block at this address" (the analysis knows each block's bytes), and the totals -1, unknown.
  void reportForeignFree(void* ptr) {
    if (!enabled_.load(std::memory_order_relaxed)) {
      return;
    }
    const int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(mutex_);
    rows_.push_back(Row{t, static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr)), -1, -1, -1,
                        static_cast<int64_t>(c10::DeviceType::CPU), -1});
    foreign_frees_ += 1;
  }

  int64_t foreign_frees() {
    std::lock_guard<std::mutex> guard(mutex_);
    return foreign_frees_;
  }

  void reportOutOfMemory(int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    std::lock_guard<std::mutex> guard(mutex_);
    oom_ = Row{now_ns(), 0, alloc_size, static_cast<int64_t>(total_allocated),
               static_cast<int64_t>(total_reserved), static_cast<int64_t>(device.type()),
               static_cast<int64_t>(device.index())};
  }

  bool memoryProfilingEnabled() const override { return enabled_.load(std::memory_order_relaxed); }

  // A reporter whose Python owner is gone may still sit in another thread's slot (the owner could
  // only take it out of its own): it stops recording so that its buffer cannot grow.
  void disable() {
    enabled_.store(false);
    std::lock_guard<std::mutex> guard(mutex_);
    rows_.clear();
    rows_.shrink_to_fit();
  }
  ActiveProfilerType profilerType() override { return ActiveProfilerType::NONE; }

  // Moves up to max_rows of the oldest rows into out, column by column (out[c * stride + i] is row i's column c:
  // each column a contiguous array for Python, which journals and compares them as such); returns how many.
  // info gets, in one call (each call through ctypes costs the training thread microseconds after a step):
  // [0] kOtherDevice when a row is not the CPU's and kUnordered when a row's time is before the one above it
  // (threads append a little out of order: Python then selects and sorts, else it does not look at the rows);
  // [1] the rows left (more than max_rows were pending); [2], [3] the net bytes the CPU and CUDA allocated.
  int64_t drain(int64_t* out, int64_t stride, int64_t max_rows, int64_t* info) {
    std::lock_guard<std::mutex> guard(mutex_);
    const int64_t n = std::min<int64_t>(max_rows, static_cast<int64_t>(rows_.size()));
    int64_t found = 0;
    int64_t last_time = INT64_MIN;
    for (int64_t i = 0; i < n; ++i) {
      const Row& row = rows_[static_cast<size_t>(i)];
      for (int c = 0; c < kColumns; ++c) {
        out[c * stride + i] = row[c];
      }
      if (row[5] != 0) {  // c10::DeviceType::CPU is 0
        found |= kOtherDevice;
      }
      if (row[0] < last_time) {
        found |= kUnordered;
      }
      last_time = row[0];
    }
    if (n > 0) {
      rows_.erase(rows_.begin(), rows_.begin() + n);
    }
    info[0] = found;
    info[1] = static_cast<int64_t>(rows_.size());
    info[2] = net_bytes_[0];
    info[3] = net_bytes_[1];
    return n;
  }

  int64_t net_bytes(int cuda) {
    std::lock_guard<std::mutex> guard(mutex_);
    return net_bytes_[cuda ? 1 : 0];
  }

  int64_t last_oom(int64_t* out) {
    std::lock_guard<std::mutex> guard(mutex_);
    std::memcpy(out, oom_.data(), sizeof(Row));
    return oom_[0] != 0;
  }

 private:
  std::atomic<bool> enabled_{true};
  std::atomic<uint32_t> cpu_events_{0};
  std::mutex mutex_;
  std::vector<Row> rows_;
  int64_t net_bytes_[2] = {0, 0};
  int64_t foreign_frees_ = 0;
  Row oom_{};
};

// The CPU allocator seen through: every CPU allocation the reporter sees (made while memprof watches, on a thread
// that carries the reporter) gets a deleter that, run on a thread whose profiler slot does not hold it, records
// the free there (reportForeignFree) before the allocator's own deleter frees it. The data pointer and its
// context stay the allocator's (context == data, as raw_allocate requires), so only the deleter differs;
// allocations whose deleter is not the allocator's raw deleter are handed out as they come. A block allocated
// while watched keeps this deleter after memprof stops: it then only calls the allocator's own.
std::mutex g_watch_mutex;
std::shared_ptr<Reporter> g_watch;              // the reporter that records foreign frees (none: not watching)
std::atomic<Reporter*> g_watch_raw{nullptr};   // the same, for the lock-free test of the common case
c10::Allocator* g_inner = nullptr;              // the CPU allocator seen through (kept for the deleters)
c10::DeleterFnPtr g_inner_deleter = nullptr;

void watching_delete(void* ptr) {
  Reporter* watching = g_watch_raw.load(std::memory_order_acquire);
  if (watching != nullptr && ProfilerStateBase::get(/*global=*/false) != watching) {
    std::shared_ptr<Reporter> reporter;
    {
      std::lock_guard<std::mutex> guard(g_watch_mutex);
      reporter = g_watch;
    }
    if (reporter) {
      reporter->reportForeignFree(ptr);
    }
  }
  g_inner_deleter(ptr);
}

class WatchingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = g_inner->allocate(n);
    // only a block whose allocation the reporter saw (made on a thread that carries it) needs its free seen
    Reporter* watching = g_watch_raw.load(std::memory_order_acquire);
    if (watching == nullptr || ProfilerStateBase::get(/*global=*/false) != watching ||
        inner.get_deleter() != g_inner_deleter || inner.get() != inner.get_context()) {
      return inner;
    }
    void* ptr = inner.release_context();
    return {ptr, ptr, &watching_delete, inner.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &watching_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_inner->copy_data(dest, src, count);
  }
};

WatchingAllocator g_watching_allocator;
constexpr uint8_t kWatchPriority = UINT8_MAX;  // above any allocator registered before (SetAllocator keeps the higher)

struct Handle {
  std::shared_ptr<Reporter> reporter = std::make_shared<Reporter>();
};

}  // namespace

extern "C" {

int memprof_abi_version() { return 6; }

void* memprof_create() {
  try {
    return new Handle();
  } catch (...) {
    return nullptr;
  }
}

int memprof_unwatch_threads(void* h);

void memprof_destroy(void* h) {
  auto* handle = static_cast<Handle*>(h);
  memprof_unwatch_threads(h);
  handle->reporter->disable();
  delete handle;
}

// 0: installed on this thread; 1: another profiler holds the slot; 2: error.
int memprof_push(void* h) {
  try {
    if (ProfilerStateBase::get() != nullptr) {
      return 1;
    }
    std::shared_ptr<ProfilerStateBase> state = static_cast<Handle*>(h)->reporter;
    ProfilerStateBase::push(std::move(state));
    quiet_unknown_frees();
    return 0;
  } catch (...) {
    return 2;
  }
}

// 0: removed; 1: this thread's slot holds something else (left alone); 2: error.
int memprof_pop(void* h) {
  try {
    if (ProfilerStateBase::get(/*global=*/false) != static_cast<Handle*>(h)->reporter.get()) {
      return 1;
    }
    ProfilerStateBase::pop(/*global=*/false);
    return 0;
  } catch (...) {
    return 2;
  }
}

// 1 when this thread's profiler slot holds this reporter.
int memprof_active(void* h) {
  try {
    return ProfilerStateBase::get(/*global=*/false) == static_cast<Handle*>(h)->reporter.get();
  } catch (...) {
    return 0;
  }
}

int64_t memprof_drain(void* h, int64_t* out, int64_t stride, int64_t max_rows, int64_t* info) {
  try {
    quiet_unknown_frees();
  } catch (...) {  // (a mutex that cannot be locked: the line may show, the events are drained all the same)
  }
  return static_cast<Handle*>(h)->reporter->drain(out, stride, max_rows, info);
}

// Starts recording the CPU frees made on other threads with this handle's reporter. 0: watching; 1: the CPU
// allocator has no raw deleter (frees on other threads stay unseen); 2: error.
int memprof_watch_threads(void* h) {
  try {
    c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
    if (current != &g_watching_allocator) {
      if (current == nullptr || current->raw_deleter() == nullptr) {
        return 1;
      }
      if (g_inner != nullptr && g_inner != current) {
        return 1;  // another allocator than the one blocks allocated before hold as their deleter's
      }
      g_inner = current;
      g_inner_deleter = current->raw_deleter();
    }
    {
      std::lock_guard<std::mutex> guard(g_watch_mutex);
      g_watch = static_cast<Handle*>(h)->reporter;
      g_watch_raw.store(g_watch.get(), std::memory_order_release);
    }
    c10::SetAllocator(c10::DeviceType::CPU, &g_watching_allocator, kWatchPriority);
    return 0;
  } catch (...) {
    return 2;
  }
}

// Stops it (when this handle's reporter is the one watching) and gives the CPU its allocator back. 0: done; 2: error.
int memprof_unwatch_threads(void* h) {
  try {
    std::lock_guard<std::mutex> guard(g_watch_mutex);
    if (g_watch.get() != static_cast<Handle*>(h)->reporter.get()) {
      return 0;
    }
    g_watch_raw.store(nullptr, std::memory_order_release);
    g_watch.reset();
    if (g_inner != nullptr && c10::GetAllocator(c10::DeviceType::CPU) == &g_watching_allocator) {
      c10::SetAllocator(c10::DeviceType::CPU, g_inner, kWatchPriority);
    }
    return 0;
  } catch (...) {
    return 2;
  }
}

int64_t memprof_foreign_frees(void* h) { return static_cast<Handle*>(h)->reporter->foreign_frees(); }

int64_t memprof_net_bytes(void* h, int cuda) { return static_cast<Handle*>(h)->reporter->net_bytes(cuda); }

int64_t memprof_last_oom(void* h, int64_t* out) { return static_cast<Handle*>(h)->reporter->last_oom(out); }

}  // extern "C"
