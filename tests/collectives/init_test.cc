#include "collectives/init.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "collectives/npy.h"

namespace shardsim {
namespace {

ArraySpec Spec(Shape shape, DType dtype, InitSpec::Kind kind, uint64_t seed = 0) {
  ArraySpec spec;
  spec.name = "x";
  spec.shape = std::move(shape);
  spec.dtype = dtype;
  spec.init.kind = kind;
  spec.init.seed = seed;
  return spec;
}

TEST(InitTest, ZerosOnesArange) {
  Array z = MakeInitialArray(Spec({2, 2}, DType::kF32, InitSpec::Kind::kZeros), true, "");
  EXPECT_EQ(z.values(), (std::vector<float>{0, 0, 0, 0}));
  Array o = MakeInitialArray(Spec({3}, DType::kBF16, InitSpec::Kind::kOnes), true, "");
  EXPECT_EQ(o.values(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(o.dtype(), DType::kBF16);
  Array r = MakeInitialArray(Spec({2, 3}, DType::kI32, InitSpec::Kind::kArange), true, "");
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.IntAt(i), i);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  Array ones = MakeInitialArray(Spec({2}, DType::kI32, InitSpec::Kind::kOnes), true, "");
  EXPECT_EQ(ones.IntAt(1), 1);
}

// arange with a modulus (`init: {arange: N}`): element i holds i mod N, in f32 and i32 alike.
TEST(InitTest, ArangeModulo) {
  for (DType dtype : {DType::kI32, DType::kF32}) {
    ArraySpec spec = Spec({2, 4}, dtype, InitSpec::Kind::kArange);
    spec.init.modulus = 3;
    const Array r = MakeInitialArray(spec, true, "");
    for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(r.ValueAt(i), static_cast<double>(i % 3));
  }
}

TEST(InitTest, Int32ArangeIsExactPast2To24) {
  // float32 would make element 2^24 + 1 equal to 2^24; int32 storage keeps every count.
  const int64_t n = (int64_t{1} << 24) + 3;
  Array r = MakeInitialArray(Spec({n}, DType::kI32, InitSpec::Kind::kArange), true, "");
  for (int64_t i = n - 4; i < n; ++i) EXPECT_EQ(r.IntAt(i), i);
}

TEST(InitTest, ArangeIsRoundedToBf16) {
  Array r = MakeInitialArray(Spec({300}, DType::kBF16, InitSpec::Kind::kArange), true, "");
  EXPECT_EQ(r.at(257), 256.0f);  // bf16 has 8 significant bits: 257 -> 256 (tie to even).
  EXPECT_EQ(r.at(259), 260.0f);
}

// i32 literals are exact over the whole int32 range: 2^24 + 1 and the extremes (read through
// float32 they became 16777216, 2147483648 clamped, ...).
TEST(InitTest, I32LiteralsAreExact) {
  ArraySpec spec = Spec({4}, DType::kI32, InitSpec::Kind::kValue);
  spec.init.values = {16777217, 2147483647, -2147483648.0, -16777219};
  const Array a = MakeInitialArray(spec, true, "");
  EXPECT_EQ(a.IntAt(0), 16777217);
  EXPECT_EQ(a.IntAt(1), 2147483647);
  EXPECT_EQ(a.IntAt(2), -2147483647 - 1);
  EXPECT_EQ(a.IntAt(3), -16777219);
}

TEST(InitTest, ValueLiteral) {
  ArraySpec spec = Spec({2, 2}, DType::kF32, InitSpec::Kind::kValue);
  spec.init.values = {1.5, -2, 3, 4};
  EXPECT_EQ(MakeInitialArray(spec, true, "").values(), (std::vector<float>{1.5f, -2, 3, 4}));
  spec.init.values = {1, 2, 3};
  try {
    MakeInitialArray(spec, false, "");  // Checked even without data.
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "the value has 3 elements, but shape [2,2] needs 4");
  }
}

TEST(InitTest, WithoutDataIsShapeOnly) {
  Array a = MakeInitialArray(Spec({1024, 4096}, DType::kBF16, InitSpec::Kind::kNormal), false, "");
  EXPECT_FALSE(a.has_data());
  EXPECT_EQ(a.TypeString(), "bf16[1024,4096]");
}

TEST(InitTest, RandomBitsArePinned) {
  // SplitMix64 is fully specified by integer arithmetic, so these hold on every platform.
  // The first output of SplitMix64 seeded with 0 is 0xe220a8397b1dcdaf (its reference value).
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  EXPECT_EQ(mix(0x9e3779b97f4a7c15ull), 0xe220a8397b1dcdafull);
  EXPECT_EQ(RandomBits(7, 0), mix(mix(7) + 0x9e3779b97f4a7c15ull));
  EXPECT_EQ(RandomBits(7, 5), mix(mix(7) + 6 * 0x9e3779b97f4a7c15ull));
}

TEST(InitTest, SameSeedSameValuesDifferentSeedsDiffer) {
  for (InitSpec::Kind kind : {InitSpec::Kind::kNormal, InitSpec::Kind::kUniform}) {
    Array a = MakeInitialArray(Spec({64, 33}, DType::kF32, kind, 3), true, "");
    Array b = MakeInitialArray(Spec({64, 33}, DType::kF32, kind, 3), true, "");
    Array c = MakeInitialArray(Spec({64, 33}, DType::kF32, kind, 4), true, "");
    EXPECT_EQ(a.values(), b.values());
    int same = 0;
    for (int64_t i = 0; i < a.size(); ++i) same += a.at(i) == c.at(i);
    EXPECT_LT(same, 3);
  }
}

TEST(InitTest, ElementsDoNotDependOnTheShape) {
  // Counter-based: element i is the same whatever the array's size (odd sizes included).
  Array small = MakeInitialArray(Spec({5}, DType::kF32, InitSpec::Kind::kNormal, 9), true, "");
  Array big = MakeInitialArray(Spec({2, 4}, DType::kF32, InitSpec::Kind::kNormal, 9), true, "");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(small.at(i), big.at(i));
}

TEST(InitTest, NormalStatistics) {
  // n = 200000 standard normals: the sample mean has standard error 1/sqrt(n) = 0.0022 and
  // the sample std about 1/sqrt(2n) = 0.0016. Bounds of 0.015 are more than 6 sigma.
  Array a = MakeInitialArray(Spec({200000}, DType::kF32, InitSpec::Kind::kNormal, 0), true, "");
  double sum = 0, sum_sq = 0;
  int beyond_3 = 0;
  for (float v : a.values()) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    beyond_3 += std::fabs(v) > 3;
  }
  double mean = sum / a.size();
  double std = std::sqrt(sum_sq / a.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.015);
  EXPECT_NEAR(std, 1.0, 0.015);
  // P(|z| > 3) = 0.0027: expect 540; 400..700 is more than 6 sigma (sd ~23).
  EXPECT_GT(beyond_3, 400);
  EXPECT_LT(beyond_3, 700);
}

TEST(InitTest, UniformStatisticsAndRange) {
  // n = 200000 uniforms on [0, 1): mean 0.5 with standard error 0.29/sqrt(n) = 0.00065;
  // the bound 0.005 is more than 7 sigma.
  Array a = MakeInitialArray(Spec({200000}, DType::kF32, InitSpec::Kind::kUniform, 1), true, "");
  double sum = 0;
  for (float v : a.values()) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / a.size(), 0.5, 0.005);
}

