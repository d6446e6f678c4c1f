// C = op(A) op(B) in float32 through a CBLAS sgemm, as an XLA FFI handler (dense_rnn/blas.py).
//
// The product is cut into as many row (or column) blocks of C as XLA's intra-op thread pool
// has threads; the calling thread and tasks on the pool take blocks until none is left, each
// block a single-threaded sgemm, so BLAS threads never compete with XLA's.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// cblas_sgemm with 64-bit integers (OpenBLAS built with INTERFACE64, as NumPy ships it).
using Sgemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t,
                       const float*, int64_t, float, float*, int64_t);
using SetThreadsLocal = int (*)(int);  // openblas_set_num_threads_local

static Sgemm g_sgemm = nullptr;
static SetThreadsLocal g_set_threads_local = nullptr;

extern "C" void dense_rnn_set_blas(void* sgemm, void* set_threads_local) {
  g_sgemm = reinterpret_cast<Sgemm>(sgemm);
  g_set_threads_local = reinterpret_cast<SetThreadsLocal>(set_threads_local);
}

namespace {

using Matrix = ffi::Buffer<ffi::F32, 2>;
using ResultMatrix = ffi::ResultBuffer<ffi::F32, 2>;
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Blocks {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

ffi::Error Gemm(ffi::ThreadPool pool, Matrix a, Matrix b, ResultMatrix c, bool trans_a,
                bool trans_b) {
  if (g_sgemm == nullptr) return ffi::Error::Internal("dense_rnn_sgemm: no BLAS set");
  const auto ad = a.dimensions(), bd = b.dimensions();
  const int64_t m = trans_a ? ad[1] : ad[0], k = trans_a ? ad[0] : ad[1];
  const int64_t n = trans_b ? bd[0] : bd[1], lda = ad[1], ldb = bd[1];
  if ((trans_b ? bd[1] : bd[0]) != k) {
    return ffi::Error::InvalidArgument("dense_rnn_sgemm: contracted sizes differ");
  }
  if (c->dimensions()[0] != m || c->dimensions()[1] != n) {
    return ffi::Error::InvalidArgument("dense_rnn_sgemm: result shape differs");
  }
  float* pc = c->typed_data();
  if (m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {  // a sum over no terms; BLAS would refuse the zero leading dimension
    std::fill(pc, pc + m * n, 0.f);
    return ffi::Error::Success();
  }
  const float* pa = a.typed_data();
  const float* pb = b.typed_data();
  const int ta = trans_a ? kTrans : kNoTrans, tb = trans_b ? kTrans : kNoTrans;
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t count = std::clamp<int64_t>(std::min(pool.num_threads(), extent / 16), 1, 64);
  auto block = [=](int64_t i) {
    const int64_t lo = extent * i / count, hi = extent * (i + 1) / count;
    if (g_set_threads_local != nullptr) g_set_threads_local(1);
    if (by_rows) {
      g_sgemm(kRowMajor, ta, tb, hi - lo, n, k, 1.f, trans_a ? pa + lo : pa + lo * lda, lda, pb,
              ldb, 0.f, pc + lo * n, n);
    } else {
      g_sgemm(kRowMajor, ta, tb, m, hi - lo, k, 1.f, pa, lda, trans_b ? pb + lo * ldb : pb + lo,
              ldb, 0.f, pc + lo, n);
    }
  };
  if (count == 1) {
    block(0);
    return ffi::Error::Success();
  }
  auto blocks = std::make_shared<Blocks>();
  auto take = [=] {
    for (int64_t i; (i = blocks->next.fetch_add(1)) < count;) {
      block(i);
      blocks->done.fetch_add(1);
    }
  };
  for (int64_t t = 1; t < count; ++t) pool.Schedule([take] { take(); });
  take();
  while (blocks->done.load() < count) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnSgemm, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Matrix>()
                                  .Arg<Matrix>()
                                  .Ret<Matrix>()
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b"));
