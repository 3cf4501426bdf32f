// SPDX-License-Identifier: Apache-2.0
// The emulated device's PTX interpreter (emulation/device.h: run_ptx): the inline PTX of the device
// sources is executed from its text, with the asm statement's operands, so that an operand list in
// the wrong order, an order (.relaxed/.acquire/.release) or a scope (.cta/.gpu/.sys) does here
// what it does on the GPU. Each statement's text is parsed once per OS thread.
//
// The instructions it knows (anything else is refused, naming the instruction and the site):
//   ld{.weak|.volatile|.relaxed.scope|.acquire.scope}{.global|.shared}{.ca|.cg|.cs|.lu|.cv}
//     {.v2|.v4}.type  d, [a{+imm}]
//   st{.weak|.volatile|.relaxed.scope|.release.scope}{.global|.shared}{.wb|.cg|.cs|.wt}
//     {.v2|.v4}.type  [a{+imm}], b
//   atom{.sem.scope}{.global}.op.type d, [a], b{, c}    (op: add exch cas and or xor min max inc
//   red{.sem.scope}{.global}.op.type [a], b              dec; type b/u 32/64, f32 for add)
//   fence.{sc|acq_rel}.{cta|gpu|sys}, membar.{cta|gl|sys}
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3}
//   griddepcontrol.wait, griddepcontrol.launch_dependents
//   mov.{u64|b64} d, %globaltimer; mov.{u32|b32} d, %globaltimer_lo
//   nanosleep.u32 t
// type: b8 b16 b32 b64 u8 u16 u32 u64 s8 s16 s32 s64 f32 f64. Scopes: .cta .gpu .sys (.cluster is
// .gpu here). Memory operations go through the memory model (memory.cpp), which checks scopes and
// polls; .volatile is .relaxed.sys, as PTX defines it.

#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "emulation/internal.h"

