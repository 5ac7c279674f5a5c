/* Plugins that misbehave on purpose, one per VARIANT (tests/CMakeLists.txt builds each), for
   tests/test_plugins.cpp: what lattnbench must refuse at load time (another ABI, no entry point,
   a malformed or duplicate name), and what must fail a case without stopping the run (a wrong
   result, an error returned, scratch left allocated, a crash under --isolate). */
#include <lattn/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Declines one length, so that a test sees a plugin's own reason recorded as the skip reason. */
static const char* runs_everything(const lattn_case* c) {
  return c->seq == 13 ? "test plugins decline seq 13" : NULL;
}

/* Writes zeros: every output's rel_err is 1. */
static int zeros(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                 void** saved, char* err, size_t errlen) {
  (void)alloc, (void)stream, (void)err, (void)errlen;
  memset(t->o, 0, (size_t)(c->batch * c->heads * c->seq * c->dim) * sizeof(float));
  memset(t->hT, 0, (size_t)(c->batch * c->heads * c->dim * c->dim) * sizeof(float));
  *saved = NULL;
  return 0;
}

static int refuses(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                   void** saved, char* err, size_t errlen) {
  (void)c, (void)t, (void)alloc, (void)stream, (void)saved;
  snprintf(err, errlen, "test_fail refuses seq %lld on purpose", (long long)c->seq);
  return 7;
}

static int leaks(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                 void** saved, char* err, size_t errlen) {
  zeros(c, t, alloc, stream, saved, err, errlen);
  return alloc->allocate(alloc->ctx, 4096) ? 0 : 1;
}

/* abort(), not a stray pointer: AddressSanitizer (scripts/test.sh's second build) turns a SIGSEGV
   into a report and exit status 1, but leaves SIGABRT to kill the process. */
static int crashes(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                   void** saved, char* err, size_t errlen) {
  (void)c, (void)t, (void)alloc, (void)stream, (void)saved, (void)err, (void)errlen;
  abort();
}

#if defined(VARIANT_wrong)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_wrong", 1, impls};
#elif defined(VARIANT_fail)
static const lattn_impl impls[] = {{"refuses", "cpu", runs_everything, refuses, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_fail", 1, impls};
#elif defined(VARIANT_leak)
static const lattn_impl impls[] = {{"leaks", "cpu", runs_everything, leaks, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_leak", 1, impls};
#elif defined(VARIANT_crash)
static const lattn_impl impls[] = {{"crashes", "cpu", runs_everything, crashes, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_crash", 1, impls};
#elif defined(VARIANT_abi)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI + 1, "test_abi", 1, impls};
#elif defined(VARIANT_badname)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "Test-Name", 1, impls};
#elif defined(VARIANT_dupimpl)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL},
                                   {"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_dupimpl", 2, impls};
#elif defined(VARIANT_dupname)
/* The example plugin's name (examples/plugins/mine.c). */
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "mine", 1, impls};
#elif defined(VARIANT_nosymbol)
/* Exports another entry point than lattn_plugin_v1. */
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_nosymbol", 1, impls};
const lattn_plugin* lattn_plugin_v0(void) { return &plugin; }
#define NO_ENTRY_POINT
#else
#error "VARIANT_<name> is not set"
#endif

#ifndef NO_ENTRY_POINT
const lattn_plugin* lattn_plugin_v1(void) { return &plugin; }
#endif
