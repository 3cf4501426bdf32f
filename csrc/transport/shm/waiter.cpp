// SPDX-License-Identifier: Apache-2.0
// The shm transport's barrier wait (transport/shm/waiter.h).

#include "transport/shm/waiter.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

namespace mhc_sp::shm {
namespace {

using Clock = std::chrono::steady_clock;

// While ranks fit the cores a spin is cheaper than a sleep and its wake-up; when they outnumber
// the cores, the rank being waited for may need this very core, so the wait sleeps almost at once.
constexpr auto kSpinForOwnCore = std::chrono::microseconds(100);
constexpr auto kSpinForSharedCore = std::chrono::microseconds(5);
constexpr int kSpinsPerClock = 64;
constexpr auto kCheckEvery = std::chrono::microseconds(5000);  // liveness, timeout, broken word

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared (not process-private) futexes: the words live in a segment mapped by several processes.
void futex_wait(uint32_t* word, uint32_t seen, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>(timeout.count() % 1000000) * 1000};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// The liveness probe: the process is gone (no /proc entry, or a zombie waiting to be reaped).
bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command name may itself contain ')'
  if (!paren || paren[1] == '\0' || paren[2] == '\0') return false;
  return paren[2] == 'Z' || paren[2] == 'X';
}

}  // namespace

Waiter::Waiter(int64_t world, std::chrono::milliseconds timeout) : timeout_(timeout) {
  cpu_set_t cpus;
  const int64_t cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  spin_for_ = world <= cores ? kSpinForOwnCore : kSpinForSharedCore;
}

void Waiter::arrive(bp::RankControl* mine, uint64_t e) {
  bp::store_release(&mine->arrived, e);
  __atomic_store_n(&mine->arrived_low, static_cast<uint32_t>(e), __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&mine->sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake_all(&mine->arrived_low);
}

WaitResult Waiter::wait_for_peers(const Segment& seg, int64_t rank, uint64_t e) const {
  const uint32_t* broken = &seg.header()->broken;
  const auto start = Clock::now();
  auto next_check = start + kCheckEvery;
  int spins = 0;
  bool spinning = true;
  for (int64_t p = 0; p < seg.world(); ++p) {
    if (p == rank) continue;
    bp::RankControl* peer = seg.control(p);
    while (bp::load_acquire(&peer->arrived) < e) {
      if (spinning && ++spins % kSpinsPerClock != 0) {
        cpu_relax();
        continue;
      }
      if (spinning) {
        spinning = Clock::now() - start < spin_for_;
        continue;
      }
      // Once a peer gave up, this rank writes nothing more into the segment (rule 6): it neither
      // announces a sleep nor takes back one it announced before it was stopped.
      const bool gave_up = bp::load_broken(broken) != 0;
      if (!gave_up) {
        // Announce the sleep before the last look (both sequentially consistent), so that either
        // this look sees the arrival or the arriving peer sees a sleeper and wakes it.
        __atomic_fetch_add(&peer->sleepers, 1, __ATOMIC_SEQ_CST);
        const uint32_t seen = __atomic_load_n(&peer->arrived_low, __ATOMIC_SEQ_CST);
        if (bp::load_acquire(&peer->arrived) < e) {
          futex_wait(&peer->arrived_low, seen, kCheckEvery);
        }
        if (bp::load_broken(broken) == 0) __atomic_fetch_sub(&peer->sleepers, 1, __ATOMIC_SEQ_CST);
      }
      const auto now = Clock::now();
      if (!gave_up && now < next_check) continue;
      next_check = now + kCheckEvery;
      if (bp::load_acquire(&peer->arrived) >= e) break;
      if (bp::load_broken(broken) != 0) return {Stall::kGaveUp, p, 0};
      const int64_t pid = __atomic_load_n(&peer->pid, __ATOMIC_RELAXED);
      if (pid < 0) return {Stall::kLeft, p, -pid};
      if (process_gone(pid)) return {Stall::kExited, p, pid};
      if (now - start >= timeout_) return {Stall::kTimedOut, p, 0};
    }
  }
  return {};
}

}  // namespace mhc_sp::shm
