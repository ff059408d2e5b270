// Backend registration, the plugin loader and the CPU fallback.
//
// Note [Backend registration]
// A backend is registered in one call that checks everything before it changes anything (name,
// key, interface, kernels), so a failure leaves no half-registered device type behind; after
// that the backend's kernels sit in the ops' tables at its PrivateUse key like the CPU's, and
// dispatch treats it like any built-in backend. A plugin is a shared library with one C entry
// point (kiln_backend_entry) whose first field is the ABI version it was built with: the loader
// refuses a mismatch before calling anything else in the library. Registration is not
// synchronised with dispatch (Note in op.h): load backends at start-up.
#include "kiln/backend/backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/op_list.h"

namespace kiln {

namespace {

bool is_private_use(DispatchKey k) {
  return k == DispatchKey::PrivateUse1 || k == DispatchKey::PrivateUse2 ||
         k == DispatchKey::PrivateUse3;
}

std::atomic<int64_t> g_fallback_calls{0};

// Note [CPU fallback]
// The op runs on the CPU over host copies of the backend's storages (one copy per storage, so
// arguments that alias still alias), Device arguments of the backend becoming cpu. Storages
// the CPU kernel wrote (their version moved) are copied back; results over a copied storage
// become views of the original, other results are copied to the device. Errors are raised by
// the CPU kernel's own checks before anything is written, so nothing is copied back then.
void cpu_fallback_kernel(const OpDef& op, DispatchKey key, Stack& stack) {
  const int type = device_type_for_key(key);
  KILN_ASSERT(type >= 0, "[cpu fallback] {}: key {} has no device type", op.name(), key_name(key));
  DeviceInterface* iface = device_interface(static_cast<DeviceType>(type));
  {
    static std::mutex mu;
    static std::set<std::string, std::less<>> logged;
    std::lock_guard<std::mutex> lock(mu);
    if (logged.insert(std::string(op.name())).second)
      fmt::print(stderr,
                 "[kiln] {}: no kernel on device '{}'; running it on the CPU with copies (the "
                 "backend's CPU fallback)\n",
                 op.name(), device_type_name(static_cast<DeviceType>(type)));
  }
  g_fallback_calls.fetch_add(1, std::memory_order_relaxed);

  struct Copy {
    Ref<StorageImpl> device, host;
    int index;
  };
  std::unordered_map<const StorageImpl*, size_t> copied;
  std::vector<Copy> copies;
  std::optional<Device> dev;
  bool to_cpu = false;  // a Device argument of another device (cpu): results stay there
  auto to_host = [&](const Tensor& t) -> Tensor {
    if (!t.defined() || t.device().dispatch_key() != key) return t;
    dev = dev.value_or(t.device());
    StorageImpl* s = t.impl()->storage();
    auto [it, fresh] = copied.try_emplace(s, copies.size());
    if (fresh) {
      auto h = make_ref<StorageImpl>(s->nbytes(), Device(kCPU), cpu_allocator());
      iface->copy_bytes(h->data(), false, s->data(), true, s->nbytes(), t.device().index());
      copies.push_back({t.impl()->storage_ref(), std::move(h), t.device().index()});
    }
    return Tensor(make_ref<TensorImpl>(copies[it->second].host, t.dtype(), t.sizes(), t.strides(),
                                       t.storage_offset()));
  };
  Stack host = detail::map_stack(stack, to_host, [&](const IValue& v) -> IValue {
    auto* d = std::get_if<Device>(&v);
    if (!d) return v;
    if (d->dispatch_key() != key) {
      to_cpu = true;
      return v;
    }
    dev = dev.value_or(*d);
    return Device(kCPU);
  });
  op.call_boxed_at(DispatchKey::CPU, host);
  for (const Copy& c : copies)
    if (c.host->version() != 0)
      iface->copy_bytes(c.device->data(), true, c.host->data(), false, c.host->nbytes(), c.index);
  auto to_device = [&](const Tensor& t) -> Tensor {
    if (!t.defined() || !t.device().is_cpu() || !dev) return t;
    const TensorImpl* h = t.impl();
    for (const Copy& c : copies)
      if (c.host.get() == h->storage())
        return Tensor(make_ref<TensorImpl>(c.device, h->dtype(), h->sizes(), h->strides(),
                                           h->storage_offset()));
    if (to_cpu) return t;
    const StorageImpl* hs = h->storage();
    auto s = make_ref<StorageImpl>(hs->nbytes(), *dev, iface->allocator(dev->index()));
    iface->copy_bytes(s->data(), true, hs->data(), false, hs->nbytes(), dev->index());
    return Tensor(make_ref<TensorImpl>(std::move(s), h->dtype(), h->sizes(), h->strides(),
                                       h->storage_offset()));
  };
  stack = detail::map_stack(host, to_device, detail::same_value);
}

struct Loaded {
  std::string backend;
  void* handle;
};
std::mutex g_load_mu;
std::map<std::string, Loaded>& loaded() {
  static std::map<std::string, Loaded> m;
  return m;
}

std::string find_plugin(std::string_view name) {
  const std::string file = fmt::format("libkiln_{}.so", name);
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::string_view s(env);
    while (!s.empty()) {
      size_t c = s.find(':');
      if (c != 0) dirs.emplace_back(s.substr(0, c));
      if (c == std::string_view::npos) break;
      s.remove_prefix(c + 1);
    }
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_backend), &info) && info.dli_fname)
    dirs.push_back(std::filesystem::path(info.dli_fname).parent_path().string());
  for (const std::string& d : dirs) {
    std::filesystem::path p = std::filesystem::path(d) / file;
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) return p.string();
  }
  KILN_THROW(Value,
             "[load_backend] no plugin named '{}': looked for {} in $KILN_PLUGIN_PATH and beside "
             "libkiln ({})",
             name, file, fmt::join(dirs, ", "));
}

