#include "src/runtime/stop_matcher.h"

#include <algorithm>

#include "src/base/utf8.h"

namespace kite {
namespace {

// Bytes at the end of `s` that start a UTF-8 character but do not finish it (0 when the end is
// complete, or when the bytes there could never form a character anyway).
size_t incomplete_utf8_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    size_t need = 0;
    if ((c & 0xe0) == 0xc0)
      need = 2;
    else if ((c & 0xf0) == 0xe0)
      need = 3;
    else if ((c & 0xf8) == 0xf0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

Status StopMatcher::validate(std::span<const std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) return make_error("stop[", i, "] is empty; a stop string needs at least one character");
    if (stops[i].size() > kMaxStopBytes)
      return make_error("stop[", i, "] is ", stops[i].size(), " bytes long; the limit is ", kMaxStopBytes);
    if (!valid_utf8(stops[i])) return make_error("stop[", i, "] is not valid UTF-8");
  }
  return ok_status();
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) continue;
    stops_.push_back(std::move(stops[i]));
    index_.push_back(static_cast<int32_t>(i));
  }
}

void StopMatcher::reset() {
  held_.clear();
  stop_index_ = -1;
}

std::string StopMatcher::push(std::string_view piece) {
  if (stopped()) return {};
  held_.append(piece);
  // A complete stop string: the earliest one in the text.
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = held_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      stop_index_ = index_[i];
    }
  }
  if (stopped()) {
    std::string out = held_.substr(0, best_pos);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string. Everything before it
  // can never be part of a match: no stop starts there (no full match was found, and no longer
  // tail is a prefix).
  const std::string_view text(held_);
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  hold = std::max(hold, incomplete_utf8_tail(text));
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace kite
