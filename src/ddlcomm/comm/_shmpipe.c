/* ddlcomm.comm._shmpipe: the pipelined shared-memory all-reduce of ranks on one node.
 *
 *     seg = <a shared segment of segment_bytes(nranks, chunk, windows) bytes, zeroed>
 *     base = allreduce(seg, send, recv, reducer, rank, nranks, chunk, windows, base)
 *
 * The input is cut into chunks of `chunk` bytes.  Per chunk, every rank copies
 * the pieces the others reduce into its slot of one of `windows` staging
 * windows in the segment, then reduces its own line-aligned part of the chunk
 * (its own input straight from send, the others' from their slots: one pass of
 * the C kernel per peer) into its part of recv, copies that part, still in the
 * caches, into the window, and copies the others' reduced parts out.  Ranks go
 * on to the next chunk as soon as their part is done, so the copies of one
 * chunk overlap the reductions of the next, and a chunk's staging stays in the
 * caches: each rank reads its input and writes its output from memory once.
 *
 * Ranks meet through three counters per rank (each on its own cache line in the
 * segment's header): READY (its piece of chunk g is staged), REDUCED (its part of
 * chunk g is reduced), DONE (it copied chunk g out).  Counters hold global chunk
 * numbers + 1 and only grow, so a bound call passes `base` (the chunks of the
 * calls before, returned by the previous call) and the segment is never reset.
 * A window is reused only when every rank has copied its chunk out.  A wait
 * spins for `spin_us`, then sleeps on a futex that the counter's owner wakes
 * when it publishes (only if someone sleeps): ranks that outnumber the cores
 * give theirs up.  The GIL is released for the whole call, so a watchdog thread
 * can still end the rank.
 *
 * `reducer` is a ddlcomm.kernels._reduce.Reducer: its `loop` capsule is the
 * SIMD loop out = a (op) b, and its `itemsize` the element size.
 *
 * `phases`, where not None, is a writable buffer of N_PHASES int64: the call adds
 * to it the nanoseconds this rank spent in each of its steps' six phases (PHASES
 * names them: waiting for a free window, staging, waiting for the others' pieces,
 * reducing, waiting for the others' parts, copying out): nine clock readings a
 * step.
 */
#include "_shmsync.h"

static size_t window_bytes(int nranks, size_t chunk) { return ((size_t)nranks + 1) * chunk; }

/* A call's phases, in the order each step takes them (see `phases` above). */
enum { WAIT_FREE, STAGE, WAIT_READY, REDUCE, WAIT_REDUCED, UNSTAGE, N_PHASES };
#define PHASES "wait_free stage wait_ready reduce wait_reduced unstage"

typedef struct {
    char *seg;
    const char *send;
    char *recv;
    size_t nbytes, itemsize, chunk;
    int rank, nranks, windows, stream;
    uint64_t spin_ns;
    ddl_loop loop;
    int64_t *phases;            /* N_PHASES sums of nanoseconds, or NULL: not timed */
} Job;

/* The clock where the call's phases are timed, else 0 (no reading). */
static uint64_t mark(const Job *j) { return j->phases != NULL ? now_ns() : 0; }

/* Add the time from `since` to now to `phase`; return now (the next phase's start). */
static uint64_t lap(const Job *j, int phase, uint64_t since)
{
    uint64_t now = mark(j);
    if (j->phases != NULL)
        j->phases[phase] += (int64_t)(now - since);
    return now;
}

/* Chunk i of a call: where it lies in the buffers and in the segment. */
typedef struct {
    int64_t g;                  /* its global number (calls before counted) */
    size_t off, len, lo, hi;    /* its bytes in send/recv; this rank's part of it */
    char *slots, *out;          /* its window: one slot per rank, then the reduced chunk */
} Chunk;

static Chunk chunk_at(const Job *j, int64_t base, size_t i)
{
    Chunk c;
    c.g = base + (int64_t)i;
    c.off = i * j->chunk;
    c.len = j->nbytes - c.off < j->chunk ? j->nbytes - c.off : j->chunk;
    part_of(c.len, j->rank, j->nranks, &c.lo, &c.hi);
    c.slots = j->seg + header_bytes(j->nranks) + (size_t)(c.g % j->windows) * window_bytes(j->nranks, j->chunk);
    c.out = c.slots + (size_t)j->nranks * j->chunk;
    return c;
}

