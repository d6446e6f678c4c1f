// What the recurrent scans of csrc/ share: the register-tiled product that streams a
// packed weight panel, tanh as XLA's CPU backend computes it, and the team of threads that
// runs a scan's steps as stages of panels claimed one at a time (lstm_scan.cc's header
// says why).
#ifndef DENSE_RNN_CSRC_SCAN_KERNEL_H_
#define DENSE_RNN_CSRC_SCAN_KERNEL_H_

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace dense_rnn {

#if defined(__AVX512F__)
constexpr int kVL = 16;  // floats in a vector register
constexpr int kMR = 10;  // rows of a register tile: 2 * kMR accumulators of 32 registers
#else
constexpr int kVL = 8;
constexpr int kMR = 6;  // 2 * kMR accumulators of 16 registers
#endif
constexpr int kNR = 2 * kVL;  // columns of a register tile: a panel's width

typedef float Vec __attribute__((vector_size(kVL * 4), aligned(4)));
// lane i holds i
inline const Vec kLane = [] {
  Vec v;
  for (int i = 0; i < kVL; ++i) v[i] = static_cast<float>(i);
  return v;
}();

using Buffer = ffi::Buffer<ffi::F32>;
using Result = ffi::ResultBuffer<ffi::F32>;

// tanh(x) as Eigen's generic_fast_tanh_float (a 13/6 rational function on [-c, c]), of a
// float or, lane by lane, of a GCC vector of floats.
template <typename V>
inline V Tanh(V x) {
  const V c = V{} + 7.90531110763549805f, zero = V{};
  x = x > c ? c : x;
  x = x < -c ? -c : x;
  const V x2 = x * x;
  V p = zero - 2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  V q = zero + 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  const V small = zero + 0.0004f;
  return (x < zero ? -x : x) < small ? x : x * p / q;
}

// out[r][0:kNR] = sum_k a[r * lda + k] * panel[k][0:kNR] for r < R: a register tile; with
// Add, out[r][0:kNR] += that sum.
template <int R, bool Add = false>
void Tile(const float* a, int64_t lda, const float* panel, int64_t k_size, float* out) {
  Vec acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = Add ? *reinterpret_cast<const Vec*>(out + r * kNR) : Vec{};
    acc1[r] = Add ? *reinterpret_cast<const Vec*>(out + r * kNR + kVL) : Vec{};
  }
  for (int64_t k = 0; k < k_size; ++k) {
    const Vec w0 = *reinterpret_cast<const Vec*>(panel + k * kNR);
    const Vec w1 = *reinterpret_cast<const Vec*>(panel + k * kNR + kVL);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = a[r * lda + k];
      acc0[r] += x * w0;
      acc1[r] += x * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    *reinterpret_cast<Vec*>(out + r * kNR) = acc0[r];
    *reinterpret_cast<Vec*>(out + r * kNR + kVL) = acc1[r];
  }
}

// v stored at p, 4 * kVL-byte aligned, past the caches (and without reading its line first).
inline void StreamStore(float* p, const Vec& v) {
#if defined(__AVX512F__)
  _mm512_stream_ps(p, reinterpret_cast<const __m512&>(v));
#elif defined(__AVX__)
  _mm256_stream_ps(p, reinterpret_cast<const __m256&>(v));
#else
  *reinterpret_cast<Vec*>(p) = v;
#endif
}

// Asks for the n floats at p in L2, ahead of their use.
inline void Prefetch(const float* p, int64_t n) {
  const char* at = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < n * 4; i += 64) __builtin_prefetch(at + i, 0, 2);
}

// dst[0:n] = src[0:n] for n <= N, without a call to memmove: a whole panel's N units as
// one vector move.
template <int N>
inline void Copy(const float* src, int n, float* dst) {
  if (n == N) {
    std::memcpy(dst, src, N * sizeof(float));
  } else {
    for (int q = 0; q < n; ++q) dst[q] = src[q];
  }
}

// Panel j of a forward product's weight w (rows, ld), from column c0: row i holds the
// kNR / Units gates of Units hidden units each, column g * Units + v the weight of unit
// u = j * Units + v of gate g, w[i][c0 + g * H + u] (0 past H).
template <int Units>
void PackGates(const float* w, int64_t rows, int64_t ld, int64_t H, int64_t c0, int64_t j,
               float* out) {
  const int units = static_cast<int>(std::min<int64_t>(Units, H - j * Units));
  for (int64_t i = 0; i < rows; ++i) {
    for (int g = 0; g < kNR / Units; ++g) {
      float* p = out + i * kNR + g * Units;
      Copy<Units>(w + i * ld + c0 + g * H + j * Units, units, p);
      std::fill(p + units, p + Units, 0.f);
    }
  }
}

