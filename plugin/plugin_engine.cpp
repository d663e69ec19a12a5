// plugin/plugin_engine.cpp — Engine<T> over a plug-in of burstlab/plugin.h (see plugin_engine.hpp).
#include "plugin_engine.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "burstlab/block_split.hpp"
#include "burstlab/error.hpp"
#include "burstlab/problem.hpp"

namespace burstlab::plugin {

static_assert(sizeof(burstlab_row_doc) == sizeof(RowDoc) && std::is_standard_layout_v<RowDoc>,
              "burstlab_row_doc mirrors RowDoc: the document arrays are handed over without copies");

burstlab_dtype to_c(Dtype t) {
  switch (t) {
    case Dtype::F64: return BURSTLAB_F64;
    case Dtype::F32: return BURSTLAB_F32;
    case Dtype::BF16: return BURSTLAB_BF16;
    case Dtype::F16: return BURSTLAB_F16;
  }
  return BURSTLAB_F32;
}
burstlab_problem to_c(const Problem& p) {
  return burstlab_problem{p.B, p.H_q, p.H_kv, p.N_q, p.N_k, p.d, scale_of(p)};
}
burstlab_mask to_c(const MaskParams& m) {
  burstlab_mask c;
  c.N_q = m.N_q;
  c.N_k = m.N_k;
  c.left = m.left;
  c.right = m.right;
  c.doc = reinterpret_cast<const burstlab_row_doc*>(m.doc);
  c.block = m.block;
  c.block_q = m.block_q;
  c.block_k = m.block_k;
  c.n_block_k = m.n_block_k;
  return c;
}
burstlab_positions to_c(Positions q) { return burstlab_positions{q.start, q.n, q.index}; }

namespace {

template <class U>
burstlab_view4 view_c(View4<U> v) {
  burstlab_view4 c;
  c.data = const_cast<void*>(static_cast<const void*>(v.data));
  for (int i = 0; i < 4; ++i) c.dim[i] = v.dim[i], c.stride[i] = v.stride[i];
  return c;
}
template <class U>
burstlab_view3 view_c(View3<U> v) {
  burstlab_view3 c;
  c.data = const_cast<void*>(static_cast<const void*>(v.data));
  for (int i = 0; i < 3; ++i) c.dim[i] = v.dim[i], c.stride[i] = v.stride[i];
  return c;
}

// The outcome of one entry: a decline is the plug-in saying it cannot run this call (Error, as
// any input an implementation refuses); anything else is a failure of the plug-in.
void check(const Library& lib, const char* entry, int rc, burstlab_status& st) {
  if (rc == BURSTLAB_OK) return;
  st.message[BURSTLAB_MESSAGE_BYTES - 1] = '\0';
  const std::string why = st.message[0] ? st.message : "(no reason given)";
  if (rc == BURSTLAB_DECLINED) fail("plugin ", lib.name, " (", lib.path, ") declined ", entry, ": ", why);
  throw std::runtime_error("plugin " + lib.name + " (" + lib.path + ") failed in " + entry + " (code " +
                           std::to_string(rc) + "): " + why);
}
#define BURSTLAB_PLUGIN_CALL(lib, entry, ...)               \
  do {                                                      \
    burstlab_status st_;                                    \
    st_.message[0] = '\0';                                  \
    const int rc_ = (lib).api->entry(__VA_ARGS__, &st_);    \
    check((lib), #entry, rc_, st_);                         \
  } while (0)

// One engine of the plug-in; buffers and prepared masks keep it alive until they are released.
struct Handle {
  std::shared_ptr<const Library> lib;
  void* engine = nullptr;
  ~Handle() {
    if (engine) lib->api->destroy(engine);
  }
};

struct Prepared {
  std::shared_ptr<Handle> h;
  MaskData data;  // the host arrays the plug-in's mask points into, for its lifetime
  void* handle = nullptr;
  ~Prepared() {
    if (handle) h->lib->api->release(h->engine, handle);
  }
};

template <class T>
class PluginEngine final : public Engine<T> {
 public:
  using A = acc_t<T>;
  explicit PluginEngine(std::shared_ptr<const Library> lib) : h_(std::make_shared<Handle>()) {
    h_->lib = std::move(lib);
    void* e = nullptr;
    BURSTLAB_PLUGIN_CALL(L(), create, to_c(dtype_of<T>()), &e);
    if (!e) throw std::runtime_error("plugin " + L().name + " (" + L().path + ") create returned no engine");
    h_->engine = e;
  }
  std::string name() const override { return "plugin:" + L().name; }

  std::shared_ptr<void> allocate(int64_t bytes) override {
    void* p = nullptr;
    BURSTLAB_PLUGIN_CALL(L(), allocate, E(), bytes, &p);
    if (!p && bytes > 0)
      throw std::runtime_error("plugin " + L().name + " (" + L().path + ") allocate returned NULL for " +
                               std::to_string(bytes) + " bytes");
    auto h = h_;
    return std::shared_ptr<void>(p, [h](void* q) {
      if (q) h->lib->api->release_memory(h->engine, q);
    });
  }
  void upload(void* dst, const void* host, int64_t bytes) override {
    BURSTLAB_PLUGIN_CALL(L(), upload, E(), dst, host, bytes);
  }
  void download(void* host, const void* src, int64_t bytes) override {
    BURSTLAB_PLUGIN_CALL(L(), download, E(), host, src, bytes);
  }
  void copy(void* dst, const void* src, int64_t bytes) override { BURSTLAB_PLUGIN_CALL(L(), copy, E(), dst, src, bytes); }
  void fill(void* dst, int64_t n, Dtype t, double value) override {
    BURSTLAB_PLUGIN_CALL(L(), fill, E(), dst, n, to_c(t), value);
  }
  void add(void* acc, const void* in, int64_t n, Dtype t) override {
    BURSTLAB_PLUGIN_CALL(L(), add, E(), acc, in, n, to_c(t));
  }
  void synchronize() override {
    if (L().api->synchronize) BURSTLAB_PLUGIN_CALL(L(), synchronize, E());
  }

  PreparedMask prepare(const MaskData& mask) override {
    auto pr = std::make_shared<Prepared>();
    pr->h = h_;
    pr->data = mask;
    const burstlab_mask c = to_c(pr->data.params());
    BURSTLAB_PLUGIN_CALL(L(), prepare, E(), &c, &pr->handle);
    PreparedMask m;
    m.params = pr->data.params();  // host arrays: the schedules and the block split read them
    m.hold = pr;
    return m;
  }

  // Blocks over a few position progressions reach the plug-in as blocks over contiguous
  // positions, as in the built-in engines (block_split.hpp); others as they are, and by parts
  // however short when the plug-in declines them, so a kernel that runs only contiguous rows
  // still runs zigzag and striped shards of any size.
  void forward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k, View4<const T> Q,
                     View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE, bool accumulate) override {
    const void* prepared = static_cast<const Prepared*>(mask.hold.get())->handle;
    // One call of the plug-in; its code (OK, DECLINED, ERROR) with st.
    const auto offer = [&](burstlab_status& st, const Problem& pp, const MaskParams& mm, Positions qp, Positions kp,
                           View4<const T> Qp, View4<const T> Kp, View4<const T> Vp, View4<T> Op, View3<A> Lp, bool acc) {
      burstlab_block b = block(pp, mm, prepared, qp, kp, Qp, Kp, Vp);
      b.O = view_c(Op);
      b.LSE = view_c(Lp);
      st.message[0] = '\0';
      return L().api->forward_block(E(), &b, acc ? 1 : 0, &st);
    };
    const auto part = [&](auto&&... a) {
      burstlab_status st;
      check(L(), "forward_block", offer(st, a...), st);
    };
    if (!q.index && !k.index) return part(p, mask.params, q, k, Q, K, V, O, LSE, accumulate);
    if (forward_parts(p, mask.params, q, k, Q, K, V, O, LSE, accumulate, part)) return;
    // Not a few long runs: the block as it is, or, when the plug-in declines indexed positions,
    // by parts however short (a declined call has written nothing).
    burstlab_status st;
    const int rc = offer(st, p, mask.params, q, k, Q, K, V, O, LSE, accumulate);
    if (rc == BURSTLAB_DECLINED && forward_parts(p, mask.params, q, k, Q, K, V, O, LSE, accumulate, part, kAnySplit))
      return;
    check(L(), "forward_block", rc, st);
  }
  void merge(View4<T> O, View3<A> LSE, View4<const T> O_part, View3<const A> LSE_part) override {
    BURSTLAB_PLUGIN_CALL(L(), merge, E(), to_c(dtype_of<T>()), view_c(O), view_c(LSE), view_c(O_part), view_c(LSE_part));
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<A> D) override {
    BURSTLAB_PLUGIN_CALL(L(), compute_D, E(), to_c(dtype_of<T>()), view_c(O), view_c(dO), view_c(D));
  }
  // Its backward the same way: the parts' gradients add up to the block's.
  void backward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k, View4<const T> Q,
                      View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> LSE, View3<const A> D,
                      View4<A> dQ, View4<A> dK, View4<A> dV) override {
    const void* prepared = static_cast<const Prepared*>(mask.hold.get())->handle;
    const auto offer = [&](burstlab_status& st, const Problem& pp, const MaskParams& mm, Positions qp, Positions kp,
                           View4<const T> Qp, View4<const T> Kp, View4<const T> Vp, View4<const T> dOp,
                           View3<const A> Lp, View3<const A> Dp, View4<A> dQp, View4<A> dKp, View4<A> dVp) {
      burstlab_block b = block(pp, mm, prepared, qp, kp, Qp, Kp, Vp);
      b.dO = view_c(dOp);
      b.LSE = view_c(Lp);
      b.D = view_c(Dp);
      b.dQ = view_c(dQp);
      b.dK = view_c(dKp);
      b.dV = view_c(dVp);
      st.message[0] = '\0';
      return L().api->backward_block(E(), &b, &st);
    };
    const auto part = [&](auto&&... a) {
      burstlab_status st;
      check(L(), "backward_block", offer(st, a...), st);
    };
    if (!q.index && !k.index) return part(p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV);
    if (backward_parts(p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV, part)) return;
    burstlab_status st;
    const int rc = offer(st, p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV);
    if (rc == BURSTLAB_DECLINED && backward_parts(p, mask.params, q, k, Q, K, V, dO, LSE, D, dQ, dK, dV, part, kAnySplit))
      return;
    check(L(), "backward_block", rc, st);
  }

