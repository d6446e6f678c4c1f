// The backward pass of the softmax layer's fused cross-entropy (softmax._bwd) as one XLA FFI
// handler (dense_rnn/softmax_kernel.py): dlogits = (softmax - onehot) * g and the three
// gradients dx = dlogits W^T, dW = x^T dlogits, db = 1^T dlogits, in float32.
//
// XLA runs this as an elementwise pass that writes dlogits, a YNNPACK product for dx (whose
// contraction over the whole vocabulary ran at 0.6-0.7x its forward product's rate), an
// Eigen dot for dW beside it and a reduction for db. Here the calling thread and tasks on
// XLA's intra-op pool (OnTeam) share three stages of items (Stages), on the LSTM kernels'
// register tile:
//  0. W^T packed into panels of kNR of its columns (PackTransposed), a block of kBlock of
//     its rows at a time, each block's panels side by side; and x transposed;
//  1. dlogits built kChunk panels (kBlock vocabulary columns) at a time, in one pass over
//     the rows of e (40 KB apart at PTB's vocabulary: one pass a panel was TLB-bound), into
//     panels that stay in L2; from them, in the same thread, those columns of db and of dW
//     (tiles over x^T); its rows written out for stage 2 past the caches (StreamStore);
//  2. dx, each member a range of its rows, the contraction cut at the kBlock blocks, so
//     that all the panels of a block of W^T (224-672 KB at the LM shapes) stay in L2 for
//     all the rows; the tiles accumulate in place (Tile<R, Add>).
// A result's arithmetic does not depend on the team's size or on who claimed what.
#include "scan_kernel.h"

