// Attention over the paged KV cache on the Vulkan device (semantics: backends/cpu/
// ops_attention.cpp; the design of backends/cuda/k_attention.cu).
//
// shaders/attention_g<N>.comp (attention_main.glsl; N = 1, 2, 4, 8, 16, the smallest that holds
// the GQA group) runs one workgroup per (token, KV head, chunk of keys): the GQA group's
// query heads against the chunk's keys, read through the sequence's block table (never a
// contiguous copy), with an online softmax. A token's chunks depend only on its own length
// (kChunk keys each, longer contexts use multiples so there are at most kMaxChunks), so its
// result never depends on what shares its batch. Tokens with several chunks write partials that
// shaders/attention_merge.comp combines in chunk order (flash-decoding). The batch is cut into
// passes of tokens so the partials' scratch stays under kMaxPartialBytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/vulkan/stream.h"

namespace kite::vk {
namespace {

constexpr int64_t kChunk = 512;     // shaders/attention.glsl
constexpr int64_t kMaxChunks = 32;  // shaders/attention.glsl
constexpr int64_t kMaxGroup = 16;   // the largest shader variant: query heads per KV head
constexpr int64_t kMaxQ = 2048;     // shaders/attention_main.glsl: group * head_dim
constexpr int64_t kMaxHd = 256;     // two output dimensions per invocation of 128
constexpr size_t kMaxPartialBytes = size_t{64} << 20;

// The layouts of P in shaders/attention_main.glsl and attention_merge.comp (scalar block layout).
struct AttentionPush {
  uint64_t q = 0, k = 0, v = 0, pos = 0, seq = 0, table = 0, out = 0, part = 0;
  uint32_t q_nb1 = 0, q_nb2 = 0, k_nb1 = 0, v_nb1 = 0;
  uint32_t types = 0;  // the K cache's type | the V cache's << 8 | k_pairs << 16 (K head slices
                       // 4-byte aligned: their 16-bit pairs are read as one word)
  int32_t window = 0;  // sliding window (Graph::attention); 0: none
  int32_t max_blocks = 0, block_size = 0;
  int32_t n_kv = 0, group = 0, hd = 0, n_tok = 0;
  float scale = 1.f;
  int32_t max_chunks = 1;
  float softcap = 0.f;  // Graph::attention's soft-capping; 0: none
  int32_t t0 = 0;
};
static_assert(offsetof(AttentionPush, q_nb1) == 64 && offsetof(AttentionPush, scale) == 112 &&
              sizeof(AttentionPush) == 128);

struct MergePush {
  uint64_t part = 0, out = 0, pos = 0;
  int32_t max_blocks = 0, block_size = 0;
  int32_t n_head = 0, hd = 0, n_tok = 0, t0 = 0;
  int32_t max_chunks = 1;
  uint32_t out_nb1 = 0;
  int32_t window = 0;
};
static_assert(offsetof(MergePush, max_blocks) == 24 && offsetof(MergePush, window) == 56);

bool kv_type_ok(const Tensor* c, int64_t hd) {
  if (c == nullptr || c->ne[1] < 1 || c->nb[1] > UINT32_MAX) return false;
  switch (c->type) {
    case DType::F32:
      return c->nb[0] == 4;
    case DType::F16:
    case DType::BF16:
      return c->nb[0] == 2;
    case DType::Q8_0:
      return hd % 32 == 0;
    default:
      return false;
  }
}

bool i32_vector(const Tensor* t, int64_t n) {
  return t != nullptr && t->type == DType::I32 && t->nb[0] == 4 && t->ne[0] >= n;
}

// The shader variant for GQA groups of `group` query heads.
const char* attention_shader(int64_t group) {
  if (group <= 1) return "attention_g1";
  if (group <= 2) return "attention_g2";
  if (group <= 4) return "attention_g4";
  if (group <= 8) return "attention_g8";
  return "attention_g16";
}

// Chunks a token's keys may be split into, for a context of at most `max_ctx` positions.
int64_t max_chunks_for(int64_t max_ctx) {
  return std::clamp<int64_t>((max_ctx + kChunk - 1) / kChunk, 1, kMaxChunks);
}

}  // namespace

bool attention_supported(const Tensor& n) {
  const Tensor* q = n.src[0];
  const Tensor* table = n.src[5];
  if (q == nullptr || q->type != DType::F32 || q->nb[0] != 4 || q->ne[3] != 1) return false;
  const int64_t hd = q->ne[0], nh = q->ne[1], nt = q->ne[2];
  const int64_t n_kv = n.params.i[0], bs = n.params.i[1];
  if (n_kv <= 0 || nh % n_kv != 0 || bs <= 0) return false;
  const int64_t group = nh / n_kv;
  if (hd <= 0 || hd % 2 != 0 || hd > kMaxHd || group > kMaxGroup || group * hd > kMaxQ) return false;
  if (q->nb[1] > UINT32_MAX || q->nb[2] > UINT32_MAX) return false;
  // The output is written contiguously ([hd * n_head, n_tok]).
  if (n.type != DType::F32 || n.nb[1] != static_cast<size_t>(hd * nh) * 4 || n.nb[1] > UINT32_MAX) return false;
  if (!kv_type_ok(n.src[1], hd) || !kv_type_ok(n.src[2], hd)) return false;
  if (n.src[1]->ne[0] < hd * n_kv || n.src[2]->ne[0] < hd * n_kv) return false;
  if (!i32_vector(n.src[3], nt) || !i32_vector(n.src[4], nt)) return false;
  if (table == nullptr || table->type != DType::I32 || table->nb[0] != 4 ||
      table->nb[1] != static_cast<size_t>(table->ne[0]) * 4)
    return false;
  const int64_t cap = table->ne[0] * bs;
  return cap < (int64_t{1} << 31) && nt * nh < (int64_t{1} << 31);
}

Status run_attention(Stream& s, Tensor* n) {
  const Tensor* q = n->src[0];
  const Tensor* kc = n->src[1];
  const Tensor* vc = n->src[2];
  const Tensor* table = n->src[5];
  AttentionPush a;
  KITE_ASSIGN_OR_RETURN(a.q, s.address(q));
  KITE_ASSIGN_OR_RETURN(a.k, s.address(kc));
  KITE_ASSIGN_OR_RETURN(a.v, s.address(vc));
  KITE_ASSIGN_OR_RETURN(a.pos, s.address(n->src[3]));
  KITE_ASSIGN_OR_RETURN(a.seq, s.address(n->src[4]));
  KITE_ASSIGN_OR_RETURN(a.table, s.address(table));
  KITE_ASSIGN_OR_RETURN(a.out, s.address(n));
  const int64_t hd = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2];
  if (n_tok == 0) return ok_status();
  a.q_nb1 = static_cast<uint32_t>(q->nb[1]), a.q_nb2 = static_cast<uint32_t>(q->nb[2]);
  a.k_nb1 = static_cast<uint32_t>(kc->nb[1]), a.v_nb1 = static_cast<uint32_t>(vc->nb[1]);
  a.window = n->params.i[2];
  a.softcap = n->params.f[1];
  a.max_blocks = static_cast<int32_t>(table->ne[0]);
  a.block_size = n->params.i[1];
  a.n_kv = n->params.i[0];
  a.group = static_cast<int32_t>(n_head / a.n_kv);
  a.hd = static_cast<int32_t>(hd);
  a.scale = n->params.f[0];
  const uint32_t k_pairs = a.k % 4 == 0 && kc->nb[1] % 4 == 0 ? 1 : 0;
  a.types = static_cast<uint32_t>(kc->type) | static_cast<uint32_t>(vc->type) << 8 | k_pairs << 16;
  const int64_t max_chunks = max_chunks_for(table->ne[0] * a.block_size);
  a.max_chunks = static_cast<int32_t>(max_chunks);

