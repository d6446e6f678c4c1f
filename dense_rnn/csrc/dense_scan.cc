// The float32 dense GRU, vanilla RNN and LSTM layers of dense_block.dense_scan (Zhao et al.
// 2019, eq. 2-3, 7-8) as XLA FFI handlers (dense_rnn/dense_kernel.py): each one's forward
// scan, with the residuals its backward needs, and that backward scan, each one call for the
// whole sequence. k = 1 is the plain GRU of cells.gru_step. Without `gru` the GRU's handlers
// run the vanilla RNN (eq. 3, h_t = tanh(xw + x~ W2^(n))): the GRU's n alone, with no r or
// z, h_t = n. The LSTM's handlers (LstmForward, LstmBackward, at the end) share the plan,
// the history and the threads.
//
// A step at block position n reads x~_t, the R_n most recent states (h_{t-1} alone at
// n = 1 without block_start; else the block's states so far, with block_start the state
// carried into it first): a contiguous run of the block's history, kept per batch row as
// slots [carried state, h_{mk+1}, ..., h_{mk+k-1}]. A forward step is two products, each
// over every panel of units, as the second reads every unit's reset gate:
//   [r, z] = sigmoid(xw_rz + x~ W_rz^(n)), and x~ * tile(r);
//   n = tanh(xw_n + (x~ * tile(r)) W_n^(n)), h_t = (1 - z) h_{t-1} + z n.
// A backward step is (A') the gradient of h_t, and from it those of n's and z's
// pre-activations; (B') d(x~ * tile(r)) = d_n W_n^T, and from it r's pre-activation's and
// part of dx~; (C') dx~ += d_rz W_rz^T, added into the gradients of the history slots x~
// read. The batch rows are cut into groups of one register tile (RowGroups), each an
// independent sequence whose steps the threads claim one at a time (Steps): no barrier
// between the threads, whose results do not depend on who ran what. The tiled product
// and tanh are lstm_scan.cc's (scan_kernel.h); sigmoid is 0.5 tanh(x / 2) + 0.5. Operands
// are batch-major, as the layer holds them: the row of batch row b, step t is b * T + t.
// The weights' gradients are products over the steps of each position, of the saved
// operands x~ and x~ * tile(r) (ops) and the returned dxw, left to XLA (dense_kernel.scan).
#include <vector>

#include "scan_kernel.h"

namespace {

using namespace dense_rnn;  // NOLINT: the shared pieces of scan_kernel.h

constexpr int kHalf = kNR / 2;  // hidden units of a stage-A panel (its r and z each)

// The sizes of a call, and where each block position's pieces lie. Position p (0-based,
// n = p + 1) reads R[p] states from history slot lo[p]; its weight is rows [wrow[p],
// wrow[p] + R[p] H) of the stacked w (sum_p R[p] H, 3H); its saved operands x~ and
// x~ * tile(r) are the buffers 2p and 2p + 1 of ops, (blocks, B, R[p] H) each.
struct Plan {
  int64_t H, T, B, k, gru, G, n0, blocks, PA, PB;  // PA, PB: panels of kHalf and kNR units
  std::vector<int64_t> R, lo, wrow, pc;  // pc[p]: kNR-column panels of x~