// The rows r[0:kVL] transposed in registers: r[c][q] = the old r[q][c]. One butterfly a bit
// of the lane index: lanes whose row and column differ in bit D change places.
template <int D, size_t... C>
inline void Swap(Vec& a, Vec& b, std::index_sequence<C...>) {
  const Vec lo = __builtin_shufflevector(a, b, ((C & D) ? kVL + C - D : C)...);
  const Vec hi = __builtin_shufflevector(a, b, ((C & D) ? kVL + C : C + D)...);
  a = lo, b = hi;
}
template <int D = kVL / 2>
inline void Transpose(Vec* r) {
  for (int i = 0; i < kVL; ++i) {
    if ((i & D) == 0) Swap<D>(r[i], r[i + D], std::make_index_sequence<kVL>{});
  }
  if constexpr (D > 1) Transpose<D / 2>(r);
}

// Panel j of a backward product's weight w (rows, ld) transposed, over its first `cols`
// columns: row i holds w[c][i] for the rows c = j * kNR + q (0 past `rows`); kVL x kVL
// blocks transposed in registers.
inline void PackTransposed(const float* w, int64_t rows, int64_t ld, int64_t cols, int64_t j,
                           float* out) {
  for (int64_t c0 = j * kNR; c0 < (j + 1) * kNR; c0 += kVL) {
    const int n = static_cast<int>(std::clamp<int64_t>(rows - c0, 0, kVL));
    float* o = out + c0 - j * kNR;
    int64_t i = 0;
    for (; i + kVL <= cols; i += kVL) {
      Vec r[kVL];
      for (int q = 0; q < kVL; ++q) {
        r[q] = Vec{};
        if (q < n) std::memcpy(&r[q], w + (c0 + q) * ld + i, sizeof(Vec));
      }
      Transpose(r);
      for (int q = 0; q < kVL; ++q) std::memcpy(o + (i + q) * kNR, &r[q], sizeof(Vec));
    }
    for (; i < cols; ++i) {
      for (int q = 0; q < kVL; ++q) o[i * kNR + q] = q < n ? w[(c0 + q) * ld + i] : 0.f;
    }
  }
}

// An LSTM panel's kNR columns hold the 4 gates [i | f | g | o] of kUnits hidden units (the
// LSTM kernels' packing): two vectors, [i | f] and [g | o], of two gates' halves each.
constexpr int kUnits = kNR / 4;
typedef float Half __attribute__((vector_size(kUnits * 4), aligned(4)));  // a gate's units

// `units` (<= kUnits) floats from p as a Half, the rest zero; and back.
inline Half Load(const float* p, int units) {
  Half v = {};
  if (units == kUnits) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (int q = 0; q < units; ++q) v[q] = p[q];
  }
  return v;
}
inline void Store(const Half& v, int units, float* p) {
  if (units == kUnits) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (int q = 0; q < units; ++q) p[q] = v[q];
  }
}

// Two halves as one vector [a | b], and a half of one, in registers: a vector stored in two
// halves and loaded whole waits for the stores to land (no store-to-load forwarding), a
// stall that cost the LSTM kernels' forward steps more than their products.
template <size_t... I>
inline Vec Join(Half a, Half b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, I...);
}
inline Vec Join(Half a, Half b) { return Join(a, b, std::make_index_sequence<kVL>{}); }
template <size_t Lo, size_t... I>
inline Half Part(Vec v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (Lo + I)...);
}
template <size_t Lo>
inline Half Part(Vec v) { return Part<Lo>(v, std::make_index_sequence<kUnits>{}); }

// s of the vector [g | o]: s tanh(s x) + 1 - s is tanh for g, sigmoid for o.
inline const Vec kGateScale = [] {
  Vec s;
  for (int q = 0; q < kVL; ++q) s[q] = q < kUnits ? 1.f : 0.5f;
  return s;
}();

