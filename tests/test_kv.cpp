// The paged KV cache: the block pool's refcounts, free list and LRU prefix cache; sharing by
// fork and prefix match; copy-on-write; errors that leave the cache unchanged.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

#include "src/core/backend.h"
#include "src/kv/kv_cache.h"

using namespace kite;

namespace {

std::vector<int32_t> iota_tokens(size_t n, int32_t first = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

HParams tiny_hparams() {
  HParams hp;
  hp.n_layer = 2;
  hp.n_head_kv = 2;
  hp.head_dim = 32;
  hp.n_vocab = 1000;
  return hp;
}

struct Fixture {
  explicit Fixture(int64_t n_blocks, DType type = DType::F32) {
    auto b = create_backend("cpu", {.n_threads = 1});
    REQUIRE(b.ok());
    backend = std::move(*b);
    KvCacheOptions o;
    o.n_ctx = 256;
    o.n_seqs = 4;
    o.block_size = 16;
    o.n_blocks = n_blocks;
    o.type = type;
    auto c = KvCache::create(tiny_hparams(), o, *backend);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
    kv = std::move(*c);
  }
  // Writes a marker value into every layer's K and V row at the slot of (seq, pos).
  void write(int32_t seq, int64_t pos, float value) {
    const int32_t slot = kv->slot(seq, pos);
    for (const auto* list : {&kv->tensors().k, &kv->tensors().v})
      for (Tensor* t : *list) {
        auto* row = reinterpret_cast<float*>(t->row_ptr(slot));
        for (int64_t i = 0; i < t->ne[0]; ++i) row[i] = value;
      }
  }
  float read(int32_t seq, int64_t pos, size_t layer = 1) {
    return *reinterpret_cast<const float*>(kv->tensors().v[layer]->row_ptr(kv->slot(seq, pos)));
  }
  // Appends `tokens` to `seq` as a model step would: reserve, write, advance.
  void append(int32_t seq, const std::vector<int32_t>& tokens) {
    REQUIRE(kv->reserve(seq, static_cast<int64_t>(tokens.size())).ok());
    const int64_t start = kv->seq_len(seq);
    for (size_t i = 0; i < tokens.size(); ++i) write(seq, start + static_cast<int64_t>(i), static_cast<float>(tokens[i]));
    kv->advance(seq, tokens);
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCache> kv;
};

}  // namespace

TEST_CASE("kv: block pool refcounts, free list and least-recently-used eviction") {
  BlockPool pool(3, 4);
  const auto t1 = iota_tokens(4, 1), t2 = iota_tokens(4, 10);
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  CHECK(a >= 0);
  CHECK(pool.allocate() == -1);
  CHECK(pool.available() == 0);
  const uint64_t ka = BlockPool::key_of(0, t1, 7), kb = BlockPool::key_of(ka, t2, 7);
  CHECK(ka != BlockPool::key_of(0, t1, 8));  // the identity is part of the key
  pool.publish(a, ka, 0, t1);
  pool.publish(b, kb, ka, t2);
  pool.release(a);  // cached, not free
  pool.release(b);
  pool.release(c);  // free
  CHECK(pool.available() == 3);
  CHECK(pool.n_cached() == 2);
  CHECK(pool.lookup(ka, 0, t1) == a);
  CHECK(pool.lookup(ka, 0, t2) == -1);  // same key, other tokens: never the wrong block
  CHECK(pool.lookup(kb, 0, t2) == -1);  // wrong parent
  pool.retain(b);  // a prefix match takes b back out of the LRU list
  CHECK(pool.n_cached() == 1);
  CHECK(pool.allocate() == c);  // free blocks go first
  CHECK(pool.allocate() == a);  // then the least recently used cached one
  CHECK(pool.lookup(ka, 0, t1) == -1);  // evicted
  CHECK(pool.lookup(kb, ka, t2) == b);
  CHECK(pool.allocate() == -1);
}

TEST_CASE("kv: bytes per block are 2 x layers x kv heads x head dim x element size") {
  const HParams hp = tiny_hparams();
  CHECK(KvCache::block_bytes(hp, DType::F16, 16) == 2u * 2 * 2 * 32 * 2 * 16);
  CHECK(KvCache::block_bytes(hp, DType::F32, 16) == 2u * 2 * 2 * 32 * 4 * 16);
  CHECK(KvCache::block_bytes(hp, DType::Q8_0, 16) == 2u * 2 * 2 * 34 * 16);  // 34 bytes per 32
}

TEST_CASE("kv: fork shares blocks and the first write copies the shared block") {
  Fixture f(16);
  f.append(0, iota_tokens(20));  // one full block and 4 positions of the second
  REQUIRE(f.kv->fork(0, 1).ok());
  CHECK(f.kv->slot(1, 19) == f.kv->slot(0, 19));
  CHECK(f.kv->pool().n_referenced() == 2);
  CHECK(f.kv->blocks_needed(1, 1) == 1);  // the copy
  f.append(1, {7});
  CHECK(f.kv->stats().cow_copies == 1);
  CHECK(f.kv->slot(1, 19) != f.kv->slot(0, 19));  // seq 1 now has its own second block
  CHECK(f.kv->slot(1, 3) == f.kv->slot(0, 3));    // the full first block stays shared
  CHECK(f.read(1, 19) == 119.f);                  // copied contents
  CHECK(f.read(1, 20) == 7.f);
  f.append(0, {9});  // seq 0's block is its own again: no copy
  CHECK(f.kv->stats().cow_copies == 1);
  CHECK(f.read(0, 20) == 9.f);
  CHECK(f.read(1, 20) == 7.f);
  CHECK(f.kv->fork(0, 1).ok() == false);  // destination not empty
  f.kv->clear(0);
  f.kv->clear(1);
  CHECK(f.kv->pool().n_referenced() == 0);
}

TEST_CASE("kv: a prefix match reuses full cached blocks and leaves one token to compute") {
  Fixture f(16);
  const auto prompt = iota_tokens(40);
  f.append(0, prompt);
  f.kv->clear(0);
  CHECK(f.kv->pool().n_cached() == 2);  // the two full blocks stay cached
  auto longer = prompt;
  longer.push_back(5);
  CHECK(f.kv->match_prefix(1, longer) == 32);
  CHECK(f.read(1, 31) == 131.f);
  f.kv->clear(1);
  CHECK(f.kv->match_prefix(2, std::vector<int32_t>(prompt.begin(), prompt.begin() + 32)) == 16);  // keeps one
  f.kv->clear(2);
  auto other = prompt;
  other[20] = 1;  // differs in the second block
  CHECK(f.kv->match_prefix(3, other) == 16);
  CHECK(f.kv->stats().prefix_hit_tokens == 64);
}

TEST_CASE("kv: a truncated, once-full block leaves the prefix cache before it is written again") {
  Fixture f(16);
  const auto prompt = iota_tokens(40);
  f.append(0, prompt);
  f.kv->truncate(0, 24);
  f.append(0, {1, 2});
  f.kv->clear(0);
  CHECK(f.kv->match_prefix(1, prompt) == 16);
}

TEST_CASE("kv: running out of blocks is an error that changes nothing") {
  Fixture f(4);
  f.append(0, iota_tokens(40));
  const int64_t before = f.kv->seq_len(0);
  auto st = f.kv->reserve(1, 20);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("KV cache full") != std::string::npos);
  CHECK(f.kv->seq_len(0) == before);
  CHECK(f.kv->reserve(1, 8).ok());
  CHECK_FALSE(f.kv->reserve(0, 300).ok());  // beyond the context
  f.kv->clear(1);
  // Cached blocks are reused when the free list is empty.
  f.kv->clear(0);
  CHECK(f.kv->pool().available() == 4);
  f.append(2, iota_tokens(64, 5000));
  CHECK(f.kv->pool().available() == 0);
}

TEST_CASE("kv: a q8_0 cache is sized by its blocks") {
  Fixture f(4, DType::Q8_0);
  CHECK(f.kv->type() == DType::Q8_0);
  CHECK(f.kv->tensors().k[0]->nb[1] == 2u * 34);  // 64 elements per slot: two Q8_0 blocks
}
