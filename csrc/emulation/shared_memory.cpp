// SPDX-License-Identifier: Apache-2.0
// The emulated blocks' __shared__ memory (emulation/device.h): poisoned and race-checked.
//
// Where it lives. `__shared__` is `static thread_local` in the shim, so every __shared__ variable
// is a function-local thread-local of this module: one copy per OS thread, i.e. per running
// block. Their offsets in the module's TLS block are read once from the module's own ELF symbol
// table (thread-local symbols named _ZZ..., function-local statics; the runtime keeps none), and
// the calling thread's TLS block is found from threadIdx's address and offset.
//
// Poison. The first access of a block to a variable fills the whole variable with all-ones bytes
// (NaN as floats) before the access: a block never sees what an earlier block left.
//
// Racecheck (as compute-sanitizer's racecheck does on a GPU). Every access of the instrumented
// device sources reaches on_access (access_hooks.cpp). Each 2-byte cell of a variable remembers,
// within the current barrier interval of the block, its last writer and two readers (thread,
// warp-collective count, code address). Two threads touching the same cell, at least one writing,
// in the same interval are a race unless they are lanes of one warp with a warp collective (a
// shuffle, an MMA) between them. The launch fails with both sites.

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "emulation/internal.h"

namespace mhc_sp::emulation::detail {
namespace {

struct SharedVar {
  uintptr_t offset;  // in the module's TLS block
  size_t size;
  std::string name;
};

struct Catalog {
  std::vector<SharedVar> vars;  // by offset
  uintptr_t lo = 0, hi = 0;     // the span of every variable
  std::string module;           // this module's file
  uintptr_t base = 0;           // its load address
  uintptr_t thread_idx_offset = 0;
};

std::string demangle(const std::string& name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return out;
}

// Reads the thread-local symbols of this module's ELF file.
Catalog read_catalog() {
  Catalog c;
  Dl_info info{};
  TORCH_CHECK(dladdr(reinterpret_cast<void*>(&read_catalog), &info) != 0 && info.dli_fname,
              "emulation: cannot find the emulation module's file");
  c.module = info.dli_fname;
  c.base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  const int fd = open(c.module.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, "emulation: cannot open ", c.module);
  struct stat st{};
  fstat(fd, &st);
  void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  TORCH_CHECK(map != MAP_FAILED, "emulation: cannot map ", c.module);
  const auto* bytes = static_cast<const uint8_t*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
  bool thread_idx_found = false;
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
    const char* names = reinterpret_cast<const char*>(bytes + sh[sh[i].sh_link].sh_offset);
    const size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t k = 0; k < count; ++k) {
      if (ELF64_ST_TYPE(syms[k].st_info) != STT_TLS || syms[k].st_shndx == SHN_UNDEF) continue;
      const std::string name = names + syms[k].st_name;
      if (name == "threadIdx") {
        c.thread_idx_offset = syms[k].st_value;
        thread_idx_found = true;
      } else if (name.rfind("_ZZ", 0) == 0 && syms[k].st_size > 0) {
        c.vars.push_back({syms[k].st_value, syms[k].st_size, demangle(name)});
      }
    }
  }
  munmap(map, st.st_size);
  TORCH_CHECK(
      thread_idx_found,
      "emulation: the module's symbol table is missing (stripped?): the racecheck needs it");
  std::sort(c.vars.begin(), c.vars.end(),
            [](const SharedVar& a, const SharedVar& b) { return a.offset < b.offset; });
  c.vars.erase(
      std::unique(c.vars.begin(), c.vars.end(),
                  [](const SharedVar& a, const SharedVar& b) { return a.offset == b.offset; }),
      c.vars.end());
  if (!c.vars.empty()) {
    c.lo = c.vars.front().offset;
    for (const SharedVar& v : c.vars) c.hi = std::max(c.hi, v.offset + v.size);
  }
  return c;
}

const Catalog& catalog() {
  static const Catalog c = read_catalog();
  return c;
}

// One 2-byte cell's accesses in the current barrier interval (`tag`: block generation and
// barrier count; a cell with another tag is empty). Threads are stored + 1 (0: none).
struct Cell {
  uint64_t tag = 0;
  uint16_t writer = 0, reader[2] = {0, 0};
  uint32_t writer_wep = 0, reader_wep[2] = {0, 0};
  const void* writer_pc = nullptr;
  const void* reader_pc[2] = {nullptr, nullptr};
};

struct VarState {
  uint64_t generation = 0;
  std::vector<Cell> cells;
};

thread_local char* tls_base = nullptr;  // this OS thread's TLS block of the module
thread_local std::vector<VarState> states;
thread_local uint64_t generations = 0;

}  // namespace

