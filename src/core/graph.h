// kite/src/core/graph.h — a DAG of ops, built once per batch shape.
//
// The Graph owns its tensors (an arena; pointers stay valid for the graph's life). Builder
// methods check shapes with assertions — shapes come from our own model code, not from users —
// and return the new node. `build(out)` orders every node that `out` depends on topologically;
// backends then execute `nodes()` in that order. Leaves (inputs, weights, caches) get their bytes
// from outside: weights point into the file mapping, inputs and activations are placed by the
// memory planner.
#pragma once

#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <unordered_set>
#include <vector>

#include "src/core/tensor.h"

namespace kite {

struct RopeParams {
  RopeMode mode = RopeMode::kNeox;
  int32_t n_rot = 0;         // rotated dimensions (the head dim for the supported models)
  float freq_base = 10000.f;
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.f;        // linear / llama3 / yarn factor
  float low_freq_factor = 1.f, high_freq_factor = 4.f;  // llama3
  int32_t original_ctx = 0;  // llama3 / yarn
  float beta_fast = 32.f, beta_slow = 1.f;              // yarn
  float attn_factor = 1.f;   // yarn magnitude scaling (mscale)
};

struct AttentionParams {
  int32_t n_kv_head = 1;
  int32_t block_size = 16;  // KV positions per block
  float scale = 1.f;        // usually 1/sqrt(head_dim)
  // Scores soft-capped after scaling, softcap * tanh(score / softcap) (gemma2); 0: not.
  float softcap = 0.f;
  // Sliding-window attention: a token at position p sees positions p - window + 1 .. p (as
  // llama.cpp's standard window masks p - p0 >= window); 0: every position 0 .. p.
  int32_t window = 0;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Leaves.
  Tensor* input(DType type, std::initializer_list<int64_t> ne, std::string name);
  // A tensor whose bytes live elsewhere (a weight in the mapping, a KV cache): not owned.
  Tensor* external(DType type, std::initializer_list<int64_t> ne, void* data, std::string name);

  // Views (no copy).
  Tensor* reshape(Tensor* a, std::initializer_list<int64_t> ne);
  // Rows [first, first + count) of a 2-D (or flattened) tensor.
  Tensor* rows(Tensor* a, int64_t first, int64_t count);

  // Ops.
  Tensor* get_rows(Tensor* table, Tensor* ids);
  // w · x, plus `bias` (F32 [m], may be null) broadcast over the columns: a linear layer with
  // a bias (qwen2's q, k, v) is one node, so that a backend can add it as it stores the product.
  Tensor* mul_mat(Tensor* w, Tensor* x, Tensor* bias = nullptr);
  Tensor* add(Tensor* a, Tensor* b);
  Tensor* mul(Tensor* a, Tensor* b);
  Tensor* scale(Tensor* a, float s);
  // cap * tanh(a / cap) (gemma2's logit soft-capping; a kScale node).
  Tensor* softcap(Tensor* a, float cap);
  Tensor* rms_norm(Tensor* a, Tensor* weight, float eps);  // weight may be null
  // freq_factors (optional, F32 [n_rot/2]): per-pair divisors of the frequency (llama3 scaling
  // as llama.cpp stores it, the rope_freqs.weight tensor).
  Tensor* rope(Tensor* a, Tensor* positions, const RopeParams& p, Tensor* freq_factors = nullptr);
  Tensor* swiglu(Tensor* gate, Tensor* up);
  // gelu(gate) * up with gelu's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  Tensor* geglu(Tensor* gate, Tensor* up);
  Tensor* kv_write(Tensor* cache, Tensor* rows, Tensor* slots);
  // q [head_dim, n_head, n_tokens]; k_cache/v_cache [head_dim * n_kv_head, n_slots] (results of
  // kv_write, so the writes come first); positions/token_seq I32 [n_tokens]; block_table I32
  // [max_blocks, n_seqs]. Token t (sequence s, position p) attends to positions 0..p of s, or
  // p - window + 1 .. p with a window (AttentionParams::window).
  // Result F32 [head_dim * n_head, n_tokens].
  Tensor* attention(Tensor* q, Tensor* k_cache, Tensor* v_cache, Tensor* positions, Tensor* token_seq,
                    Tensor* block_table, const AttentionParams& p);
  Tensor* copy(Tensor* a, DType type);
  // F32 `a` summed over the ranks of the backend's tensor-parallel group (contiguous F32 out).
  Tensor* all_reduce(Tensor* a);
  // The k (1..kMaxTopK) largest entries of each row of F32 `a` [n, rows], for sampling on the
  // host from candidates instead of whole rows of logits. Result F32 [2k + 1, rows]: the values,
  // largest first (equal values: the lower index first); then their indices, as exact floats
  // (n < 2^24); then, when `log_sum_exp`, log(sum(exp(a))) over the row (else 0). NaN and -inf
  // entries are never candidates: a row with fewer than k others pads with value -inf, index -1.
  // With `draw` two more entries: the token drawn from the whole row at a temperature T with a
  // uniform u in [0, 1), as Sampler's chain draws with every filter off — w_i = exp((a_i - max)
  // * (1 / T)) in float for the allowed entries, the first index whose running sum (in double,
  // in index order) exceeds u * sum(w), else the last allowed one; -1 when T <= 0 or nothing is
  // allowed — and its value in `a` (-inf without a token: its logprob, found outside the k too).
  // `draw` is I32 [4, rows] of raw words (pack_draw): T's float bits, 0, u's double bits.
  Tensor* top_k(Tensor* a, int32_t k, bool log_sum_exp, Tensor* draw = nullptr);

