// SPDX-License-Identifier: Apache-2.0
// A recording NVTX tool: what a profiler such as Nsight Systems would see, written to a file.
//
// NVTX v3 is header-only. At its first call, every copy of it in the process (each shared library
// that includes the headers) reads NVTX_INJECTION64_PATH, loads that library and calls its
// InitializeInjectionNvtx2 with the copy's export-table getter. Through the callbacks export table
// (NVTX_ETID_CALLBACKS) the tool gets each callback module's function table and fills in its own
// handlers; NVTX leaves the slots it did not fill as no-ops (nvtxInit.h, nvtxTypes.h).
//
// This tool records every push, pop, mark and domain creation with its domain, message, thread id
// and CLOCK_MONOTONIC time. At exit it writes them as JSON lines to MHC_SP_NVTX_RECORD ("%p" in it
// becomes the process id, so that each rank writes its own file). A process may also read its
// events so far through mhc_sp_nvtx_record_count / mhc_sp_nvtx_record_write (mhc_sp.profiling).

#define _GNU_SOURCE
#define NVTX_NO_IMPL  // the types and callback ids only: this library implements the calls
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))

// What a domain or registered-string handle points to: the tool defines these opaque types.
struct nvtxDomainRegistration_st {
  char* name;
};
struct nvtxStringRegistration_st {
  char* text;
};

enum kind { KIND_DOMAIN, KIND_PUSH, KIND_POP, KIND_MARK };
static const char* const kind_names[] = {"domain", "push", "pop", "mark"};

struct event {
  enum kind kind;
  long tid;
  uint64_t ns;
  const char* domain;  // "" for NVTX's default domain; domain names live as long as the process
  char* message;       // owned; NULL for a pop
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct event* events;
static uint64_t event_count, event_capacity;
static int attached;  // NVTX copies (instances) that called InitializeInjectionNvtx2

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static __thread long thread_id;  // cached: gettid is a system call

static void record(enum kind kind, nvtxDomainHandle_t domain, char* message) {
  if (!thread_id) thread_id = (long)syscall(SYS_gettid);
  struct event e = {kind, thread_id, now_ns(), domain ? domain->name : "", message};
  pthread_mutex_lock(&lock);
  if (event_count == event_capacity) {
    const uint64_t capacity = event_capacity ? 2 * event_capacity : 4096;
    struct event* grown = realloc(events, capacity * sizeof(struct event));
    if (!grown) {  // out of memory: drop the event rather than the process
      pthread_mutex_unlock(&lock);
      free(message);
      return;
    }
    events = grown;
    event_capacity = capacity;
  }
  events[event_count++] = e;
  pthread_mutex_unlock(&lock);
}

static char* copy_wide(const wchar_t* text) {  // non-ASCII characters become '?'
  const size_t n = text ? wcslen(text) : 0;
  char* out = malloc(n + 1);
  if (!out) return NULL;
  for (size_t i = 0; i < n; ++i) out[i] = text[i] > 0 && text[i] < 128 ? (char)text[i] : '?';
  out[n] = '\0';
  return out;
}

static char* attribute_message(const nvtxEventAttributes_t* a) {
  if (!a) return strdup("");
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return strdup(a->message.ascii ? a->message.ascii : "");
    case NVTX_MESSAGE_TYPE_UNICODE: return copy_wide(a->message.unicode);
    case NVTX_MESSAGE_TYPE_REGISTERED:
      return strdup(a->message.registered ? a->message.registered->text : "");
    default: return strdup("");
  }
}

// Push/pop return the nesting level, as NVTX documents; one count per thread over all domains.
static __thread int depth;

static int push_a(const char* message) {
  record(KIND_PUSH, NULL, strdup(message ? message : ""));
  return depth++;
}
static int push_w(const wchar_t* message) {
  record(KIND_PUSH, NULL, copy_wide(message));
  return depth++;
}
static int push_ex(const nvtxEventAttributes_t* a) {
  record(KIND_PUSH, NULL, attribute_message(a));
  return depth++;
}
static int pop(void) {
  record(KIND_POP, NULL, NULL);
  return depth > 0 ? --depth : -1;
}
static void mark_a(const char* message) { record(KIND_MARK, NULL, strdup(message ? message : "")); }
static void mark_ex(const nvtxEventAttributes_t* a) {
  record(KIND_MARK, NULL, attribute_message(a));
}

