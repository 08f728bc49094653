// The C API: saving and restoring one sequence of a context (its tokens, KV bytes and logits).
//
// Format (little-endian, as the machine writes it; a state is for the same build family):
//   "KITESEQ1"  u32 version (1)  u32 kv dtype  u32 n_layer  u32 n_head_kv  u32 head_dim
//   u32 n_vocab  u64 row_bytes  u64 n_tokens  u32 has_logits  u32 tp_ranks (0: one; else the
//   tensor-parallel ranks, whose KV heads follow one another: KvCache::read_seq)
//   i32 tokens[n_tokens]  KV bytes (KvCache::read_seq order)  f32 logits[n_vocab] if has_logits
//   u64 FNV-1a of everything before it
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "src/api/internal.h"

using namespace kite;
using kite::capi::fail;
using kite::capi::guard;
using kite::capi::null_arg;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'T', 'E', 'S', 'E', 'Q', '1'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version, kv_type, n_layer, n_head_kv, head_dim, n_vocab;
  uint64_t row_bytes, n_tokens;
  uint32_t has_logits, tp_ranks;
};
static_assert(sizeof(Header) == 56);

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

Header header_for(const kite_context& c) {
  const HParams& hp = c.ctx->model().hparams();
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.kv_type = static_cast<uint32_t>(c.ctx->kv().type());
  h.n_layer = static_cast<uint32_t>(hp.n_layer);
  h.n_head_kv = static_cast<uint32_t>(hp.n_head_kv);
  h.head_dim = static_cast<uint32_t>(hp.head_dim);
  h.n_vocab = static_cast<uint32_t>(hp.n_vocab);
  h.row_bytes = c.ctx->kv().row_bytes();
  h.tp_ranks = c.ctx->kv().n_ranks() > 1 ? static_cast<uint32_t>(c.ctx->kv().n_ranks()) : 0;
  return h;
}

// The logits of `seq`'s last token, when the context holds them.
const float* seq_logits(kite_context& c, int32_t seq) {
  if (c.outputs == kite_context::Outputs::kRestored && c.restored_seq == seq) return c.restored_logits.data();
  if (c.outputs == kite_context::Outputs::kDecode && static_cast<size_t>(seq) < c.seq_last_output.size() &&
      c.seq_last_output[static_cast<size_t>(seq)] >= 0)
    return c.ctx->logits(static_cast<size_t>(c.seq_last_output[static_cast<size_t>(seq)])).data();
  return nullptr;
}

Result<std::vector<uint8_t>> serialize(kite_context& c, int32_t seq) {
  KvCache& kv = c.ctx->kv();
  Header h = header_for(c);
  const size_t n_tokens = static_cast<size_t>(kv.seq_len(seq));
  const float* logits = seq_logits(c, seq);
  h.n_tokens = n_tokens;
  h.has_logits = logits != nullptr ? 1 : 0;
  const size_t kv_bytes = kv.seq_state_bytes(seq);
  const size_t logit_bytes = logits != nullptr ? h.n_vocab * sizeof(float) : 0;
  std::vector<uint8_t> out(sizeof(Header) + n_tokens * sizeof(int32_t) + kv_bytes + logit_bytes + sizeof(uint64_t));
  uint8_t* p = out.data();
  std::memcpy(p, &h, sizeof h);
  p += sizeof h;
  // The tokens the sequence holds: the KV cache's record of them.
  const std::span<const int32_t> tokens = kv.seq_tokens(seq);
  std::memcpy(p, tokens.data(), n_tokens * sizeof(int32_t));
  p += n_tokens * sizeof(int32_t);
  KITE_TRY(kv.read_seq(seq, std::span<uint8_t>(p, kv_bytes)));
  p += kv_bytes;
  if (logits != nullptr) std::memcpy(p, logits, logit_bytes);
  p += logit_bytes;
  const uint64_t sum = fnv1a(out.data(), static_cast<size_t>(p - out.data()));
  std::memcpy(p, &sum, sizeof sum);
  return out;
}

