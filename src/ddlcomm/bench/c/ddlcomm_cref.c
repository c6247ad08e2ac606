/*
 * ddlcomm_cref: C reference timings of MPI_Bcast, MPI_Gather and MPI_Allreduce
 * taken with exactly ddlcomm's timing protocol, so Python numbers can be set
 * against C numbers on the same MPI.
 *
 * Per point (collective, size):
 *   fill inputs (rank-dependent small integers), clear outputs, one untimed
 *   call, verify; then `warmup` untimed calls, each after MPI_Barrier; then
 *   `iters` timed iterations: MPI_Barrier; t0 = MPI_Wtime(); collective;
 *   t1 = MPI_Wtime(); keep t1 - t0.  Rank 0 gathers every rank's times and
 *   prints one JSON line (times in microseconds): each rank's mean and median
 *   (rank_avg_us, rank_p50_us) and each iteration's slowest rank (iter_max_us).
 *
 * Conventions shared with ddlcomm (src/ddlcomm/collectives.py): root 0;
 * `bytes` is the per-rank message, count = bytes / itemsize (rounded down);
 * gather's root receives count * p; all-reduce is not in place, op MPI_SUM;
 * input value i on rank r is 1 + ((i % 11) + 3 r) % 23; outputs are cleared to
 * 0xFF bytes before the check.  MPI is initialised at MPI_THREAD_FUNNELED by
 * default, as ddlcomm's mpi backend does, and the collectives run on a
 * duplicate of MPI_COMM_WORLD, as there.
 *
 * Memory (--memory): "pageable" = posix_memalign to the page size +
 * madvise(MADV_NOHUGEPAGE), so no transparent huge pages; "hugepage" = an
 * anonymous mmap aligned to 2 MiB + madvise(MADV_HUGEPAGE), as NumPy asks for
 * large arrays.  Buffers are touched (filled) before timing.
 *
 * One file, two builds.  The timing loop is the library function
 * ddlcomm_cref_time() below; compiled with -DDDLCOMM_CREF_LIB -shared -fPIC it
 * is libddlcomm_cref.so, which ddlcomm's ranks call through ctypes on their own
 * communicator and NumPy buffers (ddlcomm.bench.cref.CReference), so C and
 * Python calls are timed side by side in one job on the same memory.  Without
 * DDLCOMM_CREF_LIB the file is also the standalone program (main, below),
 * whose own buffers, fill and check wrap the same function.
 *
 * Usage: ddlcomm_cref --collective allreduce|broadcast|gather
 *          --dtype float32|int32 --bytes N [--bytes M ...] --iters N
 *          --warmup N [--memory pageable|hugepage]
 *          [--thread single|funneled|serialized|multiple]
 * Bad arguments: a message on stderr, exit status 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mpi.h>

/* ============================================================ library
 * The timing loop, shared by the program and libddlcomm_cref.so.
 */

/* Codes of ddlcomm_cref_time()'s `collective` and `dtype` arguments. */
enum coll { C_BROADCAST = 0, C_GATHER = 1, C_ALLREDUCE = 2 };
enum dtype { D_FLOAT32 = 0, D_INT32 = 1, D_FLOAT64 = 2, D_INT64 = 3, D_UINT8 = 4 };

int ddlcomm_cref_time(MPI_Comm comm, int collective, int dtype, void *sendbuf, void *recvbuf,
                      long long count, int root, int iters, int warmup, double *times_out);
int ddlcomm_cref_sizeof_comm(void);
int ddlcomm_cref_library_version(char *out, int outlen);

/* What the caller checks before handing over a communicator: the size of an
 * MPI_Comm handle and the MPI library this was built against. */
int ddlcomm_cref_sizeof_comm(void) { return (int)sizeof(MPI_Comm); }

/* MPI_Get_library_version's text into out (NUL-terminated, cut to outlen). */
int ddlcomm_cref_library_version(char *out, int outlen)
{
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    int rc = MPI_Get_library_version(text, &len);
    if (rc != MPI_SUCCESS || outlen < 1)
        return rc != MPI_SUCCESS ? rc : MPI_ERR_ARG;
    if (len > outlen - 1)
        len = outlen - 1;
    memcpy(out, text, (size_t)len);
    out[len] = '\0';
    return MPI_SUCCESS;
}