static int domain_push_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  record(KIND_PUSH, domain, attribute_message(a));
  return depth++;
}
static int domain_pop(nvtxDomainHandle_t domain) {
  record(KIND_POP, domain, NULL);
  return depth > 0 ? --depth : -1;
}
static void domain_mark_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  record(KIND_MARK, domain, attribute_message(a));
}
static nvtxDomainHandle_t domain_create_a(const char* name) {
  nvtxDomainHandle_t domain = malloc(sizeof(*domain));
  if (!domain) return NULL;
  domain->name = strdup(name ? name : "");
  record(KIND_DOMAIN, domain, strdup(domain->name));
  return domain;
}
static nvtxDomainHandle_t domain_create_w(const wchar_t* name) {
  char* ascii = copy_wide(name);
  nvtxDomainHandle_t domain = domain_create_a(ascii);
  free(ascii);
  return domain;
}
static void domain_destroy(nvtxDomainHandle_t domain) { (void)domain; }  // names stay valid
static nvtxStringHandle_t register_string_a(nvtxDomainHandle_t domain, const char* text) {
  (void)domain;
  nvtxStringHandle_t s = malloc(sizeof(*s));
  if (s) s->text = strdup(text ? text : "");
  return s;
}

// ---- output ----------------------------------------------------------------------------------

static void write_json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s; ++s) {
    const unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc(c, f);
    } else if (c < 0x20) {
      fprintf(f, "\\u%04x", c);
    } else {
      fputc(c, f);
    }
  }
  fputc('"', f);
}

// Events [first, last) of this process as JSON lines; returns 0, or -1 when the file can't be
// written.
EXPORT int mhc_sp_nvtx_record_write(const char* path, uint64_t first, uint64_t last) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  pthread_mutex_lock(&lock);
  if (last > event_count) last = event_count;
  for (uint64_t i = first; i < last; ++i) {
    const struct event* e = &events[i];
    fprintf(f, "{\"kind\":\"%s\",\"tid\":%ld,\"ns\":%llu,\"domain\":", kind_names[e->kind], e->tid,
            (unsigned long long)e->ns);
    write_json_string(f, e->domain);
    fputs(",\"message\":", f);
    if (e->message) {
      write_json_string(f, e->message);
    } else {
      fputs("null", f);
    }
    fputs("}\n", f);
  }
  pthread_mutex_unlock(&lock);
  return fclose(f) == 0 ? 0 : -1;
}

// Events recorded so far (the index the next event gets).
EXPORT uint64_t mhc_sp_nvtx_record_count(void) {
  pthread_mutex_lock(&lock);
  const uint64_t n = event_count;
  pthread_mutex_unlock(&lock);
  return n;
}

// NVTX instances in this process that attached to this tool.
EXPORT int mhc_sp_nvtx_record_attached(void) {
  return __atomic_load_n(&attached, __ATOMIC_SEQ_CST);
}

static void write_at_exit(void) {
  const char* pattern = getenv("MHC_SP_NVTX_RECORD");
  if (!pattern || !*pattern) return;
  char path[4096];
  size_t n = 0;
  for (const char* p = pattern; *p && n + 24 < sizeof(path); ++p) {
    if (p[0] == '%' && p[1] == 'p') {
      n += (size_t)snprintf(path + n, sizeof(path) - n, "%ld", (long)getpid());
      ++p;
    } else {
      path[n++] = *p;
    }
  }
  path[n] = '\0';
  if (mhc_sp_nvtx_record_write(path, 0, UINT64_MAX) != 0) {
    fprintf(stderr, "nvtx_record: cannot write %s\n", path);
  }
}

// A child made by fork() without exec keeps none of its parent's events.
static void forget_in_child(void) {
  pthread_mutex_init(&lock, NULL);
  event_count = 0;
  thread_id = 0;
}

// ---- attaching ---------------------------------------------------------------------------------

#define FN(f) ((NvtxFunctionPointer)(f))

// The calls this tool handles: (callback module, callback id, handler).
static const struct handler {
  NvtxCallbackModule module;
  unsigned int id;
  NvtxFunctionPointer fn;
} handlers[] = {
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_MarkEx, FN(mark_ex)},
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_MarkA, FN(mark_a)},
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushEx, FN(push_ex)},
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushA, FN(push_a)},
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushW, FN(push_w)},
    {NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePop, FN(pop)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainMarkEx, FN(domain_mark_ex)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePushEx, FN(domain_push_ex)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePop, FN(domain_pop)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRegisterStringA, FN(register_string_a)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainCreateA, FN(domain_create_a)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainCreateW, FN(domain_create_w)},
    {NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainDestroy, FN(domain_destroy)},
};

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const NvtxExportTableCallbacks* callbacks =
      (const NvtxExportTableCallbacks*)get_export_table(NVTX_ETID_CALLBACKS);
  if (!callbacks || callbacks->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
  for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); ++i) {
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!callbacks->GetModuleFunctionTable(handlers[i].module, &table, &size)) return 0;
    // Each slot points at the NVTX copy's function pointer for that call.
    if (table && handlers[i].id < size && table[handlers[i].id]) {
      *table[handlers[i].id] = handlers[i].fn;
    }
  }
  if (__atomic_fetch_add(&attached, 1, __ATOMIC_SEQ_CST) == 0) {
    atexit(write_at_exit);
    pthread_atfork(NULL, NULL, forget_in_child);
  }
  return 1;
}
