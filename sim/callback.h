// A move-only, type-erased `void()` callable with small-buffer storage.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace shardsim {

// Holds any move-constructible callable taking no arguments. Callables up to kInlineSize
// bytes live inside the object (no allocation), larger ones on the heap. Unlike std::function
// it accepts move-only lambdas (capturing unique_ptr, buffers) and never copies.
class Callback {
 public:
  // Bytes of callable state stored without allocating.
  static constexpr std::size_t kInlineSize = 48;

  // An empty callback.
  Callback() = default;

  // Wraps `f`.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Callback>>>
  Callback(F&& f) {  // NOLINT(google-explicit-constructor): implicit like std::function.
    using Fn = std::decay_t<F>;
    if constexpr (sizeof(Fn) <= kInlineSize && alignof(Fn) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<Fn>) {
      ::new (static_cast<void*>(storage_)) Fn(std::forward<F>(f));
      ops_ = &kInlineOps<Fn>;
    } else {
      *reinterpret_cast<Fn**>(storage_) = new Fn(std::forward<F>(f));
      ops_ = &kHeapOps<Fn>;
    }
  }

  Callback(Callback&& o) noexcept : ops_(o.ops_) {
    if (ops_) {
      ops_->move(storage_, o.storage_);
      o.ops_ = nullptr;
    }
  }
  Callback& operator=(Callback&& o) noexcept {
    if (this != &o) {
      Reset();
      ops_ = o.ops_;
      if (ops_) {
        ops_->move(storage_, o.storage_);
        o.ops_ = nullptr;
      }
    }
    return *this;
  }
  Callback(const Callback&) = delete;
  Callback& operator=(const Callback&) = delete;
  ~Callback() { Reset(); }

  // Calls the wrapped callable. Must not be empty.
  void operator()() { ops_->call(storage_); }
  // True if a callable is held.
  explicit operator bool() const { return ops_ != nullptr; }
  // Destroys the held callable, if any.
  void Reset() {
    if (ops_) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

 private:
  struct Ops {
    void (*call)(void*);
    void (*move)(void* dst, void* src);  // Moves src into dst and destroys src.
    void (*destroy)(void*);
  };

  template <typename Fn>
  static constexpr Ops kInlineOps = {
      [](void* p) { (*static_cast<Fn*>(p))(); },
      [](void* dst, void* src) {
        ::new (dst) Fn(std::move(*static_cast<Fn*>(src)));
        static_cast<Fn*>(src)->~Fn();
      },
      [](void* p) { static_cast<Fn*>(p)->~Fn(); },
  };

  template <typename Fn>
  static constexpr Ops kHeapOps = {
      [](void* p) { (**static_cast<Fn**>(p))(); },
      [](void* dst, void* src) { *static_cast<Fn**>(dst) = *static_cast<Fn**>(src); },
      [](void* p) { delete *static_cast<Fn**>(p); },
  };

  alignas(std::max_align_t) unsigned char storage_[kInlineSize];
  const Ops* ops_ = nullptr;
};

}  // namespace shardsim