/* Stage the chunk: the parts the other ranks reduce go into this rank's slot. */
static void stage(const Job *j, const Chunk *c)
{
    char *mine = c->slots + (size_t)j->rank * j->chunk;
    uint64_t t = mark(j);
    wait_all(j->seg, DONE, j->nranks, c->g - j->windows + 1, j->spin_ns);  /* the window is free */
    t = lap(j, WAIT_FREE, t);
    memcpy(mine, j->send + c->off, c->lo);
    memcpy(mine + c->hi, j->send + c->off + c->hi, c->len - c->hi);
    publish(counter(j->seg, READY, j->nranks, j->rank), c->g + 1);
    lap(j, STAGE, t);
}

/* Reduce this rank's part from every rank's input (its own straight from send, first) into
 * its part of recv, then copy that part, still in the caches, into the window for the others. */
static void reduce(const Job *j, const Chunk *c)
{
    size_t n = (c->hi - c->lo) / j->itemsize;
    const char *own = j->send + c->off + c->lo;
    char *mine = j->recv + c->off + c->lo;
    int first = 1;
    uint64_t t = mark(j);
    wait_all(j->seg, READY, j->nranks, c->g + 1, j->spin_ns);
    t = lap(j, WAIT_READY, t);
    if (n > 0 && j->nranks == 1 && mine != own)
        memcpy(mine, own, c->hi - c->lo);
    for (int q = 0; n > 0 && q < j->nranks; q++) {
        if (q == j->rank)
            continue;
        j->loop(first ? own : mine, c->slots + (size_t)q * j->chunk + c->lo, mine, n);
        first = 0;
    }
    if (n > 0 && j->nranks > 1)
        memcpy(c->out + c->lo, mine, c->hi - c->lo);
    publish(counter(j->seg, REDUCED, j->nranks, j->rank), c->g + 1);
    lap(j, REDUCE, t);
}

/* Copy the others' reduced parts of the chunk out (this rank's is already in recv). */
static void unstage(const Job *j, const Chunk *c)
{
    void (*copy)(char *, const char *, size_t) = j->stream ? copy_streaming : copy_plain;
    uint64_t t = mark(j);
    wait_all(j->seg, REDUCED, j->nranks, c->g + 1, j->spin_ns);
    t = lap(j, WAIT_REDUCED, t);
    copy(j->recv + c->off, c->out, c->lo);
    copy(j->recv + c->off + c->hi, c->out + c->hi, c->len - c->hi);
    publish(counter(j->seg, DONE, j->nranks, j->rank), c->g + 1);
    lap(j, UNSTAGE, t);
}

/* Step s stages chunk s, reduces chunk s-1 and copies chunk s-2 out: each wait is
 * for what the other ranks did a step before, so a rank late by less than a step
 * holds nobody up.  Chunks s-2..s are live at once, so windows >= 3. */
static int64_t run(const Job *j, int64_t base)
{
    size_t nchunks = (j->nbytes + j->chunk - 1) / j->chunk;
    for (size_t s = 0; s < nchunks + 2; s++) {
        Chunk c;
        if (s < nchunks) {
            c = chunk_at(j, base, s);
            stage(j, &c);
        }
        if (s >= 1 && s - 1 < nchunks) {
            c = chunk_at(j, base, s - 1);
            reduce(j, &c);
        }
        if (s >= 2) {
            c = chunk_at(j, base, s - 2);
            unstage(j, &c);
        }
    }
    return base + (int64_t)nchunks;
}

static int check_shape(int rank, int nranks, Py_ssize_t chunk, int windows)
{
    if (nranks < 1 || rank < 0 || rank >= nranks)
        PyErr_Format(PyExc_ValueError, "rank %d of %d ranks is out of range", rank, nranks);
    else if (chunk <= 0 || chunk % LINE != 0)
        PyErr_Format(PyExc_ValueError, "chunk must be a positive multiple of %d bytes, got %zd", LINE, chunk);
    else if (windows < 3)
        PyErr_Format(PyExc_ValueError, "windows must be at least 3, got %d", windows);
    else
        return 0;
    return -1;
}

static PyObject *segment_bytes(PyObject *m, PyObject *args)
{
    int nranks, windows;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "ini:segment_bytes", &nranks, &chunk, &windows) ||
        check_shape(0, nranks, chunk, windows) < 0)
        return NULL;
    return PyLong_FromSize_t(header_bytes(nranks) + (size_t)windows * window_bytes(nranks, (size_t)chunk));
}

