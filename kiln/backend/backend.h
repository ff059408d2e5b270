#pragma once
// Backends as plugins: a device type, one of the PrivateUse dispatch keys, a device interface
// and kernels, registered at run time, from code or from a shared library. See DESIGN.md
// "Core objects" and Note [Backend registration] in registry.cpp.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/dispatch/op.h"

// Bumped whenever what a plugin compiles against changes shape: DeviceInterface, BackendSpec,
// OpDef, the tensor classes. A plugin built for another version is refused.
#define KILN_BACKEND_ABI_VERSION 4u

namespace kiln {

// One unboxed kernel for one op; made by backend_kernel(), which checks the signature.
struct BackendKernel {
  OpDef* op = nullptr;
  void* fn = nullptr;
};
template <class Sig>
BackendKernel backend_kernel(TypedOp<Sig>& op, Sig* fn) {
  return {&op.def, reinterpret_cast<void*>(fn)};
}

struct BackendSpec {
  std::string name = {};                     // the device type's name, e.g. "sim"
  DispatchKey key = DispatchKey::Undefined;  // PrivateUse1..3
  DeviceInterface* interface = nullptr;      // owned by the backend; lives until exit
  bool single_device = false;                // "name:1" is an error
  std::vector<BackendKernel> kernels = {};   // any subset of the ops
  BoxedKernel fallback = nullptr;            // serves every op without a kernel of its own
  // Ops with neither a kernel nor the fallback run on the CPU, their tensors copied over and
  // back (through the interface's copy_bytes), each op logged once on stderr. Off: such an op
  // is a NotImplementedError naming the op and the device.
  bool cpu_fallback = false;
  // Called once the backend is registered, for what else the plugin registers (the CUDA
  // plugin's collective backend): a plugin whose describe or registration fails, and which the
  // loader then unloads, must leave nothing behind, so nothing may register at load time.
  void (*on_registered)() = nullptr;
};

// Registers a backend, all or nothing: the name must be free (and no alias), the key a free
// PrivateUse key, the interface set, every kernel an op's, and at most one of `fallback` and
// `cpu_fallback`. Returns the new device type.
DeviceType register_backend(const BackendSpec& spec);

// The first PrivateUse key no device type uses, or Undefined.
DispatchKey free_private_use_key();

// Loads a backend plugin: a shared library exporting the C entry point below. `path` is a file
// path, or a bare name ("sim") looked up as libkiln_<name>.so in $KILN_PLUGIN_PATH (':'
// separated) and then beside libkiln itself. Errors (each leaves nothing registered): no such
// file, not a shared library, no entry point, another ABI version, a name already taken, no
// free PrivateUse key, the same library loaded twice. Returns the backend's device type.
DeviceType load_backend(std::string_view path);

// Ops served by a CPU fallback so far (each counted once per call), for tests and logs.
int64_t cpu_fallback_calls();

}  // namespace kiln

// What a plugin exports: `extern "C" const KilnBackendEntry* kiln_backend_entry(void);`
// The loader checks abi_version before it reads anything else; `describe` fills the spec
// (a kiln::BackendSpec, its key already chosen) and returns nullptr, or an error message.
extern "C" {
struct KilnBackendEntry {
  uint32_t abi_version;  // KILN_BACKEND_ABI_VERSION the plugin was built with
  const char* name;      // the device type it registers
  const char* (*describe)(kiln::BackendSpec* spec);
};
typedef const KilnBackendEntry* (*KilnBackendEntryFn)(void);
}
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"
