// The CPU gather's direct path in one call: the rows of host ids copied by the
// host's cores into pinned staging (one parallel loop over the rows), then one
// cudaMemcpyAsync host->device and one event record. Python pays one call
// instead of the ten-odd torch and ctypes calls the same work costs from Python
// (1-9 us each on the lent H200 hosts: scripts/gpu/host_gather_direct.py --bisect).
//
// The row loop, not at::index_select: index_select splits its rows into tasks of
// 32 KiB (204 rows of 160 B), so a 1 K-row gather ran on 5 of 16 cores, and every
// call built two tensor views (the flat ids, the staging rows) at 1-2 us each on
// those hosts. On a lent H200 host the loop (64 rows a task) took 72-89 % of
// index_select's time at 1-64 K rows of a 32 GiB table, timed interleaved; software
// prefetching a few rows ahead gained nothing there and is not done
// (docs/lookup-paths.md). ``configure``
// picks the loop's rows per task, or index_select (grain 0), for A/B studies.
//
// Errors are returned, never thrown: on the lent H200 image (g++ 13, torch 2.11) any
// exception thrown from this module's own code -- a failed TORCH_CHECK or one thrown
// here -- crashed the process with a segfault,
// while the same errors raised inside libtorch (index_select's) reached Python. A call
// that fails returns its failure value (rows: -1, lookup: an undefined tensor, i.e.
// None; set_staging / wait: false) and ``error()`` says why, as (kind, message) with
// kind "index", "value" or "cuda"; ple_bench/backends/native/__init__.py raises it.
//
// Built without CUDA headers: the runtime calls come in as the addresses of
// the libcudart functions that torch has loaded (ple_bench/backends/cudart.py),
// so the same source builds on a CPU-only machine, where ``copy`` is false and
// the rows go straight into a host ``out``.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using memcpy_fn = int (*)(void*, const void*, size_t, int, void*);  // cudaMemcpyAsync
using record_fn = int (*)(void*, void*);                            // cudaEventRecord(event, stream)
using sync_fn = int (*)(void*);                                     // cudaEventSynchronize

constexpr int kHostToDevice = 1;

double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e6 * double(ts.tv_sec) + 1e-3 * double(ts.tv_nsec);
}

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// appends the wall time since the last mark to ``t`` (nothing when ``t`` is null)
struct Ticks {
  std::vector<double>* t;
  double last;
  void operator()() {
    if (t != nullptr) {
      const double now = now_us();
      t->push_back(now - last);
      last = now;
    }
  }
};

// rows ``ids[0..n)`` of ``table`` (``table_rows`` x ``rb`` bytes) into ``dst``, in parallel
// tasks of at least ``grain`` rows (torch's intra-op threads: at::parallel_for, built with
// -fopenmp so that it is torch's own OpenMP team). Returns the position of an id outside
// the table (the first one a task met), or -1.
template <typename I>
int64_t copy_rows(const I* ids, int64_t n, const uint8_t* table, int64_t table_rows, int64_t rb, uint8_t* dst,
                  int64_t grain) {
  std::atomic<int64_t> bad{-1};
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t id = uint64_t(ids[i]);  // a negative id wraps past the table
      if (id >= uint64_t(table_rows)) {
        int64_t none = -1;
        bad.compare_exchange_strong(none, i);
        return;
      }
      std::memcpy(dst + i * rb, table + id * uint64_t(rb), size_t(rb));
    }
  });
  return bad.load();
}

class HostGather {
 public:
  // table: uint8 [rows, row_bytes] on the host, contiguous. out_dtype / out_device / width:
  // what ``lookup`` allocates ([tokens, width]). memcpy/record/sync and event: 0 on the
  // host (functional mode). A bad argument leaves ``error()`` set (nothing is thrown).
  HostGather(at::Tensor table, at::ScalarType out_dtype, std::string out_device, int64_t width,
             int64_t threads, int64_t memcpy_addr, int64_t record_addr, int64_t sync_addr, int64_t event)
      : table_(std::move(table)),
        row_bytes_(table_.dim() == 2 ? table_.size(1) : 0),
        width_(width),
        threads_(int(threads)),
        out_opts_(at::TensorOptions().dtype(out_dtype).device(at::Device(out_device))),
        memcpy_(reinterpret_cast<memcpy_fn>(memcpy_addr)),
        record_(reinterpret_cast<record_fn>(record_addr)),
        sync_(reinterpret_cast<sync_fn>(sync_addr)),
        event_(reinterpret_cast<void*>(event)) {
    if (!(table_.dim() == 2 && table_.scalar_type() == at::kByte && table_.is_contiguous() && table_.device().is_cpu()))
      valid_ = fail("value", "table must be a contiguous uint8 [rows, row_bytes] host tensor");
    else if (copies() && !(record_ && sync_ && event_))
      valid_ = fail("value", "a copying HostGather needs record, sync and an event");
  }

