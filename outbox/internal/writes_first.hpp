#pragma once
// Marks the outbox's own threads that write now and then (the DONE flusher, the poller's claims,
// claim and lease renewals): an engine whose writers queue in the process (SQLite's pool) serves
// them before threads that write in a loop, which would otherwise keep them waiting. Not for
// callers' threads: two threads of this kind writing in a loop keep every other writer out.

namespace outbox::internal {

class WritesFirst {
 public:
  /// Marks the calling thread while this lives; nests.
  WritesFirst();
  ~WritesFirst();
  WritesFirst(const WritesFirst&) = delete;
  WritesFirst& operator=(const WritesFirst&) = delete;
  /// True on a thread inside a WritesFirst scope.
  static bool active();

 private:
  bool outer_;
};

}  // namespace outbox::internal
