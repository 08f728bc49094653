// kite/src/runtime/stop_matcher.h — stop strings over text that arrives a piece at a time.
//
//   KITE_TRY(StopMatcher::validate(stops));
//   StopMatcher stop(stops);
//   StreamDecoder dec(tok);
//   for each generated token t:
//     out << stop.push(dec.push(t));
//     if (stop.stopped()) break;           // stop_index() says which string
//   out << stop.push(dec.flush()) << stop.flush();
//
// Contracts:
//   - push() returns the text that is safe to show now: it holds back the longest tail that
//     could still grow into a stop string, and an incomplete UTF-8 character at the very end
//     (so raw token bytes may be fed too). A stop string may span any number of pieces.
//   - When a stop string completes, push() returns the text before it and stopped() turns true;
//     the stop string and everything after it are discarded, and later pushes return "".
//     The first stop string to complete wins; if several complete in the same push, the one that
//     starts earliest in the text wins (ties: the earlier in the list).
//   - flush() returns whatever is held back (the end of the stream); "" after a stop.
//   - With no stop strings every piece passes straight through (minus an incomplete character).
//   - Each push costs O(held + piece) per stop string, plus O(L^2) for a stop string of L
//     bytes; validate() caps L at kMaxStopBytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace kite {

class StopMatcher {
 public:
  static constexpr size_t kMaxStopBytes = 1024;

  // Each stop string must be non-empty, valid UTF-8 and at most kMaxStopBytes long; the message
  // names the index ("stop[1] is empty").
  static Status validate(std::span<const std::string> stops);

  // `stops` should have passed validate(); empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops = {});

  std::string push(std::string_view piece);
  std::string flush();
  bool stopped() const { return stop_index_ >= 0; }
  // Which stop string matched (index into the constructor's list), or -1.
  int32_t stop_index() const { return stop_index_; }
  // Starts over for a new stream, with the same stop strings.
  void reset();

 private:
  std::vector<std::string> stops_;
  std::vector<int32_t> index_;  // stops_[i] was the constructor's stops[index_[i]]
  std::string held_;
  int32_t stop_index_ = -1;
};

}  // namespace kite
