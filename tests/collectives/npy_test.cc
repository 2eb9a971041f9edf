#include "collectives/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace shardsim {
namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("npy_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a .npy file by hand: magic, version, header length, `dict` padded, then `data`.
  std::string WriteRaw(const std::string& name, int major, const std::string& dict,
                       const std::string& data) {
    std::string header = dict;
    size_t prefix = major == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += '\0';
    uint32_t len = static_cast<uint32_t>(header.size());
    out += static_cast<char>(len & 0xff);
    out += static_cast<char>(len >> 8);
    if (major != 1) out += std::string(2, '\0');
    out += header + data;
    std::ofstream(Path(name), std::ios::binary) << out;
    return Path(name);
  }

  // The error message ReadNpy gives for `path`.
  std::string ReadError(const std::string& path) {
    try {
      ReadNpy(path);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  }

  template <typename T>
  static std::string Bytes(std::initializer_list<T> values) {
    std::string s;
    for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return s;
  }

  std::filesystem::path dir_;
};

TEST_F(NpyTest, RoundTripsEveryDType) {
  struct Case {
    const char* name;
    DType dtype;
    Shape shape;
    std::vector<float> values;
  };
  const Case cases[] = {
      {"f32", DType::kF32, {2, 3}, {1.5f, -2, 3.25f, 1e-30f, 1e30f, 0}},
      {"f16", DType::kF16, {3}, {1.0f, -0.0009765625f, 65504.0f}},
      {"i32", DType::kI32, {2, 2}, {-7, 0, 16777216, 3}},
      {"scalar", DType::kF32, {}, {42}},
      {"empty", DType::kF32, {0, 4}, {}},
      {"rank4", DType::kF32, {1, 2, 1, 2}, {1, 2, 3, 4}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = Path(std::string(c.name) + ".npy");
    WriteNpy(
        Array::FromNumbers(c.dtype, c.shape, std::vector<double>(c.values.begin(), c.values.end())),
        path);
    Array back = ReadNpy(path);
    EXPECT_EQ(back.dtype(), c.dtype);
    EXPECT_EQ(back.shape(), c.shape);
    std::vector<float> got;
    for (int64_t i = 0; i < back.size(); ++i) got.push_back(static_cast<float>(back.ValueAt(i)));
    EXPECT_EQ(got, c.values);
    NpyHeader header = ReadNpyHeader(path);
    EXPECT_EQ(header.data_offset % 64, 0);
  }
}

TEST_F(NpyTest, Int32RoundTripsExactlyPast2To24) {
  // '<i4' data keeps every int32, including odd values above 2^24 that float32 cannot hold.
  const std::vector<int32_t> ints = {16777217, -16777219, 2147483647, -2147483647 - 1};
  std::string path = Path("i32_big.npy");
  WriteNpy(Array::FromInts({4}, ints), path);
  Array back = ReadNpy(path);
  ASSERT_EQ(back.dtype(), DType::kI32);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(back.IntAt(i), ints[i]);
}

TEST_F(NpyTest, Bf16IsWrittenAsFloat32) {
  std::string path = Path("bf16.npy");
  WriteNpy(Array::FromValues(DType::kBF16, {2}, {3.14159265f, 1}), path);
  Array back = ReadNpy(path);
  EXPECT_EQ(ReadNpyHeader(path).descr, "<f4");
  EXPECT_EQ(back.dtype(), DType::kF32);
  EXPECT_EQ(back.values(), (std::vector<float>{3.140625f, 1}));
}

TEST_F(NpyTest, WritesTheHeaderNumPyWrites) {
  std::string path = Path("h.npy");
  WriteNpy(Array::FromValues(DType::kF32, {2, 3}, {0, 1, 2, 3, 4, 5}), path);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string file = ss.str();
  ASSERT_EQ(file.size(), 128u + 24u);
  EXPECT_EQ(file.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>(file[8]) | (static_cast<unsigned char>(file[9]) << 8), 118);
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(file.substr(10, dict.size()), dict);
  EXPECT_EQ(file[127], '\n');
  float third;
  std::memcpy(&third, file.data() + 128 + 8, 4);
  EXPECT_EQ(third, 2.0f);
  WriteNpy(Array::FromValues(DType::kF32, {5}, {0, 1, 2, 3, 4}), path);
  EXPECT_EQ(ReadNpyHeader(path).shape, (Shape{5}));  // "(5,)"
}

TEST_F(NpyTest, ReadsAHandBuiltFloat64File) {
  std::string path =
      WriteRaw("f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
               Bytes<double>({0.1, -2.5, 1e40}));
  Array a = ReadNpy(path);
  EXPECT_EQ(a.dtype(), DType::kF32);
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_EQ(a.at(0), 0.1f);
  EXPECT_EQ(a.at(1), -2.5f);
  EXPECT_TRUE(std::isinf(a.at(2)));
}

TEST_F(NpyTest, ReadsVersion2And3HeadersAndOtherKeyOrders) {
  std::string v2 =
      WriteRaw("v2.npy", 2, "{'shape': (2, 1), 'fortran_order': False, 'descr': '<i4'}",
               Bytes<int32_t>({5, -6}));
  Array a = ReadNpy(v2);
  EXPECT_EQ(a.dtype(), DType::kI32);
  EXPECT_EQ(a.shape(), (Shape{2, 1}));
  EXPECT_EQ(a.IntAt(0), 5);
  EXPECT_EQ(a.IntAt(1), -6);
  std::string v3 =
      WriteRaw("v3.npy", 3, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": ()}",
               Bytes<uint16_t>({0x3c00}));
  Array b = ReadNpy(v3);
  EXPECT_EQ(b.dtype(), DType::kF16);
  EXPECT_EQ(b.shape(), Shape{});
  EXPECT_EQ(b.values(), (std::vector<float>{1.0f}));
}

TEST_F(NpyTest, Int64BecomesInt32WhenValuesFit) {
  std::string ok =
      WriteRaw("i8.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
               Bytes<int64_t>({-3, 1000}));
  EXPECT_EQ(ReadNpy(ok).IntAt(0), -3);
  EXPECT_EQ(ReadNpy(ok).IntAt(1), 1000);
  EXPECT_EQ(ReadNpy(ok).dtype(), DType::kI32);
  std::string big =
      WriteRaw("big.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }",
               Bytes<int64_t>({int64_t{1} << 40}));
  EXPECT_EQ(ReadError(big),
            big + ": int64 value 1099511627776 at flat index 0 does not fit in int32");
}

TEST_F(NpyTest, RejectsWhatItCannotRead) {
  struct Case {
    const char* name;
    std::string dict;
    std::string data;
    std::string error;  // After "PATH: ".
  };
  const Case cases[] = {
      {"big_endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
       std::string(4, '\0'),
       "big-endian dtype '>f4' is not supported; save it little-endian, e.g. arr.astype('<f4')"},
      {"fortran", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
       std::string(16, '\0'),
       "fortran_order True is not supported; save a C-order array, e.g. np.save(path, "
       "np.ascontiguousarray(arr))"},
      {"uint8", "{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", std::string(1, '\0'),
       "unsupported dtype '|u1' (supported: '<f4', '<f2', '<i4', '<f8', '<i8')"},
      {"structured", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
       std::string(4, '\0'), "structured dtypes are not supported (header descr is not a string)"},
      {"truncated", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
       std::string(8, '\0'), "has 8 bytes of data, but shape [3] of '<f4' needs 12"},
      {"no_shape", "{'descr': '<f4', 'fortran_order': False}", "",
       "malformed .npy header: it needs 'descr', 'fortran_order' and 'shape'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = WriteRaw(std::string(c.name) + ".npy", 1, c.dict, c.data);
    EXPECT_EQ(ReadError(path), path + ": " + c.error);
  }
  // A Fortran-order vector is the same bytes as a C-order one.
  std::string vec =
      WriteRaw("fvec.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
               Bytes<float>({1, 2}));
  EXPECT_EQ(ReadNpy(vec).values(), (std::vector<float>{1, 2}));

  std::ofstream(Path("text.npy")) << "hello, world";
  EXPECT_EQ(ReadError(Path("text.npy")), Path("text.npy") + ": not a .npy file (bad magic string)");
  EXPECT_EQ(ReadError(Path("missing.npy")), Path("missing.npy") + ": no such file");
  EXPECT_EQ(ReadError(dir_.string()), dir_.string() + ": is a directory");
}

TEST_F(NpyTest, WritingAShapeOnlyArrayThrows) {
  EXPECT_THROW(WriteNpy(Array::ShapeOnly(DType::kF32, {2}), Path("x.npy")), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(Path("x.npy")));
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {65504.0f, 0x7bff},                                       // Largest half.
      {65519.0f, 0x7bff},                                       // Below the midpoint to 65536.
      {65520.0f, 0x7c00},                                       // The midpoint ties to even: inf.
      {1e10f, 0x7c00},                                          // Overflow.
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},                   // Tie, to even.
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},               // Tie, to even (up).
      {std::ldexp(1.0f, -14), 0x0400},                          // Smallest normal.
      {std::ldexp(1.0f, -24), 0x0001},                          // Smallest subnormal.
      {std::ldexp(1.0f, -25), 0x0000},                          // Half of it: tie to even, zero.
      {3 * std::ldexp(1.0f, -26), 0x0001},                      // 0.75 of it: up.
      {3 * std::ldexp(1.0f, -25), 0x0002},                      // 1.5 units: tie, to even 2.
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400},  // Rounds up into normal.
      {std::numeric_limits<float>::infinity(), 0x7c00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToHalfBits(c.value), c.bits) << c.value;
  }
  EXPECT_EQ(FloatToHalfBits(std::nanf("")) & 0x7c00, 0x7c00);
  EXPECT_NE(FloatToHalfBits(std::nanf("")) & 0x03ff, 0);
}

TEST(HalfTest, HalfToFloatIsExactAndInvertsEveryHalf) {
  EXPECT_EQ(HalfBitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0xfbff), -65504.0f);
  EXPECT_TRUE(std::isinf(HalfBitsToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7e00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), h) << std::hex << h;
    ASSERT_EQ(RoundToDType(DType::kF16, f), f) << std::hex << h;  // Agrees with dtype.cc.
  }
}

TEST(HalfTest, AgreesWithF16Rounding) {
  // A float's round trip through half bits is RoundToDType(kF16): over a sweep of magnitudes.
  for (int e = -30; e <= 17; ++e) {
    for (int m = 0; m < 4096; m += 7) {
      float v = std::ldexp(1.0f + m / 4096.0f + 1.0f / 65536.0f, e);
      for (float x : {v, -v}) {
        ASSERT_EQ(HalfBitsToFloat(FloatToHalfBits(x)), RoundToDType(DType::kF16, x)) << x;
      }
    }
  }
}

}  // namespace
}  // namespace shardsim
