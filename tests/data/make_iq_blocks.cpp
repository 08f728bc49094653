// Writes iq-blocks.gguf: blocks of the codebook types (IQ1_S..IQ3_S) and llama.cpp's own decoding
// of them, for tests/test_quant.cpp. Not built by CMake: it links llama.cpp's ggml (the peer
// kite is checked against). Build and run, with llama.cpp built by bench/build-llama-cpp.sh:
//   L=/tmp/llama.cpp; g++ -std=c++17 -O1 tests/data/make_iq_blocks.cpp -I$L/ggml/include \
//     -L$L/build/bin -lggml-base -lggml -Wl,-rpath,$L/build/bin -o /tmp/make_iq_blocks
//   /tmp/make_iq_blocks tests/data/iq-blocks.gguf
// For each type T the file holds
//   T.data / T.data.f32: 4 rows of 512 smooth-ish random values quantized by ggml (with an
//     importance matrix: IQ2_XXS, IQ2_XS and IQ1_S require one) and ggml's to_float of them;
//   T.all / T.all.f16: blocks whose grid indices run through every codebook entry (random signs
//     and scales, d = 1 so every value is exact in F16) and ggml's to_float of them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ggml.h"
#include "gguf.h"

namespace {

uint64_t g_state = 0x9e3779b97f4a7c15ull;
uint32_t next() {
  g_state ^= g_state << 13, g_state ^= g_state >> 7, g_state ^= g_state << 17;
  return static_cast<uint32_t>(g_state >> 11);
}
float uniform() { return static_cast<float>(next() & 0xffffff) / 16777216.0f; }

struct Spec {
  ggml_type type;
  int entries;      // codebook entries
  int per_block;    // codebook indices a block
};

// Sets index `i` (0..per_block-1) of block `b` to `v`, leaving the other bits random.
void set_index(ggml_type t, uint8_t* b, int i, int v) {
  switch (t) {
    case GGML_TYPE_IQ2_XXS: b[2 + 8 * (i / 4) + i % 4] = static_cast<uint8_t>(v); break;
    case GGML_TYPE_IQ2_XS: {
      uint16_t w;
      std::memcpy(&w, b + 2 + 2 * i, 2);
      w = static_cast<uint16_t>((w & ~511) | v);
      std::memcpy(b + 2 + 2 * i, &w, 2);
      break;
    }
    case GGML_TYPE_IQ2_S:  // qs[i], qh[i / 4] bits 2(i % 4)..+1
      b[2 + i] = static_cast<uint8_t>(v);
      b[2 + 64 + i / 4] = static_cast<uint8_t>((b[2 + 64 + i / 4] & ~(3 << (2 * (i % 4)))) | (v >> 8) << (2 * (i % 4)));
      break;
    case GGML_TYPE_IQ3_XXS: b[2 + i] = static_cast<uint8_t>(v); break;
    case GGML_TYPE_IQ3_S:  // qs[i], qh[i / 8] bit i % 8
      b[2 + i] = static_cast<uint8_t>(v);
      b[2 + 64 + i / 8] = static_cast<uint8_t>((b[2 + 64 + i / 8] & ~(1 << (i % 8))) | (v >> 8) << (i % 8));
      break;
    case GGML_TYPE_IQ1_S: {  // qs[i], qh[i / 4] bits 3(i % 4)..+2
      b[2 + i] = static_cast<uint8_t>(v);
      uint16_t w;
      std::memcpy(&w, b + 2 + 32 + 2 * (i / 4), 2);
      w = static_cast<uint16_t>((w & ~(7 << (3 * (i % 4)))) | (v >> 8) << (3 * (i % 4)));
      std::memcpy(b + 2 + 32 + 2 * (i / 4), &w, 2);
      break;
    }
    case GGML_TYPE_IQ1_M: {  // qs[i], qh[i / 2] nibble i % 2, low 3 bits
      b[i] = static_cast<uint8_t>(v);
      const int sh = 4 * (i % 2);
      b[32 + i / 2] = static_cast<uint8_t>((b[32 + i / 2] & ~(7 << sh)) | (v >> 8) << sh);
      break;
    }
    default: break;
  }
}

// d = 1.0 (F16 0x3c00).
void set_unit_d(ggml_type t, uint8_t* b) {
  if (t == GGML_TYPE_IQ1_M) {  // d's nibbles on top of the 4 scale words
    for (int w = 0; w < 4; ++w) {
      uint16_t s;
      std::memcpy(&s, b + 48 + 2 * w, 2);
      s = static_cast<uint16_t>((s & 0x0fff) | ((0x3c00 >> (4 * w)) & 0xf) << 12);
      std::memcpy(b + 48 + 2 * w, &s, 2);
    }
    return;
  }
  b[0] = 0x00, b[1] = 0x3c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.gguf\n", argv[0]);
    return 2;
  }
  const Spec specs[] = {{GGML_TYPE_IQ2_XXS, 256, 32}, {GGML_TYPE_IQ2_XS, 512, 32}, {GGML_TYPE_IQ2_S, 1024, 32},
                        {GGML_TYPE_IQ3_XXS, 256, 64}, {GGML_TYPE_IQ3_S, 512, 64},  {GGML_TYPE_IQ1_S, 2048, 32},
                        {GGML_TYPE_IQ1_M, 2048, 32}};
  const int64_t k = 512, rows = 4;
  ggml_init_params ip = {64 << 20, nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  gguf_context* out = gguf_init_empty();
  gguf_set_val_str(out, "general.description", "IQ blocks and llama.cpp's decoding of them (tests/data/make_iq_blocks.cpp)");
  for (const Spec& s : specs) {
    const char* name = ggml_type_name(s.type);
    const ggml_type_traits* tr = ggml_get_type_traits(s.type);
    // Data quantized by ggml.
    std::vector<float> x(k * rows), imat(k);
    for (int64_t i = 0; i < k * rows; ++i)
      x[i] = std::sin(0.37f * static_cast<float>(i % 97)) * (0.5f + uniform()) + 0.3f * (uniform() - 0.5f);
    for (int64_t i = 0; i < k; ++i) imat[i] = 0.2f + uniform();
    ggml_quantize_init(s.type);
    ggml_tensor* q = ggml_new_tensor_2d(ctx, s.type, k, rows);
    ggml_quantize_chunk(s.type, x.data(), q->data, 0, rows, k, imat.data());
    ggml_tensor* qf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, rows);
    tr->to_float(q->data, static_cast<float*>(qf->data), k * rows);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s.data", name), ggml_set_name(q, buf);
    std::snprintf(buf, sizeof buf, "%s.data.f32", name), ggml_set_name(qf, buf);
    gguf_add_tensor(out, q);
    gguf_add_tensor(out, qf);
    // Every codebook entry.
    const int64_t blocks = s.entries / s.per_block, bytes = static_cast<int64_t>(tr->type_size);
    ggml_tensor* a = ggml_new_tensor_2d(ctx, s.type, 256, blocks);
    auto* p = static_cast<uint8_t*>(a->data);
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = p + b * bytes;
      for (int64_t i = 0; i < bytes; ++i) blk[i] = static_cast<uint8_t>(next());
      for (int i = 0; i < s.per_block; ++i) set_index(s.type, blk, i, static_cast<int>(b * s.per_block + i));
      set_unit_d(s.type, blk);
    }
    std::vector<float> af(256 * blocks);
    tr->to_float(a->data, af.data(), 256 * blocks);
    ggml_tensor* ah = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, blocks);
    for (int64_t i = 0; i < 256 * blocks; ++i) {
      static_cast<ggml_fp16_t*>(ah->data)[i] = ggml_fp32_to_fp16(af[i]);
      if (ggml_fp16_to_fp32(static_cast<ggml_fp16_t*>(ah->data)[i]) != af[i]) {
        std::fprintf(stderr, "%s: value %g is not exact in F16\n", name, af[i]);
        return 1;
      }
    }
    std::snprintf(buf, sizeof buf, "%s.all", name), ggml_set_name(a, buf);
    std::snprintf(buf, sizeof buf, "%s.all.f16", name), ggml_set_name(ah, buf);
    gguf_add_tensor(out, a);
    gguf_add_tensor(out, ah);
  }
  if (!gguf_write_to_file(out, argv[1], false)) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  gguf_free(out);
  ggml_free(ctx);
  return 0;
}