// Checks `buf` against this context and restores it; messages name the field that differs.
kite_status restore(const char* fn, kite_context& c, int32_t seq, const uint8_t* buf, size_t size) {
  auto bad = [&](const std::string& what) { return fail(KITE_ERROR_INVALID_STATE, std::string(fn) + ": " + what); };
  if (size < sizeof(Header) + sizeof(uint64_t))
    return bad("the state has " + std::to_string(size) + " bytes, less than a header");
  Header h;
  std::memcpy(&h, buf, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return bad("not a kite sequence state (bad magic)");
  if (h.version != kVersion)
    return bad("state version " + std::to_string(h.version) + ", this kite reads " + std::to_string(kVersion));
  const Header want = header_for(c);
  auto field = [&](const char* name, uint64_t got, uint64_t expected) {
    if (got == expected) return true;
    bad(std::string("the state's ") + name + " is " + std::to_string(got) + ", this context's is " +
        std::to_string(expected) + " (a state of another model or KV type)");
    return false;
  };
  if (!field("KV type", h.kv_type, want.kv_type) || !field("n_layer", h.n_layer, want.n_layer) ||
      !field("n_head_kv", h.n_head_kv, want.n_head_kv) || !field("head_dim", h.head_dim, want.head_dim) ||
      !field("n_vocab", h.n_vocab, want.n_vocab) || !field("KV row size", h.row_bytes, want.row_bytes) ||
      !field("tensor-parallel ranks", std::max(h.tp_ranks, 1u), std::max(want.tp_ranks, 1u)))
    return KITE_ERROR_INVALID_STATE;
  const uint64_t n_ctx = static_cast<uint64_t>(c.ctx->kv().n_ctx());
  if (h.n_tokens > n_ctx)
    return fail(KITE_ERROR_CONTEXT_FULL, std::string(fn) + ": the state holds " + std::to_string(h.n_tokens) +
                                             " tokens, the context " + std::to_string(n_ctx));
  if (h.has_logits > 1) return bad("has_logits is " + std::to_string(h.has_logits));
  const size_t kv_bytes = static_cast<size_t>(h.n_tokens) * 2 * h.n_layer * std::max(h.tp_ranks, 1u) * h.row_bytes;
  const size_t logit_bytes = h.has_logits ? h.n_vocab * sizeof(float) : 0;
  const size_t expected = sizeof(Header) + h.n_tokens * sizeof(int32_t) + kv_bytes + logit_bytes + sizeof(uint64_t);
  if (size != expected)
    return bad("the state has " + std::to_string(size) + " bytes, its header says " + std::to_string(expected));
  uint64_t sum;
  std::memcpy(&sum, buf + size - sizeof sum, sizeof sum);
  if (sum != fnv1a(buf, size - sizeof sum)) return bad("checksum mismatch (the state is damaged)");

  const uint8_t* p = buf + sizeof h;
  std::vector<int32_t> tokens(h.n_tokens);
  std::memcpy(tokens.data(), p, tokens.size() * sizeof(int32_t));
  p += tokens.size() * sizeof(int32_t);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= h.n_vocab)
      return bad("token " + std::to_string(i) + " (" + std::to_string(tokens[i]) + ") is outside the vocabulary");

  KvCache& kv = c.ctx->kv();
  kv.clear(seq);
  if (c.outputs == kite_context::Outputs::kRestored && c.restored_seq == seq) c.outputs = kite_context::Outputs::kNone;
  if (c.outputs == kite_context::Outputs::kDecode && static_cast<size_t>(seq) < c.seq_last_output.size())
    c.seq_last_output[static_cast<size_t>(seq)] = -1;
  if (auto st = kv.write_seq(seq, tokens, std::span<const uint8_t>(p, kv_bytes)); !st)
    return fail(capi::status_of(st.error()), std::string(fn) + ": " + st.error().message);
  p += kv_bytes;
  if (h.has_logits) {
    c.restored_logits.resize(h.n_vocab);
    std::memcpy(c.restored_logits.data(), p, logit_bytes);
    c.restored_seq = seq;
    c.outputs = kite_context::Outputs::kRestored;
  }
  return KITE_OK;
}

kite_status check_seq(const char* fn, const kite_context* ctx, int32_t seq) {
  if (seq < 0 || seq >= ctx->ctx->kv().n_seqs())
    return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(fn) + ": sequence " + std::to_string(seq) +
                                                 " is out of range [0, " + std::to_string(ctx->ctx->kv().n_seqs()) +
                                                 ")");
  return KITE_OK;
}

}  // namespace

extern "C" {

kite_status kite_state_save(kite_context* ctx, int32_t seq, void* buf, size_t capacity, size_t* size) {
  static const char* const kFn = "kite_state_save";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (size == nullptr) return null_arg(kFn, "size");
    if (buf == nullptr && capacity > 0) return null_arg(kFn, "buf (with capacity > 0)");
    if (kite_status s = check_seq(kFn, ctx, seq); s != KITE_OK) return s;
    auto bytes = serialize(*ctx, seq);
    if (!bytes) return fail(capi::status_of(bytes.error()), std::string(kFn) + ": " + bytes.error().message);
    *size = bytes->size();
    if (capacity < bytes->size()) return capi::too_small(kFn, bytes->size(), capacity);
    std::memcpy(buf, bytes->data(), bytes->size());
    return KITE_OK;
  });
}

kite_status kite_state_load(kite_context* ctx, int32_t seq, const void* buf, size_t size) {
  static const char* const kFn = "kite_state_load";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (buf == nullptr) return null_arg(kFn, "buf");
    if (kite_status s = check_seq(kFn, ctx, seq); s != KITE_OK) return s;
    return restore(kFn, *ctx, seq, static_cast<const uint8_t*>(buf), size);
  });
}

kite_status kite_state_save_file(kite_context* ctx, int32_t seq, const char* path) {
  static const char* const kFn = "kite_state_save_file";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (path == nullptr) return null_arg(kFn, "path");
    if (kite_status s = check_seq(kFn, ctx, seq); s != KITE_OK) return s;
    auto bytes = serialize(*ctx, seq);
    if (!bytes) return fail(capi::status_of(bytes.error()), std::string(kFn) + ": " + bytes.error().message);
    const std::string tmp = std::string(path) + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) return fail(KITE_ERROR_FILE_NOT_FOUND, std::string(kFn) + ": cannot write " + tmp);
      f.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
      f.close();
      if (!f) {
        std::remove(tmp.c_str());
        return fail(KITE_ERROR_FAILED, std::string(kFn) + ": writing " + tmp + " failed");
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      std::remove(tmp.c_str());
      return fail(KITE_ERROR_FAILED, std::string(kFn) + ": renaming " + tmp + " to " + path + ": " + ec.message());
    }
    return KITE_OK;
  });
}

kite_status kite_state_load_file(kite_context* ctx, int32_t seq, const char* path) {
  static const char* const kFn = "kite_state_load_file";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (path == nullptr) return null_arg(kFn, "path");
    if (kite_status s = check_seq(kFn, ctx, seq); s != KITE_OK) return s;
    std::ifstream f(path, std::ios::binary);
    if (!f) return fail(KITE_ERROR_FILE_NOT_FOUND, std::string(kFn) + ": cannot open " + path);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return restore(kFn, *ctx, seq, bytes.data(), bytes.size());
  });
}

}  // extern "C"
