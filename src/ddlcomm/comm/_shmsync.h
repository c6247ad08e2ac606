/* What ddlcomm's two shared-memory all-reduce engines (_shmpipe.c, _shmmap.c) share:
 * counters that ranks publish and wait on in a shared segment's header (spin, then a
 * futex), the balanced split of a range into whole cache lines, streaming copies, and
 * the C kernel's loop taken from a ddlcomm.kernels._reduce.Reducer.  Each engine is one
 * C file that includes this header; every function here is static.
 */
#ifndef DDLCOMM_SHMSYNC_H
#define DDLCOMM_SHMSYNC_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*ddl_loop)(const void *a, const void *b, void *out, size_t n);

#define LINE 64
#define PAGE 4096
#define LOOP_CAPSULE "ddlcomm.kernels._reduce.loop"

/* The counters of a segment's header: READY, REDUCED, DONE per rank (an engine uses what it needs). */
enum { READY, REDUCED, DONE, N_COUNTERS };

/* A rank's counter, alone on its cache line: the value (a global step or call number + 1,
 * compared modulo 2^32) and how many ranks sleep on it. */
typedef struct {
    int32_t value;
    int32_t sleepers;
} Counter;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static size_t header_bytes(int nranks)
{
    size_t bytes = (size_t)N_COUNTERS * (size_t)nranks * LINE;
    return (bytes + PAGE - 1) / PAGE * PAGE;
}

static Counter *counter(char *seg, int which, int nranks, int rank)
{
    return (Counter *)(seg + ((size_t)which * (size_t)nranks + (size_t)rank) * LINE);
}

static int at_least(int32_t value, int64_t target) { return (int32_t)((uint32_t)value - (uint32_t)target) >= 0; }

static void publish(Counter *c, int64_t value)
{
    __atomic_store_n(&c->value, (int32_t)(uint32_t)value, __ATOMIC_SEQ_CST);
#ifdef __linux__
    if (__atomic_load_n(&c->sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &c->value, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Until the counter reaches `target`: spin for up to spin_ns, then sleep on it
 * (a futex on Linux: publish() wakes the sleepers; elsewhere, yield). */
static void wait_for(Counter *c, int64_t target, uint64_t spin_ns)
{
    uint64_t start;
    unsigned spins = 0;
    if (at_least(__atomic_load_n(&c->value, __ATOMIC_ACQUIRE), target))
        return;
    start = now_ns();
    while (!at_least(__atomic_load_n(&c->value, __ATOMIC_ACQUIRE), target)) {
        if ((++spins & 255) == 0 && now_ns() - start >= spin_ns)
            break;
        cpu_relax();
    }
    while (!at_least(__atomic_load_n(&c->value, __ATOMIC_ACQUIRE), target)) {
#ifdef __linux__
        int32_t seen;
        __atomic_add_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
        seen = __atomic_load_n(&c->value, __ATOMIC_SEQ_CST);
        if (!at_least(seen, target))      /* the kernel sleeps only if the value is still `seen` */
            syscall(SYS_futex, &c->value, FUTEX_WAIT, seen, NULL, NULL, 0);
        __atomic_sub_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
#else
        sched_yield();
#endif
    }
}

static void wait_all(char *seg, int which, int nranks, int64_t target, uint64_t spin_ns)
{
    for (int q = 0; q < nranks; q++)
        wait_for(counter(seg, which, nranks, q), target, spin_ns);
}

/* [lo, hi) bytes of a `len`-byte chunk that `rank` reduces: whole cache lines, balanced. */
static void part_of(size_t len, int rank, int nranks, size_t *lo, size_t *hi)
{
    size_t lines = (len + LINE - 1) / LINE, each = lines / (size_t)nranks, extra = lines % (size_t)nranks;
    size_t r = (size_t)rank, first = r * each + (r < extra ? r : extra);
    size_t last = first + each + (r < extra ? 1 : 0);
    *lo = first * LINE < len ? first * LINE : len;
    *hi = last * LINE < len ? last * LINE : len;
}

/* memcpy with streaming stores (x86-64: SSE2, in every such CPU): the destination's
 * lines are not read first, and not kept in the caches. */
static void copy_streaming(char *dst, const char *src, size_t len)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15, i;
    if (head > len)
        head = len;
    memcpy(dst, src, head);
    for (i = head; i + 64 <= len; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, len - i);
    _mm_sfence();
#else
    memcpy(dst, src, len);
#endif
}

static void copy_plain(char *dst, const char *src, size_t len) { memcpy(dst, src, len); }

static int reducer_parts(PyObject *reducer, ddl_loop *loop, size_t *itemsize)
{
    PyObject *capsule = PyObject_GetAttrString(reducer, "loop");
    PyObject *size = capsule == NULL ? NULL : PyObject_GetAttrString(reducer, "itemsize");
    int ok = size != NULL;
    if (ok) {
        *loop = (ddl_loop)PyCapsule_GetPointer(capsule, LOOP_CAPSULE);
        *itemsize = PyLong_AsSize_t(size);
        ok = *loop != NULL && !PyErr_Occurred() && *itemsize > 0 && LINE % *itemsize == 0;
        if (!ok && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "the reducer's item size must divide 64");
    }
    Py_XDECREF(capsule);
    Py_XDECREF(size);
    return ok ? 0 : -1;
}

#endif