  bool copies() const { return memcpy_ != nullptr; }

  // (kind, message) of the last failure ("", "" when none)
  std::vector<std::string> error() const { return {err_kind_, err_msg_}; }

  // pinned uint8 [capacity, row_bytes]; the caller sizes it (waits for nothing: call
  // ``wait`` first if the last copy may still read the old one). False: not taken.
  bool set_staging(at::Tensor staging) {
    if (!(staging.dim() == 2 && staging.size(1) == row_bytes_ && staging.scalar_type() == at::kByte &&
          staging.is_contiguous()))
      return fail("value", "staging must be a contiguous uint8 [capacity, row_bytes] tensor");
    staging_ = std::move(staging);
    return true;
  }

  int64_t capacity() const { return staging_.defined() ? staging_.size(0) : 0; }

  // wait (on the host) for the last copy out of staging
  bool wait() {
    if (in_use_) {
      in_use_ = false;
      if (const int e = sync_(event_)) return fail("cuda", "cudaEventSynchronize failed: cudaError " + std::to_string(e));
    }
    return true;
  }

  // the row loop's rows per task (0: at::index_select instead of the loop), for A/B studies
  bool configure(int64_t grain) {
    if (grain < 0) return fail("value", "grain must be >= 0, got " + std::to_string(grain));
    grain_ = grain;
    return true;
  }

  int64_t grain() const { return grain_; }

  // rows of ``ids`` ([tokens, heads] int64/int32, host) into ``out`` (contiguous,
  // tokens*heads*row_bytes bytes; on the device when copying, on ``stream``).
  // Returns the calling thread's CPU seconds spent in the gather, -1 on failure. With
  // ``pieces``, the wall time (us) of each piece is appended: check, wait, gather, copy, record.
  double rows(const at::Tensor& ids_in, const at::Tensor& out, int64_t stream, std::vector<double>* pieces = nullptr) {
    Ticks tick{pieces, pieces ? now_us() : 0.0};
    if (!valid_) return fail("value", "HostGather was built with bad arguments"), -1.0;
    if (!(ids_in.device().is_cpu() && (ids_in.scalar_type() == at::kLong || ids_in.scalar_type() == at::kInt)))
      return fail("value", "ids must be an int64 or int32 host tensor"), -1.0;
    const at::Tensor ids = ids_in.is_contiguous() ? ids_in : ids_in.contiguous();
    const int64_t n = ids.numel();
    if (!(out.is_contiguous() && out.numel() * out.element_size() == n * row_bytes_))
      return fail("value", "out must be contiguous with " + std::to_string(n * row_bytes_) + " bytes"), -1.0;
    tick();
    uint8_t* dst = nullptr;
    if (copies()) {
      if (n > capacity())
        return fail("value", "staging holds " + std::to_string(capacity()) + " rows, the call needs " +
                                 std::to_string(n)), -1.0;
      if (!wait()) return -1.0;
      dst = static_cast<uint8_t*>(staging_.data_ptr());
    } else {
      dst = static_cast<uint8_t*>(out.data_ptr());
    }
    tick();
    const int prev = at::get_num_threads();
    if (threads_ != prev) at::set_num_threads(threads_);
    const double t0 = thread_cpu_s();
    const bool ok = gather(ids, n, dst);
    const double spent = thread_cpu_s() - t0;
    if (threads_ != prev) at::set_num_threads(prev);
    if (!ok) return -1.0;
    tick();
    if (copies()) {
      void* s = reinterpret_cast<void*>(stream);
      if (const int e = memcpy_(out.data_ptr(), dst, size_t(n * row_bytes_), kHostToDevice, s))
        return fail("cuda", "cudaMemcpyAsync failed: cudaError " + std::to_string(e)), -1.0;
      tick();
      if (const int e = record_(event_, s))
        return fail("cuda", "cudaEventRecord failed: cudaError " + std::to_string(e)), -1.0;
      in_use_ = true;
      tick();
    }
    last_s_ = spent;
    return spent;
  }