  // Mixture of experts (llama.cpp's build_moe_ffn with softmax gating). `route` is
  // top_k(router logits [n_expert, n], n_used, log_sum_exp = true): per token the n_used chosen
  // experts, most probable first (an index of -1, a NaN row's padding, chooses none).
  // mul_mat_id: per token t and slot j, expert route[t][j]'s matrix of `w` [k, m, n_expert]
  // times x[:, j, t] (x [k, n_used, n]; x [k, 1, n]: the same column for every slot). Result F32
  // [m, n_used, n] (zero for a slot that chose none).
  Tensor* mul_mat_id(Tensor* w, Tensor* x, Tensor* route, int32_t n_used);
  // moe_sum: y [m, n_used, n] summed over the slots with the router's probabilities, softmax
  // over all n_expert logits (exp(value - log_sum_exp)); with `norm` divided by their sum over
  // the chosen (at least 2^-14, as llama.cpp clamps it); times `scale` unless it is 0 or 1.
  // Result F32 [m, n].
  Tensor* moe_sum(Tensor* y, Tensor* route, int32_t n_used, bool norm, float scale);

  // Nodes made from now on are tagged with `layer` (Tensor::layer), so a graph can be split
  // across backends by model part. Starts at -1.
  void set_layer(int32_t layer) { layer_ = layer; }

  // Orders everything `out` depends on, in creation order; may be called for several outputs.
  void build(Tensor* out);
  const std::vector<Tensor*>& nodes() const { return nodes_; }
  const std::vector<Tensor*>& leaves() const { return leaves_; }
  const std::vector<Tensor*>& outputs() const { return outputs_; }

 private:
  Tensor* make(DType type, std::initializer_list<int64_t> ne, Op op, std::string name);
  Tensor* make_like(DType type, const std::array<int64_t, kMaxDims>& ne, Op op, std::string name);
  void visit(Tensor* t);

  std::deque<Tensor> arena_;
  std::vector<Tensor*> nodes_;
  std::vector<Tensor*> leaves_;
  std::vector<Tensor*> outputs_;
  std::unordered_set<const Tensor*> visited_;
  int32_t layer_ = -1;
};

// A row of top_k's `draw` input: u travels as its double's bits (53 random bits; a float
// would round the draw).
inline void pack_draw(float temperature, double u, int32_t out[4]) {
  std::memcpy(&out[0], &temperature, 4);
  out[1] = 0;
  std::memcpy(&out[2], &u, 8);
}
inline void unpack_draw(const int32_t in[4], float* temperature, double* u) {
  std::memcpy(temperature, &in[0], 4);
  std::memcpy(u, &in[2], 8);
}

// True for ops that produce no new bytes: views, and kv_write (it writes into its cache).
inline bool aliases_src0(Op op) { return op == Op::kView || op == Op::kKvWrite; }

}  // namespace kite