TEST(InitTest, Bf16UniformStaysBelowOne) {
  Array a = MakeInitialArray(Spec({100000}, DType::kBF16, InitSpec::Kind::kUniform, 2), true, "");
  float largest = 0;
  for (float v : a.values()) {
    ASSERT_LT(v, 1.0f);
    ASSERT_EQ(v, RoundToDType(DType::kBF16, v));
    largest = std::max(largest, v);
  }
  EXPECT_EQ(largest, 255.0f / 256.0f);  // Values are k / 256.
}

TEST(InitTest, Bf16NormalIsRounded) {
  Array a = MakeInitialArray(Spec({1000}, DType::kBF16, InitSpec::Kind::kNormal, 5), true, "");
  Array f = MakeInitialArray(Spec({1000}, DType::kF32, InitSpec::Kind::kNormal, 5), true, "");
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.at(i), RoundToDType(DType::kBF16, f.at(i)));
}

class InitFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) / ("init_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(InitFileTest, ReadsANpyFileRelativeToTheBaseDir) {
  WriteNpy(Array::FromValues(DType::kF32, {2, 2}, {1, 2, 3, 4.25f}), (dir_ / "w.npy").string());
  ArraySpec spec = Spec({2, 2}, DType::kF32, InitSpec::Kind::kFile);
  spec.init.file = "w.npy";
  Array a = MakeInitialArray(spec, true, dir_.string());
  EXPECT_EQ(a.values(), (std::vector<float>{1, 2, 3, 4.25f}));
  EXPECT_FALSE(MakeInitialArray(spec, false, dir_.string()).has_data());
}

TEST_F(InitFileTest, Bf16ArraysReadFloat32Files) {
  WriteNpy(Array::FromValues(DType::kF32, {2}, {1.0f + std::ldexp(1.0f, -8), 3.14159265f}),
           (dir_ / "w.npy").string());
  ArraySpec spec = Spec({2}, DType::kBF16, InitSpec::Kind::kFile);
  spec.init.file = (dir_ / "w.npy").string();  // Absolute: base_dir is ignored.
  Array a = MakeInitialArray(spec, true, "/nonexistent");
  EXPECT_EQ(a.dtype(), DType::kBF16);
  EXPECT_EQ(a.values(), (std::vector<float>{1.0f, 3.140625f}));
}

TEST_F(InitFileTest, MismatchedShapeOrDTypeIsRejected) {
  std::string path = (dir_ / "w.npy").string();
  WriteNpy(Array::FromValues(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6}), path);
  ArraySpec spec = Spec({3, 2}, DType::kF32, InitSpec::Kind::kFile);
  spec.init.file = path;
  try {
    MakeInitialArray(spec, false, "");
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), path + " holds '<f4' [2,3], but the array is f32[3,2]");
  }
  spec.shape = {2, 3};
  spec.dtype = DType::kI32;
  EXPECT_THROW(MakeInitialArray(spec, true, ""), std::invalid_argument);
  spec.init.file = (dir_ / "missing.npy").string();
  EXPECT_THROW(MakeInitialArray(spec, true, ""), std::invalid_argument);
}

}  // namespace
}  // namespace shardsim