  // a new [tokens, width] output with the rows of ``ids``; undefined (None) on failure
  at::Tensor lookup(const at::Tensor& ids, int64_t stream) {
    if (ids.dim() != 2) return fail("value", "ids must be [tokens, heads]"), at::Tensor();
    at::Tensor out = alloc(ids.size(0));
    if (!out.defined() || rows(ids, out, stream) < 0) return at::Tensor();
    return out;
  }

  // ``lookup`` with the wall time (us) of each of its pieces, for studies of where a call's
  // time goes (scripts/gpu/host_gather_direct.py --pieces): allocate, then ``rows``' pieces;
  // empty on failure
  std::vector<double> lookup_pieces(const at::Tensor& ids, int64_t stream) {
    if (!copies() || ids.dim() != 2)
      return fail("value", "lookup_pieces: a copying HostGather and [tokens, heads] ids"), std::vector<double>();
    std::vector<double> t;
    const double t0 = now_us();
    at::Tensor out = alloc(ids.size(0));
    t.push_back(now_us() - t0);
    if (!out.defined() || rows(ids, out, stream, &t) < 0) return {};
    return t;
  }

  double last_s() const { return last_s_; }  // the last call's gather CPU seconds

 private:
  // a new [tokens, width] output (undefined on failure: an allocator error is libtorch's, caught)
  at::Tensor alloc(int64_t tokens) {
    try {
      return at::empty({tokens, width_}, out_opts_);
    } catch (const std::exception& e) {
      fail("cuda", e.what());
      return at::Tensor();
    }
  }

  bool fail(const char* kind, std::string msg) {
    err_kind_ = kind;
    err_msg_ = std::move(msg);
    return false;
  }

  // the rows of ``ids`` (n of them, contiguous) into ``dst`` (n * row_bytes bytes)
  bool gather(const at::Tensor& ids, int64_t n, uint8_t* dst) {
    const auto* table = static_cast<const uint8_t*>(table_.data_ptr());
    const int64_t table_rows = table_.size(0);
    if (grain_ == 0) {  // torch's own gather, for A/B studies (its errors are libtorch's: caught here)
      try {
        at::Tensor d = at::from_blob(dst, {n, row_bytes_}, at::TensorOptions().dtype(at::kByte));
        at::index_select_out(d, table_, 0, ids.reshape({-1}));
      } catch (const c10::IndexError& e) {
        return fail("index", e.what_without_backtrace());
      } catch (const std::exception& e) {
        return fail("value", e.what());
      }
      return true;
    }
    int64_t bad = -1;
    int64_t id = 0;
    if (ids.scalar_type() == at::kLong) {
      const auto* p = ids.data_ptr<int64_t>();
      bad = copy_rows(p, n, table, table_rows, row_bytes_, dst, grain_);
      if (bad >= 0) id = p[bad];
    } else {
      const auto* p = ids.data_ptr<int32_t>();
      bad = copy_rows(p, n, table, table_rows, row_bytes_, dst, grain_);
      if (bad >= 0) id = p[bad];
    }
    if (bad >= 0)
      return fail("index", "index " + std::to_string(id) + " (position " + std::to_string(bad) +
                               ") is out of range for a table of " + std::to_string(table_rows) + " rows");
    return true;
  }

  at::Tensor table_;
  at::Tensor staging_;
  int64_t row_bytes_;
  int64_t width_;
  int threads_;
  at::TensorOptions out_opts_;
  memcpy_fn memcpy_;
  record_fn record_;
  sync_fn sync_;
  void* event_;
  bool in_use_ = false;
  double last_s_ = 0.0;
  int64_t grain_ = 64;  // rows per task of the row loop (0: at::index_select)
  bool valid_ = true;  // the constructor's arguments were good
  std::string err_kind_;
  std::string err_msg_;
};

// ---------------------------------------------------------------- the host node
using host_fn = void (*)(void*);
using launch_host_fn = int (*)(void*, host_fn, void*);  // cudaLaunchHostFunc(stream, fn, user_data)

// One host node's work: the rows of ``n`` ids (read from ``ids`` when the node runs) into
// ``staging``. Owned by a HostGraphGather; retired (``table`` null) when it closes and then
// kept for the process (a graph captured with it may still be replayed: the node then only
// counts a stale run, it touches no freed memory).
struct HostTask {
  const uint8_t* table = nullptr;
  int64_t table_rows = 0;
  int64_t rb = 0;
  const void* ids = nullptr;
  bool ids32 = false;
  int64_t n = 0;
  uint8_t* staging = nullptr;
  int threads = 1;
  int64_t grain = 64;
  std::atomic<int64_t> bad_pos{-1};  // the first id past the table a run met (position), -1: none
  std::atomic<int64_t> bad_id{0};
  std::atomic<int64_t> runs{0};
  std::atomic<int64_t> stale_runs{0};  // runs after the owner closed (nothing done)
  std::atomic<int64_t> last_start_ns{0};  // CLOCK_MONOTONIC of the last run's start / end
  std::atomic<int64_t> last_end_ns{0};
  std::atomic<int64_t> total_ns{0};  // wall time of every run together
  std::atomic<int64_t> cpu_ns{0};  // CPU time of the thread that ran the node, every run together
};

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + int64_t(ts.tv_nsec);
}

