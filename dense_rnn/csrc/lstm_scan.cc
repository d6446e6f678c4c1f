// The float32 LSTM recurrence as XLA FFI handlers (dense_rnn/lstm_kernel.py): the forward
// scan of recurrent.lstm_scan, with the residuals its backward needs, and that backward
// scan, each one call for the whole sequence.
//
// What XLA runs as ~16 kernels a step (the product h @ W_hh, the gates, the state update,
// the masks) is here one loop over the steps. The recurrent weight is packed once a call
// into panels that a register-tiled product streams at every step; its left operand is read
// row by row where it lies (the backward's dz_{t+1} straight from its output), so no step
// writes a transposed copy. The gates and the state update of a tile are computed right
// after its product, while it is in L1. The panels of a step are shared out between the
// calling thread and tasks on XLA's intra-op pool (OnTeam) as items claimed one at a time
// (Stages): each thread takes its own share first, then what the others have not begun, so
// a thread the OS deschedules (for the caller's host work, say) holds up a step by one
// panel at most, not by its whole share. A step starts once every panel of the one before
// is done: its product reads every unit's new state. With a direction axis, a call runs D
// independent LSTMs (a bidirectional layer's two), every direction's panels the items of
// each step.
//
// The arithmetic is cells.lstm_gates / cells.lstm_update and recurrent._lstm_scan_bwd's,
// with tanh as XLA's CPU backend and Eigen compute it (the same rational approximation).
#include "scan_kernel.h"

namespace {

using namespace dense_rnn;  // NOLINT: the shared pieces of scan_kernel.h

// The sizes of a call: D independent LSTMs (directions) of H units over T steps of B rows.
// w is (D, H, 4H), or (H, 4H) for D = 1. A sequence operand (xs, ys, dys, dzs) is (D, B, T,
// n), or (B, T, n): the layers' batch-major layout, so that no transposed copy is made on
// the way in or out; n-wide row (d * B + r) * T + t. Of the saved residuals, h_{t-1} lies
// so too (dW multiplies it with dzs); the gates' activations, c_{t-1} and tanh(c_t), read by
// the backward scan alone, lie time-major, (T, D, B, n), as XLA's scan saves them. A carry
// is (D, B, H), row d * B + r; the mask (B, T).
struct Dims {
  int64_t D, H, G, T, B;

