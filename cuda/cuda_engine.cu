// cuda/cuda_engine.cu — Engine<T> over cuda.hpp; device memory, a stream per calling thread.
#include "cuda_engine.hpp"

#include "burstlab/block_split.hpp"
#include "burstlab/dispatch.hpp"
#include "burstlab/env.hpp"
#include "detail.cuh"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace burstlab::cuda {

namespace {

using detail::as_device;
using detail::device_t;

// X: a device element type; value already rounded to it.
template <class X>
__global__ void fill_kernel(X* dst, int64_t n, X value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}
// acc += in, summed in the accumulation type (float for every X but double) and rounded once.
template <class X>
__global__ void add_kernel(X* acc, const X* in, int64_t n) {
  using A = acc_t<X>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = detail::from_acc<X>(detail::to_acc<A>(acc[i]) + detail::to_acc<A>(in[i]));
}
int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)); }
// rows pieces of `words` W-byte words: piece r from src + r * src_pitch to dst + r * dst_pitch
// (pitches in words). A kernel, not cudaMemcpy2DAsync: that returned invalid argument for some of
// the collectives' device pitches, as cuMemcpy2D documents it may for pitches it did not compute.
template <class W>
__global__ void copy_rows_kernel(W* dst, int64_t dst_pitch, const W* src, int64_t src_pitch, int64_t words,
                                 int64_t rows) {
  const int64_t n = words * rows;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / words, c = i - r * words;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
}

// A stream per calling thread, from a pool: a thread leases one on first use and gives it back
// when it exits (SimComm starts fresh rank threads every pass, so a stream per thread id would
// create streams without bound). The streams are destroyed with the pool.
class Streams {
  struct Pool {
    std::mutex mu;
    std::vector<cudaStream_t> free, all;
    ~Pool() {
      for (cudaStream_t s : all) cudaStreamDestroy(s);
    }
  };
  struct Lease {
    std::weak_ptr<Pool> pool;
    cudaStream_t s = nullptr;
    ~Lease() {
      if (auto p = pool.lock()) {
        std::lock_guard<std::mutex> lk(p->mu);
        p->free.push_back(s);
      }
    }
  };

 public:
  cudaStream_t get() {
    thread_local std::map<const Pool*, Lease> leases;  // this thread's stream of each engine
    auto it = leases.find(pool_.get());
    if (it != leases.end() && it->second.pool.lock() == pool_) return it->second.s;
    if (it != leases.end()) leases.erase(it);  // a dead pool's lease at a reused address
    Lease l;
    l.pool = pool_;
    {
      std::lock_guard<std::mutex> lk(pool_->mu);
      if (!pool_->free.empty()) {
        l.s = pool_->free.back();
        pool_->free.pop_back();
      }
    }
    if (!l.s) {
      BURSTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&l.s, cudaStreamNonBlocking));
      std::lock_guard<std::mutex> lk(pool_->mu);
      pool_->all.push_back(l.s);
    }
    const cudaStream_t s = l.s;
    leases.emplace(pool_.get(), std::move(l));
    return s;
  }

 private:
  std::shared_ptr<Pool> pool_ = std::make_shared<Pool>();
};

// Device memory with a cache of freed blocks by size (cudaFree synchronizes the whole device,
// which would serialize the ranks' streams at every pass). A block goes back to the cache with
// an event recorded on the releasing thread's stream, and is handed out again only after that
// event completed (work still queued on the block has finished): the new owner may give it to
// another stream (a transport's receive). Scratch that only the calling thread's stream will
// touch (get with same_stream_only) takes a block that stream released without the wait, as
// stream order runs the new work after the old. BURSTLAB_CUDA_CACHE=0 turns the cache off
// (cudaMalloc / cudaFree per buffer), so that compute-sanitizer sees every free.
class BlockCache {
  struct Block {
    void* p;
    cudaEvent_t done;
    cudaStream_t stream;  // the releasing thread's
  };
  struct State {
    std::mutex mu;
    std::multimap<size_t, Block> free;
    ~State() {
      for (auto& f : free) {
        cudaEventDestroy(f.second.done);
        cudaFree(f.second.p);
      }
    }
  };

