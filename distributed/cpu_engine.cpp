// distributed/cpu_engine.cpp — Engine<T> over cpu/cpu.hpp; host memory.
#include "cpu_engine.hpp"

#include <algorithm>

#include "burstlab/merge.hpp"

namespace burstlab::dist {

namespace {

template <class T>
class CpuEngine final : public Engine<T> {
 public:
  explicit CpuEngine(cpu::Tiles tiles) : tiles_(tiles) { cpu::validate_tiles(tiles); }
  std::string name() const override { return "cpu"; }
  Buffer<T> alloc(int64_t n) override {
    auto v = std::make_shared<std::vector<T>>(static_cast<size_t>(std::max<int64_t>(n, 1)));
    Buffer<T> b;
    b.data = v->data();
    b.n = n;
    b.hold = v;
    return b;
  }
  void fill(T* dst, int64_t n, T value) override { std::fill(dst, dst + n, value); }
  void upload(T* dst, const T* host, int64_t n) override { std::copy(host, host + n, dst); }
  void download(T* host, const T* src, int64_t n) override { std::copy(src, src + n, host); }
  void forward_block(const Problem& p, const MaskData& mask, Positions q, Positions k,
                     View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                     View3<T> LSE) override {
    cpu::forward_block<T>(p, mask.params(), q, k, Q, K, V, O, LSE, tiles_);
  }
  void merge(View4<T> O, View3<T> LSE, View4<const T> O_part, View3<const T> LSE_part) override {
    burstlab::merge<T>(O, LSE, O_part, LSE_part);
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<T> D) override {
    cpu::compute_D<T>(O, dO, D);
  }
  void backward_block(const Problem& p, const MaskData& mask, Positions q, Positions k,
                      View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                      View3<const T> LSE, View3<const T> D, View4<T> dQ, View4<T> dK,
                      View4<T> dV) override {
    cpu::backward_block<T>(p, mask.params(), q, k, Q, K, V, dO, LSE, D, dQ, dK, dV, tiles_);
  }

 private:
  cpu::Tiles tiles_;
};

}  // namespace

template <class T>
std::unique_ptr<Engine<T>> make_cpu_engine(cpu::Tiles tiles) {
  return std::make_unique<CpuEngine<T>>(tiles);
}
template std::unique_ptr<Engine<float>> make_cpu_engine<float>(cpu::Tiles);
template std::unique_ptr<Engine<double>> make_cpu_engine<double>(cpu::Tiles);

}  // namespace burstlab::dist
