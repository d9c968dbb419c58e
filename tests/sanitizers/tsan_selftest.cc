// Proves the TSan build reports what it should and nothing else:
//   tsan_selftest race   two threads write one int unguarded: TSan must report
//                        (CTest expects this run to fail);
//   tsan_selftest absl-race  one thread writes under an absl::Mutex, the other
//                        without it: TSan must still report (the annotations
//                        do not synchronise more than the lock does);
//   tsan_selftest absl   the same writes under absl::Mutex, a hand-off through
//                        Mutex::AwaitWithTimeout, absl::CondVar and
//                        absl::Notification: no report (needs the annotations
//                        of tsan_absl_sync.cc, Debian's absl being uninstrumented).
#include <cstdio>
#include <cstring>
#include <thread>

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
  std::printf("counter %d taken %d turn %d payload %d\n", counter, taken, turn, seen);
  return counter == 2000 && taken && turn == 2 && seen == 7 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  if (argc == 2 && std::strcmp(argv[1], "absl-race") == 0) return AbslRace();
  if (argc == 2 && std::strcmp(argv[1], "absl") == 0) return Absl();
  std::fprintf(stderr, "usage: %s race|absl-race|absl\n", argv[0]);
  return 2;
}