  // gates: the GRU's [r, z, n] (3), G = 3H; the vanilla RNN's n alone (1), G = H; the
  // LSTM's [i, f, g, o] (4), G = 4H. n0: the GRU's n's first column.
  Plan(int64_t H, int64_t T, int64_t B, int64_t k, bool block_start, int gates)
      : H(H), T(T), B(B), k(k), gru(gates == 3), G(gates * H), n0(gru ? 2 * H : 0),
        blocks((T + k - 1) / k), PA(gru ? (H + kHalf - 1) / kHalf : 0),
        PB((H + kNR - 1) / kNR) {
    int64_t rows = 0;
    for (int64_t p = 0; p < k; ++p) {
      R.push_back(block_start ? p + 1 : std::max<int64_t>(p, 1));
      lo.push_back(block_start || p == 0 ? 0 : 1);
      wrow.push_back(rows);
      pc.push_back((R[p] * H + kNR - 1) / kNR);
      rows += R[p] * H;
    }
    wrow.push_back(rows);  // the total, at [k]
  }
  int64_t Row(int64_t b, int64_t t) const { return b * T + t; }
  int64_t Slots() const { return k + 1; }  // of a row's history, H floats each
  // Backward, at step t (-1: before the first): where the block after t read carry_t as
  // its slot 0, adds that slot's gradient dslot[0:H] into the row's dh and restarts its
  // slots' gradients for the block ending at t.
  void EndBlock(int64_t t, float* dslot, float* dh) const {
    if (t + 1 < T ? (t + 1) % k != 0 : t != -1) return;
    for (int64_t u = 0; u < H; ++u) dh[u] += dslot[u];
    std::fill_n(dslot, Slots() * H, 0.f);
  }
  int64_t Operands() const { return gru ? 2 : 1; }  // saved a position: x~ (, x~ * tile(r))
  // Where step t's x~ (gated: the GRU's x~ * tile(r)) of batch row b lies in ops.
  template <typename F>
  F* Op(const std::vector<F*>& ops, int64_t t, int64_t b, bool gated) const {
    const int64_t p = t % k;
    return ops[Operands() * p + gated] + ((t / k) * B + b) * R[p] * H;
  }
};

inline float Sigmoid(float x) { return 0.5f * Tanh(0.5f * x) + 0.5f; }

// A forward product's panels of w (rows, G), from column c0, `gates` gates of kNR / gates
// units each (scan_kernel.h's PackGates), panel after panel.
void PackGatePanels(const float* w, int64_t rows, int64_t G, int64_t H, int64_t c0, int gates,
                    float* out) {
  const int64_t units = kNR / gates;
  for (int64_t j = 0; j * units < H; ++j) {
    float* panel = out + j * rows * kNR;
    if (gates == 4) PackGates<kNR / 4>(w, rows, G, H, c0, j, panel);
    if (gates == 2) PackGates<kNR / 2>(w, rows, G, H, c0, j, panel);
    if (gates == 1) PackGates<kNR>(w, rows, G, H, c0, j, panel);
  }
}

// A backward product's panels of w (rows, G) transposed over its first `cols` columns
// (scan_kernel.h's PackTransposed), panel after panel.
void PackTransposedPanels(const float* w, int64_t rows, int64_t G, int64_t cols, float* out) {
  for (int64_t j = 0; j * kNR < rows; ++j) {
    PackTransposed(w, rows, G, cols, j, out + j * cols * kNR);
  }
}

// The plan of w and a (B, T, G) operand seq, or an error.
ffi::Error ReadPlan(const char* name, const Buffer& w, const Buffer& seq, int64_t k,
                    bool block_start, int gates, std::unique_ptr<Plan>& plan) {
  const auto wd = w.dimensions();
  const auto xd = seq.dimensions();
  if (wd.size() != 2 || xd.size() != 3 || k < 1 || xd[2] % gates != 0) {
    return ffi::Error::InvalidArgument(std::string(name) + ": w is (rows, G), xw (B, T, G)");
  }
  plan = std::make_unique<Plan>(xd[2] / gates, xd[1], xd[0], k, block_start, gates);
  return Check(wd[1] == xd[2] && wd[0] == plan->wrow[k],
               "dense_rnn_gru: w is the k positions' W2^(n) stacked, (sum_n R_n H, G)");
}

// The saved operands' buffers (Plan::Op): Operands() k of them, position p's (blocks, B,
// R[p] H); from the results (F = float) or the arguments (F = const float).
template <typename Remaining, typename F>
ffi::Error ReadOps(const Remaining& buffers, const Plan& P, std::vector<F*>& ops,
                   const char* name) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    auto got = buffers.template get<Buffer>(i);
    if (got.has_error()) return got.error();
    const Buffer& buffer = [&]() -> const Buffer& {
      if constexpr (std::is_const_v<F>) return *got;
      else return **got;
    }();
    ops.push_back(buffer.typed_data());
    if (Count(buffer) != P.blocks * P.B * P.R[i / P.Operands()] * P.H) break;
  }
  return Check(static_cast<int64_t>(ops.size()) == P.Operands() * P.k &&
                   ops.size() == buffers.size(),
               name, "the operands' buffers differ from the plan");
}

