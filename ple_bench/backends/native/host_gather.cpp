// The CPU gather's direct path in one call: rows of host ids gathered by
// at::index_select into pinned staging, then one cudaMemcpyAsync host->device
// and one event record. Python pays one call instead of the ten-odd torch and
// ctypes calls the same work costs from Python (1-9 us each on the lent H200
// hosts: scripts/gpu/host_gather_direct.py --bisect).
//
// Built without CUDA headers: the runtime calls come in as the addresses of
// the libcudart functions that torch has loaded (ple_bench/backends/cudart.py),
// so the same source builds on a CPU-only machine, where ``copy`` is false and
// the rows go straight into a host ``out``.
#include <torch/extension.h>

#include <ctime>
#include <stdexcept>
#include <string>
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

void check(int err, const char* what) {
  if (err != 0) throw std::runtime_error(std::string(what) + " failed: cudaError " + std::to_string(err));
}

class HostGather {
 public:
  // table: uint8 [rows, row_bytes] on the host. out_dtype / out_device / width:
  // what ``lookup`` allocates ([tokens, width]). memcpy/record/sync and event:
  // 0 on the host (functional mode).
  HostGather(at::Tensor table, at::ScalarType out_dtype, std::string out_device, int64_t width,
             int64_t threads, int64_t memcpy_addr, int64_t record_addr, int64_t sync_addr, int64_t event)
      : table_(std::move(table)),
        row_bytes_(table_.size(1)),
        width_(width),
        threads_(int(threads)),
        out_opts_(at::TensorOptions().dtype(out_dtype).device(at::Device(out_device))),
        memcpy_(reinterpret_cast<memcpy_fn>(memcpy_addr)),
        record_(reinterpret_cast<record_fn>(record_addr)),
        sync_(reinterpret_cast<sync_fn>(sync_addr)),
        event_(reinterpret_cast<void*>(event)) {
    TORCH_CHECK(table_.dim() == 2 && table_.scalar_type() == at::kByte && table_.is_contiguous(),
                "table must be a contiguous uint8 [rows, row_bytes] host tensor");
    TORCH_CHECK(!copies() || (record_ && sync_ && event_), "a copying HostGather needs record, sync and an event");
  }

  bool copies() const { return memcpy_ != nullptr; }

  // pinned uint8 [capacity, row_bytes]; the caller sizes it (waits for nothing: call
  // ``wait`` first if the last copy may still read the old one)
  void set_staging(at::Tensor staging) {
    TORCH_CHECK(staging.dim() == 2 && staging.size(1) == row_bytes_ && staging.scalar_type() == at::kByte &&
                    staging.is_contiguous(),
                "staging must be a contiguous uint8 [capacity, row_bytes] tensor");
    staging_ = std::move(staging);
  }

  int64_t capacity() const { return staging_.defined() ? staging_.size(0) : 0; }

  // wait (on the host) for the last copy out of staging
  void wait() {
    if (in_use_) {
      check(sync_(event_), "cudaEventSynchronize");
      in_use_ = false;
    }
  }

  // rows of ``ids`` ([tokens, heads] int64/int32, host) into ``out`` (contiguous,
  // tokens*heads*row_bytes bytes; on the device when copying, on ``stream``).
  // Returns the calling thread's CPU seconds spent in the gather. With ``pieces``, the
  // wall time (us) of each piece is appended: flatten, wait, narrow, gather, copy, record.
  double rows(const at::Tensor& ids, const at::Tensor& out, int64_t stream, std::vector<double>* pieces = nullptr) {
    Ticks tick{pieces, pieces ? now_us() : 0.0};
    const at::Tensor flat = ids.reshape({-1});
    const int64_t n = flat.numel();
    TORCH_CHECK(out.is_contiguous() && out.numel() * out.element_size() == n * row_bytes_,
                "out must be contiguous with ", n * row_bytes_, " bytes");
    tick();
    const int prev = at::get_num_threads();
    if (threads_ != prev) at::set_num_threads(threads_);
    double spent = 0.0;
    try {
      if (!copies()) {
        at::Tensor dest = at::from_blob(out.data_ptr(), {n, row_bytes_}, at::TensorOptions().dtype(at::kByte));
        const double t0 = thread_cpu_s();
        at::index_select_out(dest, table_, 0, flat);
        spent = thread_cpu_s() - t0;
      } else {
        TORCH_CHECK(n <= capacity(), "staging holds ", capacity(), " rows, the call needs ", n);
        wait();
        tick();
        at::Tensor stage = staging_.narrow(0, 0, n);
        tick();
        const double t0 = thread_cpu_s();
        at::index_select_out(stage, table_, 0, flat);
        spent = thread_cpu_s() - t0;
        tick();
        void* s = reinterpret_cast<void*>(stream);
        check(memcpy_(out.data_ptr(), stage.data_ptr(), size_t(n * row_bytes_), kHostToDevice, s), "cudaMemcpyAsync");
        tick();
        check(record_(event_, s), "cudaEventRecord");
        in_use_ = true;
        tick();
      }
    } catch (...) {
      if (threads_ != prev) at::set_num_threads(prev);
      throw;
    }
    if (threads_ != prev) at::set_num_threads(prev);
    last_s_ = spent;
    return spent;
  }

  // a new [tokens, width] output with the rows of ``ids``
  at::Tensor lookup(const at::Tensor& ids, int64_t stream) {
    TORCH_CHECK(ids.dim() == 2, "ids must be [tokens, heads]");
    at::Tensor out = at::empty({ids.size(0), width_}, out_opts_);
    rows(ids, out, stream);
    return out;
  }

  // ``lookup`` with the wall time (us) of each of its pieces, for studies of where a call's
  // time goes (scripts/gpu/host_gather_direct.py --pieces): allocate, then ``rows``' pieces
  std::vector<double> lookup_pieces(const at::Tensor& ids, int64_t stream) {
    TORCH_CHECK(copies() && ids.dim() == 2, "lookup_pieces: a copying HostGather and [tokens, heads] ids");
    std::vector<double> t;
    const double t0 = now_us();
    at::Tensor out = at::empty({ids.size(0), width_}, out_opts_);
    t.push_back(now_us() - t0);
    rows(ids, out, stream, &t);
    return t;
  }

  double last_s() const { return last_s_; }  // the last call's gather CPU seconds

 private:
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
      .def("last_s", &HostGather::last_s);
}
