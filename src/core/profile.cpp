#include "src/core/profile.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace kite {
namespace {

bool digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// A node's name without its layer: "l12.ffn_out" -> "ffn_out", "cache_k.12" -> "cache_k".
std::string_view role(const Tensor& n) {
  std::string_view s = n.name;
  if (s.size() > 2 && s[0] == 'l' && digit(s[1])) {
    size_t i = 1;
    while (i < s.size() && digit(s[i])) ++i;
    if (i < s.size() && s[i] == '.') return s.substr(i + 1);
  }
  size_t j = s.size();
  while (j > 0 && digit(s[j - 1])) --j;
  if (j < s.size() && j > 1 && s[j - 1] == '.') return s.substr(0, j - 1);
  return s;
}

std::string_view type_name(DType t) {
  const quant::TypeTraits* tr = quant::find_traits(t);
  return tr != nullptr ? tr->name : std::string_view("?");
}

bool computes(const Tensor& n) {
  return n.op != Op::kView && n.op != Op::kNone;
}

}  // namespace

std::string profile_label(std::span<Tensor* const> nodes) {
  std::string out;
  const Tensor* first_mm = nullptr;
  for (const Tensor* n : nodes) {
    if (!computes(*n)) continue;
    const std::string_view r = role(*n);
    if (out.empty()) {
      out = op_name(n->op);
      if (n->op == Op::kMulMat) {
        first_mm = n;
        const Tensor& w = *n->src[0];
        out += ' ';
        out += type_name(w.type);
        out += ' ' + std::to_string(w.ne[0]) + 'x' + std::to_string(w.ne[1]);
      }
      if (!r.empty()) (out += ' ') += r;
      continue;
    }
    out += " +";
    out += r.empty() ? std::string_view(op_name(n->op)) : r;
    if (n->op == Op::kMulMat) {
      if (first_mm == nullptr)
        first_mm = n;
      else if (n->src[0]->type != first_mm->src[0]->type)
        ((out += '(') += type_name(n->src[0]->type)) += ')';
    }
  }
  return out;
}

void OpProfile::add(std::span<Tensor* const> nodes, double seconds) {
  double bytes = 0;
  bool any = false;
  for (const Tensor* n : nodes) {
    any = any || computes(*n);
    if (n->op == Op::kMulMat) bytes += static_cast<double>(n->src[0]->nbytes());
  }
  if (!any) return;
  std::string what = profile_label(nodes);
  std::lock_guard<std::mutex> lock(mu_);
  Row& r = rows_[what];
  if (r.what.empty()) r.what = std::move(what);
  ++r.calls;
  r.seconds += seconds;
  r.weight_bytes += bytes;
}

void OpProfile::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rows_.clear();
}

std::vector<OpProfile::Row> OpProfile::rows() const {
  std::vector<Row> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(rows_.size());
    for (const auto& [what, r] : rows_) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.what < b.what;
  });
  return out;
}

double OpProfile::seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  double s = 0;
  for (const auto& [what, r] : rows_) s += r.seconds;
  return s;
}

std::string format_profile(const OpProfile& p, int64_t steps, double wall_seconds) {
  const std::vector<OpProfile::Row> rows = p.rows();
  const double total = p.seconds(), per = static_cast<double>(std::max<int64_t>(steps, 1));
  std::string out = "| launch | calls/step | ms/step | % | µs/call | weights GB/s |\n|---|---:|---:|---:|---:|---:|\n";
  char buf[160];
  int64_t calls = 0;
  for (const OpProfile::Row& r : rows) {
    calls += r.calls;
    std::string gbs;
    if (r.weight_bytes > 0 && r.seconds > 0) {
      std::snprintf(buf, sizeof buf, "%.1f", r.weight_bytes / r.seconds / 1e9);
      gbs = buf;
    }
    std::snprintf(buf, sizeof buf, " | %.4g | %.3f | %.1f | %.1f | %s |\n", static_cast<double>(r.calls) / per,
                  1e3 * r.seconds / per, total > 0 ? 100 * r.seconds / total : 0.0,
                  1e6 * r.seconds / static_cast<double>(r.calls), gbs.c_str());
    out += "| " + r.what + buf;
  }
  std::snprintf(buf, sizeof buf, "| all launches | %.4g | %.3f | 100 | | |\n", static_cast<double>(calls) / per,
                1e3 * total / per);
  out += buf;
  // By op (a label's first word): where the time goes at a glance.
  std::vector<std::pair<std::string, double>> ops;
  for (const OpProfile::Row& r : rows) {
    const std::string op = r.what.substr(0, r.what.find(' '));
    auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& e) { return e.first == op; });
    if (it == ops.end())
      ops.emplace_back(op, r.seconds);
    else
      it->second += r.seconds;
  }
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  out += "(by op:";
  for (size_t i = 0; i < ops.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s %s %.1f%%", i == 0 ? "" : ",", ops[i].first.c_str(),
                  total > 0 ? 100 * ops[i].second / total : 0.0);
    out += buf;
  }
  out += ")\n";
  if (wall_seconds > 0) {
    std::snprintf(
        buf, sizeof buf, "(%lld step%s, %.3f ms a step by the wall clock: the launches' time is %.0f%% of it)\n",
        static_cast<long long>(steps), steps == 1 ? "" : "s", 1e3 * wall_seconds / per, 100 * total / wall_seconds);
    out += buf;
  }
  return out;
}

}  // namespace kite
