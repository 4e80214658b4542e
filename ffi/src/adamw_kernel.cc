// Fused AdamW for XLA on CPU: one pass over p, g, m, v, split across threads.
//
// Per element, in this order and in float32 (the file is compiled with -ffp-contract=off, so
// no multiply-add is fused and a numpy float32 reference can reproduce it bit for bit):
//   m' = (1-b1)*g + b1*m            v' = (1-b2)*(g*g) + b2*v
//   u  = (m'*r1) / (sqrt(v'*r2) + eps)          r1 = 1/(1-b1^t), r2 = 1/(1-b2^t)
//   u  = u + wd*p                   (only where weight decay applies: attribute `decay`)
//   u  = neg_lr * u                 (neg_lr = -learning rate)
//   mode 0 ("apply"):   p' = p + u, written over p;   mode 1 ("updates"): u is the result.
// This is optax.adamw as XLA compiles it, except that XLA contracts the multiply-adds (mu, nu,
// p + neg_lr*x) into fused multiply-adds (see jaxoff/optim/_fused.py). The bias corrections
// are multiplied as reciprocals because XLA rewrites optax's division by a scalar that way.
//
// Operands: p (f32|bf16), g (f32|bf16), m (f32), v (f32), hyper (f32[9]: b1, 1-b1, b2, 1-b2,
// r1, r2, eps, wd, neg_lr) -- data, so a learning-rate schedule never recompiles.
// Results: p' or u, m', v'. Python aliases them to p, m, v (input_output_aliases).
#include "adamw_kernel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace ffi = xla::ffi;

namespace jaxoff::ffi_handlers {
namespace {

constexpr int64_t kNumHyper = 9;
constexpr int64_t kMinPerThread = 1 << 18;  // elements: below this a thread costs more than it saves
constexpr int64_t kBlock = 1 << 16;  // elements a thread claims at a time (256 KiB per array)

struct Hyper {
  float b1, omb1, b2, omb2, r1, r2, eps, wd, neg_lr;
};

using bf16_bits = uint16_t;

inline float ToFloat(float x) { return x; }
inline float ToFloat(bf16_bits x) {
  uint32_t b = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
template <typename T>
inline T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) { return f; }
template <>
inline bf16_bits FromFloat<bf16_bits>(float f) {  // round to nearest even; NaN stays NaN
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  uint32_t rounded = b + 0x7fffu + ((b >> 16) & 1u);
  uint32_t r = (b & 0x7fffffffu) > 0x7f800000u ? (b | 0x00400000u) : rounded;
  return static_cast<bf16_bits>(r >> 16);
}

// One range [lo, hi). `out` may equal `p` (mode 0, in place); m/v results may equal m/v.
// `omp simd` (with -fopenmp-simd, no OpenMP runtime) vectorises despite that aliasing: every
// iteration touches only its own index.
template <typename P, typename G, typename O, bool kDecay, bool kApply>
[[gnu::always_inline]] inline void Range(const P* p, const G* g, const float* m, const float* v,
                                         O* out, float* m_out, float* v_out, Hyper h,
                                         int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = ToFloat(g[i]);
    const float pi = ToFloat(p[i]);
    const float mi = h.omb1 * gi + h.b1 * m[i];
    const float vi = h.omb2 * (gi * gi) + h.b2 * v[i];
    float u = (mi * h.r1) / (std::sqrt(vi * h.r2) + h.eps);
    if constexpr (kDecay) u = u + h.wd * pi;
    u = h.neg_lr * u;
    m_out[i] = mi;
    v_out[i] = vi;
    if constexpr (kApply) {
      out[i] = FromFloat<O>(pi + u);
    } else {
      out[i] = u;
    }
  }
}

// The same loop compiled for three instruction sets, chosen once at run time.
template <typename P, typename G, typename O, bool kDecay, bool kApply>
using RangeFn = void (*)(const P*, const G*, const float*, const float*, O*, float*, float*,
                         Hyper, int64_t, int64_t);

template <typename P, typename G, typename O, bool kDecay, bool kApply>
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2")]] void RangeAvx512(
    const P* p, const G* g, const float* m, const float* v, O* out, float* m_out, float* v_out,
    Hyper h, int64_t lo, int64_t hi) {
  Range<P, G, O, kDecay, kApply>(p, g, m, v, out, m_out, v_out, h, lo, hi);
}
template <typename P, typename G, typename O, bool kDecay, bool kApply>
[[gnu::target("avx2")]] void RangeAvx2(const P* p, const G* g, const float* m, const float* v,
                                       O* out, float* m_out, float* v_out, Hyper h, int64_t lo,
                                       int64_t hi) {
  Range<P, G, O, kDecay, kApply>(p, g, m, v, out, m_out, v_out, h, lo, hi);
}
template <typename P, typename G, typename O, bool kDecay, bool kApply>
void RangeBase(const P* p, const G* g, const float* m, const float* v, O* out, float* m_out,
               float* v_out, Hyper h, int64_t lo, int64_t hi) {
  Range<P, G, O, kDecay, kApply>(p, g, m, v, out, m_out, v_out, h, lo, hi);
}

