// The rank-agreement protocol over all_gather_strings; see collectives.h.
#include "harness/optim/collectives.h"

namespace rh::optim {

namespace {

// On the wire: 'o' + payload, or 'e' / 'f' (flag set) + error.
std::string encode(const RankOutcome& o) {
  if (o.ok) return "o" + o.payload;
  return (o.flag ? "f" : "e") + o.error;
}

}   // namespace

Agreement agree(Collectives* group, const RankOutcome& mine) {
  Agreement a;
  if (!group) {
    if (mine.ok) {
      a.payloads = {mine.payload};
    } else {
      a.failed_rank = 0;
      a.error = mine.error;
      a.flag = mine.flag;
    }
    return a;
  }
  const auto all = group->all_gather_strings(encode(mine));
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& s = all[r];
    if (!s.empty() && s[0] == 'o') {
      a.payloads.push_back(s.substr(1));
    } else if (a.ok()) {
      a.failed_rank = static_cast<int>(r);
      a.error = s.empty() ? "sent nothing" : s.substr(1);
      a.flag = !s.empty() && s[0] == 'f';
    }
  }
  if (!a.ok()) a.payloads.clear();
  return a;
}

}   // namespace rh::optim
