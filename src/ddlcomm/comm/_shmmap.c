/* ddlcomm.comm._shmmap: the mapped shared-memory all-reduce of ranks on one node.
 *
 *     ctl = <a shared segment of control_bytes(nranks) bytes, zeroed>
 *     call = allreduce(ctl, sends, recvs, send, recv, lo, hi, reducer, rank, nranks,
 *                      piece, call, spin_us, stream_min)
 *
 * Every rank's send and receive buffers lie in shared memory that every rank maps
 * (ddlcomm.comm.shm_mapped maps them): `sends` and `recvs` hold, per rank, the bytes
 * [lo, hi) of its buffers as mapped here.  Nothing is staged: each rank reduces its
 * line-aligned part of [lo, hi) straight from every rank's input into its own
 * receive buffer, `piece` bytes at a time, and copies each piece, still in its
 * caches, into every other rank's receive buffer.  Each rank reads the inputs and
 * writes the results of its part once.  `send` and `recv` are this rank's whole
 * buffers: the bytes outside [lo, hi) (a buffer's first and last partial pages, at
 * most EDGE_BYTES in all) go through this rank's edge slot in `ctl`, and every rank
 * reduces them all into its own.
 *
 * Ranks meet twice a call on counters in `ctl` (see _shmsync.h): READY (this rank's
 * input is final and its edge staged: nobody reads or writes its buffers before) and
 * DONE (its part is in every receive buffer: nobody returns before all are).
 * Counters hold call numbers + 1; `call` is the calls before (the return value of
 * the previous call), so the segment is never reset.  In place (send is recv) is
 * right: the bytes of a rank's part are read and written by that rank alone, each
 * piece read before it is written.  The GIL is released for the whole call.
 */
#include "_shmsync.h"

/* Bytes per rank for what lies outside [lo, hi): two partial pages, rounded up. */
#define EDGE_BYTES (3 * PAGE)

typedef struct {
    char *ctl;                  /* the counters, then one edge slot of EDGE_BYTES per rank */
    const char *send;
    char *recv;                 /* this rank's whole buffers */
    const char **sends;
    char **recvs;               /* every rank's [lo, hi), as mapped here */
    size_t nbytes, lo, hi, itemsize, piece;
    int rank, nranks, stream;
    uint64_t spin_ns;
    ddl_loop loop;
} Job;

static char *edge_slot(const Job *j, int q) { return j->ctl + header_bytes(j->nranks) + (size_t)q * EDGE_BYTES; }

/* The bytes outside [lo, hi), staged in every rank's slot: head first, then tail. */
static void reduce_edges(const Job *j)
{
    size_t head = j->lo, tail = j->nbytes - j->hi;
    size_t at[2] = {0, j->hi}, from[2] = {0, head}, len[2] = {head, tail};
    for (int k = 0; k < 2; k++) {
        char *out = j->recv + at[k];
        if (len[k] == 0)
            continue;
        memcpy(out, edge_slot(j, 0) + from[k], len[k]);
        for (int q = 1; q < j->nranks; q++)
            j->loop(out, edge_slot(j, q) + from[k], out, len[k] / j->itemsize);
    }
}

/* This rank's part of [lo, hi): reduced piece by piece into its recv, then copied to the others'. */
static void reduce_part(const Job *j)
{
    size_t a, b;
    void (*copy)(char *, const char *, size_t) = j->stream ? copy_streaming : copy_plain;
    part_of(j->hi - j->lo, j->rank, j->nranks, &a, &b);
    for (size_t pos = a; pos < b; pos += j->piece) {
        size_t len = b - pos < j->piece ? b - pos : j->piece, n = len / j->itemsize;
        char *out = j->recvs[j->rank] + pos;
        int first = 1;
        if (j->nranks == 1 && out != j->sends[0] + pos)
            memcpy(out, j->sends[0] + pos, len);
        for (int q = 0; q < j->nranks; q++) {
            if (q == j->rank)
                continue;
            j->loop(first ? j->sends[j->rank] + pos : out, j->sends[q] + pos, out, n);
            first = 0;
        }
        for (int q = 0; q < j->nranks; q++)
            if (q != j->rank)
                copy(j->recvs[q] + pos, out, len);
    }
}