/* The MPI datatype of a dtype code (as ddlcomm's mpi backend maps it), or MPI_DATATYPE_NULL. */
static MPI_Datatype mpi_type(int dtype)
{
    switch (dtype) {
    case D_FLOAT32: return MPI_FLOAT;
    case D_INT32: return MPI_INT32_T;
    case D_FLOAT64: return MPI_DOUBLE;
    case D_INT64: return MPI_INT64_T;
    case D_UINT8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

/* One collective call, as ddlcomm's mpi backend makes it. */
static inline int call_once(int coll, void *send, void *recv, int count, MPI_Datatype type,
                            int root, MPI_Comm comm)
{
    switch (coll) {
    case C_BROADCAST:
        return MPI_Bcast(send, count, type, root, comm);
    case C_GATHER:
        return MPI_Gather(send, count, type, recv, count, type, root, comm);
    case C_ALLREDUCE:
        return MPI_Allreduce(send, recv, count, type, MPI_SUM, comm);
    }
    return MPI_ERR_ARG;
}

/*
 * Time `iters` calls of one collective on `comm`, this rank's side.
 *
 * collective: 0 broadcast (sendbuf is the buffer, in place; recvbuf unused),
 * 1 gather (recvbuf: count * size elements, significant at the root only),
 * 2 allreduce (not in place, MPI_SUM).  dtype: 0 float32, 1 int32, 2 float64,
 * 3 int64, 4 uint8.  count: elements per rank.
 *
 * Runs `warmup` untimed calls, each after MPI_Barrier, then per timed
 * iteration: MPI_Barrier; t0 = MPI_Wtime(); collective; t1 = MPI_Wtime();
 * times_out[i] = t1 - t0 (seconds).  Nothing is filled or checked here: the
 * caller owns the buffers.  Returns MPI_SUCCESS, MPI_ERR_ARG / MPI_ERR_TYPE /
 * MPI_ERR_COUNT / MPI_ERR_ROOT for bad arguments (before any communication),
 * or the error code of a failed MPI call (when the communicator's error
 * handler returns errors, as mpi4py's does).
 */
int ddlcomm_cref_time(MPI_Comm comm, int collective, int dtype, void *sendbuf, void *recvbuf,
                      long long count, int root, int iters, int warmup, double *times_out)
{
    MPI_Datatype type = mpi_type(dtype);
    int size = 0, rc;
    if (collective < C_BROADCAST || collective > C_ALLREDUCE)
        return MPI_ERR_ARG;
    if (type == MPI_DATATYPE_NULL)
        return MPI_ERR_TYPE;
    if (count < 0 || count > INT_MAX)
        return MPI_ERR_COUNT;
    if (iters < 0 || warmup < 0 || (iters > 0 && times_out == NULL))
        return MPI_ERR_ARG;
    if ((rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return rc;
    if (root < 0 || root >= size)
        return MPI_ERR_ROOT;
    int n = (int)count;

    for (int w = 0; w < warmup; w++) {
        if ((rc = MPI_Barrier(comm)) != MPI_SUCCESS)
            return rc;
        if ((rc = call_once(collective, sendbuf, recvbuf, n, type, root, comm)) != MPI_SUCCESS)
            return rc;
    }
    for (int it = 0; it < iters; it++) {
        if ((rc = MPI_Barrier(comm)) != MPI_SUCCESS)
            return rc;
        double t0 = MPI_Wtime();
        rc = call_once(collective, sendbuf, recvbuf, n, type, root, comm);
        double t1 = MPI_Wtime();
        if (rc != MPI_SUCCESS)
            return rc;
        times_out[it] = t1 - t0;
    }
    return MPI_SUCCESS;
}

#ifndef DDLCOMM_CREF_LIB
/* ============================================================ program */

#define MAX_SIZES 256
#define HUGE_ALIGN ((size_t)2 << 20)
#define SENTINEL 0xFF

/* Indexed by enum coll and enum dtype (the program offers the first two dtypes). */
static const char *const COLL_NAMES[] = {"broadcast", "gather", "allreduce"};
static const char *const DTYPE_NAMES[] = {"float32", "int32"};

enum memory { M_PAGEABLE, M_HUGEPAGE };
static const char *const MEMORY_NAMES[] = {"pageable", "hugepage"};

static const char *const THREAD_NAMES[] = {"single", "funneled", "serialized", "multiple"};
static const int THREAD_LEVELS[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED,
                                    MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};

struct options {
    enum coll coll;
    enum dtype dtype;
    enum memory memory;
    int thread;                /* index into THREAD_NAMES */
    long long sizes[MAX_SIZES];
    int nsizes;
    long long iters;
    long long warmup;
};

/* ------------------------------------------------------------ arguments */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ddlcomm_cref --collective allreduce|broadcast|gather "
            "--dtype float32|int32 --bytes N [--bytes M ...] --iters N --warmup N "
            "[--memory pageable|hugepage] [--thread single|funneled|serialized|multiple]\n");
}

static void bad_arg(const char *msg, const char *value)
{
    if (value)
        fprintf(stderr, "ddlcomm_cref: %s: %s\n", msg, value);
    else
        fprintf(stderr, "ddlcomm_cref: %s\n", msg);
    usage(stderr);
    exit(2);
}

static int pick(const char *value, const char *const *names, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (strcmp(value, names[i]) == 0)
            return i;
    char msg[64];
    snprintf(msg, sizeof msg, "unknown %s", what);
    bad_arg(msg, value);
    return -1;
}

static long long parse_int(const char *value, const char *what, long long minimum)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0') {
        char msg[64];
        snprintf(msg, sizeof msg, "%s must be a whole number", what);
        bad_arg(msg, value);
    }
    if (v < minimum) {
        char msg[64];
        snprintf(msg, sizeof msg, "%s must be at least %lld", what, minimum);
        bad_arg(msg, value);
    }
    return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
    int have_coll = 0, have_dtype = 0, have_iters = 0, have_warmup = 0;
    memset(o, 0, sizeof *o);
    o->memory = M_PAGEABLE;
    o->thread = 1; /* funneled, as ddlcomm's mpi backend */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (a[0] != '-' || a[1] != '-')
            bad_arg("unexpected argument", a);
        if (i + 1 >= argc)
            bad_arg("option needs a value", a);
        const char *v = argv[++i];
        if (strcmp(a, "--collective") == 0) {
            o->coll = (enum coll)pick(v, COLL_NAMES, 3, "collective");
            have_coll = 1;
        } else if (strcmp(a, "--dtype") == 0) {
            o->dtype = (enum dtype)pick(v, DTYPE_NAMES, 2, "dtype");
            have_dtype = 1;
        } else if (strcmp(a, "--memory") == 0) {
            o->memory = (enum memory)pick(v, MEMORY_NAMES, 2, "memory kind");
        } else if (strcmp(a, "--thread") == 0) {
            o->thread = pick(v, THREAD_NAMES, 4, "thread level");
        } else if (strcmp(a, "--bytes") == 0) {
            if (o->nsizes == MAX_SIZES)
                bad_arg("too many --bytes (at most 256)", v);
            o->sizes[o->nsizes++] = parse_int(v, "--bytes", 0);
        } else if (strcmp(a, "--iters") == 0) {
            o->iters = parse_int(v, "--iters", 1);
            have_iters = 1;
        } else if (strcmp(a, "--warmup") == 0) {
            o->warmup = parse_int(v, "--warmup", 0);
            have_warmup = 1;
        } else {
            bad_arg("unknown option", a);
        }
    }
    if (!have_coll)
        bad_arg("missing --collective", NULL);
    if (!have_dtype)
        bad_arg("missing --dtype", NULL);
    if (o->nsizes == 0)
        bad_arg("missing --bytes", NULL);
    if (!have_iters)
        bad_arg("missing --iters", NULL);
    if (!have_warmup)
        bad_arg("missing --warmup", NULL);
    if (o->iters > INT_MAX)
        bad_arg("--iters is too large (at most INT_MAX)", NULL);
    if (o->warmup > INT_MAX)
        bad_arg("--warmup is too large (at most INT_MAX)", NULL);
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] / 4 > INT_MAX)
            bad_arg("--bytes gives more than INT_MAX elements", NULL);
}

