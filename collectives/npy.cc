#include "collectives/npy.h"

#include <bit>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "sim/atomic_file.h"

namespace shardsim {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy reading and writing assume a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

// Thrown for every problem with a file: the path, then what is wrong.
[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument(path + ": " + what);
}

// A recursive-descent reader for the Python dict literal of a .npy header, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  // Parses the dict into `header` (descr and shape) and returns fortran_order.
  bool Parse(NpyHeader& header) {
    bool fortran_order = false;
    bool have_descr = false, have_order = false, have_shape = false;
    Expect('{');
    while (true) {
      SkipSpace();
      if (Peek() == '}') break;
      std::string key = ParseString();
      Expect(':');
      SkipSpace();
      if (key == "descr") {
        if (Peek() != '\'' && Peek() != '"') {
          Fail(path_, "structured dtypes are not supported (header descr is not a string)");
        }
        header.descr = ParseString();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = ParseBool();
        have_order = true;
      } else if (key == "shape") {
        header.shape = ParseShape();
        have_shape = true;
      } else {
        Fail(path_, "malformed .npy header: unexpected key '" + key + "'");
      }
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != '}') {
        Fail(path_, "malformed .npy header: expected ',' or '}'");
      }
    }
    if (!have_descr || !have_order || !have_shape) {
      Fail(path_, "malformed .npy header: it needs 'descr', 'fortran_order' and 'shape'");
    }
    return fortran_order;
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void Expect(char c) {
    SkipSpace();
    if (Peek() != c) Fail(path_, std::string("malformed .npy header: expected '") + c + "'");
    ++pos_;
  }

  std::string ParseString() {
    SkipSpace();
    char quote = Peek();
    if (quote != '\'' && quote != '"') Fail(path_, "malformed .npy header: expected a string");
    size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) Fail(path_, "malformed .npy header: unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }

  bool ParseBool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    Fail(path_, "malformed .npy header: fortran_order is not True or False");
  }

  Shape ParseShape() {
    Shape shape;
    Expect('(');
    while (true) {
      SkipSpace();
      if (Peek() == ')') break;
      if (Peek() < '0' || Peek() > '9') Fail(path_, "malformed .npy header: bad shape");
      int64_t d = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        if (d > (std::numeric_limits<int64_t>::max() - 9) / 10) {
          Fail(path_, "dimension too large in .npy header");
        }
        d = d * 10 + (Peek() - '0');
        ++pos_;
      }
      if (Peek() == 'L') ++pos_;  // Python 2 long literals.
      shape.push_back(d);
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != ')') {
        Fail(path_, "malformed .npy header: bad shape");
      }
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

// Bytes per element of a supported descr (without the byte-order character).
int64_t ItemSize(const std::string& descr) { return descr[2] - '0'; }

// Reads the header of an open file; leaves the stream at the first element.
NpyHeader ReadHeader(std::ifstream& in, const std::string& path) {
  char prefix[kMagicSize + 2];
  if (!in.read(prefix, sizeof(prefix)) || std::memcmp(prefix, kMagic, kMagicSize) != 0) {
    Fail(path, "not a .npy file (bad magic string)");
  }
  int major = static_cast<unsigned char>(prefix[kMagicSize]);
  int64_t header_len = 0;
  int64_t offset = 0;
  if (major == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) Fail(path, "truncated .npy header");
    header_len = len[0] | (len[1] << 8);
    offset = kMagicSize + 4;
  } else if (major == 2 || major == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) Fail(path, "truncated .npy header");
    header_len = static_cast<int64_t>(len[0]) | (static_cast<int64_t>(len[1]) << 8) |
                 (static_cast<int64_t>(len[2]) << 16) | (static_cast<int64_t>(len[3]) << 24);
    offset = kMagicSize + 6;
  } else {
    Fail(path, "unsupported .npy format version " + std::to_string(major) +
                   " (versions 1, 2 and 3 are read)");
  }
  constexpr int64_t kMaxHeader = 1 << 20;  // NumPy's own limit is far lower (10 KB).
  if (header_len > kMaxHeader) Fail(path, "malformed .npy header: too long");
  std::string text(static_cast<size_t>(header_len), '\0');
  if (!in.read(text.data(), header_len)) Fail(path, "truncated .npy header");
  NpyHeader header;
  header.data_offset = offset + header_len;
  bool fortran_order = HeaderParser(text, path).Parse(header);
  const std::string& d = header.descr;
  if (!d.empty() && d[0] == '>') {
    Fail(path, "big-endian dtype '" + d +
                   "' is not supported; save it little-endian, e.g. "
                   "arr.astype('<" +
                   d.substr(1) + "')");
  }
  if (d == "<f4") {
    header.dtype = DType::kF32;
  } else if (d == "<f8") {
    header.dtype = DType::kF32;
  } else if (d == "<f2") {
    header.dtype = DType::kF16;
  } else if (d == "<i4" || d == "<i8") {
    header.dtype = DType::kI32;
  } else {
    Fail(path, "unsupported dtype '" + d + "' (supported: '<f4', '<f2', '<i4', '<f8', '<i8')");
  }
  if (fortran_order) {
    int big = 0;  // With at most one dimension above 1, both orders are the same bytes.
    for (int64_t dim : header.shape) big += dim > 1 ? 1 : 0;
    if (big > 1) {
      Fail(path,
           "fortran_order True is not supported; save a C-order array, e.g. "
           "np.save(path, np.ascontiguousarray(arr))");
    }
  }
  return header;
}

// Opens `path` for reading or throws naming it.
std::ifstream Open(const std::string& path) {
  std::error_code ec;
  std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) Fail(path, "no such file");
  if (status.type() == std::filesystem::file_type::directory) Fail(path, "is a directory");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    Fail(path, std::string("cannot open: ") + (errno ? std::strerror(errno) : "unknown error"));
  return in;
}

