// Proves the TSan build reports what it should and nothing else:
//   tsan_selftest race   two threads write one int unguarded: TSan must report
//                        (CTest expects this run to fail);
//   tsan_selftest absl-race  one thread writes under an absl::Mutex, the other
//                        without it: TSan must still report (the annotations
//                        do not synchronise more than the lock does);
//   tsan_selftest absl-status-race  a thread writes an int and drops a copy
//                        of a shared absl::Status that is not the last: TSan
//                        must report the unguarded read (dropping a copy
//                        orders nothing unless it frees the record);
//   tsan_selftest absl   the same writes under absl::Mutex, a hand-off through
//                        Mutex::AwaitWithTimeout, absl::CondVar and
//                        absl::Notification, and an error status whose last
//                        copy is dropped on another thread than its first:
//                        no report (needs the annotations of tsan_absl_sync.cc,
//                        Debian's absl being uninstrumented).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/status/status.h"

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

int Race() {
  int counter = 0;
  std::thread a([&] {
    for (int i = 0; i < 1000; ++i) ++counter;
  });
  std::thread b([&] {
    for (int i = 0; i < 1000; ++i) ++counter;
  });
  a.join();
  b.join();
  std::printf("counter %d\n", counter);
  return 0;
}

int AbslRace() {
  absl::Mutex mu;
  int counter = 0;
  std::thread a([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock l(&mu);
      ++counter;
    }
  });
  std::thread b([&] {
    for (int i = 0; i < 1000; ++i) ++counter;
  });
  a.join();
  b.join();
  std::printf("counter %d\n", counter);
  return 0;
}

// Waits for `flag` with relaxed loads, which order nothing for TSan: what a
// test checks is then ordered (or not) by absl alone.
void SpinUntil(const std::atomic<bool>& flag) {
  while (!flag.load(std::memory_order_relaxed)) std::this_thread::yield();
}

int AbslStatusRace() {
  int payload = 0;
  std::atomic<bool> dropped{false};
  absl::Status first = absl::InternalError("shared");
  absl::Status second = first;  // two copies stay here: the thread's drop is not the last
  std::thread t([&, copy = first]() mutable {
    payload = 7;
    copy = absl::OkStatus();
    dropped.store(true, std::memory_order_relaxed);
  });
  SpinUntil(dropped);
  const int seen = payload;  // races: nothing ordered the write before this read
  t.join();
  std::printf("payload %d %s\n", seen, second.ToString().c_str());
  return 0;
}

// A job's error, as a scheduler hands one to its caller: the maker hands a
// copy over through a Notification, the taker copies it again and drops its
// copies, and the maker's drop is the last, freeing the shared record. Without
// the annotations TSan sees the taker's copy (a write to the count) and the
// free, but not the decrements that order them. Run with either thread as the
// maker.
bool StatusHandOff() {
  for (const bool main_makes : {true, false}) {
    absl::Notification ready;
    std::atomic<bool> dropped{false};
    absl::Status box;
    auto make = [&] {
      absl::Status made = absl::InternalError("job failed");
      box = made;
      ready.Notify();
      SpinUntil(dropped);
      made = absl::OkStatus();  // the last copy: frees the record
    };
    auto take = [&] {
      ready.WaitForNotification();
      absl::Status copy = box;
      box = absl::OkStatus();
      copy = absl::OkStatus();
      dropped.store(true, std::memory_order_relaxed);
    };
    std::thread other(main_makes ? std::function<void()>(take) : std::function<void()>(make));
    main_makes ? make() : take();
    other.join();
  }
  return true;
}

int Absl() {
  absl::Mutex mu;
  int counter = 0;  // guarded by mu
  {
    std::thread a([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock l(&mu);
        ++counter;
      }
    });
    std::thread b([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock l(&mu);
        ++counter;
      }
    });
    a.join();
    b.join();
  }
  // Hand-off through a condition, as the scheduler's engine loop waits.
  int box = 0;  // guarded by mu; 0: empty
  bool taken = false;
  std::thread consumer([&] {
    absl::MutexLock l(&mu);
    while (!mu.AwaitWithTimeout(absl::Condition(
                                    +[](int* b) { return *b != 0; }, &box),
                                absl::Seconds(1))) {
    }
    taken = box == 42;
  });
  {
    absl::MutexLock l(&mu);
    box = 42;
  }
  consumer.join();
  // CondVar.
  absl::CondVar cv;
  int turn = 0;
  std::thread ping([&] {
    absl::MutexLock l(&mu);
    while (turn != 1) cv.Wait(&mu);
    turn = 2;
    cv.Signal();
  });
  {
    absl::MutexLock l(&mu);
    turn = 1;
    cv.Signal();
    while (turn != 2) cv.Wait(&mu);
  }
  ping.join();
  // Notification: plain data written before Notify, read after the wait.
  int payload = 0;
  absl::Notification done;
  std::thread writer([&] {
    payload = 7;
    done.Notify();
  });
  done.WaitForNotification();
  const int seen = payload;
  writer.join();
  const bool handed_off = StatusHandOff();
  std::printf("counter %d taken %d turn %d payload %d status %d\n", counter, taken, turn, seen, handed_off);
  return counter == 2000 && taken && turn == 2 && seen == 7 && handed_off ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  if (argc == 2 && std::strcmp(argv[1], "absl-race") == 0) return AbslRace();
  if (argc == 2 && std::strcmp(argv[1], "absl-status-race") == 0) return AbslStatusRace();
  if (argc == 2 && std::strcmp(argv[1], "absl") == 0) return Absl();
  std::fprintf(stderr, "usage: %s race|absl-race|absl-status-race|absl\n", argv[0]);
  return 2;
}