static int64_t run(const Job *j, int64_t call)
{
    char *slot = edge_slot(j, j->rank);
    memcpy(slot, j->send, j->lo);
    memcpy(slot + j->lo, j->send + j->hi, j->nbytes - j->hi);
    publish(counter(j->ctl, READY, j->nranks, j->rank), call + 1);
    wait_all(j->ctl, READY, j->nranks, call + 1, j->spin_ns);
    reduce_edges(j);
    reduce_part(j);
    publish(counter(j->ctl, DONE, j->nranks, j->rank), call + 1);
    wait_all(j->ctl, DONE, j->nranks, call + 1, j->spin_ns);
    return call + 1;
}

static size_t ctl_bytes(int nranks) { return header_bytes(nranks) + (size_t)nranks * EDGE_BYTES; }

static PyObject *control_bytes(PyObject *m, PyObject *args)
{
    int nranks;
    if (!PyArg_ParseTuple(args, "i:control_bytes", &nranks))
        return NULL;
    if (nranks < 1) {
        PyErr_Format(PyExc_ValueError, "nranks must be at least 1, got %d", nranks);
        return NULL;
    }
    return PyLong_FromSize_t(ctl_bytes(nranks));
}

/* Take every rank's mapped parts (each hi - lo bytes) from the tuples into j->sends, j->recvs;
 * views[] gets the buffers to release, *got how many.  Returns an error text, "" with the
 * exception set, or NULL. */
static const char *take_parts(Job *j, PyObject *sends, PyObject *recvs, Py_buffer *views, int *got)
{
    if (!PyTuple_Check(sends) || !PyTuple_Check(recvs) || PyTuple_GET_SIZE(sends) != j->nranks ||
        PyTuple_GET_SIZE(recvs) != j->nranks)
        return "sends and recvs must be tuples of one buffer per rank";
    for (int q = 0; q < j->nranks; q++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(sends, q), &views[*got], PyBUF_SIMPLE) < 0)
            return "";
        j->sends[q] = views[(*got)++].buf;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(recvs, q), &views[*got], PyBUF_WRITABLE) < 0)
            return "";
        j->recvs[q] = views[(*got)++].buf;
        if (views[*got - 2].len != (Py_ssize_t)(j->hi - j->lo) || views[*got - 1].len != (Py_ssize_t)(j->hi - j->lo))
            return "every rank's mapped parts must be hi - lo bytes";
    }
    return NULL;
}

static const char *check_job(const Job *j, const Py_buffer *ctl, const Py_buffer *send, Py_ssize_t lo, Py_ssize_t hi)
{
    if (send->len != (Py_ssize_t)j->nbytes)
        return "send and receive buffers differ in size";
    if (j->nbytes % j->itemsize != 0)
        return "the buffers' size is not a whole number of elements";
    if (lo < 0 || hi < lo || (size_t)hi > j->nbytes || lo % (Py_ssize_t)j->itemsize || hi % (Py_ssize_t)j->itemsize)
        return "lo and hi must be whole elements within the buffers";
    if (j->lo + (j->nbytes - j->hi) > EDGE_BYTES)
        return "the bytes outside [lo, hi) do not fit an edge slot";
    if (j->piece == 0 || j->piece % LINE != 0)
        return "piece must be a positive multiple of 64 bytes";
    if ((size_t)ctl->len < ctl_bytes(j->nranks))
        return "the control segment is smaller than control_bytes(nranks)";
    return NULL;
}