// Appends the raw (little-endian) bytes of `values[0..n)`.
template <typename T>
void AppendRaw(std::string& out, const T* values, size_t n) {
  out.append(reinterpret_cast<const char*>(values), n * sizeof(T));
}

}  // namespace

float HalfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // Zero or subnormal: mant * 2^-24.
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf/NaN.
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t FloatToHalfBits(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN (kept quiet).
    return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  int exp = static_cast<int>(abs >> 23) - 127;
  uint32_t mant = abs & 0x7fffffu;
  if (exp > 15) return sign | 0x7c00u;
  if (exp >= -14) {  // Normal half: keep 10 of the 23 mantissa bits, round to nearest even.
    uint32_t half = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // May carry into inf.
    return static_cast<uint16_t>(sign | half);
  }
  if (exp < -25) return sign;  // Below half the smallest subnormal: zero.
  // Subnormal half: units of 2^-24. value = m * 2^(exp-23) = (m >> s) units, s = -(exp+1).
  uint32_t m = mant | 0x800000u;
  int s = -(exp + 1);
  uint32_t half = m >> s;
  uint32_t rem = m & ((1u << s) - 1);
  uint32_t halfway = 1u << (s - 1);
  if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

NpyHeader ReadNpyHeader(const std::string& path) {
  std::ifstream in = Open(path);
  return ReadHeader(in, path);
}

Array ReadNpy(const std::string& path) {
  std::ifstream in = Open(path);
  NpyHeader header = ReadHeader(in, path);
  int64_t n = NumElements(header.shape);
  int64_t item = ItemSize(header.descr);
  int64_t expected = n * item;
  in.seekg(0, std::ios::end);
  int64_t available = static_cast<int64_t>(in.tellg()) - header.data_offset;
  if (available != expected) {
    Fail(path, "has " + std::to_string(available) + " bytes of data, but shape " +
                   FormatShape(header.shape) + " of '" + header.descr + "' needs " +
                   std::to_string(expected));
  }
  in.seekg(header.data_offset);
  std::vector<float> values(static_cast<size_t>(n));
  auto read = [&](void* dst) {
    if (!in.read(static_cast<char*>(dst), expected)) Fail(path, "cannot read the data");
  };
  const std::string& d = header.descr;
  if (d == "<f4") {
    read(values.data());
  } else if (d == "<f2") {
    std::vector<uint16_t> raw(static_cast<size_t>(n));
    read(raw.data());
    for (int64_t i = 0; i < n; ++i) values[i] = HalfBitsToFloat(raw[i]);
  } else if (d == "<i4") {
    std::vector<int32_t> raw(static_cast<size_t>(n));
    read(raw.data());
    for (int64_t i = 0; i < n; ++i) values[i] = IntToWord(raw[i]);
  } else if (d == "<f8") {
    std::vector<double> raw(static_cast<size_t>(n));
    read(raw.data());
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(raw[i]);
  } else {  // "<i8"
    std::vector<int64_t> raw(static_cast<size_t>(n));
    read(raw.data());
    for (int64_t i = 0; i < n; ++i) {
      if (raw[i] < std::numeric_limits<int32_t>::min() ||
          raw[i] > std::numeric_limits<int32_t>::max()) {
        Fail(path, "int64 value " + std::to_string(raw[i]) + " at flat index " + std::to_string(i) +
                       " does not fit in int32");
      }
      values[i] = IntToWord(static_cast<int32_t>(raw[i]));
    }
  }
  return Array::FromValues(header.dtype, header.shape, std::move(values));
}

void WriteNpy(const Array& array, const std::string& path) {
  if (!array.has_data()) {
    throw std::invalid_argument("cannot write " + path + ": " + array.TypeString() +
                                " has no values (numerics are off)");
  }
  WriteFileAtomically(path, EncodeNpy(array));
}

std::string EncodeNpy(const Array& array) {
  assert(array.has_data());
  const char* descr = "<f4";
  if (array.dtype() == DType::kF16) descr = "<f2";
  if (array.dtype() == DType::kI32) descr = "<i4";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int64_t d : array.shape()) dict += std::to_string(d) + ", ";
  if (array.rank() == 1) dict.pop_back();              // "(5,)"
  if (array.rank() > 1) dict.resize(dict.size() - 2);  // "(2, 3)"
  dict += "), }";
  // Pad with spaces and a final newline so the data starts on a 64-byte boundary.
  size_t prefix = kMagicSize + 4;
  int major = 1;
  if (dict.size() + 1 + 64 > 65535) {
    major = 2;
    prefix = kMagicSize + 6;
  }
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  uint32_t header_len = static_cast<uint32_t>(dict.size());

  int64_t n = array.size();
  std::string out;
  out.reserve(total + static_cast<size_t>(n * 4));
  out.append(kMagic, kMagicSize);
  out += static_cast<char>(major);
  out += '\0';
  out += static_cast<char>(header_len & 0xff);
  out += static_cast<char>((header_len >> 8) & 0xff);
  if (major == 2) {
    out += static_cast<char>((header_len >> 16) & 0xff);
    out += static_cast<char>((header_len >> 24) & 0xff);
  }
  out += dict;
  const float* v = array.data();
  if (array.dtype() == DType::kF16) {
    std::vector<uint16_t> raw(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) raw[i] = FloatToHalfBits(v[i]);
    AppendRaw(out, raw.data(), raw.size());
  } else if (array.dtype() == DType::kI32) {
    std::vector<int32_t> raw(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) raw[i] = WordToInt(v[i]);
    AppendRaw(out, raw.data(), raw.size());
  } else {
    AppendRaw(out, v, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace shardsim
