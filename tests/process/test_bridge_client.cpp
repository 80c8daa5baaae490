// The long-lived helper child (harness/process/bridge_client.h): one line out, one JSON reply
// back; a child that answers garbage, ends, or hangs past the timeout fails that request with a
// message naming it and is started again on the next one; a command that cannot be made throws.
// The child is a /bin/sh loop that answers each request line by its word.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "harness/process/bridge_client.h"

namespace {

// ok -> {"ok": true}; err -> an error reply; garbage -> not JSON; exit -> ends; hang -> no answer.
const char* kChildScript =
    "while read -r line; do case \"$line\" in "
    "ok) echo '{\"ok\": true}' ;; "
    "err) echo '{\"ok\": false, \"error\": \"no such tensor\"}' ;; "
    "garbage) echo 'Traceback (most recent call last):' ;; "
    "exit) exit 0 ;; "
    "hang) exec sleep 30 ;; "
    "esac; done";

rh::BridgeCommand sh_child() { return {{"/bin/sh", "-c", kChildScript}, {}}; }

struct BridgeCase {
  const char* request;
  const char* reply;   // what request() returns
};

class BridgeReplies : public testing::TestWithParam<BridgeCase> {};

TEST_P(BridgeReplies, EachRequestGetsItsReplyAndAFailedOneRestartsTheChild) {
  int starts = 0;
  rh::BridgeClient client("the test bridge", [&starts] {
    ++starts;
    return sh_child();
  });
  EXPECT_EQ(client.request("ok", 10), "");
  EXPECT_EQ(client.request(GetParam().request, 1), GetParam().reply);
  EXPECT_EQ(client.request("ok", 10), "");   // answered, by the same child or a new one
  const bool failed_ours = std::string(GetParam().reply).rfind("the test bridge", 0) == 0;
  EXPECT_EQ(starts, failed_ours ? 2 : 1);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BridgeReplies,
    testing::Values(BridgeCase{"ok", ""}, BridgeCase{"err", "no such tensor"},
                    BridgeCase{"garbage", "the test bridge answered something that is not its reply"},
                    BridgeCase{"exit", "the test bridge ended (killed, or out of memory?)"},
                    BridgeCase{"hang", "the test bridge did not answer within 1 s"}),
    [](const testing::TestParamInfo<BridgeCase>& info) { return std::string(info.param.request); });

TEST(BridgeClient, ACommandThatCannotBeMadeThrowsFromTheRequest) {
  rh::BridgeClient client("the test bridge",
                          []() -> rh::BridgeCommand { throw std::runtime_error("python/rhckpt not found"); });
  EXPECT_THROW(client.request("ok", 10), std::runtime_error);
}

}   // namespace