// "file:line (function)" of a code address of this module, through addr2line when it is there.
std::string code_site(const void* pc) {
  const Catalog& c = catalog();
  const uintptr_t offset = reinterpret_cast<uintptr_t>(pc) - c.base - 1;
  std::ostringstream cmd;
  cmd << "addr2line -C -f -e '" << c.module << "' 0x" << std::hex << offset << " 2>/dev/null";
  std::string fn, loc;
  if (FILE* p = popen(cmd.str().c_str(), "r")) {
    char line[4096];
    if (fgets(line, sizeof(line), p)) fn = line;
    if (fgets(line, sizeof(line), p)) loc = line;
    pclose(p);
  }
  auto trim = [](std::string& s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  };
  trim(fn);
  trim(loc);
  if (loc.empty() || loc.rfind("??", 0) == 0) {
    std::ostringstream s;
    s << c.module << "+0x" << std::hex << offset;
    return s.str();
  }
  const size_t slash = loc.rfind('/');
  if (slash != std::string::npos) loc = loc.substr(slash + 1);
  for (size_t a; (a = fn.find("(anonymous namespace)::")) != std::string::npos;) fn.erase(a, 23);
  const size_t paren = fn.find('(');
  return loc + " (" + (paren == std::string::npos ? fn : fn.substr(0, paren)) + ")";
}

namespace {

[[noreturn]] void report(const Block& b, const SharedVar& v, uintptr_t offset, int me, bool write,
                         const void* pc, int other, bool other_wrote, const void* other_pc) {
  std::ostringstream s;
  s << "racecheck: a __shared__ race on byte " << offset << " of " << v.name << " (" << v.size
    << " bytes): thread " << me << " (warp " << me / kWarp << ") " << (write ? "writes" : "reads")
    << " it at " << code_site(pc) << ", thread " << other << " (warp " << other / kWarp << ") "
    << (other_wrote ? "wrote" : "read") << " it at " << code_site(other_pc)
    << ", with no __syncthreads between (barrier interval " << b.barrier_epoch << ")";
  if (me / kWarp == other / kWarp) s << " and no warp collective either";
  abandon(s.str());
}

}  // namespace

void shared_block_begin(Block& b) {
  b.generation = ++generations;
  if (tls_base == nullptr) {
    tls_base = reinterpret_cast<char*>(&threadIdx) - catalog().thread_idx_offset;
    states.resize(catalog().vars.size());
  }
}

// Whether `addr` is __shared__ memory of the running block: then it is poisoned on first touch
// and race-checked.
bool shared_access(Block& b, const void* addr, int bytes, bool write, const void* pc) {
  if (tls_base == nullptr) return false;
  const Catalog& c = catalog();
  const uintptr_t off = reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(tls_base);
  if (off < c.lo || off >= c.hi) return false;
  auto it = std::upper_bound(c.vars.begin(), c.vars.end(), off,
                             [](uintptr_t o, const SharedVar& v) { return o < v.offset; });
  if (it == c.vars.begin()) return false;
  --it;
  const SharedVar& v = *it;
  if (off >= v.offset + v.size) return false;
  VarState& st = states[it - c.vars.begin()];
  if (st.generation != b.generation) {  // this block's first touch: poison the variable
    std::memset(tls_base + v.offset, 0xff, v.size);
    st.generation = b.generation;
    if (st.cells.size() != (v.size + 1) / 2) st.cells.assign((v.size + 1) / 2, Cell{});
  }
  if (!b.launch->racecheck || b.running == nullptr) return true;
  const int me = static_cast<int>(b.running->thread_idx.x), warp = me / kWarp;
  const uint64_t tag = (b.generation << 32) | b.barrier_epoch;
  const uint32_t wep = b.warp_epoch[warp];
  const auto ordered = [&](uint16_t other, uint32_t other_wep) {
    const int o = other - 1;
    return o == me || (o / kWarp == warp && other_wep < wep);
  };
  const size_t first = (off - v.offset) / 2,
               last = std::min(st.cells.size() - 1, (off - v.offset + bytes - 1) / 2);
  for (size_t k = first; k <= last; ++k) {
    Cell& cell = st.cells[k];
    if (cell.tag != tag) cell = Cell{tag};
    if (cell.writer != 0 && !ordered(cell.writer, cell.writer_wep)) {
      report(b, v, off - v.offset, me, write, pc, cell.writer - 1, true, cell.writer_pc);
    }
    if (write) {
      for (int r = 0; r < 2; ++r) {
        if (cell.reader[r] != 0 && !ordered(cell.reader[r], cell.reader_wep[r])) {
          report(b, v, off - v.offset, me, true, pc, cell.reader[r] - 1, false, cell.reader_pc[r]);
        }
      }
      cell.writer = static_cast<uint16_t>(me + 1);
      cell.writer_wep = wep;
      cell.writer_pc = pc;
    } else {
      const uint16_t id = static_cast<uint16_t>(me + 1);
      if (cell.reader[0] == id || cell.reader[1] == id) {
        const int r = cell.reader[0] == id ? 0 : 1;
        cell.reader_wep[r] = wep;
        cell.reader_pc[r] = pc;
      } else {
        // Keep the newest two readers: a later write by a third thread races with them anyway.
        cell.reader[1] = cell.reader[0];
        cell.reader_wep[1] = cell.reader_wep[0];
        cell.reader_pc[1] = cell.reader_pc[0];
        cell.reader[0] = id;
        cell.reader_wep[0] = wep;
        cell.reader_pc[0] = pc;
      }
    }
  }
  return true;
}

// The __shared__ variables this module has (for the tests: the racecheck sees what it must).
std::vector<std::pair<std::string, size_t>> shared_variables() {
  std::vector<std::pair<std::string, size_t>> out;
  for (const SharedVar& v : catalog().vars) out.emplace_back(v.name, v.size);
  return out;
}

}  // namespace mhc_sp::emulation::detail