 private:
  const Library& L() const { return *h_->lib; }
  void* E() const { return h_->engine; }
  static burstlab_block block(const Problem& p, const MaskParams& m, const void* prepared, Positions q, Positions k,
                              View4<const T> Q, View4<const T> K, View4<const T> V) {
    burstlab_block b;
    std::memset(&b, 0, sizeof b);
    b.problem = to_c(p);
    b.dtype = to_c(dtype_of<T>());
    b.acc_dtype = to_c(dtype_of<A>());
    b.mask = to_c(m);
    b.prepared = prepared;
    b.q = to_c(q);
    b.k = to_c(k);
    b.Q = view_c(Q);
    b.K = view_c(K);
    b.V = view_c(V);
    return b;
  }

  std::shared_ptr<Handle> h_;
};

bool file_exists(const std::string& path) {
  struct stat s;
  return ::stat(path.c_str(), &s) == 0;
}

}  // namespace

std::shared_ptr<const Library> load(const std::string& path) {
  if (path.empty()) fail("plugin path is empty; give plugin:PATH.so");
  // A bare file name in the current directory is that file, not a search of the library path.
  const std::string open = path.find('/') == std::string::npos && file_exists(path) ? "./" + path : path;
  void* so = ::dlopen(open.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    const char* e = ::dlerror();
    fail("plugin (", path, ") cannot be loaded: ", e ? e : "dlopen failed");
  }
  ::dlerror();
  void* sym = ::dlsym(so, BURSTLAB_PLUGIN_SYMBOL);
  if (!sym)
    fail("plugin (", path, ") does not export ", BURSTLAB_PLUGIN_SYMBOL,
         ": not a burstlab engine plug-in (build it against include/burstlab/plugin.h)");
  burstlab_plugin_entry_v1 entry;
  std::memcpy(&entry, &sym, sizeof entry);  // dlsym's object pointer as a function pointer
  const burstlab_host_v1 host{BURSTLAB_PLUGIN_ABI_VERSION, BURSTLAB_VERSION};
  const burstlab_api_v1* api = entry(&host);
  if (!api) fail("plugin (", path, ") returned no table from ", BURSTLAB_PLUGIN_SYMBOL);
  // Only abi_version is read before it matches: the rest of another version's table may differ.
  if (api->abi_version != BURSTLAB_PLUGIN_ABI_VERSION)
    fail("plugin (", path, ") was built for plug-in ABI version ", api->abi_version, "; this burstlab loads version ",
         BURSTLAB_PLUGIN_ABI_VERSION, " (rebuild it against include/burstlab/plugin.h)");
  if (!api->name || !*api->name) fail("plugin (", path, ") has no name");
  if (api->memory != BURSTLAB_MEMORY_HOST && api->memory != BURSTLAB_MEMORY_DEVICE)
    fail("plugin (", path, ") memory (", api->memory, ") must be BURSTLAB_MEMORY_HOST (0) or BURSTLAB_MEMORY_DEVICE (1)");
  if (api->dtypes == 0 || (api->dtypes >> 4) != 0)
    fail("plugin (", path, ") dtypes (", api->dtypes, ") must be a non-empty bit set of BURSTLAB_F64..BURSTLAB_F16");
  const std::pair<const char*, bool> required[] = {
      {"create", api->create != nullptr},           {"destroy", api->destroy != nullptr},
      {"allocate", api->allocate != nullptr},       {"release_memory", api->release_memory != nullptr},
      {"upload", api->upload != nullptr},           {"download", api->download != nullptr},
      {"copy", api->copy != nullptr},               {"fill", api->fill != nullptr},
      {"add", api->add != nullptr},                 {"prepare", api->prepare != nullptr},
      {"release", api->release != nullptr},         {"forward_block", api->forward_block != nullptr},
      {"merge", api->merge != nullptr},             {"compute_D", api->compute_D != nullptr},
      {"backward_block", api->backward_block != nullptr},
      {"transport_copy", api->memory == BURSTLAB_MEMORY_HOST || api->transport_copy != nullptr},
      {"transport_poison", api->memory == BURSTLAB_MEMORY_HOST || api->transport_poison != nullptr},
  };
  for (const auto& [entry_name, ok] : required)
    if (!ok) fail("plugin (", path, ") leaves ", entry_name, " NULL; burstlab/plugin.h requires it");
  auto lib = std::make_shared<Library>();
  lib->path = path;
  lib->api = api;
  lib->name = api->name;
  for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16})
    if (api->dtypes & (1u << to_c(t))) lib->dtypes.push_back(t);
  lib->device = api->memory == BURSTLAB_MEMORY_DEVICE;
  return lib;  // the library stays loaded (plugin_engine.hpp)
}