  // Tokens per pass: all of them unless the partials would pass kMaxPartialBytes.
  const size_t per_token = static_cast<size_t>(n_head * max_chunks * (hd + 2)) * sizeof(float);
  const int64_t pass =
      max_chunks == 1 ? n_tok : std::clamp<int64_t>(static_cast<int64_t>(kMaxPartialBytes / per_token), 1, n_tok);
  if (max_chunks > 1) {
    KITE_ASSIGN_OR_RETURN(a.part, s.scratch("attention.partials", per_token * static_cast<size_t>(pass)));
  }
  MergePush m;
  m.part = a.part, m.out = a.out, m.pos = a.pos;
  m.max_blocks = a.max_blocks, m.block_size = a.block_size;
  m.n_head = static_cast<int32_t>(n_head), m.hd = a.hd, m.max_chunks = a.max_chunks;
  m.out_nb1 = static_cast<uint32_t>(n->nb[1]);
  m.window = a.window;
  const char* shader = attention_shader(a.group);
  for (int64_t t0 = 0; t0 < n_tok; t0 += pass) {
    const int64_t nt = std::min(pass, n_tok - t0);
    a.t0 = m.t0 = static_cast<int32_t>(t0);
    a.n_tok = m.n_tok = static_cast<int32_t>(nt);
    KITE_TRY(s.dispatch(shader, a, static_cast<uint64_t>(nt * a.n_kv * max_chunks)));
    if (max_chunks > 1) KITE_TRY(s.dispatch("attention_merge", m, static_cast<uint64_t>(nt * n_head)));
  }
  return ok_status();
}

}  // namespace kite::vk