 public:
  std::shared_ptr<void> get(size_t bytes, std::shared_ptr<Streams> streams, bool same_stream_only = false) {
    if (!enabled_) {
      void* p = nullptr;
      BURSTLAB_CUDA_CHECK(cudaMalloc(&p, bytes));
      return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    }
    bytes = (bytes + 255) / 256 * 256;
    const cudaStream_t mine = same_stream_only ? streams->get() : nullptr;
    void* p = nullptr;
    {
      std::unique_lock<std::mutex> lk(st_->mu);
      const auto [first, last] = st_->free.equal_range(bytes);
      auto it = first;
      while (same_stream_only && it != last && it->second.stream != mine) ++it;
      if (it == last) it = first;
      if (it != last) {
        Block b = it->second;
        st_->free.erase(it);
        lk.unlock();
        if (!same_stream_only || b.stream != mine) BURSTLAB_CUDA_CHECK(cudaEventSynchronize(b.done));
        BURSTLAB_CUDA_CHECK(cudaEventDestroy(b.done));
        p = b.p;
      }
    }
    if (!p) BURSTLAB_CUDA_CHECK(cudaMalloc(&p, bytes));
    std::shared_ptr<State> st = st_;
    return std::shared_ptr<void>(p, [st, bytes, streams](void* q) {
      cudaEvent_t e = nullptr;
      cudaStream_t s = nullptr;
      try {  // a deleter must not throw (getting this thread's stream may create one)
        s = streams->get();
      } catch (...) {
        s = nullptr;
      }
      if (!s || cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(e, s) != cudaSuccess) {
        if (e) cudaEventDestroy(e);
        cudaDeviceSynchronize();  // no event: wait for everything before reusing the block
        cudaFree(q);
        return;
      }
      std::lock_guard<std::mutex> lk(st->mu);
      st->free.emplace(bytes, Block{q, e, s});
    });
  }

 private:
  std::shared_ptr<State> st_ = std::make_shared<State>();
  bool enabled_ = env::flag("BURSTLAB_CUDA_CACHE");
};

// Positions whose index lives on the host (partitions, gathered rows): a stream-ordered device
// copy, freed in stream order after the kernels that read it.
class DevicePositions {
 public:
  DevicePositions(Positions p, cudaStream_t s) : pos_(p), s_(s) {
    if (!p.index || p.n == 0) return;
    BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d_), size_t(p.n) * sizeof(int64_t), s));
    BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(d_, p.index, size_t(p.n) * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    pos_.index = d_;
  }
  ~DevicePositions() {
    if (d_) cudaFreeAsync(d_, s_);
  }
  DevicePositions(const DevicePositions&) = delete;
  DevicePositions& operator=(const DevicePositions&) = delete;
  Positions get() const { return pos_; }

 private:
  Positions pos_;
  cudaStream_t s_;
  int64_t* d_ = nullptr;
};

template <class T>
class CudaEngine final : public Engine<T> {
  using A = acc_t<T>;

 public:
  explicit CudaEngine(Variant fwd) : fwd_(fwd) {
    std::string why;
    if (!gpu_available(&why)) fail("cuda engine: no usable GPU (", why, ")");
  }
  std::string name() const override { return "cuda"; }