// A device type the core registers by name without a backend (cuda: so "cuda:1" parses before
// the plugin is loaded) is filled in by the backend of that name with the type's own key.
int builtin_slot(std::string_view name, DispatchKey key) {
  int t = find_device_type(name);
  if (t < 0 || device_type_name(static_cast<DeviceType>(t)) != name) return -1;
  if (device_interface(static_cast<DeviceType>(t)) != nullptr) return -1;
  return Device(static_cast<DeviceType>(t)).dispatch_key() == key ? t : -1;
}

}  // namespace

DispatchKey free_private_use_key() {
  for (DispatchKey k :
       {DispatchKey::PrivateUse1, DispatchKey::PrivateUse2, DispatchKey::PrivateUse3})
    if (device_type_for_key(k) < 0) return k;
  return DispatchKey::Undefined;
}

DeviceType register_backend(const BackendSpec& spec) {
  KILN_CHECK(!spec.name.empty(), "[register_backend] the backend has no name");
  const int slot = builtin_slot(spec.name, spec.key);
  KILN_CHECK(is_private_use(spec.key) || slot >= 0,
             "[register_backend] '{}': key {} is not one of PrivateUse1..3 (nor the key of a "
             "built-in device type of that name without a backend)",
             spec.name, key_name(spec.key));
  KILN_CHECK(spec.interface != nullptr, "[register_backend] '{}' has no device interface",
             spec.name);
  KILN_CHECK(!(spec.fallback && spec.cpu_fallback),
             "[register_backend] '{}' sets both a fallback kernel and the CPU fallback", spec.name);
  for (const BackendKernel& k : spec.kernels) {
    KILN_CHECK(k.op && k.fn, "[register_backend] '{}': a kernel without an op or a function",
               spec.name);
    KILN_CHECK(std::ranges::find(ops::all_ops(), k.op) != ops::all_ops().end(),
               "[register_backend] '{}': kernel for '{}', which is not a registered op", spec.name,
               k.op->name());
  }
  if (slot < 0) {
    KILN_CHECK(find_device_type(spec.name) < 0,
               "[register_backend] device type '{}' is already registered (or an alias)",
               spec.name);
    int holder = device_type_for_key(spec.key);
    KILN_CHECK(holder < 0, "[register_backend] '{}': key {} is already used by '{}'", spec.name,
               key_name(spec.key),
               holder < 0 ? "" : device_type_name(static_cast<DeviceType>(holder)));
  }
  // Checked: now nothing below can fail but the registry itself, which checks the same things.
  DeviceType t;
  if (slot >= 0) {
    t = static_cast<DeviceType>(slot);
    set_device_interface(t, spec.interface);
  } else {
    t = register_device_type(spec.name, spec.key, spec.interface, spec.single_device);
  }
  for (const BackendKernel& k : spec.kernels) k.op->set_kernel_raw(spec.key, k.fn);
  if (spec.fallback) register_fallback(spec.key, spec.fallback);
  if (spec.cpu_fallback) register_fallback(spec.key, &cpu_fallback_kernel);
  if (spec.on_registered) spec.on_registered();
  return t;
}