// row ``i`` of ``ids`` into ``dst`` (row ``i``): false, and the row filled with 0x7F bytes (never a
// valid row: e4m3 NaN), for an id past the table (a negative id wraps past it)
template <typename I>
inline bool copy_row(const I* ids, int64_t i, const uint8_t* table, int64_t table_rows, int64_t rb, uint8_t* dst) {
  const uint64_t id = uint64_t(ids[i]);
  if (id >= uint64_t(table_rows)) {
    std::memset(dst + i * rb, 0x7F, size_t(rb));
    return false;
  }
  std::memcpy(dst + i * rb, table + id * uint64_t(rb), size_t(rb));
  return true;
}

// every row of ``ids``: a row whose id is past the table is filled with 0x7F bytes (never a
// valid row: e4m3 NaN) and the first such position is returned (-1: none). OpenMP tasks of
// ``grain`` rows on ``threads`` threads of the calling thread's team (no team for one thread).
template <typename I>
int64_t copy_all_rows(const I* ids, int64_t n, const uint8_t* table, int64_t table_rows, int64_t rb, uint8_t* dst,
                      int threads, int64_t grain) {
  std::atomic<int64_t> bad{-1};
  const int64_t tasks = (n + grain - 1) / grain;
  const int nt = int(std::max<int64_t>(1, std::min<int64_t>(threads, tasks)));
  auto body = [&](int64_t t) {
    const int64_t end = std::min(n, (t + 1) * grain);
    for (int64_t i = t * grain; i < end; ++i) {
      if (!copy_row(ids, i, table, table_rows, rb, dst)) {
        int64_t none = -1;
        bad.compare_exchange_strong(none, i);
      }
    }
  };
  if (nt == 1) {
    for (int64_t t = 0; t < tasks; ++t) body(t);
  } else {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < tasks; ++t) body(t);
  }
  return bad.load();
}

// the host node (runs on the CUDA driver's callback thread, or on the caller's for ``run``)
void run_host_task(void* p) {
  auto* t = static_cast<HostTask*>(p);
  const int64_t t0 = now_ns();
  const double c0 = thread_cpu_s();
  t->last_start_ns.store(t0);
  if (t->table == nullptr) {
    t->stale_runs.fetch_add(1);
    return;
  }
  int64_t bad = -1;
  int64_t id = 0;
  if (t->ids32) {
    const auto* q = static_cast<const int32_t*>(t->ids);
    bad = copy_all_rows(q, t->n, t->table, t->table_rows, t->rb, t->staging, t->threads, t->grain);
    if (bad >= 0) id = q[bad];
  } else {
    const auto* q = static_cast<const int64_t*>(t->ids);
    bad = copy_all_rows(q, t->n, t->table, t->table_rows, t->rb, t->staging, t->threads, t->grain);
    if (bad >= 0) id = q[bad];
  }
  if (bad >= 0) {
    int64_t none = -1;
    if (t->bad_pos.compare_exchange_strong(none, bad)) t->bad_id.store(id);
  }
  const int64_t t1 = now_ns();
  t->last_end_ns.store(t1);
  t->total_ns.fetch_add(t1 - t0);
  t->cpu_ns.fetch_add(int64_t(1e9 * (thread_cpu_s() - c0)));
  t->runs.fetch_add(1);
}

// tasks of closed HostGraphGathers: kept for the process (see HostTask)
std::mutex retired_mu;
std::vector<std::unique_ptr<HostTask>>* retired_tasks = new std::vector<std::unique_ptr<HostTask>>();

