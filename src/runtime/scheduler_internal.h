// kite/src/runtime/scheduler_internal.h — the scheduler's per-request state, shared by its
// source files (scheduler.cpp: admission, steps, speculation; scheduler_sampling.cpp: how a
// step's rows become tokens). Not part of its interface.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/scheduler.h"

namespace kite {

struct Scheduler::Seq {
  Seq(Job* j, int32_t c, const Tokenizer* tok, const GenerationParams& p)
      : job(j), choice(c), sampler(p.sampling), stop(p.stop) {
    if (tok != nullptr) decoder.emplace(*tok, DecodeOptions{.render_special = false});
  }
  Job* job;
  int32_t choice;
  std::vector<int32_t> tokens;  // prompt + generated; tokens[computed..] are not in the KV yet
  int64_t computed = 0;
  int32_t slot = -1;
  int32_t generated = 0;
  bool done = false;
  Sampler sampler;
  std::optional<GrammarMatcher> grammar;
  std::optional<StreamDecoder> decoder;  // none without a tokenizer (token ids only)
  StopMatcher stop;
  // Speculative decoding (created on first use).
  std::optional<Sampler> draft_sampler;
  std::optional<NgramIndex> ngram;
  AcceptanceEstimate acceptance;
  ProbeBackoff backoff;
  Draft draft;
};

struct Scheduler::Job {
  uint64_t id = 0;
  Request req;
  int64_t n_prompt = 0;
  int32_t live = 0;      // choices not finished
  bool forked = false;   // n > 1: the choices exist (the prompt is computed)
  bool first_admission = true;
  std::vector<int32_t> reserved_slots;  // n > 1 before the fork: slots held for the other choices
  std::vector<std::unique_ptr<Seq>> seqs;
  Usage usage;
};

}  // namespace kite
