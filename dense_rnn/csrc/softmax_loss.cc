// The forward pass of the softmax layer's fused cross-entropy after its product (softmax._nll)
// as one XLA FFI handler (dense_rnn/softmax_kernel.py): for each row t of the logits
// raw (N, V) (without the bias b), its maximum m_t = max(raw_t + b), the sum
// s_t = sum(exp(raw_t + b - m_t)) and the NLL log(s_t) + m_t - (raw_t + b)[y_t], in float32;
// for a training step also e = exp(raw + b - m) (N, V) and 1 / s, the backward's residuals.
//
// XLA runs this as three passes over the (N, V) logits: their maximum, the exponential
// (written out), its sum; a row there is read from memory each time. Here the calling
// thread and tasks on XLA's intra-op pool (OnTeam) take blocks of rows (Stages), each row
// read from memory once (40 KB at PTB's vocabulary, with the bias in L2): its maximum, then
// from L2 the exponential and its sum, e written past the caches (the backward reads it
// back from memory). The shift is the row's exact maximum, so no row's sum can underflow.
// A row's arithmetic is the same whoever computes it.
#include <limits>

#include "scan_kernel.h"

namespace {

using namespace dense_rnn;  // NOLINT: the shared pieces of scan_kernel.h

constexpr int64_t kRows = 8;  // rows of one item
constexpr int kAcc = 4;       // vectors of a row in flight

// exp(x) lane by lane for x <= 0 (a logit less its row's maximum), as Cephes' expf:
// x = n log(2) + r with n an integer (rounded with the 1.5 * 2^23 trick) and
// |r| <= log(2) / 2, e^r by its polynomial, 2^n from the exponent's bits; 0 below
// log(FLT_MIN), NaN kept.
inline Vec Exp(Vec x) {
  typedef int32_t IVec __attribute__((vector_size(kVL * 4)));
  const Vec lo = Vec{} - 87.33654475f, magic = Vec{} + 12582912.f;
  const Vec t = x * 1.44269504088896341f + magic;  // n + magic, n = round(x / log(2))
  const Vec n = t - magic;
  const Vec r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  Vec p = Vec{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  // 2^n: n's bits are t's low mantissa bits; n + 127 in the exponent's field
  const IVec bits = (reinterpret_cast<const IVec&>(t) - 0x4B400000 + 127) << 23;
  const Vec y = p * reinterpret_cast<const Vec&>(bits);
  return x < lo ? Vec{} : y;
}

inline float Max(Vec v) {
  float m = v[0];
  for (int i = 1; i < kVL; ++i) m = std::max(m, v[i]);
  return m;
}

inline float Sum(Vec v) {
  float s = 0.f;
  for (int i = 0; i < kVL; ++i) s += v[i];
  return s;
}

inline Vec Load(const float* p) { return *reinterpret_cast<const Vec*>(p); }

// The vector at q of a row of n floats, lanes past n filled with `fill`.
inline Vec LoadPart(const float* p, int64_t q, int64_t n, float fill) {
  if (q + kVL <= n) return *reinterpret_cast<const Vec*>(p + q);
  Vec v = Vec{} + fill;
  for (int64_t i = q; i < n; ++i) v[i - q] = p[i];
  return v;
}

// The lane-wise maximum of x + b, rows of V floats (lanes past V: -inf); kAcc vectors in
// flight, their chains of dependent operations interleaved.
inline Vec RowMax(const float* x, const float* b, int64_t V) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Vec m[kAcc];
  for (Vec& a : m) a = Vec{} - kInf;
  int64_t q = 0;
  for (; q + kAcc * kVL <= V; q += kAcc * kVL) {
    for (int a = 0; a < kAcc; ++a) {
      const Vec v = Load(x + q + a * kVL) + Load(b + q + a * kVL);
      m[a] = v > m[a] ? v : m[a];  // a NaN is dropped here but makes its sum NaN
    }
  }
  for (; q < V; q += kVL) {
    const Vec v = LoadPart(x, q, V, -kInf) + LoadPart(b, q, V, 0.f);
    m[0] = v > m[0] ? v : m[0];
  }
  for (int a = 1; a < kAcc; ++a) m[0] = m[a] > m[0] ? m[a] : m[0];
  return m[0];
}

// The lane-wise sum of exp(x + b - shift), as RowMax; each vector also stored at e (if not
// null; past the caches with `stream`).
inline Vec RowExpSum(const float* x, const float* b, int64_t V, float shift, float* e,
                     bool stream) {
  Vec s[kAcc] = {};
  int64_t q = 0;
  for (; q + kAcc * kVL <= V; q += kAcc * kVL) {
    for (int a = 0; a < kAcc; ++a) {
      const Vec v = Exp(Load(x + q + a * kVL) + Load(b + q + a * kVL) - shift);
      s[a] += v;
      if (stream) {
        StreamStore(e + q + a * kVL, v);
      } else if (e != nullptr) {
        std::memcpy(e + q + a * kVL, &v, sizeof(Vec));
      }
    }
  }
  for (; q < V; q += kVL) {
    Vec v = Exp(LoadPart(x, q, V, 0.f) + LoadPart(b, q, V, 0.f) - shift);
    v = kLane + static_cast<float>(q) < static_cast<float>(V) ? v : Vec{};
    s[0] += v;
    for (int64_t i = q; e != nullptr && i < std::min(V, q + kVL); ++i) e[i] = v[i - q];
  }
  for (int a = 1; a < kAcc; ++a) s[0] += s[a];
  return s[0];
}

// raw (N, V) logits without the bias, bias (V), targets (N). Results: nll (N), inv_total (N)
// the reciprocals of the rows' sums, and e: (N, V) exp(raw + bias - max) for a training
// step, or empty (0,) for the loss alone.
ffi::Error Forward(ffi::ThreadPool pool, Buffer raw, Buffer bias, ffi::Buffer<ffi::S32> targets,
                   Result nll, Result inv_total, Result e) {
  const auto rd = raw.dimensions();
  if (rd.size() != 2) {
    return ffi::Error::InvalidArgument("dense_rnn_softmax_forward: raw is (N, V)");
  }
  const int64_t N = rd[0], V = rd[1];
  const bool save = Count(*e) != 0;
  if (auto err = Check(Count(bias) == V && Count(targets) == N && Count(*nll) == N &&
                           Count(*inv_total) == N && (!save || Count(*e) == N * V),
                       "dense_rnn_softmax_forward: operand shapes differ");
      err.failure()) {
    return err;
  }
  const float* px = raw.typed_data();
  const float* pb = bias.typed_data();
  const int32_t* py = targets.typed_data();
  float* pe = save ? e->typed_data() : nullptr;
  const bool stream = save && reinterpret_cast<uintptr_t>(pe) % sizeof(Vec) == 0 && V % kVL == 0;
  const int64_t items = (N + kRows - 1) / kRows;
  Stages stages(items);
  OnTeam(pool, Threads(pool, items), [&](int member, int members) {
    stages.Run(member, members, 1, [&](int64_t, int64_t item) {
      const int64_t t1 = std::min(N, (item + 1) * kRows);
      for (int64_t t = item * kRows; t < t1; ++t) {
        const float* x = px + t * V;
        const float shift = Max(RowMax(x, pb, V));
        const float total = Sum(RowExpSum(x, pb, V, shift, save ? pe + t * V : nullptr, stream));
        const int32_t y = py[t];
        const float picked =
            y >= 0 && y < V ? x[y] + pb[y] : std::numeric_limits<float>::quiet_NaN();
        nll->typed_data()[t] = std::log(total) + shift - picked;
        inv_total->typed_data()[t] = 1.f / total;
      }
      if (stream) _mm_sfence();  // the streamed stores land before XLA's next use of e
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseRnnSoftmaxForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buffer>()                  // raw
                                  .Arg<Buffer>()                  // bias
                                  .Arg<ffi::Buffer<ffi::S32>>()  // targets
                                  .Ret<Buffer>()                  // nll
                                  .Ret<Buffer>()                  // inv_total
                                  .Ret<Buffer>());                // e