class HostGraphGather {
 public:
  // table: uint8 [rows, row_bytes] host tensor, contiguous (its first ``valid_rows`` rows are
  // read); launch: the address of cudaLaunchHostFunc (0 on a host without CUDA: ``run`` only)
  HostGraphGather(at::Tensor table, int64_t valid_rows, int64_t threads, int64_t grain, int64_t launch_addr)
      : table_(std::move(table)),
        valid_rows_(valid_rows),
        threads_(int(threads)),
        grain_(grain),
        launch_(reinterpret_cast<launch_host_fn>(launch_addr)) {
    if (!(table_.dim() == 2 && table_.scalar_type() == at::kByte && table_.is_contiguous() && table_.device().is_cpu()))
      valid_ = fail("value", "table must be a contiguous uint8 [rows, row_bytes] host tensor");
    else if (valid_rows < 0 || valid_rows > table_.size(0))
      valid_ = fail("value", "valid_rows must be within the table's rows");
    else if (threads < 1 || grain < 1)
      valid_ = fail("value", "threads and grain must be >= 1");
  }

  ~HostGraphGather() { retire(); }

  std::vector<std::string> error() const { return {err_kind_, err_msg_}; }

  // a new task: ``n`` ids (int64, or int32 with ``ids32``) at host address ``ids``, rows into
  // ``staging`` (host address, n * row_bytes bytes); its index, -1 on failure
  int64_t task(int64_t ids, int64_t n, bool ids32, int64_t staging) {
    if (!valid_) return fail("value", "HostGraphGather was built with bad arguments"), -1;
    if (ids == 0 || staging == 0 || n < 0) return fail("value", "task: null ids or staging, or n < 0"), -1;
    auto t = std::make_unique<HostTask>();
    t->table = static_cast<const uint8_t*>(table_.data_ptr());
    t->table_rows = valid_rows_;
    t->rb = table_.size(1);
    t->ids = reinterpret_cast<const void*>(ids);
    t->ids32 = ids32;
    t->n = n;
    t->staging = reinterpret_cast<uint8_t*>(staging);
    t->threads = threads_;
    t->grain = grain_;
    tasks_.push_back(std::move(t));
    return int64_t(tasks_.size()) - 1;
  }

  // enqueue task ``i`` as a host function on ``stream`` (captured as a host node during a capture)
  bool launch(int64_t i, int64_t stream) {
    HostTask* t = get(i);
    if (t == nullptr) return false;
    if (launch_ == nullptr) return fail("value", "launch: no cudaLaunchHostFunc (a host without CUDA)");
    if (const int e = launch_(reinterpret_cast<void*>(stream), &run_host_task, t))
      return fail("cuda", "cudaLaunchHostFunc failed: cudaError " + std::to_string(e));
    return true;
  }

  // run task ``i`` now, on the calling thread (functional mode, tests)
  bool run(int64_t i) {
    HostTask* t = get(i);
    if (t == nullptr) return false;
    run_host_task(t);
    return true;
  }

  // (position, id) of the first id past the table any run of task ``i`` met since the last
  // ``clear``, (-1, 0) for none; read after a sync of the stream the task ran on
  std::vector<int64_t> bad(int64_t i) {
    HostTask* t = get(i);
    if (t == nullptr) return {-1, 0};
    return {t->bad_pos.load(), t->bad_id.load()};
  }

  void clear(int64_t i) {
    if (HostTask* t = get(i)) t->bad_pos.store(-1);
  }

  // (runs, stale runs, last start ns, last end ns, total ns, CPU ns of the running thread) of
  // task ``i`` (CLOCK_MONOTONIC; the CPU time is CLOCK_THREAD_CPUTIME_ID of the thread that ran it)
  std::vector<int64_t> timing(int64_t i) {
    HostTask* t = get(i);
    if (t == nullptr) return {};
    return {t->runs.load(), t->stale_runs.load(), t->last_start_ns.load(), t->last_end_ns.load(),
            t->total_ns.load(), t->cpu_ns.load()};
  }

  int64_t tasks() const { return int64_t(tasks_.size()); }

  // no task reads the table or writes staging from now on (a replay of a graph that holds one
  // counts a stale run); the tasks live on for the process, the table reference is dropped
  void retire() {
    std::lock_guard<std::mutex> lock(retired_mu);
    for (auto& t : tasks_) {
      t->table = nullptr;
      retired_tasks->push_back(std::move(t));
    }
    tasks_.clear();
    table_ = at::Tensor();
    valid_ = false;
  }

 private:
  HostTask* get(int64_t i) {
    if (i < 0 || i >= int64_t(tasks_.size())) {
      fail("value", "no task " + std::to_string(i));
      return nullptr;
    }
    return tasks_[size_t(i)].get();
  }

  bool fail(const char* kind, std::string msg) {
    err_kind_ = kind;
    err_msg_ = std::move(msg);
    return false;
  }

