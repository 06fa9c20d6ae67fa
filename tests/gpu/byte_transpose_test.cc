// TransposeBytes (kernels/cuda/byte_transpose.h) against the host transpose, byte for byte,
// on shapes of one tile, an odd number of tiles (the kernel takes two a block) and wide rows.
#include "kernels/cuda/byte_transpose.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace forge {
namespace {

using test::DeviceBuffer;

TEST(GpuByteTranspose, MatchesHostTranspose) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const auto [rows, cols] :
       {std::pair<int64_t, int64_t>{64, 64}, {192, 64}, {128, 960}, {320, 192}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    std::vector<uint8_t> in(size_t(rows * cols));
    for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t((i * 2654435761u) >> 13);
    DeviceBuffer<uint8_t> d_in(in), d_out(in.size());
    d_out.Poison();
    ASSERT_STATUS_OK(cuda::TransposeBytes(d_out.data(), d_in.data(), rows, cols, nullptr));
    const std::vector<uint8_t> got = d_out.Download();
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        bad += got[size_t(c * rows + r)] != in[size_t(r * cols + c)];
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(GpuByteTranspose, RejectsWhatItCannotTile) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> a(size_t(128 * 96)), b(size_t(128 * 96));
  const Status st = cuda::TransposeBytes(b.data(), a.data(), 128, 96, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("multiples of 64"), std::string::npos) << st.ToString();
  EXPECT_TRUE(cuda::TransposeBytes(b.data(), a.data(), 0, 64, nullptr).ok());
}

}  // namespace
}  // namespace forge
