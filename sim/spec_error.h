// The error a model raises for an invalid user-given value, naming the key at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace shardsim {

// Thrown by builders and models when a validated struct holds a value they cannot use.
// `key` is the dotted path of the offending run-file key (e.g. "hardware.shape"), so the
// loader at the edge can point at its file, line and column.
class SpecError : public std::runtime_error {
 public:
  // `key`: dotted path of the key at fault; `message`: what is wrong, for the user.
  SpecError(std::string key, const std::string& message)
      : std::runtime_error(message), key_(std::move(key)) {}
  // The dotted key path.
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

}  // namespace shardsim