int64_t cpu_fallback_calls() { return g_fallback_calls.load(std::memory_order_relaxed); }

DeviceType load_backend(std::string_view path_or_name) {
  std::lock_guard<std::mutex> lock(g_load_mu);
  std::string path = path_or_name.find('/') == std::string_view::npos ? find_plugin(path_or_name)
                                                                      : std::string(path_or_name);
  std::error_code ec;
  std::filesystem::path canon = std::filesystem::canonical(path, ec);
  KILN_CHECK(!ec, "[load_backend] cannot open '{}': {}", path, ec.message());
  const std::string key = canon.string();
  if (auto it = loaded().find(key); it != loaded().end())
    KILN_THROW(Value, "[load_backend] '{}' is already loaded (backend '{}')", path,
               it->second.backend);
  void* h = dlopen(key.c_str(), RTLD_NOW | RTLD_LOCAL);
  KILN_CHECK(h != nullptr, "[load_backend] cannot load '{}': {}", path, dlerror());
  struct Closer {
    void* h;
    ~Closer() {
      if (h) dlclose(h);
    }
  } closer{h};
  auto entry_fn = reinterpret_cast<KilnBackendEntryFn>(dlsym(h, KILN_BACKEND_ENTRY_SYMBOL));
  KILN_CHECK(entry_fn != nullptr,
             "[load_backend] '{}' has no entry point '{}': not a Kiln backend plugin", path,
             KILN_BACKEND_ENTRY_SYMBOL);
  const KilnBackendEntry* entry = entry_fn();
  KILN_CHECK(entry != nullptr, "[load_backend] '{}': {}() returned no entry", path,
             KILN_BACKEND_ENTRY_SYMBOL);
  KILN_CHECK(entry->abi_version == KILN_BACKEND_ABI_VERSION,
             "[load_backend] '{}' was built for backend ABI version {}, this Kiln has version {}: "
             "rebuild the plugin against this Kiln",
             path, entry->abi_version, KILN_BACKEND_ABI_VERSION);
  KILN_CHECK(entry->name && entry->describe,
             "[load_backend] '{}': its entry has no name or no "
             "describe function",
             path);
  const std::string name = entry->name;
  const int type = find_device_type(name);
  const DispatchKey builtin_key =
      type >= 0 ? Device(static_cast<DeviceType>(type)).dispatch_key() : DispatchKey::Undefined;
  const bool builtin = type >= 0 && builtin_slot(name, builtin_key) >= 0;
  KILN_CHECK(type < 0 || builtin, "[load_backend] '{}': device type '{}' is already registered",
             path, name);
  BackendSpec spec;
  spec.name = name;
  spec.key = builtin ? builtin_key : free_private_use_key();
  KILN_CHECK(spec.key != DispatchKey::Undefined,
             "[load_backend] '{}': no free PrivateUse dispatch key for '{}' (all three are used)",
             path, name);
  if (const char* err = entry->describe(&spec))
    KILN_THROW(Value, "[load_backend] '{}' failed to describe backend '{}': {}", path, name, err);
  KILN_CHECK(spec.name == name, "[load_backend] '{}': the spec names '{}', the entry '{}'", path,
             spec.name, name);
  DeviceType t = register_backend(spec);
  loaded()[key] = {name, h};
  closer.h = nullptr;  // registered kernels point into the library: it stays loaded
  return t;
}

}  // namespace kiln
