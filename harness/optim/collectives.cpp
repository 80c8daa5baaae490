// The rank-agreement protocol over all_gather_strings; see collectives.h.
#include "harness/optim/collectives.h"

namespace rh::optim {

namespace {

// On the wire: 'o' + payload, or 'e' / 'f' (flag set) + error.
std::string encode(const RankOutcome& outcome) {
  if (outcome.ok) return "o" + outcome.payload;
  return (outcome.flag ? "f" : "e") + outcome.error;
}

}   // namespace

Agreement agree(Collectives* group, const RankOutcome& mine) {
  Agreement agreement;
  if (!group) {
    if (mine.ok) {
      agreement.payloads = {mine.payload};
    } else {
      agreement.failed_rank = 0;
      agreement.error = mine.error;
      agreement.flag = mine.flag;
    }
    return agreement;
  }
  const auto all = group->all_gather_strings(encode(mine));
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& sent = all[r];
    if (!sent.empty() && sent[0] == 'o') {
      agreement.payloads.push_back(sent.substr(1));
    } else if (agreement.ok()) {
      agreement.failed_rank = static_cast<int>(r);
      agreement.error = sent.empty() ? "sent nothing" : sent.substr(1);
      agreement.flag = !sent.empty() && sent[0] == 'f';
    }
  }
  if (!agreement.ok()) agreement.payloads.clear();
  return agreement;
}

}   // namespace rh::optim