// Forward. w (sum_n R_n H, G); xw (B, T, G) = W1 x_t + b, gates [r, z,] n (gru: the GRU,
// G = 3H; else the vanilla RNN, h_t = n, G = H); h0 (B, H); mask (B, T) or empty. Results:
// ys (B, T, H), h (B, H) and, unless empty, the residuals acts (B, T, G) = [r, z,] n and
// ops, the operands x~ (and x~ * tile(r)) (Plan::Op; none without acts).
ffi::Error Forward(ffi::ThreadPool pool, Buffer w, Buffer xw, Buffer h0, Buffer mask,
                   int64_t k, bool block_start, bool gru, Result ys, Result h_out,
                   Result acts, ffi::RemainingRets ops_out) {
  std::unique_ptr<Plan> plan;
  if (auto e = ReadPlan("dense_rnn_gru_forward", w, xw, k, block_start, gru ? 3 : 1, plan);
      e.failure()) {
    return e;
  }
  const Plan& P = *plan;
  const int64_t H = P.H, T = P.T, B = P.B, G = P.G, n0 = P.n0;
  const bool masked = Count(mask) > 0, save = Count(*acts) > 0;
  if (auto e = Check(Count(h0) == B * H && (!masked || Count(mask) == B * T) &&
                         Count(*ys) == B * T * H &&
                         (!save || Count(*acts) == B * T * G),
                     "dense_rnn_gru_forward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* h = h_out->typed_data();
  std::copy_n(h0.typed_data(), B * H, h);
  if (T == 0 || B == 0 || H == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* px = xw.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  float* py = ys->typed_data();
  std::vector<float*> ops;
  if (save) {
    if (auto e = ReadOps(ops_out, P, ops, "dense_rnn_gru_forward"); e.failure()) return e;
    // the operands of positions past the last step: zero, as XLA's padding
    for (int64_t t = T; t < P.blocks * k; ++t) {
      for (int64_t b = 0; b < B; ++b) {
        for (int gated = 0; gated < P.Operands(); ++gated) {
          std::fill_n(P.Op(ops, t, b, gated), P.R[t % k] * H, 0.f);
        }
      }
    }
  }
  const int64_t slots = P.Slots() * H;  // a row's history
  std::vector<float> history(B * slots);
  std::vector<float> own_acts(save ? 0 : B * G);  // [r, z,] n of the step, without acts
  const int64_t widest = P.R[k - 1] * H;  // x~ of the last block position
  // the left operand of n's product: x~ * tile(r) (GRU) or a copy of x~ (vanilla RNN, as
  // the product's loop writes the history), in ops or, without, a buffer of the row's
  std::vector<float> own_gated(save ? 0 : B * widest);
  auto act = [&](int64_t b, int64_t t) {
    return save ? acts->typed_data() + P.Row(b, t) * G : own_acts.data() + b * G;
  };
  auto gated = [&](int64_t b, int64_t t) {
    return save ? P.Op(ops, t, b, gru) : own_gated.data() + b * widest;
  };

  // Position p's panels, in the calling thread's buffer: the GRU's r-z panel j, row i holds
  // [r, z] of units j * kHalf + q, W_p[i][g * H + u] (g = 0, 1); the n panel j, n's of
  // units j * kNR + q, W_p[i][n0 + u].
  std::vector<int64_t> at_a(k), at_b(k);
  int64_t size = 0;
  for (int64_t p = 0; p < k; ++p) {
    at_a[p] = size, size += P.PA * P.R[p] * H * kNR;
    at_b[p] = size, size += P.PB * P.R[p] * H * kNR;
  }
  float* packed = Scratch(size);
  for (int64_t p = 0; p < k; ++p) {
    const float* wp = pw + P.wrow[p] * G;
    if (gru) PackGatePanels(wp, P.R[p] * H, G, H, 0, 2, packed + at_a[p]);
    PackGatePanels(wp, P.R[p] * H, G, H, n0, 1, packed + at_b[p]);
  }
  for (int64_t b = 0; b < B; ++b) std::copy_n(h + b * H, H, history.data() + b * slots);

  const RowGroups groups(B);
  Steps steps(groups.count, T);
  OnTeam(pool, Threads(pool, groups.count), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    steps.Run(member, members, [&](int64_t group, int64_t t) {
      const int64_t r0 = groups.First(group), p = t % k, width = P.R[p] * H;
      const int rows = groups.Rows(group);
      const float* rec0 = history.data() + r0 * slots + P.lo[p] * H;
      for (int i = 0; t + 1 < T && i < rows; ++i) {  // the next step's xw, toward L2
        Prefetch(px + P.Row(r0 + i, t + 1) * G, G);
      }
      for (int64_t j = 0; j < P.PA; ++j) {  // r and z of units [u0, u0 + units), x~ * tile(r)
        const int64_t u0 = j * kHalf;
        const int units = static_cast<int>(std::min<int64_t>(kHalf, H - u0));
        for (int i = 0; i < rows && u0 + 2 * kHalf < H; ++i) {  // panel j + 2's, toward L1
          const float* x = px + P.Row(r0 + i, t) * G + u0 + 2 * kHalf;
          __builtin_prefetch(x, 0, 3), __builtin_prefetch(x + H, 0, 3);
        }
        kTiles[rows - 1](rec0, slots, packed + at_a[p] + j * width * kNR, width, tile);
        for (int i = 0; i < rows; ++i) {  // in vectors of kHalf units, stored `units`
          const int64_t b = r0 + i;
          const float* x = px + P.Row(b, t) * G + u0;
          float* a = act(b, t) + u0;
          const float* rec = rec0 + i * slots + u0;
          float* g = gated(b, t) + u0;
          float* saved = save ? P.Op(ops, t, b, false) + u0 : nullptr;
          alignas(64) float r[kHalf] = {}, z[kHalf] = {}, v[kHalf] = {};
          Copy<kHalf>(x, units, r);
          Copy<kHalf>(x + H, units, z);
          for (int q = 0; q < kHalf; ++q) {
            r[q] = Sigmoid(tile[i * kNR + q] + r[q]);
            z[q] = Sigmoid(tile[i * kNR + kHalf + q] + z[q]);
          }
          Copy<kHalf>(r, units, a);
          Copy<kHalf>(z, units, a + H);
          for (int64_t s = 0; s < P.R[p]; ++s) {
            Copy<kHalf>(rec + s * H, units, v);
            if (saved) Copy<kHalf>(v, units, saved + s * H);
            for (int q = 0; q < kHalf; ++q) v[q] *= r[q];
            Copy<kHalf>(v, units, g + s * H);
          }
        }
      }
      for (int i = 0; i < rows && !gru; ++i) {  // the vanilla RNN's x~ (its saved operand)
        std::copy_n(rec0 + i * slots, width, gated(r0 + i, t));
      }
      const bool next_starts = (t + 1) % k == 0;
      for (int64_t j = 0; j < P.PB; ++j) {  // n and h_t of units [u0, u0 + units)
        const int64_t u0 = j * kNR;
        const int units = static_cast<int>(std::min<int64_t>(kNR, H - u0));
        for (int i = 0; i < rows && u0 + kNR < H; ++i) {  // panel j + 1's n, toward L1
          const float* x = px + P.Row(r0 + i, t) * G + n0 + u0 + kNR;
          __builtin_prefetch(x, 0, 3), __builtin_prefetch(x + kVL, 0, 3);
        }
        kTiles[rows - 1](gated(r0, t), save ? width : widest, packed + at_b[p] + j * width * kNR,
                         width, tile);
        for (int i = 0; i < rows; ++i) {  // in vectors of kNR units, stored `units`
          const int64_t b = r0 + i;
          float* a = act(b, t) + u0;
          float* hb = h + b * H + u0;
          float* slot = history.data() + b * slots + u0;
          alignas(64) float n[kNR] = {}, z[kNR] = {}, h_new[kNR] = {};
          Copy<kNR>(px + P.Row(b, t) * G + n0 + u0, units, n);
          if (gru) {
            Copy<kNR>(a + H, units, z);
          } else {
            std::fill_n(z, kNR, 1.f);  // h_t = n
          }
          Copy<kNR>(hb, units, h_new);
          for (int q = 0; q < kNR; ++q) {
            n[q] = Tanh(tile[i * kNR + q] + n[q]);
            h_new[q] = (1.f - z[q]) * h_new[q] + z[q] * n[q];
          }
          Copy<kNR>(n, units, a + n0);
          const bool keep = pm == nullptr || pm[P.Row(b, t)] != 0.f;
          if (keep) Copy<kNR>(h_new, units, hb);
          float* y = py + P.Row(b, t) * H + u0;
          if (keep) {
            Copy<kNR>(h_new, units, y);
          } else {
            std::fill_n(y, units, 0.f);
          }
          if (p + 1 < k) Copy<kNR>(h_new, units, slot + (p + 1) * H);  // the block's state
          if (next_starts) Copy<kNR>(hb, units, slot);  // the state carried into the next
        }
      }
    });
  });
  return ffi::Error::Success();
}

// Backward. w, mask (a prefix one, from lengths), k, block_start, gru as Forward's; dys
// (B, T, H); dh (B, H), the final carry's cotangent; the residuals acts and ops. Results:
// dxw (B, T, G), the gradients of the gates' pre-activations [r, z,] n; dh0 (B, H).
ffi::Error Backward(ffi::ThreadPool pool, Buffer w, Buffer dys, Buffer dh_last, Buffer mask,
                    Buffer acts, ffi::RemainingArgs ops_in, int64_t k, bool block_start,
                    bool gru, Result dxw, Result dh_out) {
  std::unique_ptr<Plan> plan;
  if (auto e = ReadPlan("dense_rnn_gru_backward", w, acts, k, block_start, gru ? 3 : 1,
                              plan);
      e.failure()) {
    return e;
  }
  const Plan& P = *plan;
  const int64_t H = P.H, T = P.T, B = P.B, G = P.G, n0 = P.n0;
  const bool masked = Count(mask) > 0;
  if (auto e = Check(Count(dys) == B * T * H && Count(dh_last) == B * H &&
                         (!masked || Count(mask) == B * T) && Count(acts) == B * T * G &&
                         Count(*dxw) == B * T * G,
                     "dense_rnn_gru_backward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* dh = dh_out->typed_data();  // the carry's gradient, at each step's end
  std::copy_n(dh_last.typed_data(), B * H, dh);
  if (T == 0 || B == 0 || H == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  const float* pa = acts.typed_data();
  std::vector<const float*> ops;
  if (auto e = ReadOps(ops_in, P, ops, "dense_rnn_gru_backward"); e.failure()) return e;
  const float* pdy = dys.typed_data();
  float* pdx = dxw->typed_data();
  const int64_t slots = P.Slots() * H;
  std::vector<float> dhistory(B * slots);  // the history slots' gradients, this block
  const int64_t widest = P.R[k - 1] * H;  // x~ of the last block position
  std::vector<float> dgated(gru ? B * widest : 0);  // d(x~ * tile(r)) * tile(r), a row's

  // Position p's panels: B' panel (s, j), row i holds W_p[s H + u][n0 + i] for units
  // u = j * kNR + q (W_n^T's rows of x~'s state s); C' panel j, row i, W_p[c][i] for
  // columns c = j * kNR + q of x~ (W_rz^T).
  std::vector<int64_t> at_b(k), at_c(k);
  int64_t size = 0;
  for (int64_t p = 0; p < k; ++p) {
    at_b[p] = size, size += P.R[p] * P.PB * H * kNR;
    at_c[p] = size, size += gru ? P.pc[p] * 2 * H * kNR : 0;
  }
  float* packed = Scratch(size);
  for (int64_t p = 0; p < k; ++p) {
    const float* wp = pw + P.wrow[p] * G;
    for (int64_t s = 0; s < P.R[p]; ++s) {
      PackTransposedPanels(wp + s * H * G + n0, H, G, H, packed + at_b[p] + s * P.PB * H * kNR);
    }
    if (gru) PackTransposedPanels(wp, P.R[p] * H, G, 2 * H, packed + at_c[p]);
  }

  const RowGroups groups(B);
  Steps steps(groups.count, T + 1);
  OnTeam(pool, Threads(pool, groups.count), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    alignas(64) float dr[kMR * kNR];
    // Step s is t = T - 1 - s's A', B', C'; s = T (t = -1) adds the carried state's
    // gradient to dh0.
    steps.Run(member, members, [&](int64_t group, int64_t step) {
      const int64_t r0 = groups.First(group), t = T - 1 - step;
      const int rows = groups.Rows(group);
      // A': the gradient of h_t, then those of n's and z's pre-activations
      for (int64_t b = r0; t > 0 && b < r0 + rows; ++b) {  // the next step's rows, toward L2
        const int64_t row = P.Row(b, t - 1);
        Prefetch(pa + row * G, G), Prefetch(pdy + row * H, H);
        for (int gated = 0; gated < P.Operands(); ++gated) {
          Prefetch(P.Op(ops, t - 1, b, gated), P.R[(t - 1) % k] * H);
        }
      }
      for (int64_t b = r0; b < r0 + rows; ++b) {
        float* dslot = dhistory.data() + b * slots;
        float* dhb = dh + b * H;
        P.EndBlock(t, dslot, dhb);
        if (t < 0) continue;
        const int64_t p = t % k, row = P.Row(b, t);
        const float* a = pa + row * G;
        float* dx = pdx + row * G;
        if (pm != nullptr && pm[row] == 0.f) {  // padding: no gradient, the carry's passed on
          std::fill_n(dx, G, 0.f);
          continue;
        }
        const float* h_prev = P.Op(ops, t, b, false) + (P.R[p] - 1) * H;  // x~'s last
        const float* dy = pdy + row * H;
        const float* dnext = p + 1 < k ? dslot + (p + 1) * H : nullptr;
        for (int64_t u = 0; u < H; ++u) {
          const float g = dhb[u] + dy[u] + (dnext ? dnext[u] : 0.f), n = a[n0 + u];
          if (!gru) {  // h_t = n: no gate, no carry past x~
            dx[u] = g * (1.f - n * n);
            dhb[u] = 0.f;
            continue;
          }
          const float z = a[H + u];
          dx[2 * H + u] = g * z * (1.f - n * n);
          dx[H + u] = g * (n - h_prev[u]) * z * (1.f - z);
          dhb[u] = g * (1.f - z);
        }
      }
      if (t < 0) return;
      const int64_t p = t % k, width = P.R[p] * H;
      const float* dx0 = pdx + P.Row(r0, t) * G;  // row r0 + i of the step's dxw: + i T G
      for (int64_t j = 0; j < P.PB; ++j) {  // B': d(x~ * tile(r)) of units [u0, u0 + units)
        const int64_t u0 = j * kNR;
        const int units = static_cast<int>(std::min<int64_t>(kNR, H - u0));
        std::fill_n(dr, kMR * kNR, 0.f);
        for (int64_t s = 0; s < P.R[p]; ++s) {
          kTiles[rows - 1](dx0 + n0, T * G, packed + at_b[p] + (s * P.PB + j) * H * kNR, H,
                           tile);
          for (int i = 0; i < rows && !gru; ++i) {  // the vanilla RNN's dx~: into its slots
            float* dslot = dhistory.data() + (r0 + i) * slots + (P.lo[p] + s) * H + u0;
            for (int q = 0; q < units; ++q) dslot[q] += tile[i * kNR + q];
          }
          for (int i = 0; i < rows && gru; ++i) {
            const int64_t b = r0 + i;
            const float* rec = P.Op(ops, t, b, false) + s * H + u0;
            const float* r = pa + P.Row(b, t) * G + u0;
            float* dg = dgated.data() + b * widest + s * H + u0;
            for (int q = 0; q < units; ++q) {
              const float d = tile[i * kNR + q];
              dr[i * kNR + q] += d * rec[q];
              dg[q] = d * r[q];
            }
          }
        }
        for (int i = 0; i < rows && gru; ++i) {  // then r's pre-activation's
          const float* r = pa + P.Row(r0 + i, t) * G + u0;
          float* dx = pdx + P.Row(r0 + i, t) * G + u0;
          for (int q = 0; q < units; ++q) dx[q] = dr[i * kNR + q] * r[q] * (1.f - r[q]);
        }
      }
      for (int64_t j = 0; j < P.pc[p] && gru; ++j) {  // C': dx~ of columns [c0, c0 + cols)
        const int64_t c0 = j * kNR;
        const int cols = static_cast<int>(std::min<int64_t>(kNR, width - c0));
        kTiles[rows - 1](dx0, T * G, packed + at_c[p] + j * 2 * H * kNR, 2 * H, tile);
        for (int i = 0; i < rows; ++i) {  // into the history slots x~ read
          const int64_t b = r0 + i;
          const float* dg = dgated.data() + b * widest;
          float* dslot = dhistory.data() + b * slots + P.lo[p] * H;
          for (int q = 0; q < cols; ++q) dslot[c0 + q] += tile[i * kNR + q] + dg[c0 + q];
        }
      }
    });
  });
  return ffi::Error::Success();
}

// The dense LSTM (cell "lstm" of dense_block: cells.lstm_step with U h_{t-1} replaced by
// U x~_t). Its step is one product, x~ W^(n), over panels of kUnits units and their 4 gates
// (lstm_scan.cc's packing), the gates and the state update beside each panel's tile
// (LstmUnits); the history and its slots are the GRU's. x~ is copied out first (the saved
// operand), as the step's last panel writes slot 0. The step's xw rows lie T x 4H floats
// apart: the next step's are asked for in L2 as a step starts, the panel after next's in
// L1 before each tile.

// Forward. w (sum_n R_n H, 4H); xw (B, T, 4H) = W1 x_t + b, gates [i, f, g, o]; c0, h0 (B,
// H); mask (B, T) or empty. Results: ys (B, T, H), c, h (B, H) and, unless empty, the
// residuals acts (B, T, 4H) = [i, f, g, o], c_prev and tc = tanh(c_t) (B, T, H), and ops,
// the operands x~ (Plan::Op; none without acts).
ffi::Error LstmForward(ffi::ThreadPool pool, Buffer w, Buffer xw, Buffer c0, Buffer h0,
                       Buffer mask, int64_t k, bool block_start, Result ys, Result c_out,
                       Result h_out, Result acts, Result c_prev, Result tc_out,
                       ffi::RemainingRets ops_out) {
  const char* name = "dense_rnn_dense_lstm_forward";
  std::unique_ptr<Plan> plan;
  if (auto e = ReadPlan(name, w, xw, k, block_start, 4, plan); e.failure()) return e;
  const Plan& P = *plan;
  const int64_t H = P.H, T = P.T, B = P.B, G = P.G;
  const bool masked = Count(mask) > 0, save = Count(*acts) > 0;
  if (auto e = Check(Count(c0) == B * H && Count(h0) == B * H &&
                         (!masked || Count(mask) == B * T) && Count(*ys) == B * T * H &&
                         (!save || (Count(*acts) == B * T * G && Count(*c_prev) == B * T * H &&
                                    Count(*tc_out) == B * T * H)),
                     "dense_rnn_dense_lstm_forward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* c = c_out->typed_data();
  float* h = h_out->typed_data();
  std::copy_n(c0.typed_data(), B * H, c);
  std::copy_n(h0.typed_data(), B * H, h);
  if (T == 0 || B == 0 || H == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* px = xw.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  float* py = ys->typed_data();
  std::vector<float*> ops;
  if (save) {
    if (auto e = ReadOps(ops_out, P, ops, name); e.failure()) return e;
    for (int64_t t = T; t < P.blocks * k; ++t) {  // positions past the last step: zero
      for (int64_t b = 0; b < B; ++b) std::fill_n(P.Op(ops, t, b, false), P.R[t % k] * H, 0.f);
    }
  }
  const int64_t slots = P.Slots() * H, widest = P.R[k - 1] * H;
  std::vector<float> history(B * slots);
  std::vector<float> own_rec(save ? 0 : B * widest);  // x~, without ops
  auto rec = [&](int64_t b, int64_t t) {
    return save ? P.Op(ops, t, b, false) : own_rec.data() + b * widest;
  };

  // Position p's panel j, row i: the 4 gates of units j * kUnits + q, W_p[i][g * H + u].
  const int64_t panels = (H + kUnits - 1) / kUnits;
  std::vector<int64_t> at(k);
  int64_t size = 0;
  for (int64_t p = 0; p < k; ++p) at[p] = size, size += panels * P.R[p] * H * kNR;
  float* packed = Scratch(size);
  for (int64_t p = 0; p < k; ++p) {
    PackGatePanels(pw + P.wrow[p] * G, P.R[p] * H, G, H, 0, 4, packed + at[p]);
  }
  for (int64_t b = 0; b < B; ++b) std::copy_n(h + b * H, H, history.data() + b * slots);

  const RowGroups groups(B);
  Steps steps(groups.count, T);
  OnTeam(pool, Threads(pool, groups.count), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    steps.Run(member, members, [&](int64_t group, int64_t t) {
      const int64_t r0 = groups.First(group), p = t % k, width = P.R[p] * H;
      const int rows = groups.Rows(group);
      for (int i = 0; t + 1 < T && i < rows; ++i) {  // the next step's xw, toward L2
        Prefetch(px + P.Row(r0 + i, t + 1) * G, G);
      }
      for (int i = 0; i < rows; ++i) {  // x~, as the panels below write the history
        std::copy_n(history.data() + (r0 + i) * slots + P.lo[p] * H, width, rec(r0 + i, t));
      }
      const bool next_starts = (t + 1) % k == 0;
      for (int64_t j = 0; j < panels; ++j) {  // the gates, c_t and h_t of units [u0, +units)
        const int64_t u0 = j * kUnits;
        const int units = static_cast<int>(std::min<int64_t>(kUnits, H - u0));
        if ((j + 2) * kUnits < H && j % 2 == 0) {  // panel j + 2's xw, toward L1
          for (int i = 0; i < rows; ++i) {
            const float* x = px + P.Row(r0 + i, t) * G + (j + 2) * kUnits;
            for (int g = 0; g < 4; ++g) __builtin_prefetch(x + g * H, 0, 3);
          }
        }
        kTiles[rows - 1](rec(r0, t), save ? width : widest, packed + at[p] + j * width * kNR,
                         width, tile);
        for (int i = 0; i < rows; ++i) {
          const int64_t b = r0 + i, row = P.Row(b, t);
          float* cb = c + b * H + u0;
          float* hb = h + b * H + u0;
          const LstmUnits s(tile + i * kNR, px + row * G + u0, H, cb, units);
          if (save) {
            s.StoreGates(acts->typed_data() + row * G + u0, H, units);
            Store(s.c_old, units, c_prev->typed_data() + row * H + u0);
            Store(s.tc, units, tc_out->typed_data() + row * H + u0);
          }
          const bool keep = pm == nullptr || pm[row] != 0.f;
          if (keep) Store(s.c, units, cb), Store(s.h, units, hb);
          Store(keep ? s.h : Half{}, units, py + row * H + u0);
          float* slot = history.data() + b * slots + u0;
          if (p + 1 < k) Store(s.h, units, slot + (p + 1) * H);  // the block's state
          if (next_starts) Copy<kUnits>(hb, units, slot);  // the state carried into the next
        }
      }
    });
  });
  return ffi::Error::Success();
}

// Backward. w, mask, k, block_start as LstmForward's; dys (B, T, H); dc, dh (B, H), the
// final carry's cotangents; the residuals acts, c_prev, tc and ops. Results: dxw (B, T,
// 4H), the gates' pre-activation gradients; dc0, dh0 (B, H). A step is (A') the gates'
// gradients of its rows, recurrent._lstm_scan_bwd's, from dh_t (the carry's, dy_t and the
// history slots') and dc_t; (C') dx~ = dz W^(n)T, added into the slots x~ read.
ffi::Error LstmBackward(ffi::ThreadPool pool, Buffer w, Buffer dys, Buffer dc_last,
                        Buffer dh_last, Buffer mask, Buffer acts, Buffer c_prev, Buffer tc,
                        ffi::RemainingArgs ops_in, int64_t k, bool block_start, Result dxw,
                        Result dc_out, Result dh_out) {
  const char* name = "dense_rnn_dense_lstm_backward";
  std::unique_ptr<Plan> plan;
  if (auto e = ReadPlan(name, w, acts, k, block_start, 4, plan); e.failure()) return e;
  const Plan& P = *plan;
  const int64_t H = P.H, T = P.T, B = P.B, G = P.G;
  const bool masked = Count(mask) > 0;
  if (auto e = Check(Count(dys) == B * T * H && Count(dc_last) == B * H &&
                         Count(dh_last) == B * H && (!masked || Count(mask) == B * T) &&
                         Count(c_prev) == B * T * H && Count(tc) == B * T * H &&
                         Count(*dxw) == B * T * G,
                     "dense_rnn_dense_lstm_backward: operand shapes differ");
      e.failure()) {
    return e;
  }
  float* dc = dc_out->typed_data();  // the carry's gradients, at each step's end
  float* dh = dh_out->typed_data();
  std::copy_n(dc_last.typed_data(), B * H, dc);
  std::copy_n(dh_last.typed_data(), B * H, dh);
  if (T == 0 || B == 0 || H == 0) return ffi::Error::Success();
  const float* pw = w.typed_data();
  const float* pm = masked ? mask.typed_data() : nullptr;
  std::vector<const float*> ops;
  if (auto e = ReadOps(ops_in, P, ops, name); e.failure()) return e;
  float* pdx = dxw->typed_data();
  const int64_t slots = P.Slots() * H;
  std::vector<float> dhistory(B * slots);  // the history slots' gradients, this block

  // Position p's panel j, row i: W_p[c][i] for the columns c = j * kNR + q of x~ (W_p^T).
  std::vector<int64_t> at(k);
  int64_t size = 0;
  for (int64_t p = 0; p < k; ++p) at[p] = size, size += P.pc[p] * G * kNR;
  float* packed = Scratch(size);
  for (int64_t p = 0; p < k; ++p) {
    PackTransposedPanels(pw + P.wrow[p] * G, P.R[p] * H, G, G, packed + at[p]);
  }

  const RowGroups groups(B);
  Steps steps(groups.count, T + 1);
  OnTeam(pool, Threads(pool, groups.count), [&](int member, int members) {
    alignas(64) float tile[kMR * kNR];
    // Step s is t = T - 1 - s's A' and C'; s = T (t = -1) adds the carried state's
    // gradient to dh0.
    steps.Run(member, members, [&](int64_t group, int64_t step) {
      const int64_t r0 = groups.First(group), t = T - 1 - step;
      const int rows = groups.Rows(group);
      for (int64_t b = r0; t > 0 && b < r0 + rows; ++b) {  // the next step's rows, toward L2
        const int64_t row = P.Row(b, t - 1);
        Prefetch(acts.typed_data() + row * G, G);
        for (const Buffer* a : {&tc, &c_prev, &dys}) Prefetch(a->typed_data() + row * H, H);
      }
      for (int64_t b = r0; b < r0 + rows; ++b) {  // A'
        float* dslot = dhistory.data() + b * slots;
        float* dhb = dh + b * H;
        P.EndBlock(t, dslot, dhb);
        if (t < 0) continue;
        const int64_t p = t % k, row = P.Row(b, t);
        float* dz = pdx + row * G;
        if (pm != nullptr && pm[row] == 0.f) {  // padding: no gradient, the carry's passed on
          std::fill_n(dz, G, 0.f);
          continue;
        }
        const float* ai = acts.typed_data() + row * G;
        const float* tcr = tc.typed_data() + row * H;
        const float* cpr = c_prev.typed_data() + row * H;
        const float* dy = dys.typed_data() + row * H;
        const float* dnext = p + 1 < k ? dslot + (p + 1) * H : nullptr;
        float* dcb = dc + b * H;
        for (int64_t u = 0; u < H; ++u) {  // h_t's gradient reaches no later carry but x~'s
          const LstmGrads<float> g(ai[u], ai[H + u], ai[2 * H + u], ai[3 * H + u], tcr[u],
                                   cpr[u], dhb[u] + dy[u] + (dnext ? dnext[u] : 0.f), dcb[u]);
          for (int q = 0; q < 4; ++q) dz[q * H + u] = g.dz[q];
          dcb[u] = g.dc_old;
          dhb[u] = 0.f;
        }
      }
      if (t < 0) return;
      const int64_t p = t % k, width = P.R[p] * H;
      const float* dz0 = pdx + P.Row(r0, t) * G;  // row r0 + i of the step's dz: + i T G
      for (int64_t j = 0; j < P.pc[p]; ++j) {  // C': dx~ of columns [c0, c0 + cols)
        const int64_t c0 = j * kNR;
        const int cols = static_cast<int>(std::min<int64_t>(kNR, width - c0));
        kTiles[rows - 1](dz0, T * G, packed + at[p] + j * G * kNR, G, tile);
        for (int i = 0; i < rows; ++i) {  // into the history slots x~ read
          float* dslot = dhistory.data() + (r0 + i) * slots + P.lo[p] * H + c0;
          for (int q = 0; q < cols; ++q) dslot[q] += tile[i * kNR + q];
        }
      }
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnGruForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // xw
                                  .Arg<Buffer>()  // h0
                                  .Arg<Buffer>()  // mask
                                  .Attr<int64_t>("k")
                                  .Attr<bool>("block_start")
                                  .Attr<bool>("gru")
                                  .Ret<Buffer>()  // ys
                                  .Ret<Buffer>()  // h
                                  .Ret<Buffer>()  // acts
                                  .RemainingRets());  // ops

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnGruBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // dys
                                  .Arg<Buffer>()  // dh
                                  .Arg<Buffer>()  // mask
                                  .Arg<Buffer>()  // acts
                                  .RemainingArgs()  // ops
                                  .Attr<int64_t>("k")
                                  .Attr<bool>("block_start")
                                  .Attr<bool>("gru")
                                  .Ret<Buffer>()  // dxw
                                  .Ret<Buffer>());  // dh0

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnDenseLstmForward, LstmForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // xw
                                  .Arg<Buffer>()  // c0
                                  .Arg<Buffer>()  // h0
                                  .Arg<Buffer>()  // mask
                                  .Attr<int64_t>("k")
                                  .Attr<bool>("block_start")
                                  .Ret<Buffer>()  // ys
                                  .Ret<Buffer>()  // c
                                  .Ret<Buffer>()  // h
                                  .Ret<Buffer>()  // acts
                                  .Ret<Buffer>()  // c_prev
                                  .Ret<Buffer>()  // tc
                                  .RemainingRets());  // ops

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnDenseLstmBackward, LstmBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()  // w
                                  .Arg<Buffer>()  // dys
                                  .Arg<Buffer>()  // dc
                                  .Arg<Buffer>()  // dh
                                  .Arg<Buffer>()  // mask
                                  .Arg<Buffer>()  // acts
                                  .Arg<Buffer>()  // c_prev
                                  .Arg<Buffer>()  // tc
                                  .RemainingArgs()  // ops
                                  .Attr<int64_t>("k")
                                  .Attr<bool>("block_start")
                                  .Ret<Buffer>()  // dxw
                                  .Ret<Buffer>()  // dc0
                                  .Ret<Buffer>());  // dh0