enum class Isa { kBase, kAvx2, kAvx512 };

Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
  return Isa::kBase;
}

template <typename P, typename G, typename O, bool kDecay, bool kApply>
RangeFn<P, G, O, kDecay, kApply> PickRange() {
  static const Isa isa = DetectIsa();
  switch (isa) {
    case Isa::kAvx512: return &RangeAvx512<P, G, O, kDecay, kApply>;
    case Isa::kAvx2: return &RangeAvx2<P, G, O, kDecay, kApply>;
    default: return &RangeBase<P, G, O, kDecay, kApply>;
  }
}

int64_t NumThreads(int64_t n, int64_t requested) {
  int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  int64_t want = requested > 0 ? requested : hw;
  return std::clamp<int64_t>(std::min(want, n / kMinPerThread), 1, 64);
}

template <typename P, typename G, typename O, bool kDecay, bool kApply>
void Run(const void* p, const void* g, const float* m, const float* v, void* out, float* m_out,
         float* v_out, Hyper h, int64_t n, int64_t threads) {
  auto fn = PickRange<P, G, O, kDecay, kApply>();
  auto call = [&](int64_t lo, int64_t hi) {
    fn(static_cast<const P*>(p), static_cast<const G*>(g), m, v, static_cast<O*>(out), m_out,
       v_out, h, lo, hi);
  };
  int64_t t = NumThreads(n, threads);
  if (t == 1) {
    call(0, n);
    return;
  }
  // Threads claim blocks from a shared counter rather than taking fixed halves: on a shared
  // machine one thread may be descheduled for a while, and the others then do its share.
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t lo; (lo = next.fetch_add(kBlock, std::memory_order_relaxed)) < n;) {
      call(lo, std::min(n, lo + kBlock));
    }
  };
  std::vector<std::thread> workers;
  try {
    workers.reserve(t - 1);
    for (int64_t k = 0; k + 1 < t; ++k) workers.emplace_back(work);
  } catch (const std::exception&) {
    // No (more) threads to be had: the blocks left are done by the threads that started.
  }
  work();
  for (auto& w : workers) w.join();
}

template <typename P, typename G, typename O>
void Dispatch(bool decay, bool apply, const void* p, const void* g, const float* m,
              const float* v, void* out, float* m_out, float* v_out, Hyper h, int64_t n,
              int64_t threads) {
  if (apply) {
    if (decay) Run<P, G, O, true, true>(p, g, m, v, out, m_out, v_out, h, n, threads);
    else Run<P, G, O, false, true>(p, g, m, v, out, m_out, v_out, h, n, threads);
  } else {
    if (decay) Run<P, G, float, true, false>(p, g, m, v, out, m_out, v_out, h, n, threads);
    else Run<P, G, float, false, false>(p, g, m, v, out, m_out, v_out, h, n, threads);
  }
}

