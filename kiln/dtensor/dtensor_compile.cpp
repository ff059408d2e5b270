// DTensors across kiln::compile's boundary: Note [Wrapped tensors in compiled functions] in
// kiln/compile/compile.cpp. A DTensor input is its local tensor plus its interned spec; the spec
// is part of the cache entry's key, and results are wrapped again with the specs traced.
#include "kiln/compile/compile.h"
#include "kiln/dtensor/dtensor.h"

namespace kiln::dtensor {
namespace {

bool wrapped(const Tensor& t) { return is_dtensor(t); }
Tensor unwrap(const Tensor& t, const void** layout) {
  const ShardedMeta& m = sharded_meta(t);
  *layout = m.spec;
  return m.local;
}
Tensor wrap(const Tensor& local, const void* layout) {
  return make_dtensor(local, static_cast<const DTensorSpec*>(layout));
}
std::string describe(const void* layout) { return static_cast<const DTensorSpec*>(layout)->str(); }

const compiler::WrappedTensors kDTensors{&wrapped, &unwrap, &wrap, &describe};
const bool g_installed = [] {
  compiler::set_wrapped_tensors(&kDTensors);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor
