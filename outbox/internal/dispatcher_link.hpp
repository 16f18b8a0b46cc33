#pragma once
// The writer hook's way to its dispatcher. An open transaction keeps the hook alive through its
// after-commit callback, possibly longer than the Outbox that made it: the dispatcher cuts the
// link when it goes, and the hook then leaves its events to the poller.

#include <shared_mutex>

namespace outbox {
class OutboxDispatcher;
}

namespace outbox::internal {

struct DispatcherLink {
  std::shared_mutex mutex;  // shared by hook calls, exclusive to cut the link
  OutboxDispatcher* dispatcher = nullptr;
};

}  // namespace outbox::internal