// One row of an LSTM panel's step, cells.lstm_gates and cells.lstm_update: z, the row of
// the panel's tile, holds the recurrent products of the gates; x, the row's input
// projection at the panel's first unit (gate g at x + g * H); c, its c_{t-1}. if_ and go
// are the gates' activations [i | f] and [g | o]; c_old, c, tc and h are c_{t-1}, c_t,
// tanh(c_t) and h_t. With b, the gates' biases at the panel's first unit (gate g at
// b + g * H), the input is x + b, added first, as XLA adds the bias to the projection.
struct LstmUnits {
  LstmUnits(const float* z, const float* x, int64_t H, const float* c_prev, int units,
            const float* b = nullptr) {
    const Vec* zv = reinterpret_cast<const Vec*>(z);
    Vec x_if = Join(Load(x, units), Load(x + H, units));
    Vec x_go = Join(Load(x + 2 * H, units), Load(x + 3 * H, units));
    if (b != nullptr) {
      x_if += Join(Load(b, units), Load(b + H, units));
      x_go += Join(Load(b + 2 * H, units), Load(b + 3 * H, units));
    }
    if_ = zv[0] + x_if;
    go = zv[1] + x_go;
    if_ = 0.5f * Tanh(0.5f * if_) + 0.5f;
    go = kGateScale * Tanh(kGateScale * go) + (1.f - kGateScale);
    c_old = Load(c_prev, units);
    c = Part<kUnits>(if_) * c_old + Part<0>(if_) * Part<0>(go);
    tc = Tanh(c);
    h = Part<kUnits>(go) * tc;
  }

  // The gates' activations, gate g's units at acts + g * H: stored from registers, as a
  // half of a vector reloaded from a whole one's store waits for it to land (Join's note).
  void StoreGates(float* acts, int64_t H, int units) const {
    Store(Part<0>(if_), units, acts), Store(Part<kUnits>(if_), units, acts + H);
    Store(Part<0>(go), units, acts + 2 * H), Store(Part<kUnits>(go), units, acts + 3 * H);
  }

  Vec if_, go;
  Half c_old, c, tc, h;
};

// recurrent._lstm_scan_bwd's step for units as floats or vectors V: from the gates'
// activations, tanh(c_t), c_{t-1} and the gradients dh of h_t and dc of c_t, the gates'
// pre-activation gradients dz [i, f, g, o] and that of c_{t-1}.
template <typename V>
struct LstmGrads {
  LstmGrads(V ig, V fg, V gg, V og, V tc, V c_prev, V dh, V dc) {
    const V dc_new = dc + dh * og * (1.f - tc * tc);
    dz[0] = dc_new * gg * ig * (1.f - ig);
    dz[1] = dc_new * c_prev * fg * (1.f - fg);
    dz[2] = dc_new * ig * (1.f - gg * gg);
    dz[3] = dh * tc * og * (1.f - og);
    dc_old = dc_new * fg;
  }
  V dz[4], dc_old;
};

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*);

template <bool Add, int... R>
constexpr auto MakeTiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&Tile<R + 1, Add>...};
}
constexpr auto kTiles = MakeTiles<false>(std::make_integer_sequence<int, kMR>{});
constexpr auto kAddTiles = MakeTiles<true>(std::make_integer_sequence<int, kMR>{});

// A buffer of at least n floats for the calling thread, kept for its next call: the
// packed weights would otherwise be fresh pages, faulted in at every call.
inline float* Scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// A run of stages of `items` items each, shared by a team of threads: stage s + 1 starts
// once every item of stage s is done. Member m of n owns the items [items * m / n,
// items * (m + 1) / n) and claims them first, then the other members' unclaimed ones.
class Stages {
 public:
  explicit Stages(int64_t items) : items_(items) {}

  // Runs fn(stage, item) for the items this member claims, over stages [0, stages).
  template <typename Fn>
  void Run(int member, int members, int64_t stages, Fn fn) {
    for (int64_t s = 0; s < stages;) {
      for (int k = 0; k < members; ++k) {
        const int r = (member + k) % members;
        for (int64_t item; (item = Claim(r, members, s)) >= 0; done_.fetch_add(1)) fn(s, item);
      }
      const int64_t target = (s + 1) * items_;  // then wait for the others' items
      for (int spins = 0; done_.load() < target; ++spins) {
        if (spins > 64) std::this_thread::yield();
      }
      s = done_.load() / items_;  // a member that slept through stages skips them
    }
  }

 private:
  // An unclaimed item of stage s in member r's share, or -1. A share's claims count up
  // across stages, so a count at or past the end of stage s's leaves it for the next.
  int64_t Claim(int r, int members, int64_t s) {
    const int64_t lo = items_ * r / members, size = items_ * (r + 1) / members - lo;
    std::atomic<int64_t>& claimed = claimed_[r].count;
    for (int64_t c = claimed.load(); c < (s + 1) * size;) {
      if (claimed.compare_exchange_weak(c, c + 1)) return lo + c % size;
    }
    return -1;
  }