  std::shared_ptr<void> allocate(int64_t bytes) override {
    return blocks_.get(size_t(std::max<int64_t>(bytes, 1)), streams_);
  }
  void upload(void* dst, const void* host, int64_t bytes) override {
    const cudaStream_t s = streams_->get();
    BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, host, size_t(bytes), cudaMemcpyHostToDevice, s));
    BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void download(void* host, const void* src, int64_t bytes) override {
    const cudaStream_t s = streams_->get();
    BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(host, src, size_t(bytes), cudaMemcpyDeviceToHost, s));
    BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes) BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, streams_->get()));
  }
  // One kernel in the widest word (16 down to 1 bytes) that divides both addresses, both pitches
  // and the piece; row by row where a pitch below the piece makes rows overlap.
  void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t bytes,
                 int64_t rows) override {
    if (bytes <= 0 || rows <= 0) return;
    if (rows == 1) return copy(dst, src, bytes);
    if (dst_pitch < bytes || src_pitch < bytes) return Engine<T>::copy_rows(dst, dst_pitch, src, src_pitch, bytes, rows);
    const uint64_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                          uint64_t(dst_pitch) | uint64_t(src_pitch) | uint64_t(bytes);
    const cudaStream_t s = streams_->get();
    auto launch = [&](auto word) {
      using W = decltype(word);
      const int64_t w = sizeof(W);
      copy_rows_kernel<W><<<grid_for(bytes / w * rows), 256, 0, s>>>(
          static_cast<W*>(dst), dst_pitch / w, static_cast<const W*>(src), src_pitch / w, bytes / w, rows);
    };
    if (bits % 16 == 0) launch(uint4{});
    else if (bits % 8 == 0) launch(uint2{});
    else if (bits % 4 == 0) launch(uint32_t{});
    else if (bits % 2 == 0) launch(uint16_t{});
    else launch(uint8_t{});
    BURSTLAB_CUDA_LAUNCH_CHECK("copy_rows_kernel");
  }
  void fill(void* dst, int64_t n, Dtype t, double v) override {
    if (n <= 0) return;
    const cudaStream_t s = streams_->get();
    dispatch_dtype(t, [&](auto tag) {
      using X = typename decltype(tag)::type;  // storage type; rounded on the host, bits to the device
      const X x = from_double<X>(v);
      fill_kernel<<<grid_for(n), 256, 0, s>>>(as_device(static_cast<X*>(dst)), n, *as_device(&x));
    });
    BURSTLAB_CUDA_LAUNCH_CHECK("fill_kernel");
  }
  void add(void* acc, const void* in, int64_t n, Dtype t) override {
    if (n <= 0) return;
    const cudaStream_t s = streams_->get();
    dispatch_dtype(t, [&](auto tag) {
      using X = typename decltype(tag)::type;
      add_kernel<<<grid_for(n), 256, 0, s>>>(as_device(static_cast<X*>(acc)), as_device(static_cast<const X*>(in)), n);
    });
    BURSTLAB_CUDA_LAUNCH_CHECK("add_kernel");
  }
  void synchronize() override { BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(streams_->get())); }
  cudaStream_t stream() const { return streams_->get(); }
  std::shared_ptr<void> scratch(int64_t bytes) {
    return blocks_.get(size_t(std::max<int64_t>(bytes, 1)), streams_, true);
  }

  PreparedMask prepare(const MaskData& mask) override {
    auto dm = std::make_shared<DeviceMask>(mask);  // uploaded once; every block reuses it
    PreparedMask m;
    m.params = dm->params();
    m.hold = dm;
    return m;
  }

  // Positions in a few progressions (the gathered shards, grid rows and columns of zigzag and
  // striped partitions) run as blocks over contiguous positions, where the kernels skip hidden
  // tiles and full tiles skip the predicate (block_split.hpp). Other blocks run as given.
  void forward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k, View4<const T> Q,
                     View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE, bool accumulate) override {
    const auto part = [this](auto&&... a) { launch_forward(a...); };
    if ((q.index || k.index) && forward_parts(p, mask.params, q, k, Q, K, V, O, LSE, accumulate, part)) return;
    launch_forward(p, mask.params, q, k, Q, K, V, O, LSE, accumulate);
  }
  void merge(View4<T> O, View3<A> LSE, View4<const T> O_part, View3<const A> LSE_part) override {
    Options opt;
    opt.stream = streams_->get();
    cuda::merge<T>(O, LSE, O_part, LSE_part, opt);
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<A> Dv) override {
    Options opt;
    opt.stream = streams_->get();
    cuda::compute_D<T>(O, dO, Dv, opt);
  }
  // The backward by the same parts (their gradients add up, §6.2): over indexed positions each
  // dK/dV CTA walks every query tile of the whole block, loading each row's position, and the
  // partial tiles test positions loaded per key; a hidden part is not launched at all.
  void backward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k, View4<const T> Q,
                      View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> LSE, View3<const A> Dv,
                      View4<A> dQ, View4<A> dK, View4<A> dV) override {
    const auto part = [this](auto&&... a) { launch_backward(a...); };
    if ((q.index || k.index) && backward_parts(p, mask.params, q, k, Q, K, V, dO, LSE, Dv, dQ, dK, dV, part)) return;
    launch_backward(p, mask.params, q, k, Q, K, V, dO, LSE, Dv, dQ, dK, dV);
  }

 private:
  // One cuda::backward_block over host positions (their index uploaded for the call).
  void launch_backward(const Problem& p, const MaskParams& mask, Positions q, Positions k, View4<const T> Q,
                       View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> LSE, View3<const A> Dv,
                       View4<A> dQ, View4<A> dK, View4<A> dV) {
    const cudaStream_t s = streams_->get();
    const DevicePositions dq(q, s), dk(k, s);
    Options opt;
    // The fallback row by name runs every block itself; any other engine lets the table choose
    // (rows without backward_block, and a row's declines, fall back along it).
    opt.variant = fwd_ == variants().back().id ? fwd_ : Variant::Auto;
    opt.stream = s;
    cuda::backward_block<T>(p, mask, dq.get(), dk.get(), Q, K, V, dO, LSE, Dv, dQ, dK, dV, opt);
  }
  // One cuda::forward_block over host positions (their index uploaded for the call).
  void launch_forward(const Problem& p, const MaskParams& mask, Positions q, Positions k, View4<const T> Q,
                      View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE, bool accumulate) {
    const cudaStream_t s = streams_->get();
    const DevicePositions dq(q, s), dk(k, s);
    Options opt;
    opt.variant = fwd_;
    opt.stream = s;
    cuda::forward_block<T>(p, mask, dq.get(), dk.get(), Q, K, V, O, LSE, accumulate, opt);
  }

  Variant fwd_;
  std::shared_ptr<Streams> streams_ = std::make_shared<Streams>();  // shared with released blocks
  BlockCache blocks_;
};