namespace mhc_sp::emulation {
namespace detail {
namespace {

enum class Op : uint8_t {
  kLd,
  kSt,
  kAtom,
  kRed,
  kFence,
  kMma,
  kGridWait,
  kGridLaunch,
  kMovTimer,
  kNanosleep
};

struct Arg {
  enum Kind : uint8_t { kReg, kVec, kAddr, kSpecial, kImm } kind = kReg;
  std::vector<int> regs;  // kReg: one; kVec: several; kAddr: the base
  int64_t value = 0;      // kAddr: offset; kImm: the number
  std::string special;    // kSpecial: "globaltimer", "globaltimer_lo"
};

struct Instr {
  std::string text;
  Op op = Op::kLd;
  Sem sem = Sem::kWeak;
  Scope scope = Scope::kNone;
  int vec = 1, bytes = 4;
  bool is_float = false;
  Rmw rmw = Rmw::kAdd;
  std::vector<Arg> args;
};

struct Program {
  std::vector<Instr> instrs;
};

[[noreturn]] void refuse(const std::string& text, const char* file, int line,
                         const std::string& why) {
  abandon("the emulated device does not run the PTX '" + text + "' at " + site(file, line) + ": " +
          why + " (csrc/emulation/ptx.cpp lists what it runs)");
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n\r"), b = s.find_last_not_of(" \t\n\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

int reg_of(const std::string& tok) {
  if (tok.size() < 2 || tok[0] != '%' || !std::isdigit(static_cast<unsigned char>(tok[1]))) {
    return -1;
  }
  return std::stoi(tok.substr(1));
}

Arg parse_arg(const std::string& raw, const std::string& text, const char* file, int line) {
  const std::string tok = trim(raw);
  Arg a;
  if (tok.empty()) refuse(text, file, line, "an empty operand");
  if (tok.front() == '{') {
    if (tok.back() != '}') refuse(text, file, line, "an unclosed vector operand");
    a.kind = Arg::kVec;
    std::stringstream in(tok.substr(1, tok.size() - 2));
    std::string part;
    while (std::getline(in, part, ',')) {
      const int r = reg_of(trim(part));
      if (r < 0) refuse(text, file, line, "a vector element '" + trim(part) + "'");
      a.regs.push_back(r);
    }
    return a;
  }
  if (tok.front() == '[') {
    if (tok.back() != ']') refuse(text, file, line, "an unclosed address");
    a.kind = Arg::kAddr;
    std::string inner = trim(tok.substr(1, tok.size() - 2));
    const size_t plus = inner.find('+');
    if (plus != std::string::npos) {
      a.value = std::stoll(trim(inner.substr(plus + 1)), nullptr, 0);
      inner = trim(inner.substr(0, plus));
    }
    const int r = reg_of(inner);
    if (r < 0) refuse(text, file, line, "an address that is not an operand: '" + inner + "'");
    a.regs.push_back(r);
    return a;
  }
  if (tok.rfind("%%", 0) == 0) {  // %% in an asm template is one %: a special register
    a.kind = Arg::kSpecial;
    a.special = tok.substr(2);
    return a;
  }
  if (std::isdigit(static_cast<unsigned char>(tok[0]))) {
    a.kind = Arg::kImm;
    a.value = std::stoll(tok, nullptr, 0);
    return a;
  }
  const int r = reg_of(tok);
  if (r < 0) refuse(text, file, line, "an operand '" + tok + "'");
  a.regs.push_back(r);
  return a;
}

// Splits "a, {b, c}, [d]" at the commas outside braces and brackets.
std::vector<std::string> split_args(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char ch : s) {
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') --depth;
    if (ch == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!trim(cur).empty()) out.push_back(cur);
  return out;
}

bool type_of(const std::string& q, Instr& in) {
  static const std::unordered_map<std::string, std::pair<int, bool>> types = {
      {"b8", {1, false}}, {"b16", {2, false}}, {"b32", {4, false}}, {"b64", {8, false}},
      {"u8", {1, false}}, {"u16", {2, false}}, {"u32", {4, false}}, {"u64", {8, false}},
      {"s8", {1, false}}, {"s16", {2, false}}, {"s32", {4, false}}, {"s64", {8, false}},
      {"f32", {4, true}}, {"f64", {8, true}}};
  const auto it = types.find(q);
  if (it == types.end()) return false;
  in.bytes = it->second.first;
  in.is_float = it->second.second;
  return true;
}

bool scope_of(const std::string& q, Scope& s) {
  if (q == "cta") return s = Scope::kCta, true;
  if (q == "gpu" || q == "cluster") return s = Scope::kGpu, true;
  if (q == "sys") return s = Scope::kSys, true;
  return false;
}

Instr decode(const std::string& text, const char* file, int line) {
  Instr in;
  in.text = text;
  const size_t sp = text.find_first_of(" \t");
  const std::string opcode = text.substr(0, sp);
  const std::string rest = sp == std::string::npos ? std::string() : text.substr(sp);
  for (const std::string& a : split_args(rest)) in.args.push_back(parse_arg(a, text, file, line));
  std::vector<std::string> q;
  {
    std::stringstream s(opcode);
    std::string part;
    while (std::getline(s, part, '.')) q.push_back(part);
  }
  const std::string& name = q[0];
  const auto bad = [&](const std::string& why) { refuse(text, file, line, why); };
  const auto want_args = [&](size_t n) {
    if (in.args.size() != n) bad("expected " + std::to_string(n) + " operands");
  };
  if (opcode == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") {
    in.op = Op::kMma;
    want_args(4);
    const size_t sizes[4] = {4, 4, 2, 4};
    for (int k = 0; k < 4; ++k) {
      if (in.args[k].kind != Arg::kVec || in.args[k].regs.size() != sizes[k]) {
        bad("the MMA takes vectors of 4, 4, 2 and 4 registers");
      }
    }
    return in;
  }
  if (opcode == "griddepcontrol.wait" || opcode == "griddepcontrol.launch_dependents") {
    in.op = opcode == "griddepcontrol.wait" ? Op::kGridWait : Op::kGridLaunch;
    want_args(0);
    return in;
  }
  if (name == "fence" || name == "membar") {
    in.op = Op::kFence;
    want_args(0);
    if (name == "membar") {
      if (q.size() != 2) bad("membar takes one level");
      in.sem = Sem::kSc;
      if (q[1] == "cta")
        in.scope = Scope::kCta;
      else if (q[1] == "gl")
        in.scope = Scope::kGpu;
      else if (q[1] == "sys")
        in.scope = Scope::kSys;
      else
        bad("an unknown membar level");
      return in;
    }
    if (q.size() != 3) bad("expected fence.sem.scope");
    if (q[1] == "sc")
      in.sem = Sem::kSc;
    else if (q[1] == "acq_rel")
      in.sem = Sem::kAcqRel;
    else
      bad("an unknown fence order ." + q[1]);
    if (!scope_of(q[2], in.scope)) bad("an unknown scope ." + q[2]);
    return in;
  }
  if (name == "mov") {
    in.op = Op::kMovTimer;
    want_args(2);
    if (q.size() != 2 || !type_of(q[1], in)) bad("mov takes one type");
    if (in.args[1].kind != Arg::kSpecial ||
        !((in.args[1].special == "globaltimer" && in.bytes == 8) ||
          (in.args[1].special == "globaltimer_lo" && in.bytes == 4))) {
      bad("mov is run for %globaltimer (64 bits) and %globaltimer_lo (32 bits) only");
    }
    return in;
  }
  if (name == "nanosleep") {
    in.op = Op::kNanosleep;
    want_args(1);
    return in;
  }
  if (name != "ld" && name != "st" && name != "atom" && name != "red") {
    bad("an unknown instruction");
  }
  in.op = name == "ld" ? Op::kLd : name == "st" ? Op::kSt : name == "atom" ? Op::kAtom : Op::kRed;
  bool typed = false, has_op = false;
  for (size_t k = 1; k < q.size(); ++k) {
    const std::string& x = q[k];
    Scope sc;
    if (x == "weak")
      in.sem = Sem::kWeak;
    else if (x == "volatile")
      in.sem = Sem::kVolatile;
    else if (x == "relaxed")
      in.sem = Sem::kRelaxed;
    else if (x == "acquire")
      in.sem = Sem::kAcquire;
    else if (x == "release")
      in.sem = Sem::kRelease;
    else if (x == "acq_rel")
      in.sem = Sem::kAcqRel;
    else if (x == "sc")
      in.sem = Sem::kSc;
    else if (scope_of(x, sc))
      in.scope = sc;
    else if (x == "global" || x == "shared")
      continue;
    else if (x == "ca" || x == "cg" || x == "cs" || x == "lu" || x == "cv" || x == "wb" ||
             x == "wt")
      continue;
    else if (x == "v2")
      in.vec = 2;
    else if (x == "v4")
      in.vec = 4;
    else if (!typed && type_of(x, in))
      typed = true;
    else if ((in.op == Op::kAtom || in.op == Op::kRed) && !has_op) {
      static const std::unordered_map<std::string, Rmw> ops = {
          {"add", Rmw::kAdd}, {"exch", Rmw::kExch}, {"cas", Rmw::kCas}, {"and", Rmw::kAnd},
          {"or", Rmw::kOr},   {"xor", Rmw::kXor},   {"min", Rmw::kMin}, {"max", Rmw::kMax},
          {"inc", Rmw::kInc}, {"dec", Rmw::kDec}};
      const auto it = ops.find(x);
      if (it == ops.end()) bad("an unknown qualifier ." + x);
      in.rmw = it->second;
      has_op = true;
    } else {
      bad("an unknown qualifier ." + x);
    }
  }
  if (!typed) bad("no type");
  const bool ordered = in.sem != Sem::kWeak && in.sem != Sem::kVolatile;
  if (ordered && in.scope == Scope::kNone)
    bad("." + std::string("relaxed/acquire/release needs a scope"));
  if (!ordered && in.scope != Scope::kNone) bad("a scope needs .relaxed, .acquire or .release");
  if (in.op == Op::kLd) {
    want_args(2);
    if (in.sem == Sem::kRelease || in.sem == Sem::kAcqRel || in.sem == Sem::kSc) {
      bad("ld cannot release");
    }
    if (in.args[1].kind != Arg::kAddr) bad("ld reads from [address]");
  } else if (in.op == Op::kSt) {
    want_args(2);
    if (in.sem == Sem::kAcquire || in.sem == Sem::kAcqRel || in.sem == Sem::kSc) {
      bad("st cannot acquire");
    }
    if (in.args[0].kind != Arg::kAddr) bad("st writes to [address]");
  } else {
    if (!has_op) bad("atom/red need an operation");
    if (in.vec != 1) bad("atom/red take no vectors");
    if (in.is_float && in.rmw != Rmw::kAdd) bad("only add takes .f32");
    if (in.is_float) in.rmw = Rmw::kAddF32;
    const size_t n = (in.op == Op::kAtom ? 3 : 2) + (in.rmw == Rmw::kCas ? 1 : 0);
    want_args(n);
    if (in.args[in.op == Op::kAtom ? 1 : 0].kind != Arg::kAddr) bad("atom/red take [address]");
  }
  if ((in.op == Op::kLd || in.op == Op::kSt) && in.vec > 1) {
    const Arg& v = in.args[in.op == Op::kLd ? 0 : 1];
    if (v.kind != Arg::kVec || static_cast<int>(v.regs.size()) != in.vec) {
      bad("a .v" + std::to_string(in.vec) + " access takes a vector of that many registers");
    }
  }
  return in;
}

Program parse(const char* text, const char* file, int line) {
  Program p;
  std::string all = text, cur;
  for (char ch : all) {
    if (ch == ';') {
      const std::string one = trim(cur);
      if (!one.empty()) p.instrs.push_back(decode(one, file, line));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!trim(cur).empty()) refuse(trim(cur), file, line, "an instruction without ';'");
  return p;
}

// The operands of one execution: %0.. the outputs, then the inputs.
struct Operands {
  std::vector<AsmOperand> ops;
  size_t outputs = 0;
  const Instr* in = nullptr;
  const char* file = nullptr;
  int line = 0;

  const AsmOperand& at(int r, int bytes, bool output) const {
    if (r < 0 || r >= static_cast<int>(ops.size())) {
      refuse(in->text, file, line, "%" + std::to_string(r) + " is not an operand");
    }
    const AsmOperand& o = ops[r];
    if (output && static_cast<size_t>(r) >= outputs) {
      refuse(in->text, file, line, "%" + std::to_string(r) + " is an input, written here");
    }
    if (bytes > 0 && o.bytes != bytes) {
      refuse(in->text, file, line,
             "%" + std::to_string(r) + " (\"" + o.constraint + "\") holds " +
                 std::to_string(o.bytes) + " bytes where the instruction moves " +
                 std::to_string(bytes));
    }
    return o;
  }
  uint64_t get(int r, int bytes) const {
    uint64_t v = 0;
    std::memcpy(&v, at(r, bytes, false).value, bytes);
    return v;
  }
  void set(int r, int bytes, uint64_t v) const { std::memcpy(at(r, bytes, true).value, &v, bytes); }
  uint64_t value(const Arg& a, int bytes) const {
    return a.kind == Arg::kImm ? static_cast<uint64_t>(a.value) : get(a.regs[0], bytes);
  }
  char* address(const Arg& a) const { return reinterpret_cast<char*>(get(a.regs[0], 8)) + a.value; }
};

// A vector access must be aligned to its whole size (the GPU raises a misaligned address error).
char* aligned(const Instr& in, const Operands& o, char* p) {
  if (reinterpret_cast<uintptr_t>(p) % (in.bytes * in.vec) != 0) {
    abandon("a misaligned .v" + std::to_string(in.vec) + " access by '" + in.text + "' at " +
            site(o.file, o.line));
  }
  return p;
}

void execute(const Instr& in, const Operands& o) {
  const Site at{o.file, o.line, in.text.c_str()};
  switch (in.op) {
    case Op::kLd: {
      char* p = aligned(in, o, o.address(in.args[1]));
      const Arg& d = in.args[0];
      for (int k = 0; k < in.vec; ++k) {
        const int r = in.vec == 1 ? d.regs[0] : d.regs[k];
        // One poll for the whole vector: the elements are loaded together.
        o.set(r, in.bytes, mem_load(p + k * in.bytes, in.bytes, in.sem, in.scope, at, k == 0));
      }
      break;
    }
    case Op::kSt: {
      char* p = aligned(in, o, o.address(in.args[0]));
      const Arg& s = in.args[1];
      for (int k = 0; k < in.vec; ++k) {
        const uint64_t v = in.vec == 1 ? o.value(s, in.bytes) : o.get(s.regs[k], in.bytes);
        mem_store(p + k * in.bytes, in.bytes, v, in.sem, in.scope, at);
      }
      break;
    }
    case Op::kAtom:
    case Op::kRed: {
      const int base = in.op == Op::kAtom ? 1 : 0;
      char* p = o.address(in.args[base]);
      const bool cas = in.rmw == Rmw::kCas;
      const uint64_t compare = cas ? o.value(in.args[base + 1], in.bytes) : 0;
      const uint64_t operand = o.value(in.args[base + (cas ? 2 : 1)], in.bytes);
      const uint64_t old = mem_rmw(in.rmw, p, in.bytes, operand, compare, in.sem, in.scope, at);
      if (in.op == Op::kAtom) o.set(in.args[0].regs[0], in.bytes, old);
      break;
    }
    case Op::kFence: mem_fence(in.sem, in.scope, at); break;
    case Op::kMma: {
      float d[4], c[4];
      uint32_t a[4], b[2];
      for (int k = 0; k < 4; ++k) {
        a[k] = static_cast<uint32_t>(o.get(in.args[1].regs[k], 4));
        const uint32_t cb = static_cast<uint32_t>(o.get(in.args[3].regs[k], 4));
        std::memcpy(&c[k], &cb, 4);
      }
      for (int k = 0; k < 2; ++k) b[k] = static_cast<uint32_t>(o.get(in.args[2].regs[k], 4));
      mma_m16n8k16(d, a, b[0], b[1], c, o.file, o.line);
      for (int k = 0; k < 4; ++k) {
        uint32_t bits;
        std::memcpy(&bits, &d[k], 4);
        o.set(in.args[0].regs[k], 4, bits);
      }
      break;
    }
    case Op::kGridWait: wait_for_primary(); break;
    case Op::kGridLaunch: launch_dependents(); break;
    case Op::kMovTimer: {
      poll();  // the waits read the timer between polls
      o.set(in.args[0].regs[0], in.bytes, now_ns());
      break;
    }
    case Op::kNanosleep: {
      const uint64_t ns = std::min<uint64_t>(o.value(in.args[0], 4), 1000000);
      poll();
      if (ns >= 1000) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
      break;
    }
  }
}

}  // namespace
}  // namespace detail

void run_ptx(const char* text, const char* file, int line,
             std::initializer_list<AsmOperand> outputs, std::initializer_list<AsmOperand> inputs) {
  thread_local std::unordered_map<const char*, std::shared_ptr<detail::Program>> parsed;
  auto& program = parsed[text];
  if (!program) program = std::make_shared<detail::Program>(detail::parse(text, file, line));
  detail::Operands o;
  o.ops.assign(outputs.begin(), outputs.end());
  o.outputs = o.ops.size();
  o.ops.insert(o.ops.end(), inputs.begin(), inputs.end());
  o.file = file;
  o.line = line;
  for (const detail::Instr& in : program->instrs) {
    o.in = &in;
    detail::execute(in, o);
  }
}

}  // namespace mhc_sp::emulation
