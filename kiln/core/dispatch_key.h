#pragma once
// Dispatch keys and key sets. They live in core because every tensor carries its key set.
// See DESIGN.md "Dispatch" for the order.
#include <bit>
#include <cstdint>
#include <string_view>

namespace kiln {

// Ascending priority: a call runs the kernel of the highest key in its set.
// See Note [Dispatch key order] in kiln/dispatch/op.h.
enum class DispatchKey : uint8_t {
  Undefined = 0,
  CPU,
  CUDA,
  PrivateUse1,
  PrivateUse2,
  PrivateUse3,
  Meta,
  Profile,
  Trace,
  Sharded,
  Autograd,
  Autocast,
  NumKeys
};
inline constexpr int kNumDispatchKeys = static_cast<int>(DispatchKey::NumKeys);
static_assert(kNumDispatchKeys == 12, "update key_name() and the key tables when adding a key");

std::string_view key_name(DispatchKey k);

// A set of dispatch keys as a bitmask; bit i is DispatchKey(i).
class DispatchKeySet {
 public:
  constexpr DispatchKeySet() = default;
  constexpr explicit DispatchKeySet(DispatchKey k) : bits_(1u << static_cast<int>(k)) {}
  constexpr static DispatchKeySet from_bits(uint32_t b) {
    DispatchKeySet s;
    s.bits_ = b;
    return s;
  }
  constexpr bool has(DispatchKey k) const { return bits_ & (1u << static_cast<int>(k)); }
  constexpr bool empty() const { return (bits_ & ~1u) == 0; }
  constexpr DispatchKeySet operator|(DispatchKeySet o) const { return from_bits(bits_ | o.bits_); }
  constexpr DispatchKeySet operator&(DispatchKeySet o) const { return from_bits(bits_ & o.bits_); }
  constexpr DispatchKeySet operator-(DispatchKeySet o) const { return from_bits(bits_ & ~o.bits_); }
  constexpr DispatchKeySet add(DispatchKey k) const { return *this | DispatchKeySet(k); }
  constexpr DispatchKeySet remove(DispatchKey k) const { return *this - DispatchKeySet(k); }
  // The highest-priority key, or Undefined for an empty set.
  constexpr DispatchKey highest() const {
    return bits_ ? static_cast<DispatchKey>(31 - std::countl_zero(bits_)) : DispatchKey::Undefined;
  }
  constexpr uint32_t bits() const { return bits_; }
  constexpr bool operator==(const DispatchKeySet&) const = default;

 private:
  uint32_t bits_ = 0;
};

// The keys of backends (CPU through Meta): what a tensor's storage decides.
inline constexpr DispatchKeySet kBackendKeys =
    DispatchKeySet::from_bits(((1u << (static_cast<int>(DispatchKey::Meta) + 1)) - 1) & ~1u);

}  // namespace kiln