static PyObject *allreduce(PyObject *m, PyObject *args)
{
    PyObject *ctl_obj, *sends_obj, *recvs_obj, *send_obj, *recv_obj, *reducer;
    Py_ssize_t lo, hi, piece, stream_min;
    int rank, nranks, got = 0;
    long long call;
    double spin_us;
    Py_buffer ctl = {0}, send = {0}, recv = {0}, *views = NULL;
    Job j = {0};
    const char *bad = NULL;

    if (!PyArg_ParseTuple(args, "OOOOOnnOiinLdn:allreduce", &ctl_obj, &sends_obj, &recvs_obj, &send_obj, &recv_obj,
                          &lo, &hi, &reducer, &rank, &nranks, &piece, &call, &spin_us, &stream_min))
        return NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        PyErr_Format(PyExc_ValueError, "rank %d of %d ranks is out of range", rank, nranks);
        return NULL;
    }
    j.rank = rank;
    j.nranks = nranks;
    j.lo = (size_t)lo;
    j.hi = (size_t)hi;
    j.piece = piece > 0 ? (size_t)piece : 0;
    j.spin_ns = spin_us > 0 ? (uint64_t)(spin_us * 1000.0) : 0;
    views = PyMem_Calloc(2 * (size_t)nranks, sizeof(Py_buffer));
    j.sends = PyMem_Calloc((size_t)nranks, sizeof(char *));
    j.recvs = PyMem_Calloc((size_t)nranks, sizeof(char *));
    if (views == NULL || j.sends == NULL || j.recvs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (reducer_parts(reducer, &j.loop, &j.itemsize) < 0 || PyObject_GetBuffer(ctl_obj, &ctl, PyBUF_WRITABLE) < 0 ||
        PyObject_GetBuffer(send_obj, &send, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(recv_obj, &recv, PyBUF_WRITABLE) < 0)
        goto done;
    j.ctl = ctl.buf;
    j.send = send.buf;
    j.recv = recv.buf;
    j.nbytes = (size_t)recv.len;
    j.stream = send.buf != recv.buf && stream_min >= 0 && j.nbytes >= (size_t)stream_min;
    bad = check_job(&j, &ctl, &send, lo, hi);
    if (bad == NULL)
        bad = take_parts(&j, sends_obj, recvs_obj, views, &got);
    if (bad == NULL) {
        Py_BEGIN_ALLOW_THREADS
        call = run(&j, call);
        Py_END_ALLOW_THREADS
    } else if (*bad) {
        PyErr_SetString(PyExc_ValueError, bad);
    }
done:
    /* a buffer never got has obj NULL: releasing it does nothing */
    for (int k = 0; k < got; k++)
        PyBuffer_Release(&views[k]);
    PyBuffer_Release(&ctl);
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    PyMem_Free(views);
    PyMem_Free(j.sends);
    PyMem_Free(j.recvs);
    return PyErr_Occurred() ? NULL : PyLong_FromLongLong(call);
}

static PyMethodDef module_methods[] = {
    {"control_bytes", control_bytes, METH_VARARGS,
     "control_bytes(nranks): bytes of the control segment allreduce() needs."},
    {"allreduce", allreduce, METH_VARARGS,
     "allreduce(ctl, sends, recvs, send, recv, lo, hi, reducer, rank, nranks, piece, call, spin_us,\n"
     "          stream_min)\n"
     "-> the next call number: the mapped all-reduce (see the module's source); sends/recvs: every\n"
     "rank's bytes [lo, hi) of its buffers as mapped here; a wait spins spin_us microseconds before\n"
     "it sleeps; out of place, from stream_min bytes (-1: never), the copies to the others use\n"
     "streaming stores."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_shmmap",
    "The mapped shared-memory all-reduce's inner loop; see ddlcomm.comm.shm_mapped.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__shmmap(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && (PyModule_AddIntConstant(m, "EDGE_BYTES", EDGE_BYTES) < 0 ||
                      PyModule_AddIntConstant(m, "PAGE", PAGE) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
