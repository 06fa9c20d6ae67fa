// safetensors export: GPT-2-style names, shapes and bytes read back by our reader (F32
// bitwise, BF16 rounded to nearest even), metadata, and an independent parse of the file by a
// small python3 (standard library only) script when python3 is available.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "../common/run_command.h"

namespace forge {
namespace {

using namespace ckpt_test;

TEST(CheckpointSafetensorsTest, TensorNames) {
  const std::map<std::string, std::string> want = {
      {"wte", "transformer.wte.weight"},
      {"blocks.0.attn_norm", "transformer.h.0.ln_1.weight"},
      {"blocks.11.attn.q_norm", "transformer.h.11.attn.q_norm.weight"},
      {"blocks.11.attn.k_norm", "transformer.h.11.attn.k_norm.weight"},
      {"blocks.3.attn.wqkv", "transformer.h.3.attn.c_attn.weight"},
      {"blocks.3.attn.wo", "transformer.h.3.attn.c_proj.weight"},
      {"blocks.23.mlp_norm", "transformer.h.23.ln_2.weight"},
      {"blocks.23.mlp.w_gate_up", "transformer.h.23.mlp.c_fc.weight"},
      {"blocks.23.mlp.w_down", "transformer.h.23.mlp.c_proj.weight"},
      {"final_norm", "transformer.ln_f.weight"},
      {"lm_head", "lm_head.weight"}};  // an untied head
  for (const auto& [forge_name, st_name] : want) {
    auto n = SafetensorsTensorName(forge_name);
    ASSERT_TRUE(n.ok()) << forge_name;
    EXPECT_EQ(*n, st_name);
  }
  EXPECT_FALSE(SafetensorsTensorName("blocks.x.attn.wo").ok());
  EXPECT_FALSE(SafetensorsTensorName("blocks.1.attn.bias").ok());
  EXPECT_FALSE(SafetensorsTensorName("lm_head.weight").ok());
}

TEST(CheckpointSafetensorsTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(Bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(Bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(Bits(0x3f808001u)), 0x3f81);  // above half
  EXPECT_EQ(FloatToBf16(Bits(0xff800000u)), 0xff80);  // -inf
  EXPECT_EQ(FloatToBf16(Bits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(FloatToBf16(Bits(0x7f800001u)) & 0x7fc0, 0x7fc0);  // NaN stays NaN (quiet)
}

struct Exported {
  std::string path;
  RunConfig cfg;
  ParamLayout layout;
  FullState full;
};

Exported Export(const std::string& name, SafetensorsDtype dtype) {
  Exported e;
  e.path = FreshDir(name) + "/model.safetensors";
  e.cfg = SmallConfig(/*qk_norm=*/true);
  e.layout = MakeParamLayout(e.cfg.model);
  e.full = MakeState(e.layout, 44);
  ExportOptions opt;
  opt.dtype = dtype;
  opt.metadata = ExportMetadata(e.cfg);
  const Status st = ExportSafetensors(e.full.master, e.layout, e.path, opt);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fs::exists(e.path + ".tmp"));
  return e;
}

TEST(CheckpointSafetensorsTest, F32ReadsBackBitwise) {
  const Exported e = Export("st_f32", SafetensorsDtype::kF32);
  auto f = ReadSafetensors(e.path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  size_t count = 0;
  for (size_t u = 0; u < e.layout.units.size(); ++u) {
    for (const TensorSlot& t : e.layout.units[u].tensors) {
      const std::string name = *SafetensorsTensorName(t.name);
      ASSERT_TRUE(f->tensors.count(name)) << name;
      const SafetensorsTensor& x = f->tensors.at(name);
      EXPECT_EQ(x.dtype, "F32");
      EXPECT_EQ(x.shape, t.shape) << name;
      ASSERT_EQ(x.bytes.size(), 4 * static_cast<size_t>(t.numel));
      EXPECT_EQ(std::memcmp(x.bytes.data(), e.full.master[u].data() + t.offset, x.bytes.size()), 0)
          << name;
      ++count;
    }
  }
  EXPECT_EQ(f->tensors.size(), count);
  EXPECT_EQ(f->tensors.at("transformer.h.1.attn.c_attn.weight").shape,
            (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(f->tensors.at("transformer.h.0.mlp.c_fc.weight").shape,
            (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(f->tensors.at("transformer.wte.weight").shape, (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(f->metadata.at("format"), "pt");
  EXPECT_EQ(f->metadata.at("vocab"), "100");
  EXPECT_EQ(f->metadata.at("padded_vocab"), "128");
  EXPECT_EQ(f->metadata.at("qk_norm"), "true");
  auto cfg = ParseRunConfig(f->metadata.at("forge_config"), "metadata");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->model.ffn, 32);

  // The header length is a multiple of 8 (data 8-byte aligned).
  std::ifstream in(e.path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(CheckpointSafetensorsTest, Bf16ReadsBackRounded) {
  const Exported e = Export("st_bf16", SafetensorsDtype::kBF16);
  auto f = ReadSafetensors(e.path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const TensorSlot& t = e.layout.units[1].tensors[3];  // blocks.0.attn.wqkv (qk_norm on)
  const SafetensorsTensor& x = f->tensors.at(*SafetensorsTensorName(t.name));
  EXPECT_EQ(x.dtype, "BF16");
  ASSERT_EQ(x.bytes.size(), 2 * static_cast<size_t>(t.numel));
  for (int64_t i = 0; i < t.numel; ++i) {
    uint16_t h;
    std::memcpy(&h, x.bytes.data() + 2 * i, 2);
    ASSERT_EQ(h, FloatToBf16(e.full.master[1][t.offset + i])) << i;
  }
}

TEST(CheckpointSafetensorsTest, ExportFromCheckpoint) {
  const std::string root = FreshDir("st_ckpt");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 45);
  const std::string dir = SaveAll(root, cfg, layout, full, 3, 70, 0);
  const std::string path = root + "/export.safetensors";
  ASSERT_TRUE(ExportCheckpointSafetensors(dir, path, SafetensorsDtype::kF32).ok());
  auto f = ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata.at("forge_checkpoint_step"), "70");
  const SafetensorsTensor& x = f->tensors.at("transformer.ln_f.weight");
  EXPECT_EQ(std::memcmp(x.bytes.data(), full.master.back().data(), x.bytes.size()), 0);
  // A damaged checkpoint is not exported.
  FlipByte(ShardPath(dir, 2, 3), 200);
  const Status bad = ExportCheckpointSafetensors(dir, root + "/bad.safetensors",
                                                 SafetensorsDtype::kF32);
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(fs::exists(root + "/bad.safetensors"));
}

// An independent reader: python3's struct + json, per the safetensors spec. Prints, per
// tensor, dtype, shape and the zlib CRC-32 of its bytes; we compare with our own buffers.
TEST(CheckpointSafetensorsTest, IndependentPythonParse) {
  if (std::system("python3 -c 'import json, struct, zlib' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 not available";
  }
  const Exported e = Export("st_python", SafetensorsDtype::kF32);
  const std::string script = fs::path(e.path).parent_path().string() + "/check.py";
  {
    std::ofstream py(script);
    py << "import json, struct, sys, zlib\n"
          "b = open(sys.argv[1], 'rb').read()\n"
          "(n,) = struct.unpack('<Q', b[:8])\n"
          "h = json.loads(b[8:8 + n].decode('utf-8'))\n"
          "data = b[8 + n:]\n"
          "meta = h.pop('__metadata__', {})\n"
          "spans = sorted(tuple(v['data_offsets']) for v in h.values())\n"
          "pos = 0\n"
          "for s, t in spans:\n"
          "    assert s == pos, 'gap'\n"
          "    pos = t\n"
          "assert pos == len(data), 'trailing'\n"
          "out = {k: [v['dtype'], v['shape'],\n"
          "           zlib.crc32(data[v['data_offsets'][0]:v['data_offsets'][1]])]\n"
          "       for k, v in h.items()}\n"
          "out['__metadata__'] = meta\n"
          "print(json.dumps(out))\n";
  }
  const std::string cmd = "python3 " + script + " " + e.path;
  const test::CommandResult r = test::RunCommand(cmd, "", test::Stderr::kInherited);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string& text = r.out;
  const auto j = nlohmann::json::parse(text);
  size_t count = 0;
  for (size_t u = 0; u < e.layout.units.size(); ++u) {
    for (const TensorSlot& t : e.layout.units[u].tensors) {
      const std::string name = *SafetensorsTensorName(t.name);
      ASSERT_TRUE(j.contains(name)) << name;
      EXPECT_EQ(j[name][0], "F32");
      EXPECT_EQ(j[name][1].get<std::vector<int64_t>>(), t.shape);
      const auto* bytes = reinterpret_cast<const Bytef*>(e.full.master[u].data() + t.offset);
      EXPECT_EQ(j[name][2].get<uint32_t>(),
                static_cast<uint32_t>(::crc32(0, bytes, static_cast<uInt>(4 * t.numel))))
          << name;
      ++count;
    }
  }
  EXPECT_EQ(j.size(), count + 1);
  EXPECT_EQ(j["__metadata__"]["n_layer"], "2");
}

}  // namespace
}  // namespace forge
