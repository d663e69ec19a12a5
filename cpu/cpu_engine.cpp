// cpu/cpu_engine.cpp — Engine<T> over cpu.hpp; host memory.
#include "cpu_engine.hpp"

#include "burstlab/block_split.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "burstlab/merge.hpp"

namespace burstlab::cpu {

namespace {

template <class U>
void fill_as(void* dst, int64_t n, double value) {
  std::fill(static_cast<U*>(dst), static_cast<U*>(dst) + n, from_double<U>(value));
}
template <class U>
void add_as(void* acc, const void* in, int64_t n) {
  U* a = static_cast<U*>(acc);
  const U* b = static_cast<const U*>(in);
  for (int64_t i = 0; i < n; ++i) a[i] = from_double<U>(to_double(a[i]) + to_double(b[i]));
}

template <class T>
class CpuEngine final : public Engine<T> {
 public:
  using A = acc_t<T>;
  explicit CpuEngine(Tiles tiles) : tiles_(tiles) { validate_tiles(tiles); }
  std::string name() const override { return "cpu"; }

  std::shared_ptr<void> allocate(int64_t bytes) override {
    // 64-byte aligned (Eigen's packets), contents unspecified.
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1) + 63) / 64;
    return std::shared_ptr<void>(::operator new[](n * 64, std::align_val_t(64)),
                                 [](void* q) { ::operator delete[](q, std::align_val_t(64)); });
  }
  void upload(void* dst, const void* host, int64_t bytes) override { std::memcpy(dst, host, size_t(bytes)); }
  void download(void* host, const void* src, int64_t bytes) override { std::memcpy(host, src, size_t(bytes)); }
  void copy(void* dst, const void* src, int64_t bytes) override { std::memmove(dst, src, size_t(bytes)); }
  void fill(void* dst, int64_t n, Dtype t, double value) override {
    dispatch_dtype(t, [&](auto tag) { fill_as<typename decltype(tag)::type>(dst, n, value); });
  }
  void add(void* acc, const void* in, int64_t n, Dtype t) override {
    dispatch_dtype(t, [&](auto tag) { add_as<typename decltype(tag)::type>(acc, in, n); });
  }

  PreparedMask prepare(const MaskData& mask) override {
    auto held = std::make_shared<MaskData>(mask);  // params point into this copy
    PreparedMask m;
    m.params = held->params();
    m.hold = held;
    return m;
  }

  // Blocks over a few position progressions run by parts over contiguous positions, forward and
  // backward, as the CUDA engine runs them (block_split.hpp), so that the split is checked end to
  // end here too.
  void forward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k,
                     View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE,
                     bool accumulate) override {
    const auto part = [this](auto&&... a) { block(a...); };
    if ((q.index || k.index) && forward_parts(p, mask.params, q, k, Q, K, V, O, LSE, accumulate, part)) return;
    block(p, mask.params, q, k, Q, K, V, O, LSE, accumulate);
  }
  void merge(View4<T> O, View3<A> LSE, View4<const T> O_part, View3<const A> LSE_part) override {
    burstlab::merge<T>(O, LSE, O_part, LSE_part);
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<A> D) override { cpu::compute_D<T>(O, dO, D); }
  void backward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k,
                      View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                      View3<const A> LSE, View3<const A> D, View4<A> dQ, View4<A> dK, View4<A> dV) override {
    const auto part = [this](const Problem& pp, const MaskParams& m, auto&&... a) {
      cpu::backward_block<T>(pp, m, a..., tiles_);
    };
    if ((q.index || k.index) && backward_parts(p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV, part)) return;
    cpu::backward_block<T>(p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV, tiles_);
  }

 private:
  void block(const Problem& p, const MaskParams& mask, Positions q, Positions k, View4<const T> Q,
             View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE, bool accumulate) {
    if (!accumulate) return cpu::forward_block<T>(p, mask, q, k, Q, K, V, O, LSE, tiles_);
    // The partial in scratch, then the merge (4.5) into (O, LSE).
    const int64_t B = O.dim[0], H = O.dim[1], n = O.dim[2], d = O.dim[3];
    std::vector<T> o(static_cast<size_t>(B * H * n * d)), l(static_cast<size_t>(B * H * n));
    View4<T> Op = view4(o.data(), Layout::BHSD, B, H, n, d);
    View3<T> Lp = view3(l.data(), B, H, n);
    cpu::forward_block<T>(p, mask, q, k, Q, K, V, Op, Lp, tiles_);
    burstlab::merge<T>(O, LSE, as_const(Op), as_const(Lp));
  }

  Tiles tiles_;
};

}  // namespace

template <class T>
std::unique_ptr<Engine<T>> make_engine(Tiles tiles) {
  return std::make_unique<CpuEngine<T>>(tiles);
}
template std::unique_ptr<Engine<float>> make_engine<float>(Tiles);
template std::unique_ptr<Engine<double>> make_engine<double>(Tiles);

}  // namespace burstlab::cpu
