// memprof's allocator reporter: receives every allocation and free that PyTorch's CPU and CUDA
// allocators report to the profiler slot (c10::reportMemoryUsageToProfiler) and keeps them in a
// buffer that Python drains at each record_stats(). Draining needs no profiler restart.
//
// On request it also notes every autograd node that runs in backward (memprof_nodes_on): one
// thread-local RecordFunction callback, for the BACKWARD_FUNCTION scope only, so forward operators
// cost nothing extra. It records the node's sequence number, the addresses of the gradients it
// receives, and the end of each graph task (a final callback queued on the task, as Python's
// queue_callback would). memprof/analysis/backward_replay.py turns these rows into the backward marks the
// Python node pre-hooks would have made, without a Python call per node.
//
// C ABI only (loaded with ctypes); no C++ exception crosses it: every entry point catches and
// returns an error code.
#include <ATen/record_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace {

using torch::profiler::impl::ActiveProfilerType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;
using torch::profiler::impl::ProfilerStateBase;

constexpr int kColumns = 7;  // time_ns, ptr, size, total_allocated, total_reserved, device_type, device_index
using Row = std::array<int64_t, kColumns>;
// Node rows: {kind, a, b, c, d}. kNodeRun: {time_ns, sequence_nr, graph_task_id, forward_thread_id};
// kNodeGrad (after its run): {input index, storage address, tensor bytes, 0}; kTaskEnd: {time_ns,
// graph_task_id, 0, 0}.
constexpr int kNodeColumns = 5;
constexpr int64_t kNodeRun = 0, kNodeGrad = 1, kTaskEnd = 2;
using NodeRow = std::array<int64_t, kNodeColumns>;

int64_t now_ns() {
  // The clock of Python's time.time_ns(), which the hooks use.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Reporter final : public ProfilerStateBase, public std::enable_shared_from_this<Reporter> {
 public:
  // The state is not Disabled so that torch.profiler sees the slot taken ("already enabled")
  // instead of silently stealing it; memory profiling is forced on below.
  Reporter() : ProfilerStateBase(ProfilerConfig(ProfilerState::CPU, false, true)) {}

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!enabled_.load(std::memory_order_relaxed)) {
      return;
    }
    const int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(mutex_);
    rows_.push_back(Row{t, static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr)), alloc_size,
                        static_cast<int64_t>(total_allocated), static_cast<int64_t>(total_reserved),
                        static_cast<int64_t>(device.type()), static_cast<int64_t>(device.index())});
    net_bytes_[device.is_cpu() ? 0 : 1] += alloc_size;
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
    nodes_.clear();
    nodes_.shrink_to_fit();
  }
  ActiveProfilerType profilerType() override { return ActiveProfilerType::NONE; }

  void node_started(const at::RecordFunction& fn) {
    if (!enabled_.load(std::memory_order_relaxed) || !nodes_on_.load(std::memory_order_relaxed)) {
      return;
    }
    const int64_t t = now_ns();
    const int64_t task = torch::autograd::get_current_graph_task_id();
    bool queue_end = false;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      nodes_.push_back(NodeRow{kNodeRun, t, fn.seqNr(), task, static_cast<int64_t>(fn.forwardThreadId())});
      if (fn.needsInputs()) {
        const auto inputs = fn.inputs();
        for (size_t k = 0; k < inputs.size(); ++k) {
          add_grad(static_cast<int64_t>(k), inputs[k]);
        }
      }
      if (task >= 0 && std::find(open_tasks_.begin(), open_tasks_.end(), task) == open_tasks_.end()) {
        open_tasks_.push_back(task);
        queue_end = true;
      }
    }
    if (queue_end) {
      std::weak_ptr<Reporter> self = weak_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([self, task] {
        if (auto reporter = self.lock()) {
          reporter->task_ended(task);
        }
      });
    }
  }

  void set_nodes_on(bool on) { nodes_on_.store(on); }

  int64_t nodes_pending() { return count(nodes_); }
  int64_t nodes_drain(int64_t* out, int64_t max_rows) { return take(nodes_, out, max_rows); }
  int64_t pending() { return count(rows_); }
  int64_t drain(int64_t* out, int64_t max_rows) { return take(rows_, out, max_rows); }

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
  std::mutex mutex_;
  std::vector<Row> rows_;
  std::atomic<bool> nodes_on_{false};
  std::vector<NodeRow> nodes_;
  std::vector<int64_t> open_tasks_;  // graph tasks with an end callback queued

  template <typename R>
  int64_t count(const std::vector<R>& rows) {
    std::lock_guard<std::mutex> guard(mutex_);
    return static_cast<int64_t>(rows.size());
  }

  // Moves up to max_rows of the oldest rows into out (int64 columns); returns how many.
  template <typename R>
  int64_t take(std::vector<R>& rows, int64_t* out, int64_t max_rows) {
    std::lock_guard<std::mutex> guard(mutex_);
    const int64_t n = std::min<int64_t>(max_rows, static_cast<int64_t>(rows.size()));
    if (n > 0) {
      std::memcpy(out, rows.data(), sizeof(R) * static_cast<size_t>(n));
      rows.erase(rows.begin(), rows.begin() + n);
    }
    return n;
  }

  // Called with mutex_ held.
  void add_grad(int64_t index, const c10::IValue& value) {
    if (!value.isTensor()) {
      return;
    }
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined() || !tensor.has_storage()) {
      return;  // no gradient for this output, or a sparse one
    }
    try {
      const auto ptr = reinterpret_cast<uintptr_t>(tensor.storage().data());
      nodes_.push_back(NodeRow{kNodeGrad, index, static_cast<int64_t>(ptr), static_cast<int64_t>(tensor.nbytes()), 0});
    } catch (...) {  // a tensor whose storage cannot be read (a functional or fake tensor)
    }
  }

  void task_ended(int64_t task) {
    const int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(mutex_);
    open_tasks_.erase(std::remove(open_tasks_.begin(), open_tasks_.end(), task), open_tasks_.end());
    if (enabled_.load(std::memory_order_relaxed)) {
      nodes_.push_back(NodeRow{kTaskEnd, t, task, 0, 0});
    }
  }
  int64_t net_bytes_[2] = {0, 0};
  Row oom_{};
};