static PyObject *allreduce(PyObject *m, PyObject *args)
{
    PyObject *seg_obj, *send_obj, *recv_obj, *reducer, *phases_obj = Py_None;
    int rank, nranks, windows;
    Py_ssize_t chunk;
    long long base;
    double spin_us;
    Py_ssize_t stream_min;
    Py_buffer seg = {0}, send = {0}, recv = {0}, phases = {0};
    Job j;
    const char *bad = NULL;

    if (!PyArg_ParseTuple(args, "OOOOiiniLdn|O:allreduce", &seg_obj, &send_obj, &recv_obj, &reducer,
                          &rank, &nranks, &chunk, &windows, &base, &spin_us, &stream_min, &phases_obj) ||
        check_shape(rank, nranks, chunk, windows) < 0 || reducer_parts(reducer, &j.loop, &j.itemsize) < 0)
        return NULL;
    if (PyObject_GetBuffer(seg_obj, &seg, PyBUF_WRITABLE) < 0 ||
        PyObject_GetBuffer(send_obj, &send, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(recv_obj, &recv, PyBUF_WRITABLE) < 0 ||
        (phases_obj != Py_None && PyObject_GetBuffer(phases_obj, &phases, PyBUF_WRITABLE) < 0)) {
        bad = "";               /* the exception is set */
        goto done;
    }
    j = (Job){seg.buf, send.buf, recv.buf, (size_t)recv.len, j.itemsize, (size_t)chunk, rank, nranks, windows,
              0, spin_us > 0 ? (uint64_t)(spin_us * 1000.0) : 0, j.loop, phases.buf};
    j.stream = send.buf != recv.buf && stream_min >= 0 && j.nbytes >= (size_t)stream_min;
    if (send.len != recv.len)
        bad = "send and receive buffers differ in size";
    else if (j.nbytes % j.itemsize != 0)
        bad = "the buffers' size is not a whole number of elements";
    else if ((size_t)seg.len < header_bytes(nranks) + (size_t)windows * window_bytes(nranks, j.chunk))
        bad = "the segment is smaller than segment_bytes(nranks, chunk, windows)";
    else if (send.buf != recv.buf && (char *)send.buf < (char *)recv.buf + recv.len &&
             (char *)recv.buf < (char *)send.buf + send.len)
        bad = "send and receive buffers overlap without being the same memory";
    else if (phases_obj != Py_None &&
             (phases.len != (Py_ssize_t)(N_PHASES * sizeof(int64_t)) || (uintptr_t)phases.buf % sizeof(int64_t)))
        bad = "phases must be an aligned buffer of N_PHASES int64";
    if (bad == NULL) {
        Py_BEGIN_ALLOW_THREADS
        base = run(&j, base);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, bad);
    }
done:
    /* a buffer never got has obj NULL: releasing it does nothing */
    PyBuffer_Release(&seg);
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    PyBuffer_Release(&phases);
    return bad == NULL ? PyLong_FromLongLong(base) : NULL;
}

static PyMethodDef module_methods[] = {
    {"segment_bytes", segment_bytes, METH_VARARGS,
     "segment_bytes(nranks, chunk, windows): bytes of the shared segment allreduce() needs."},
    {"allreduce", allreduce, METH_VARARGS,
     "allreduce(seg, send, recv, reducer, rank, nranks, chunk, windows, base, spin_us, stream_min,\n"
     "          phases=None)\n"
     "-> the next base: the pipelined all-reduce of this rank's part (see the module's source);\n"
     "a wait spins spin_us microseconds before it sleeps; an out-of-place result of at least\n"
     "stream_min bytes (-1: never) is written with streaming stores; phases (N_PHASES int64,\n"
     "or None) gets the nanoseconds of each phase (PHASES) added."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_shmpipe",
    "The pipelined shared-memory all-reduce's inner loop; see ddlcomm.comm.shm.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__shmpipe(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && (PyModule_AddIntConstant(m, "LINE", LINE) < 0 ||
                      PyModule_AddIntConstant(m, "N_PHASES", N_PHASES) < 0 ||
                      PyModule_AddStringConstant(m, "PHASES", PHASES) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