  // The row of step t, direction d, batch row r: in a sequence operand (Row), in a
  // time-major residual (Saved).
  int64_t Row(int64_t t, int64_t d, int64_t r) const { return (d * B + r) * T + t; }
  int64_t Saved(int64_t t, int64_t d, int64_t r) const { return (t * D + d) * B + r; }
};

// The dims of w and a sequence operand seq ([D,] B, T, n), or an error message.
const char* ReadDims(const Buffer& w, const Buffer& seq, Dims& dims) {
  const auto wd = w.dimensions();
  const auto sd = seq.dimensions();
  if ((wd.size() != 2 && wd.size() != 3) || sd.size() != wd.size() + 1 ||
      (wd.size() == 3 && sd[0] != wd[0])) {
    return "w is (H, 4H) or (D, H, 4H); the sequence (B, T, n) or (D, B, T, n)";
  }
  dims.D = wd.size() == 3 ? wd[0] : 1;
  dims.H = wd[wd.size() - 2];
  dims.G = 4 * dims.H;
  dims.T = sd[sd.size() - 2];
  dims.B = sd[sd.size() - 3];
  return wd[wd.size() - 1] == dims.G ? nullptr : "w is (H, 4H) or (D, H, 4H)";
}

// Forward. w (D, H, 4H) or (H, 4H); xs (D, B, T, 4H) or (B, T, 4H); c0, h0 (D, B, H);
// mask (B, T), the same for every direction, or empty; rmask (D, B, H) or empty; b (D, 4H),
// the gates' biases added to xs, or empty. Results: ys (D, B, T, H), c, h (D, B, H) and,
// unless empty, the residuals acts (T, D, B, 4H), c_prev, tc (T, D, B, H) and h_prev (D, B,
// T, H) of recurrent._lstm_forward (without D: its dims left out).
ffi::Error Forward(ffi::ThreadPool pool, Buffer w, Buffer xs, Buffer c0, Buffer h0, Buffer mask,
                   Buffer rmask, Buffer bias, Result ys, Result c_out, Result h_out, Result acts,
                   Result c_prev, Result tc_out, Result h_prev) {
  Dims dims;
  if (const char* bad = ReadDims(w, xs, dims)) {
    return ffi::Error::InvalidArgument(std::string("dense_rnn_lstm_forward: ") + bad);
  }
  const int64_t D = dims.D, H = dims.H, G = dims.G, T = dims.T, B = dims.B;
  const bool masked = Count(mask) > 0, dropped = Count(rmask) > 0,
             biased = Count(bias) > 0, save = Count(*acts) > 0;
  const int64_t rows = T * D * B;  // of every per-step operand
  if (auto e = Check(xs.dimensions().back() == G &&
                         Count(c0) == D * B * H && Count(h0) == D * B * H &&
                         (!masked || Count(mask) == B * T) &&
                         (!dropped || Count(rmask) == D * B * H) &&
                         (!biased || Count(bias) == D * G) &&
                         Count(*ys) == rows * H &&
                         (!save || (Count(*acts) == rows * G &&
                                    Count(*c_prev) == rows * H &&
                                    Count(*tc_out) == rows * H &&
                                    Count(*h_prev) == rows * H)),
                     "dense_rnn_lstm_forward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* c = c_out->typed_data();
  float* h = h_out->typed_data();
  std::copy_n(c0.typed_data(), D * B * H, c);
  std::copy_n(h0.typed_data(), D * B * H, h);
  if (T == 0 || B == 0 || H == 0 || D == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* px = xs.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  const float* pr = dropped ? rmask.typed_data() : nullptr;
  const float* pb = biased ? bias.typed_data() : nullptr;
  float* py = ys->typed_data();

  const int64_t panels = (H + kUnits - 1) / kUnits;  // of each direction
  // the recurrent product's input h_{t-1} (times rmask), (D, B, H), one buffer a step in turn
  std::vector<float> hin[2] = {std::vector<float>(D * B * H), std::vector<float>(D * B * H)};

  // direction d's packed weight: panel j, row k holds the 4 gates of units j * kUnits + q,
  // gate-major: W_d[k][g * H + u]; in the calling thread's buffer, kept for its next call
  float* packed = Scratch(D * panels * H * kNR);
  Stages stages(D * panels);
  OnTeam(pool, Threads(pool, D * panels), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    stages.Run(member, members, T + 1, [&](int64_t stage, int64_t item) {
      const int64_t d = item / panels, j = item % panels;  // direction d's panel j
      const int64_t carry0 = d * B * H;  // direction d's rows of a carry
      float* pd = packed + d * panels * H * kNR;
      const float* prd = pr ? pr + carry0 : nullptr;
      if (stage == 0) {  // item (d, j) packs W_d's panel j, right before its first product ...
        PackGates<kUnits>(pw + d * H * G, H, G, H, 0, j, pd + j * H * kNR);
        for (int64_t r = 0; r < B; ++r) {  // ... and panel j's h_0
          for (int64_t u = j * kUnits; u < std::min((j + 1) * kUnits, H); ++u) {
            hin[0][carry0 + r * H + u] = h[carry0 + r * H + u] * (prd ? prd[r * H + u] : 1.f);
          }
        }
        return;
      }
      const int64_t t = stage - 1;  // item (d, j): step t of direction d's panel j
      const float* a = hin[t % 2].data() + carry0;
      float* a_next = hin[(t + 1) % 2].data() + carry0;
      float* cd = c + carry0;
      float* hd = h + carry0;
      for (int64_t r0 = 0; r0 < B; r0 += kMR) {
        const int rows = static_cast<int>(std::min<int64_t>(kMR, B - r0));
        kTiles[rows - 1](a + r0 * H, H, pd + j * H * kNR, H, tile);
        const int64_t u0 = j * kUnits;
        const int units = static_cast<int>(std::min<int64_t>(kUnits, H - u0));
        for (int i = 0; i < rows; ++i) {
          const int64_t r = r0 + i, row = dims.Row(t, d, r), saved = dims.Saved(t, d, r);
          float* cr = cd + r * H + u0;
          float* hr = hd + r * H + u0;
          // the gates and state update
          const LstmUnits s(tile + i * kNR, px + row * G + u0, H, cr, units,
                            pb ? pb + d * G + u0 : nullptr);
          if (save) {
            s.StoreGates(acts->typed_data() + saved * G + u0, H, units);
            Store(s.c_old, units, c_prev->typed_data() + saved * H + u0);
            Store(s.tc, units, tc_out->typed_data() + saved * H + u0);
            Copy<kUnits>(hr, units, h_prev->typed_data() + row * H + u0);
          }
          const bool keep = pm == nullptr || pm[r * T + t] != 0.f;
          if (keep) Store(s.c, units, cr), Store(s.h, units, hr);
          Store(keep ? s.h : Half{}, units, py + row * H + u0);
          float* an = a_next + r * H + u0;
          if (prd != nullptr) {
            for (int q = 0; q < units; ++q) an[q] = hr[q] * prd[r * H + u0 + q];
          } else {
            Copy<kUnits>(hr, units, an);
          }
        }
      }
    });
  });
  return ffi::Error::Success();
}

// Backward. w (D, H, 4H) or (H, 4H); dys (D, B, T, H) or (B, T, H); dc, dh (D, B, H), the
// final carry's cotangents; mask, rmask as Forward's; the residuals acts, c_prev, tc,
// h_prev, as Forward saves them. Results: dzs (D, B, T, 4H) or (B, T, 4H), the gates'
// gradients; dc0, dh0 (D, B, H); drmask (D, B, H), or empty without rmask.
ffi::Error Backward(ffi::ThreadPool pool, Buffer w, Buffer dys, Buffer dc_last, Buffer dh_last,
                    Buffer mask, Buffer rmask, Buffer acts, Buffer c_prev, Buffer tc,
                    Buffer h_prev, Result dzs, Result dc_out, Result dh_out, Result drmask) {
  Dims dims;
  if (const char* bad = ReadDims(w, dys, dims)) {
    return ffi::Error::InvalidArgument(std::string("dense_rnn_lstm_backward: ") + bad);
  }
  const int64_t D = dims.D, H = dims.H, G = dims.G, T = dims.T, B = dims.B;
  const bool masked = Count(mask) > 0, dropped = Count(rmask) > 0;
  const int64_t rows = T * D * B, carries = D * B * H;
  if (auto e = Check(dys.dimensions().back() == H &&
                         Count(dc_last) == carries && Count(dh_last) == carries &&
                         (!masked || Count(mask) == B * T) &&
                         (!dropped || (Count(rmask) == carries &&
                                       Count(*drmask) == carries)) &&
                         Count(acts) == rows * G && Count(c_prev) == rows * H &&
                         Count(tc) == rows * H && Count(h_prev) == rows * H &&
                         Count(*dzs) == rows * G,
                     "dense_rnn_lstm_backward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* dc = dc_out->typed_data();
  float* dh = dh_out->typed_data();
  std::copy_n(dc_last.typed_data(), carries, dc);
  std::copy_n(dh_last.typed_data(), carries, dh);
  float* pdr = dropped ? drmask->typed_data() : nullptr;
  if (pdr) std::fill_n(pdr, carries, 0.f);
  if (T == 0 || B == 0 || H == 0 || D == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  const float* pr = dropped ? rmask.typed_data() : nullptr;

  // the product dh_in = dz @ W^T: panels of kNR units over W^T's 4H rows, per direction
  const int64_t panels = (H + kNR - 1) / kNR;
  std::vector<float> dh_pass(carries);

  // direction d's panel j: the rows of W_d^T (4H of them) for units j * kNR + q; in the
  // calling thread's buffer, kept for its next call
  float* packed = Scratch(D * panels * G * kNR);
  Stages stages(D * panels);
  OnTeam(pool, Threads(pool, D * panels), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    // Item (d, j) of stage 0 packs direction d's panel j; of stage s in [1, T], for step
    // t = T - s and the panel's units, finishes step t + 1 (dh_in = dz_{t+1} @ W_d^T, after
    // the first) and computes the gates' gradients of step t; of stage T + 1, finishes
    // step 0.
    stages.Run(member, members, T + 2, [&](int64_t stage, int64_t item) {
      const int64_t d = item / panels, j = item % panels;
      const int64_t u_lo = j * kNR, u_hi = std::min(u_lo + kNR, H);
      float* pd = packed + (d * panels + j) * G * kNR;
      if (stage == 0) {
        PackTransposed(pw + d * H * G, H, G, G, j, pd);
        return;
      }
      const int64_t t = T - stage;
      const int64_t carry0 = d * B * H;  // direction d's rows of a carry
      if (t + 1 < T) {  // dh of step t + 1's inputs: its dz (all units') times W_d^T
        for (int64_t r0 = 0; r0 < B; r0 += kMR) {
          const int rows = static_cast<int>(std::min<int64_t>(kMR, B - r0));
          // every unit's dz of step t + 1 by now: rows r0... of it, T rows apart
          kTiles[rows - 1](dzs->typed_data() + dims.Row(t + 1, d, r0) * G, T * G, pd, G, tile);
          for (int i = 0; i < rows; ++i) {
            const int64_t r = r0 + i;
            const float* hp = h_prev.typed_data() + dims.Row(t + 1, d, r) * H;
            for (int64_t u = u_lo; u < u_hi; ++u) {
              const int64_t at = carry0 + r * H + u;
              float dh_in = tile[i * kNR + u - u_lo];
              if (pr) {
                pdr[at] += hp[u] * dh_in;
                dh_in *= pr[at];
              }
              dh[at] = dh_pass[at] + dh_in;
            }
          }
        }
      }
      if (t < 0) return;
      // the gates' gradients of step t for the panel's units: recurrent._lstm_scan_bwd's
      for (int64_t r = 0; r < B; ++r) {
        const int64_t row = dims.Row(t, d, r), saved = dims.Saved(t, d, r);
        const int64_t at = carry0 + r * H;
        const bool keep = pm == nullptr || pm[r * T + t] != 0.f;
        const float* ai = acts.typed_data() + saved * G;
        const float *af = ai + H, *ag = ai + 2 * H, *ao = ai + 3 * H;
        const float* tcr = tc.typed_data() + saved * H;
        const float* cpr = c_prev.typed_data() + saved * H;
        const float* dyr = dys.typed_data() + row * H;
        float* dzi = dzs->typed_data() + row * G;
        float *dzf = dzi + H, *dzg = dzi + 2 * H, *dzo = dzi + 3 * H;
        float* dhr = dh + at;
        float* dcr = dc + at;
        float* dhp = dh_pass.data() + at;
        if (keep) {
          auto gates = [&](auto v, int64_t u) {  // v: a float or a Vec, for units u...
            using V = decltype(v);
            auto at = [u](const float* p) {  // unaligned, as memcpy
              V x;
              std::memcpy(&x, p + u, sizeof x);
              return x;
            };
            auto put = [u](float* p, V x) { std::memcpy(p + u, &x, sizeof x); };
            const LstmGrads<V> g(at(ai), at(af), at(ag), at(ao), at(tcr), at(cpr),
                                 at(dhr) + at(dyr), at(dcr));
            put(dzi, g.dz[0]), put(dzf, g.dz[1]), put(dzg, g.dz[2]), put(dzo, g.dz[3]);
            put(dhp, V{});
            put(dcr, g.dc_old);
          };
          int64_t u = u_lo;
          for (; u + kVL <= u_hi; u += kVL) gates(Vec{}, u);
          for (; u < u_hi; ++u) gates(0.f, u);
        } else {  // padding: no gradient for its gates, the carry's passed on
          for (int g = 0; g < 4; ++g) std::fill(dzi + g * H + u_lo, dzi + g * H + u_hi, 0.f);
          std::copy(dhr + u_lo, dhr + u_hi, dhp + u_lo);
        }
      }
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnLstmForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // xs
                                  .Arg<Buffer>()  // c0
                                  .Arg<Buffer>()  // h0
                                  .Arg<Buffer>()  // mask
                                  .Arg<Buffer>()  // rmask
                                  .Arg<Buffer>()  // b
                                  .Ret<Buffer>()  // ys
                                  .Ret<Buffer>()  // c
                                  .Ret<Buffer>()  // h
                                  .Ret<Buffer>()  // acts
                                  .Ret<Buffer>()  // c_prev
                                  .Ret<Buffer>()  // tc
                                  .Ret<Buffer>());  // h_prev

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnLstmBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // dys
                                  .Arg<Buffer>()  // dc
                                  .Arg<Buffer>()  // dh
                                  .Arg<Buffer>()  // mask
                                  .Arg<Buffer>()  // rmask
                                  .Arg<Buffer>()  // acts
                                  .Arg<Buffer>()  // c_prev
                                  .Arg<Buffer>()  // tc
                                  .Arg<Buffer>()  // h_prev
                                  .Ret<Buffer>()  // dzs
                                  .Ret<Buffer>()  // dc0
                                  .Ret<Buffer>()  // dh0
                                  .Ret<Buffer>());  // drmask