Streams& transport_streams() {
  static Streams s;
  return s;
}

}  // namespace

template <class T>
std::unique_ptr<Engine<T>> make_engine(Variant forward) {
  return std::make_unique<CudaEngine<T>>(forward);
}
template std::unique_ptr<Engine<double>> make_engine<double>(Variant);
template std::unique_ptr<Engine<float>> make_engine<float>(Variant);
template std::unique_ptr<Engine<bf16_t>> make_engine<bf16_t>(Variant);
template std::unique_ptr<Engine<f16_t>> make_engine<f16_t>(Variant);

template <class T>
void* stream_of(const Engine<T>& e) {
  const auto* c = dynamic_cast<const CudaEngine<T>*>(&e);
  if (!c) fail("stream_of: engine '", e.name(), "' is not this layer's CUDA engine");
  return c->stream();
}
template void* stream_of<double>(const Engine<double>&);
template void* stream_of<float>(const Engine<float>&);
template void* stream_of<bf16_t>(const Engine<bf16_t>&);
template void* stream_of<f16_t>(const Engine<f16_t>&);

template <class T>
std::shared_ptr<void> scratch_of(Engine<T>& e, int64_t bytes) {
  auto* c = dynamic_cast<CudaEngine<T>*>(&e);
  if (!c) fail("scratch_of: engine '", e.name(), "' is not this layer's CUDA engine");
  return c->scratch(bytes);
}
template std::shared_ptr<void> scratch_of<double>(Engine<double>&, int64_t);
template std::shared_ptr<void> scratch_of<float>(Engine<float>&, int64_t);
template std::shared_ptr<void> scratch_of<bf16_t>(Engine<bf16_t>&, int64_t);
template std::shared_ptr<void> scratch_of<f16_t>(Engine<f16_t>&, int64_t);

void transport_copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  const cudaStream_t s = transport_streams().get();
  BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault, s));
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
}
void transport_poison(void* dst, int64_t bytes) {
  if (bytes <= 0) return;
  const cudaStream_t s = transport_streams().get();
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dst, 0xff, size_t(bytes), s));
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace burstlab::cuda
