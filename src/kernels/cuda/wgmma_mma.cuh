// The warpgroup MMAs with an FP32 accumulator that our Hopper GEMMs issue: m64n256 (128
// registers a thread; gemm_wgmma.cu) in BF16 and with 8-bit operands, and m64n128 (64
// registers; swiglu_backward_gemm_fp8.cu) with 8-bit operands; and the accumulator register
// lists every wgmma in the project names (flash_backward.cu's m64n64 and m64n32 forms too).
#pragma once

#include <cstdint>

namespace forge::cuda {

// FORGE_WGMMA_REGS_N: the asm register list of an N-register FP32 accumulator (%0 .. %N-1),
// FORGE_WGMMA_OUTS_N(d): its operands, d[0] .. d[N-1]. Inline PTX must name every accumulator
// register; each list extends the one before it.
#define FORGE_WGMMA_REGS_16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FORGE_WGMMA_OUTS_16(d)                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
#define FORGE_WGMMA_REGS_32 \
  FORGE_WGMMA_REGS_16       \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FORGE_WGMMA_OUTS_32(d)                                                                   \
  FORGE_WGMMA_OUTS_16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),       \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FORGE_WGMMA_REGS_64                                                                 \
  FORGE_WGMMA_REGS_32                                                                       \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FORGE_WGMMA_OUTS_64(d)                                                                   \
  FORGE_WGMMA_OUTS_32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),       \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FORGE_WGMMA_REGS_128                                                                 \
  FORGE_WGMMA_REGS_64                                                                        \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "  \
  "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "    \
  "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
  "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "     \
  "%127"
#define FORGE_WGMMA_OUTS_128(d)                                                                  \
  FORGE_WGMMA_OUTS_64(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),       \
      "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
      "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
      "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
      "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),           \
      "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),        \
      "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),        \
      "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),        \
      "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),        \
      "+f"(d[127])

// kTransB: B is N-major in shared memory (wgmma's imm-trans-b).
template <int kTransB>
__device__ __forceinline__ void WgmmaM64N256K16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{" FORGE_WGMMA_REGS_128
      "}, "
      "%128, %129, p, 1, 1, 0, %131;\n"
      "}\n"
      : FORGE_WGMMA_OUTS_128(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
}

// One 8-bit MMA (desc_a, desc_b, scale_d in scope): the forms differ only in shape, A's type
// word (e4m3 or e5m2) and the operand numbers after the accumulator's.
#define FORGE_WGMMA_8BIT(shape, a_type, regs, outs, scale_op, desc_ops) \
  asm volatile(                                                         \
      "{\n"                                                             \
      ".reg .pred p;\n"                                                 \
      "setp.ne.b32 p, " scale_op                                        \
      ", 0;\n"                                                          \
      "wgmma.mma_async.sync.aligned." shape ".f32." a_type              \
      ".e4m3 "                                                          \
      "{" regs "}, " desc_ops                                           \
      ", p, 1, 1;\n"                                                    \
      "}\n"                                                             \
      : outs                                                            \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

// 8-bit operands, K 32 (32 bytes of a K-major row, as bf16's K 16): both K-major, the only
// layout wgmma takes for 8-bit types. B is E4M3 (weights and activations); A is E4M3, or E5M2
// with kAE5M2 (a gradient times a weight: the backward's input-gradient GEMMs).
template <bool kAE5M2 = false>
__device__ __forceinline__ void WgmmaM64N256K32Fp8(float (&d)[128], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
  if constexpr (kAE5M2) {
    FORGE_WGMMA_8BIT("m64n256k32", "e5m2", FORGE_WGMMA_REGS_128, FORGE_WGMMA_OUTS_128(d), "%130",
                     "%128, %129");
  } else {
    FORGE_WGMMA_8BIT("m64n256k32", "e4m3", FORGE_WGMMA_REGS_128, FORGE_WGMMA_OUTS_128(d), "%130",
                     "%128, %129");
  }
}

// m64n128k32 with 8-bit operands (as WgmmaM64N256K32Fp8).
template <bool kAE5M2 = false>
__device__ __forceinline__ void WgmmaM64N128K32Fp8(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                   int scale_d) {
  if constexpr (kAE5M2) {
    FORGE_WGMMA_8BIT("m64n128k32", "e5m2", FORGE_WGMMA_REGS_64, FORGE_WGMMA_OUTS_64(d), "%66",
                     "%64, %65");
  } else {
    FORGE_WGMMA_8BIT("m64n128k32", "e4m3", FORGE_WGMMA_REGS_64, FORGE_WGMMA_OUTS_64(d), "%66",
                     "%64, %65");
  }
}
#undef FORGE_WGMMA_8BIT

}  // namespace forge::cuda