bool IsF32(const ffi::AnyBuffer& b) { return b.element_type() == ffi::DataType::F32; }
bool IsF32OrBf16(const ffi::AnyBuffer& b) {
  return IsF32(b) || b.element_type() == ffi::DataType::BF16;
}

ffi::Error Invalid(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxoff_adamw: " + msg);
}

ffi::Error AdamWImpl(ffi::AnyBuffer p, ffi::AnyBuffer g, ffi::AnyBuffer m, ffi::AnyBuffer v,
                     ffi::AnyBuffer hyper, int64_t mode, int64_t decay, int64_t threads,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> m_out,
                     ffi::Result<ffi::AnyBuffer> v_out) {
  const int64_t n = static_cast<int64_t>(p.element_count());
  if (mode != 0 && mode != 1) return Invalid("mode must be 0 (apply) or 1 (updates)");
  if (!IsF32OrBf16(p) || !IsF32OrBf16(g)) {
    return Invalid("parameters and gradients must be float32 or bfloat16");
  }
  if (!IsF32(m) || !IsF32(v) || !IsF32(*m_out) || !IsF32(*v_out)) {
    return Invalid("the moments mu and nu must be float32");
  }
  if (!IsF32(hyper) || static_cast<int64_t>(hyper.element_count()) != kNumHyper) {
    return Invalid("hyper must be float32[9]");
  }
  if (static_cast<int64_t>(g.element_count()) != n ||
      static_cast<int64_t>(m.element_count()) != n ||
      static_cast<int64_t>(v.element_count()) != n ||
      static_cast<int64_t>(out->element_count()) != n ||
      static_cast<int64_t>(m_out->element_count()) != n ||
      static_cast<int64_t>(v_out->element_count()) != n) {
    return Invalid("parameters, gradients, moments and results must have the same size");
  }
  const bool apply = mode == 0;
  if (apply ? out->element_type() != p.element_type() : !IsF32(*out)) {
    return Invalid(apply ? "the new parameters must have the parameters' dtype"
                         : "the updates must be float32");
  }
  if (n == 0) return ffi::Error::Success();
  Hyper h;
  static_assert(sizeof(Hyper) == kNumHyper * sizeof(float));
  std::memcpy(&h, hyper.untyped_data(), sizeof h);

  const void* pp = p.untyped_data();
  const void* gp = g.untyped_data();
  const auto* mp = static_cast<const float*>(m.untyped_data());
  const auto* vp = static_cast<const float*>(v.untyped_data());
  void* op = out->untyped_data();
  auto* mo = static_cast<float*>(m_out->untyped_data());
  auto* vo = static_cast<float*>(v_out->untyped_data());
  const bool p32 = IsF32(p), g32 = IsF32(g);
  if (p32 && g32) {
    Dispatch<float, float, float>(decay, apply, pp, gp, mp, vp, op, mo, vo, h, n, threads);
  } else if (p32) {
    Dispatch<float, bf16_bits, float>(decay, apply, pp, gp, mp, vp, op, mo, vo, h, n, threads);
  } else if (g32) {
    Dispatch<bf16_bits, float, bf16_bits>(decay, apply, pp, gp, mp, vp, op, mo, vo, h, n,
                                          threads);
  } else {
    Dispatch<bf16_bits, bf16_bits, bf16_bits>(decay, apply, pp, gp, mp, vp, op, mo, vo, h, n,
                                              threads);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamWHandler, AdamWImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // p
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // m
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // hyper
                                  .Attr<int64_t>("mode")
                                  .Attr<int64_t>("decay")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::AnyBuffer>()   // p' (mode 0) or u (mode 1)
                                  .Ret<ffi::AnyBuffer>()   // m'
                                  .Ret<ffi::AnyBuffer>());  // v'

}  // namespace jaxoff::ffi_handlers
