// SPDX-License-Identifier: Apache-2.0
// POSIX shared-memory segments (transport/shm/segment.h).

#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include <c10/util/Exception.h>

#include "transport/shm/transport.h"

namespace mhc_sp::shm {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// An open file descriptor, closed on scope exit (a mapping outlives it).
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() { ::close(fd_); }
  int get() const { return fd_; }

 private:
  int fd_;
};

Segment map_fd(int fd, int64_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  TORCH_CHECK(p != MAP_FAILED, "shm: cannot map segment ", name, " (", bytes,
              " bytes): ", errno_text(err));
  return Segment(static_cast<uint8_t*>(p), bytes);
}

}  // namespace

Segment::Segment(Segment&& other) noexcept : base_(other.base_), bytes_(other.bytes_) {
  other.base_ = nullptr;
  other.bytes_ = 0;
}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, static_cast<size_t>(bytes_));
    base_ = other.base_;
    bytes_ = other.bytes_;
    other.base_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) ::munmap(base_, static_cast<size_t>(bytes_));
}

Segment create_segment(const std::string& name, int64_t world, int64_t half_bytes) {
  const int64_t bytes = bp::segment_bytes(world, half_bytes);
  const int raw_fd =
      ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, S_IRUSR | S_IWUSR);
  const int err = errno;
  TORCH_CHECK(raw_fd >= 0, "shm: cannot create segment ", name, ": ", errno_text(err));
  UnlinkOnExit unlink_on_error(name);
  const FdGuard fd(raw_fd);
  TORCH_CHECK(::fchmod(fd.get(), S_IRUSR | S_IWUSR) == 0, "shm: cannot restrict segment ", name,
              ": ", errno_text(errno));
  const int rc = ::posix_fallocate(fd.get(), 0, bytes);
  TORCH_CHECK(rc == 0, "shm: cannot reserve ", bytes,
              " bytes for the workspace in /dev/shm: ", errno_text(rc), " (", world,
              " ranks x 2 halves x ", half_bytes, " bytes)");
  Segment seg = map_fd(fd.get(), bytes, name);
  auto* h = seg.header();
  h->version = bp::kVersion;
  h->world = static_cast<uint32_t>(world);
  h->half_bytes = static_cast<uint64_t>(half_bytes);
  h->total_bytes = static_cast<uint64_t>(bytes);
  __atomic_store_n(&h->magic, bp::kMagic, __ATOMIC_RELEASE);
  unlink_on_error.keep();
  return seg;
}

Segment open_segment(const std::string& name, int64_t world, int64_t half_bytes,
                     std::chrono::steady_clock::time_point deadline) {
  std::string last = "it does not exist yet";
  while (true) {
    const int raw_fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (raw_fd >= 0) {
      const FdGuard fd(raw_fd);
      struct stat st{};
      TORCH_CHECK(::fstat(fd.get(), &st) == 0, "shm: cannot stat segment ", name, ": ",
                  errno_text(errno));
      TORCH_CHECK(st.st_uid == ::geteuid() && (st.st_mode & 077) == 0, "shm: segment ", name,
                  " is not private to this user (uid ", st.st_uid, ", mode ", std::oct,
                  (st.st_mode & 0777), "); refusing it");
      const int64_t bytes = st.st_size;
      if (bytes >= bp::slots_offset(1)) {
        Segment seg = map_fd(fd.get(), bytes, name);
        const auto* h = seg.header();
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == bp::kMagic) {
          TORCH_CHECK(h->version == bp::kVersion, "shm: segment ", name, " has protocol version ",
                      h->version, ", this build speaks ", bp::kVersion);
          TORCH_CHECK(h->world == static_cast<uint64_t>(world), "shm: segment ", name, " is for ",
                      h->world, " ranks, the group has ", world);
          const auto half = static_cast<int64_t>(h->half_bytes);
          TORCH_CHECK(half > 0 && half % bp::kAlign == 0 && half >= bp::call_layout(0, 0).need &&
                          (half_bytes < 0 || half == half_bytes) &&
                          static_cast<int64_t>(h->total_bytes) == bytes &&
                          bp::segment_bytes(world, half) == bytes,
                      "shm: segment ", name, " is inconsistent: ", bytes, " bytes, header says ",
                      h->total_bytes, " bytes and half size ", half,
                      half_bytes < 0 ? std::string() : c10::str(" (expected ", half_bytes, ")"));
          return seg;
        }
        last = "it is not initialised yet";
      } else {
        last = "it is not sized yet";
      }
    } else if (errno != ENOENT) {
      TORCH_CHECK(false, "shm: cannot open segment ", name, ": ", errno_text(errno));
    }
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "shm: segment ", name,
                " did not appear in time (", last, "): rank 0 did not create it");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void unlink_segment(const std::string& name) {
  if (!name.empty()) ::shm_unlink(name.c_str());  // ENOENT: rank 0 or a peer already did
}

std::string new_segment_name() {
  std::random_device device;  // /dev/urandom
  std::string name = "/mhc_sp_";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {  // 128 random bits
    const uint32_t v = device();
    for (int k = 0; k < 8; ++k) name += hex[(v >> (4 * k)) & 15];
  }
  return name;
}

}  // namespace mhc_sp::shm