template <class T>
std::unique_ptr<Engine<T>> make_engine(std::shared_ptr<const Library> lib) {
  if (!(lib->api->dtypes & (1u << to_c(dtype_of<T>()))))
    fail("plugin ", lib->name, " (", lib->path, ") does not run dtype ", to_string(dtype_of<T>()));
  return std::make_unique<PluginEngine<T>>(std::move(lib));
}
template std::unique_ptr<Engine<double>> make_engine<double>(std::shared_ptr<const Library>);
template std::unique_ptr<Engine<float>> make_engine<float>(std::shared_ptr<const Library>);
template std::unique_ptr<Engine<bf16_t>> make_engine<bf16_t>(std::shared_ptr<const Library>);
template std::unique_ptr<Engine<f16_t>> make_engine<f16_t>(std::shared_ptr<const Library>);

void check_supports(const Library& lib, const Problem& p, Dtype dtype, const MaskData& mask, bool backward) {
  if (!lib.api->supports) return;
  burstlab_query q;
  std::memset(&q, 0, sizeof q);
  q.pass = backward ? BURSTLAB_PASS_BACKWARD : BURSTLAB_PASS_FORWARD;
  q.dtype = to_c(dtype);
  q.problem = to_c(p);
  q.mask = to_c(mask.params());
  burstlab_status st;
  st.message[0] = '\0';
  const int rc = lib.api->supports(&q, &st);
  check(lib, backward ? "the backward of this problem" : "the forward of this problem", rc, st);
}

void transport_copy(const Library& lib, void* dst, const void* src, int64_t bytes) {
  BURSTLAB_PLUGIN_CALL(lib, transport_copy, dst, src, bytes);
}
void transport_poison(const Library& lib, void* dst, int64_t bytes) {
  BURSTLAB_PLUGIN_CALL(lib, transport_poison, dst, bytes);
}

}  // namespace burstlab::plugin