  at::Tensor table_;
  int64_t valid_rows_;
  int threads_;
  int64_t grain_;
  launch_host_fn launch_;
  std::vector<std::unique_ptr<HostTask>> tasks_;
  bool valid_ = true;
  std::string err_kind_;
  std::string err_msg_;
};

// ---------------------------------------------------------------- the posted gather
// The host gather started by the host itself (*posted*) right after it launches the graph that
// consumes its rows, on a persistent team of threads of its own: nothing waits for a driver
// callback thread to start it (a host node starts 24-33 us after its graph's launch on the lent
// H200 hosts). Its rows go into pinned staging in ``chunks``
// contiguous pieces; a post first zeroes the pinned flag words ``flags[2 + c]``, and once every
// row of piece c is in, the team writes the post's number (never 0) into its word, which a
// one-thread kernel of the graph polls until it is not 0, then zeroes it (backends/host_flag.py)
// before the copy of that piece. ``flags[0]`` is the post's number; ``flags[1]`` counts the polls
// that timed out (the kernel's). The caller posts only once the kernels of the previous post ran.
//
// Rows are handed out ``grain`` at a time from one counter (dynamic scheduling: no thread
// waits for a slower one's fixed share), in row order, so the pieces complete about in order.
// The counter carries the post's number beside the next grain, so a thread that wakes late
// (descheduled, asleep) claims nothing of a later post; a post is done when its last grain is,
// whichever threads did the work (a thread that never woke does not hold it up).
// An id past the table fills its row with 0x7F bytes and is recorded (``bad``). Workers spin
// for ``spin_us`` after a job, then sleep until the next post. With ``pin``, worker i is
// bound to the i-th CPU of the process's affinity mask other than the constructing thread's.
class PostedGather {
 public:
  PostedGather(at::Tensor table, int64_t valid_rows, int64_t threads, int64_t grain, int64_t spin_us, bool pin)
      : table_(std::move(table)), valid_rows_(valid_rows), grain_(grain), spin_ns_(spin_us * 1000) {
    if (!(table_.dim() == 2 && table_.scalar_type() == at::kByte && table_.is_contiguous() && table_.device().is_cpu())) {
      fail("value", "table must be a contiguous uint8 [rows, row_bytes] host tensor");
      return;
    }
    if (valid_rows < 0 || valid_rows > table_.size(0) || threads < 1 || grain < 1 || spin_us < 0) {
      fail("value", "valid_rows within the table, threads >= 1, grain >= 1, spin_us >= 0");
      return;
    }
    rb_ = table_.size(1);
    base_ = static_cast<const uint8_t*>(table_.data_ptr());
    std::vector<int> cpus;
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      const int self = sched_getcpu();
      if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &set) && c != self) cpus.push_back(c);
    }
    for (int64_t w = 0; w < threads; ++w) {
      const int cpu = cpus.empty() ? -1 : cpus[size_t(w) % cpus.size()];
      workers_.emplace_back([this, cpu] { work(cpu); });
    }
    valid_ = true;
  }

  ~PostedGather() { stop(); }

  std::vector<std::string> error() const { return {err_kind_, err_msg_}; }

  int64_t threads() const { return int64_t(workers_.size()); }

  // the first row of each of ``chunks`` pieces of an ``n``-row gather, then ``n``: the pieces
  // are whole runs of ``grain`` rows (piece of grain g: g * chunks / grains); a piece may be empty
  std::vector<int64_t> chunk_bounds(int64_t n, int64_t chunks) const {
    std::vector<int64_t> out;
    const int64_t grains = (n + grain_ - 1) / grain_;
    for (int64_t c = 0; c < chunks; ++c) out.push_back(std::min(n, grain_ * ((c * grains + chunks - 1) / chunks)));
    out.push_back(n);
    return out;
  }

  // start gathering the rows of ``n`` ids at host address ``ids`` (int64, or int32 with ``ids32``)
  // into ``staging`` (host address, n * row_bytes bytes); flags: pinned int64 [2 + chunks].
  // Waits (spinning) for the previous post's rows first. Returns the post's number, -1 on failure.
  int64_t post(int64_t ids, int64_t n, bool ids32, int64_t staging, int64_t flags, int64_t chunks) {
    if (!valid_) return fail("value", "PostedGather was built with bad arguments or stopped"), -1;
    if (ids == 0 || staging == 0 || flags == 0 || n < 0 || chunks < 1 || chunks > kMaxChunks)
      return fail("value", "post: null ids, staging or flags, n < 0, or chunks outside 1.." +
                               std::to_string(kMaxChunks)), -1;
    const int64_t grains = (n + grain_ - 1) / grain_;
    if (grains >= (int64_t(1) << 32)) return fail("value", "post: more than 2^32 grains of rows"), -1;
    wait();
    const int64_t g = posted_ + 1;
    // first: from now on no thread can claim a grain of the previous post (see rows())
    next_.store(uint64_t(g) << 32, std::memory_order_seq_cst);
    flags_ = reinterpret_cast<int64_t*>(flags);
    for (int64_t c = 0; c < chunks; ++c) __atomic_store_n(&flags_[2 + c], int64_t(0), __ATOMIC_SEQ_CST);
    ids_ = reinterpret_cast<const void*>(ids);
    ids32_ = ids32;
    n_ = n;
    grains_ = grains;
    chunks_ = chunks;
    staging_ = reinterpret_cast<uint8_t*>(staging);
    for (int64_t c = 0; c < chunks; ++c) {  // grain g is in piece g * chunks / grains (as rows() says)
      const int64_t g0 = (c * grains + chunks - 1) / chunks;
      const int64_t g1 = ((c + 1) * grains + chunks - 1) / chunks;
      remaining_[c].store(g1 - g0, std::memory_order_relaxed);
    }
    completed_.store(0, std::memory_order_relaxed);
    posted_ = g;
    __atomic_store_n(&flags_[0], g, __ATOMIC_RELEASE);
    for (int64_t c = 0; c < chunks; ++c) {  // an empty piece is in at once
      if (remaining_[c].load(std::memory_order_relaxed) == 0) __atomic_store_n(&flags_[2 + c], g, __ATOMIC_RELEASE);
    }
    const int64_t t0 = now_ns();
    post_ns_.store(t0, std::memory_order_relaxed);
    if (grains == 0) {  // nothing to gather: done now
      end_ns_.store(t0);
      done_.store(g, std::memory_order_release);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      gen_.store(g, std::memory_order_release);
    }
    cv_.notify_all();
    return g;
  }

  // until the last post's rows are all in staging (spinning on this thread)
  bool wait() {
    while (done_.load(std::memory_order_acquire) != posted_) {
      if (!valid_) return false;
      spin_pause();
    }
    return true;
  }

  int64_t posted() const { return posted_; }

  // (position, id) of the first id past the table since the last ``clear``; (-1, 0) for none
  std::vector<int64_t> bad() const { return {bad_pos_.load(), bad_id_.load()}; }

  void clear() { bad_pos_.store(-1); }

  // (posts, last post ns, last end ns, total ns post->end of the posts done, CPU ns of the workers in jobs)
  std::vector<int64_t> timing() const {
    return {posted_, post_ns_.load(), end_ns_.load(), total_ns_.load(), cpu_ns_.load()};
  }

  // the workers end (after the job in flight); the table reference is dropped
  void stop() {
    if (workers_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    table_ = at::Tensor();
    valid_ = false;
  }

 private:
  static constexpr int64_t kMaxChunks = 64;

  static void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  void work(int cpu) {
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort: unpinned if refused
    }
    int64_t seen = 0;
    for (;;) {
      int64_t until = now_ns() + spin_ns_;
      int64_t g;
      while ((g = gen_.load(std::memory_order_acquire)) == seen) {
        if (stop_.load()) return;
        if (now_ns() < until) {
          spin_pause();
          continue;
        }
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return gen_.load() != seen || stop_.load(); });
        until = now_ns() + spin_ns_;
      }
      seen = g;
      const double c0 = thread_cpu_s();
      rows(g);
      cpu_ns_.fetch_add(int64_t(1e9 * (thread_cpu_s() - c0)));
    }
  }

  // the next grain of post ``g`` (its index), or -1 when post ``g`` has none left (or is not
  // the current post any more). The job's fields read here and by the caller are stable while
  // a grain of the post is claimed and not done: the next post waits for every grain.
  int64_t claim(int64_t g) {
    uint64_t v = next_.load(std::memory_order_seq_cst);
    for (;;) {
      if (int64_t(v >> 32) != g) return -1;
      const int64_t gi = int64_t(v & 0xffffffffu);
      if (gi >= grains_) return -1;
      if (next_.compare_exchange_weak(v, v + 1, std::memory_order_seq_cst)) return gi;
    }
  }

  void rows(int64_t g) {
    for (;;) {
      const int64_t gi = claim(g);
      if (gi < 0) return;
      if (ids32_) grain_rows(static_cast<const int32_t*>(ids_), gi);
      else grain_rows(static_cast<const int64_t*>(ids_), gi);
      const int64_t c = gi * chunks_ / grains_;
      if (remaining_[c].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::atomic_thread_fence(std::memory_order_seq_cst);  // the rows before the flag, for the GPU too
        __atomic_store_n(&flags_[2 + c], g, __ATOMIC_RELEASE);
      }
      if (completed_.fetch_add(1, std::memory_order_acq_rel) + 1 == grains_) {
        const int64_t t1 = now_ns();
        end_ns_.store(t1);
        total_ns_.fetch_add(t1 - post_ns_.load());
        done_.store(g, std::memory_order_release);
      }
    }
  }

  template <typename I>
  void grain_rows(const I* ids, int64_t gi) {
    const int64_t end = std::min(n_, (gi + 1) * grain_);
    for (int64_t i = gi * grain_; i < end; ++i) {
      if (!copy_row(ids, i, base_, valid_rows_, rb_, staging_)) {
        int64_t none = -1;
        if (bad_pos_.compare_exchange_strong(none, i)) bad_id_.store(int64_t(ids[i]));
      }
    }
  }


  bool fail(const char* kind, std::string msg) {
    err_kind_ = kind;
    err_msg_ = std::move(msg);
    return false;
  }

  at::Tensor table_;
  const uint8_t* base_ = nullptr;
  int64_t valid_rows_ = 0;
  int64_t rb_ = 0;
  int64_t grain_ = 64;
  int64_t spin_ns_ = 0;
  bool valid_ = false;
  // the job: written by ``post`` before ``gen_`` (release), read by the workers after it (acquire)
  const void* ids_ = nullptr;
  bool ids32_ = false;
  int64_t n_ = 0;
  int64_t grains_ = 0;
  int64_t chunks_ = 1;
  uint8_t* staging_ = nullptr;
  int64_t* flags_ = nullptr;
  int64_t posted_ = 0;  // the last post's number (the posting thread's)
  std::atomic<int64_t> remaining_[kMaxChunks];
  std::atomic<uint64_t> next_{0};  // (post number << 32) | the next grain to claim
  std::atomic<int64_t> completed_{0};  // grains of the current post done
  std::atomic<int64_t> gen_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> bad_pos_{-1};
  std::atomic<int64_t> bad_id_{0};
  std::atomic<int64_t> post_ns_{0};
  std::atomic<int64_t> end_ns_{0};
  std::atomic<int64_t> total_ns_{0};
  std::atomic<int64_t> cpu_ns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::string err_kind_;
  std::string err_msg_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<HostGather>(m, "HostGather")
      .def(pybind11::init<at::Tensor, at::ScalarType, std::string, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t>())
      .def("set_staging", &HostGather::set_staging)
      .def("capacity", &HostGather::capacity)
      .def("wait", &HostGather::wait)
      .def("rows", [](HostGather& g, const at::Tensor& ids, const at::Tensor& out, int64_t stream) {
        return g.rows(ids, out, stream);
      })
      .def("lookup", &HostGather::lookup)
      .def("lookup_pieces", &HostGather::lookup_pieces)
      .def("last_s", &HostGather::last_s)
      .def("configure", &HostGather::configure)
      .def("grain", &HostGather::grain)
      .def("error", &HostGather::error);
  pybind11::class_<HostGraphGather>(m, "HostGraphGather")
      .def(pybind11::init<at::Tensor, int64_t, int64_t, int64_t, int64_t>())
      .def("task", &HostGraphGather::task)
      .def("launch", &HostGraphGather::launch)
      .def("run", &HostGraphGather::run, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("bad", &HostGraphGather::bad)
      .def("clear", &HostGraphGather::clear)
      .def("timing", &HostGraphGather::timing)
      .def("tasks", &HostGraphGather::tasks)
      .def("retire", &HostGraphGather::retire)
      .def("error", &HostGraphGather::error);
  pybind11::class_<PostedGather>(m, "PostedGather")
      .def(pybind11::init<at::Tensor, int64_t, int64_t, int64_t, int64_t, bool>())
      .def("threads", &PostedGather::threads)
      .def("chunk_bounds", &PostedGather::chunk_bounds)
      .def("post", &PostedGather::post, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("wait", &PostedGather::wait, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("posted", &PostedGather::posted)
      .def("bad", &PostedGather::bad)
      .def("clear", &PostedGather::clear)
      .def("timing", &PostedGather::timing)
      .def("stop", &PostedGather::stop, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("error", &PostedGather::error);
}