namespace {

using namespace dense_rnn;  // NOLINT: the shared pieces of scan_kernel.h

constexpr int64_t kBlock = 256;  // vocabulary entries of one block of dx's contraction
constexpr int64_t kChunk = 8;    // dlogits' panels built in one pass over its rows

// x (N, D), w (D, V); e (N, V) = exp(logits - shift), inv_total (N) the reciprocals of its
// row sums; targets (N); g (N) the cotangent of each token's loss. Results: dx (N, D),
// dw (D, V), db (V); scratch: d_rows (N, V), dlogits; packed (>= ceil(D / kNR) * kNR * V
// + D * N), W^T's panels and x^T.
ffi::Error Backward(ffi::ThreadPool pool, Buffer x, Buffer w, Buffer e, Buffer inv_total,
                    ffi::Buffer<ffi::S32> targets, Buffer g, Result dx, Result dw, Result db,
                    Result d_rows, Result packed) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || wd[0] != xd[1]) {
    return ffi::Error::InvalidArgument("dense_rnn_softmax_backward: x is (N, D), w (D, V)");
  }
  const int64_t N = xd[0], D = xd[1], V = wd[1];
  const int64_t P = (D + kNR - 1) / kNR, Q = (V + kNR - 1) / kNR;  // panels of W^T, of V
  if (auto err = Check(Count(e) == N * V && Count(inv_total) == N && Count(targets) == N &&
                           Count(g) == N && Count(*dx) == N * D && Count(*dw) == D * V &&
                           Count(*db) == V && Count(*d_rows) == N * V &&
                           Count(*packed) >= P * kNR * V + D * N,
                       "dense_rnn_softmax_backward: operand shapes differ");
      err.failure()) {
    return err;
  }
  if (N == 0 || D == 0 || V == 0) {
    std::fill_n(dx->typed_data(), N * D, 0.f);
    std::fill_n(dw->typed_data(), D * V, 0.f);
    std::fill_n(db->typed_data(), V, 0.f);
    return ffi::Error::Success();
  }
  const float* px = x.typed_data();
  const float* pe = e.typed_data();
  const float* ps = inv_total.typed_data();
  const int32_t* py = targets.typed_data();
  const float* pg = g.typed_data();
  float* pd = d_rows->typed_data();
  float* wt = packed->typed_data();  // W^T, block k0 (k rows): panel p at (k0 * P + p * k) * kNR
  float* xt = wt + P * kNR * V;      // x^T, (D, N)
  const RowGroups tokens(N), features(D);
  const bool stream = reinterpret_cast<uintptr_t>(pd) % sizeof(Vec) == 0 && V % kVL == 0;
  const int64_t items = 2 * P;
  Stages stages(items);
  OnTeam(pool, Threads(pool, items), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    stages.Run(member, members, 3, [&](int64_t stage, int64_t item) {
      if (stage == 0) {
        if (item < P) {
          for (int64_t k0 = 0; k0 < V; k0 += kBlock) {  // block k0's panels side by side
            const int64_t k = std::min(kBlock, V - k0);
            PackTransposed(w.typed_data() + k0, D, V, k, item, wt + (k0 * P + item * k) * kNR);
          }
          return;
        }
        for (int64_t c = D * (item - P) / P; c < D * (item - P + 1) / P; ++c) {
          for (int64_t t = 0; t < N; ++t) xt[c * N + t] = px[t * D + c];
        }
        return;
      }
      if (stage == 1) {
        float* panels = Scratch(kChunk * N * kNR);  // panel c: columns v0 + c * kNR + [0, kNR)
        for (int64_t j0 = Q * item / items, j1 = Q * (item + 1) / items; j0 < j1; j0 += kChunk) {
          const int64_t v0 = j0 * kNR, c1 = std::min(kChunk, j1 - j0);
          const int64_t n = std::min(c1 * kNR, V - v0);  // the chunk's columns
          Vec sums[2 * kChunk] = {};
          for (int64_t t = 0; t < N; ++t) {
            if (t + 8 < N) Prefetch(pe + (t + 8) * V + v0, n);  // rows lie 4V bytes apart
            const float s = ps[t], gt = pg[t];
            const float* er = pe + t * V + v0;
            float* dr = pd + t * V + v0;
            const Vec y = Vec{} + static_cast<float>(py[t] - v0);  // exact below 2^24
            for (int64_t h = 0; h < 2 * c1; ++h) {  // vector h of the chunk's row t
              const int64_t q0 = h * kVL;
              const Vec lane = kLane + static_cast<float>(q0);
              const bool whole = q0 + kVL <= n;
              Vec ev = Vec{};
              if (whole) {
                ev = *reinterpret_cast<const Vec*>(er + q0);
              } else {
                for (int64_t q = q0; q < n; ++q) ev[q - q0] = er[q];
              }
              Vec d = (ev * s - (lane == y ? 1.f : 0.f)) * gt;
              if (!whole) d = lane < static_cast<float>(n) ? d : Vec{};
              *reinterpret_cast<Vec*>(panels + ((h / 2) * N + t) * kNR + (h % 2) * kVL) = d;
              sums[h] += d;
              if (whole && stream) {  // read back from memory only by stage 2, so past
                StreamStore(dr + q0, d);  // the caches: the panels and x^T stay in them
              } else if (whole) {
                *reinterpret_cast<Vec*>(dr + q0) = d;
              } else {
                for (int64_t q = q0; q < n; ++q) dr[q] = d[q - q0];
              }
            }
          }
          float* out = db->typed_data() + v0;
          for (int64_t q = 0; q < n; ++q) out[q] = sums[q / kVL][q % kVL];
          for (int64_t c = 0; c < c1; ++c) {
            const int nc = static_cast<int>(std::min<int64_t>(kNR, n - c * kNR));
            for (int64_t f = 0; f < features.count; ++f) {
              const int64_t f0 = features.First(f);
              const int rows = features.Rows(f);
              kTiles[rows - 1](xt + f0 * N, N, panels + c * N * kNR, N, tile);
              for (int r = 0; r < rows; ++r) {
                Copy<kNR>(tile + r * kNR, nc, dw->typed_data() + (f0 + r) * V + v0 + c * kNR);
              }
            }
          }
        }
        _mm_sfence();  // the streamed stores land before stage 2 reads them
        return;
      }
      // dx's rows of row groups [g0, g1), the first item of member m's share: m's row range
      int64_t m = 0;
      while (m < members && item != items * m / members) ++m;
      if (m == members) return;
      const int64_t g0 = tokens.count * m / members, g1 = tokens.count * (m + 1) / members;
      const int64_t t0 = tokens.First(g0), t1 = tokens.First(g1);
      float* acc = Scratch((t1 - t0) * P * kNR);  // row group g's tiles at (First(g) - t0) * P
      for (int64_t k0 = 0; k0 < V; k0 += kBlock) {
        const int64_t k = std::min(kBlock, V - k0);
        for (int64_t gr = g0; gr < g1; ++gr) {
          const int64_t r0 = tokens.First(gr);
          const int rows = tokens.Rows(gr);
          if (gr + 1 < g1) {  // the next group's rows of dlogits, from memory
            for (int64_t q = tokens.First(gr + 1); q < tokens.First(gr + 2); ++q) {
              Prefetch(pd + q * V + k0, k);
            }
          }
          for (int64_t p = 0; p < P; ++p) {
            (k0 == 0 ? kTiles : kAddTiles)[rows - 1](
                pd + r0 * V + k0, V, wt + (k0 * P + p * k) * kNR, k,
                acc + ((r0 - t0) * P + p * rows) * kNR);
          }
        }
      }
      for (int64_t gr = g0; gr < g1; ++gr) {
        const int64_t r0 = tokens.First(gr);
        const int rows = tokens.Rows(gr);
        for (int64_t p = 0; p < P; ++p) {
          const int n = static_cast<int>(std::min<int64_t>(kNR, D - p * kNR));
          for (int r = 0; r < rows; ++r) {
            Copy<kNR>(acc + ((r0 - t0) * P + p * rows + r) * kNR, n,
                      dx->typed_data() + (r0 + r) * D + p * kNR);
          }
        }
      }
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnSoftmaxBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()                  // x
                                  .Arg<Buffer>()                  // w
                                  .Arg<Buffer>()                  // e
                                  .Arg<Buffer>()                  // inv_total
                                  .Arg<ffi::Buffer<ffi::S32>>()  // targets
                                  .Arg<Buffer>()                  // g
                                  .Ret<Buffer>()                  // dx
                                  .Ret<Buffer>()                  // dw
                                  .Ret<Buffer>()                  // db
                                  .Ret<Buffer>()                  // d_rows
                                  .Ret<Buffer>());                // packed