/* ------------------------------------------------------------ memory */

struct buffer {
    void *data;   /* aligned start, what MPI sees */
    void *base;   /* what to free / munmap */
    size_t mapped;
    enum memory kind;
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void die(const char *what)
{
    fprintf(stderr, "ddlcomm_cref: %s\n", what);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static struct buffer alloc_buffer(size_t nbytes, enum memory kind)
{
    struct buffer b = {NULL, NULL, 0, kind};
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = round_up(nbytes ? nbytes : 1, page);
    if (kind == M_HUGEPAGE) {
        len = round_up(len, HUGE_ALIGN);
        b.mapped = len + HUGE_ALIGN;
        void *p = mmap(NULL, b.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            die("mmap failed (out of memory?)");
        b.base = p;
        b.data = (void *)round_up((uintptr_t)p, HUGE_ALIGN);
        madvise(b.data, len, MADV_HUGEPAGE); /* a hint: fine if THP is off */
    } else {
        void *p = NULL;
        if (posix_memalign(&p, page, len) != 0)
            die("posix_memalign failed (out of memory?)");
        b.base = b.data = p;
        madvise(b.data, len, MADV_NOHUGEPAGE);
    }
    return b;
}

static void free_buffer(struct buffer *b)
{
    if (b->kind == M_HUGEPAGE)
        munmap(b->base, b->mapped);
    else
        free(b->base);
    b->base = b->data = NULL;
}

/* ------------------------------------------------------------ data */

static int value_at(size_t i, int rank) { return 1 + (int)(((long long)(i % 11) + 3LL * rank) % 23); }

static void fill(void *buf, enum dtype dt, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++) {
        if (dt == D_FLOAT32)
            ((float *)buf)[i] = (float)value_at(i, rank);
        else
            ((int32_t *)buf)[i] = value_at(i, rank);
    }
}

/* Values are small integers, so float32 sums are exact: compare exactly. */
static int matches(const void *buf, enum dtype dt, size_t i, long long want)
{
    if (dt == D_FLOAT32)
        return ((const float *)buf)[i] == (float)want;
    return ((const int32_t *)buf)[i] == (int32_t)want;
}

static int verify(enum coll c, const void *recv, enum dtype dt, size_t count, int rank, int p)
{
    switch (c) {
    case C_BROADCAST:
        for (size_t i = 0; i < count; i++)
            if (!matches(recv, dt, i, value_at(i, 0)))
                return 0;
        return 1;
    case C_GATHER:
        if (rank != 0)
            return 1;
        for (int r = 0; r < p; r++)
            for (size_t i = 0; i < count; i++)
                if (!matches(recv, dt, (size_t)r * count + i, value_at(i, r)))
                    return 0;
        return 1;
    case C_ALLREDUCE:
        for (size_t i = 0; i < count; i++) {
            long long sum = 0;
            for (int r = 0; r < p; r++)
                sum += value_at(i, r);
            if (!matches(recv, dt, i, sum))
                return 0;
        }
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ one point */

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (n >= 1), as NumPy's 50th percentile (the middle two averaged);
 * sorts a copy in scratch. */
static double median(const double *v, int n, double *scratch)
{
    memcpy(scratch, v, (size_t)n * sizeof *scratch);
    qsort(scratch, (size_t)n, sizeof *scratch, by_value);
    return n % 2 ? scratch[n / 2] : 0.5 * (scratch[n / 2 - 1] + scratch[n / 2]);
}

static void print_us_list(const double *v, long long n)
{
    putchar('[');
    for (long long i = 0; i < n; i++)
        printf(i ? ",%.4f" : "%.4f", v[i] * 1e6);
    putchar(']');
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void run_point(const struct options *o, long long nbytes, MPI_Comm comm, int rank, int p,
                      const char *library, int thread_provided)
{
    size_t item = 4;
    size_t count = (size_t)(nbytes / (long long)item);
    size_t msg = count * item;
    int iters = (int)o->iters;
    void *send = NULL, *recv = NULL;  /* recv: broadcast: same as send; gather: NULL off the root */

    struct buffer sendb = alloc_buffer(msg, o->memory);
    struct buffer recvb = {NULL, NULL, 0, o->memory};
    send = sendb.data;
    size_t recv_bytes = 0;
    if (o->coll == C_ALLREDUCE)
        recv_bytes = msg;
    else if (o->coll == C_GATHER && rank == 0)
        recv_bytes = msg * (size_t)p;
    if (o->coll == C_BROADCAST) {
        recv = send;
    } else if (o->coll == C_ALLREDUCE || rank == 0) {
        recvb = alloc_buffer(recv_bytes, o->memory);
        recv = recvb.data;
    }

    double *times = malloc((size_t)iters * sizeof *times);
    double *all = rank == 0 ? malloc((size_t)iters * (size_t)p * sizeof *all) : NULL;
    if (!times || (rank == 0 && !all))
        die("out of memory for the timings");

    /* fill and clear (touches every page before timing), one checked call
     * (barrier first, as every call), then warm-up and timed calls */
    if (o->coll == C_BROADCAST && rank != 0)
        memset(send, SENTINEL, msg);
    else
        fill(send, o->dtype, count, rank);
    if (recvb.data)
        memset(recv, SENTINEL, recv_bytes);
    if (ddlcomm_cref_time(comm, o->coll, o->dtype, send, recv, (long long)count, 0, 1, 0,
                          times) != MPI_SUCCESS)
        die("the checked call failed");
    int ok = verify(o->coll, recv, o->dtype, count, rank, p), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);

    if (ddlcomm_cref_time(comm, o->coll, o->dtype, send, recv, (long long)count, 0, iters,
                          (int)o->warmup, times) != MPI_SUCCESS)
        die("the timed calls failed");
    MPI_Gather(times, iters, MPI_DOUBLE, all, iters, MPI_DOUBLE, 0, comm);

    if (rank == 0) {
        double *rank_avg = malloc((size_t)p * sizeof *rank_avg);
        double *rank_p50 = malloc((size_t)p * sizeof *rank_p50);
        double *iter_max = malloc((size_t)iters * sizeof *iter_max);
        if (!rank_avg || !rank_p50 || !iter_max)
            die("out of memory for the summary");
        for (int r = 0; r < p; r++)
            rank_p50[r] = median(all + (size_t)r * iters, iters, iter_max); /* as scratch */
        for (int r = 0; r < p; r++) {
            double s = 0.0;
            for (int it = 0; it < iters; it++)
                s += all[(size_t)r * iters + it];
            rank_avg[r] = s / iters;
        }
        for (int it = 0; it < iters; it++) {
            double m = all[it];
            for (int r = 1; r < p; r++)
                if (all[(size_t)r * iters + it] > m)
                    m = all[(size_t)r * iters + it];
            iter_max[it] = m;
        }
        printf("{\"impl\":\"c\",\"collective\":\"%s\",\"dtype\":\"%s\",\"bytes\":%lld,"
               "\"count\":%zu,\"ranks\":%d,\"iterations\":%d,\"warmup\":%lld,"
               "\"memory\":\"%s\",\"thread_level\":\"%s\",\"mpi_library\":",
               COLL_NAMES[o->coll], DTYPE_NAMES[o->dtype], nbytes, count, p, iters,
               o->warmup, MEMORY_NAMES[o->memory], THREAD_NAMES[thread_provided]);
        json_string(library);
        printf(",\"check\":\"%s\",\"rank_avg_us\":", all_ok ? "passed" : "failed");
        print_us_list(rank_avg, p);
        printf(",\"rank_p50_us\":");
        print_us_list(rank_p50, p);
        printf(",\"iter_max_us\":");
        print_us_list(iter_max, iters);
        printf("}\n");
        fflush(stdout);
        free(rank_avg);
        free(rank_p50);
        free(iter_max);
    }
    free(times);
    free(all);
    free_buffer(&sendb);
    if (recvb.data)
        free_buffer(&recvb);
}

int main(int argc, char **argv)
{
    struct options o;
    parse_args(argc, argv, &o); /* before MPI_Init: bad args exit 2 without MPI */

    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, THREAD_LEVELS[o.thread], &provided);
    int provided_index = 0;
    for (int i = 0; i < 4; i++)
        if (THREAD_LEVELS[i] == provided)
            provided_index = i;

    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int rank, p;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &p);

    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(library, &len);
    library[strcspn(library, "\n")] = '\0'; /* first line only */

    for (int i = 0; i < o.nsizes; i++)
        run_point(&o, o.sizes[i], comm, rank, p, library, provided_index);

    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
#endif /* !DDLCOMM_CREF_LIB */
