// A vector of trivially copyable values that keeps its first few elements inline.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace shardsim {

// Holds up to N elements inside the object (no allocation, no extra cache miss to reach them)
// and spills to a heap vector that then holds all of them. For the hot per-link and per-flow
// lists of the network model, which almost always stay short. Order is kept except by erase.
template <typename T, int N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // Whether there are no elements.
  bool empty() const { return size_ == 0; }
  // Number of elements.
  int32_t size() const { return size_; }
  // The elements, as a contiguous range.
  const T* begin() const { return size_ <= N ? inline_ : spill_.data(); }
  const T* end() const { return begin() + size_; }
  // The i-th element.
  T operator[](int32_t i) const { return begin()[i]; }
  // The i-th element, writable.
  T& operator[](int32_t i) { return (size_ <= N ? inline_ : spill_.data())[i]; }
  // The last element (not empty).
  T back() const { return begin()[size_ - 1]; }

  // Removes every element.
  void clear() {
    size_ = 0;
    spill_.clear();
  }
  // Appends a value.
  void push_back(T v) {
    if (size_ < N) {
      inline_[size_++] = v;
      return;
    }
    if (size_ == N) spill_.assign(inline_, inline_ + N);
    spill_.push_back(v);
    ++size_;
  }
  // Replaces the contents with [first, last).
  void assign(const T* first, const T* last) {
    clear();
    for (; first != last; ++first) push_back(*first);
  }
  // Removes the last element (not empty); back inline once N or fewer remain.
  void pop_back() {
    --size_;
    if (size_ > N) {
      spill_.pop_back();
    } else if (size_ == N) {
      std::copy(spill_.begin(), spill_.begin() + N, inline_);
      spill_.clear();
    }
  }
  // Removes one element equal to `v`, which must be present; the last takes its place.
  void erase(T v) {
    T* data = size_ <= N ? inline_ : spill_.data();
    T* it = std::find(data, data + size_, v);
    assert(it != data + size_);
    *it = data[size_ - 1];
    pop_back();
  }

 private:
  T inline_[N] = {};
  int32_t size_ = 0;
  std::vector<T> spill_;
};

}  // namespace shardsim