struct Handle {
  std::shared_ptr<Reporter> reporter = std::make_shared<Reporter>();
  at::CallbackHandle node_callback = 0;
};

// Runs on whichever thread executes the node: the reporter is found in that thread's profiler slot,
// which autograd carries from the thread that called backward.
std::unique_ptr<at::ObserverContext> on_node_start(const at::RecordFunction& fn) {
  if (auto* reporter = dynamic_cast<Reporter*>(ProfilerStateBase::get(/*global=*/false))) {
    reporter->node_started(fn);
  }
  return nullptr;
}

}  // namespace

extern "C" {

int memprof_abi_version() { return 2; }

void* memprof_create() {
  try {
    return new Handle();
  } catch (...) {
    return nullptr;
  }
}

void memprof_destroy(void* h) {
  auto* handle = static_cast<Handle*>(h);
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

int64_t memprof_pending(void* h) { return static_cast<Handle*>(h)->reporter->pending(); }

int64_t memprof_drain(void* h, int64_t* out, int64_t max_rows) {
  return static_cast<Handle*>(h)->reporter->drain(out, max_rows);
}

int64_t memprof_net_bytes(void* h, int cuda) { return static_cast<Handle*>(h)->reporter->net_bytes(cuda); }

// Starts noting backward nodes run on this thread (and the autograd threads it starts). 0: ok; 2: error.
int memprof_nodes_on(void* h) {
  try {
    auto* handle = static_cast<Handle*>(h);
    if (handle->node_callback == 0) {
      handle->node_callback = at::addThreadLocalCallback(
          at::RecordFunctionCallback(&on_node_start).needsInputs(true).scopes({at::RecordScope::BACKWARD_FUNCTION}));
    }
    handle->reporter->set_nodes_on(true);
    return 0;
  } catch (...) {
    return 2;
  }
}

// Stops it; call on the thread that called memprof_nodes_on (the callback is thread-local there).
int memprof_nodes_off(void* h) {
  try {
    auto* handle = static_cast<Handle*>(h);
    handle->reporter->set_nodes_on(false);
    if (handle->node_callback != 0) {
      at::removeCallback(handle->node_callback);
      handle->node_callback = 0;
    }
    return 0;
  } catch (...) {
    return 2;
  }
}

// RecordFunction's id for this thread: a node's forward_thread_id when it was made here.
int64_t memprof_thread_id() { return static_cast<int64_t>(at::RecordFunction::currentThreadId()); }

// Whether this thread has any thread-local RecordFunction callback (1) or none (0): lets tests check
// that closing the profiler removed the one memprof_nodes_on added.
int memprof_thread_callbacks() { return at::hasThreadLocalCallbacks() ? 1 : 0; }

int64_t memprof_nodes_pending(void* h) { return static_cast<Handle*>(h)->reporter->nodes_pending(); }

int64_t memprof_nodes_drain(void* h, int64_t* out, int64_t max_rows) {
  return static_cast<Handle*>(h)->reporter->nodes_drain(out, max_rows);
}

int64_t memprof_last_oom(void* h, int64_t* out) { return static_cast<Handle*>(h)->reporter->last_oom(out); }

}  // extern "C"