  struct alignas(64) Counter {
    std::atomic<int64_t> count{0};
  };
  const int64_t items_;
  std::array<Counter, 64> claimed_;  // one per member's share (Threads caps a team at 64)
  std::atomic<int64_t> done_{0};
};

// The batch rows cut into groups of at most kMR, one register tile each, sizes balanced.
struct RowGroups {
  explicit RowGroups(int64_t rows) : rows(rows), count((rows + kMR - 1) / kMR) {}
  int64_t First(int64_t g) const { return rows * g / count; }
  int Rows(int64_t g) const { return static_cast<int>(First(g + 1) - First(g)); }
  const int64_t rows, count;
};

// The steps of independent sequences (groups of rows), shared by a team with no barrier:
// each group's steps run in order, one at a time, and a member takes the first group
// (from its own share on) whose next step no one is running. So a member stays on a group
// while it can, and one the OS deschedules holds up only the group it holds.
class Steps {
 public:
  Steps(int64_t groups, int64_t steps) : steps_(steps), state_(groups) {}

  // Runs fn(group, step) for every step of every group.
  template <typename Fn>
  void Run(int member, int members, Fn fn) {
    const int64_t groups = static_cast<int64_t>(state_.size());
    const int64_t first = groups * member / members;
    for (int spins = 0;;) {
      bool left = false, ran = false;
      for (int64_t i = 0; i < groups && !ran; ++i) {
        std::atomic<int64_t>& state = state_[(first + i) % groups].value;
        int64_t s = state.load();  // 2 * next step, + 1 while it runs
        if (s >= 2 * steps_) continue;
        left = true;
        if (s % 2 == 0 && state.compare_exchange_strong(s, s + 1)) {
          fn((first + i) % groups, s / 2);
          state.store(s + 2);
          ran = true;
        }
      }
      if (!left) return;
      if (ran) {
        spins = 0;
      } else if (++spins > 64) {
        std::this_thread::yield();
      }
    }
  }

 private:
  struct alignas(64) State {
    std::atomic<int64_t> value{0};
  };
  const int64_t steps_;
  std::vector<State> state_;
};

// Runs body(member, members) on a team of at most `want` threads: the caller (member 0)
// and the tasks on the pool that start within kJoinWindow. The team is fixed before body
// runs and a task that starts later does nothing, so the caller never waits on a task that
// cannot start (the pool's threads all busy, with another call like this one say). Every
// hidden unit's arithmetic is the same whoever computes it: results depend neither on the
// team's size nor on who claimed what.
template <typename Body>
void OnTeam(ffi::ThreadPool& pool, int want, Body body) {
  constexpr int kClosed = 1 << 30;
  constexpr auto kJoinWindow = std::chrono::milliseconds(2);
  struct Team {
    std::atomic<int> state{1};  // members so far, | kClosed once the team is fixed
    std::atomic<bool> ready{false};
    std::atomic<int> done{0};
    int members = 1;
  };
  auto team = std::make_shared<Team>();
  for (int i = 1; i < want; ++i) {
    pool.Schedule([team, run = &body] {
      int s = team->state.load();
      do {
        if (s & kClosed) return;  // too late: the team was fixed without this task
      } while (!team->state.compare_exchange_weak(s, s + 1));
      while (!team->ready.load()) std::this_thread::yield();
      (*run)(s, team->members);
      team->done.fetch_add(1);
    });
  }
  const auto start = std::chrono::steady_clock::now();
  while (team->state.load() < want && std::chrono::steady_clock::now() - start < kJoinWindow) {
    std::this_thread::yield();
  }
  const int members = team->state.fetch_or(kClosed);
  team->members = members;
  team->ready.store(true);
  body(0, members);
  while (team->done.load() < members - 1) std::this_thread::yield();
}

inline int Threads(ffi::ThreadPool& pool, int64_t panels) {
  const int64_t threads = std::min<int64_t>(pool.num_threads(), panels);
  return static_cast<int>(std::clamp<int64_t>(threads, 1, 64));
}

// A buffer's element count, signed like the shapes it is checked against.
template <typename B>
int64_t Count(const B& buffer) {
  return static_cast<int64_t>(buffer.element_count());
}

inline ffi::Error Check(bool ok, const char* what) {
  return ok ? ffi::Error::Success() : ffi::Error::InvalidArgument(what);
}

inline ffi::Error Check(bool ok, const char* name, const char* what) {
  return ok ? ffi::Error::Success()
            : ffi::Error::InvalidArgument(std::string(name) + ": " + what);
}

}  // namespace dense_rnn

#endif  // DENSE_RNN_CSRC_SCAN_KERNEL_H_
