/* ddlcomm.kernels._reduce: out = a (op) b in one pass, SIMD where the CPU has it.
 *
 *     r = Reducer("sum", "float16", "avx512")   # op, dtype, ISA (default: the best)
 *     r(a, b, out)                              # any C-contiguous buffers, equal sizes
 *
 * Ops: sum, prod, min, max.  Dtypes: float32, float64, int32, int64, uint8,
 * float16, bfloat16.  ISAs, each a superset of the one before:
 *
 *   portable    plain C (loops_portable.h), any CPU
 *   avx2        AVX2 + F16C (loops_x86.h)
 *   avx512      AVX-512F (+ the AVX2 loops for uint8, as byte ops need AVX512BW)
 *   avx512bf16  avx512, with bfloat16 rounded by VCVTNE2PS2BF16
 *
 * Every loop is compiled with its own target attribute; at import the module
 * asks the CPU (__builtin_cpu_supports, CPUID) which ISAs it can run, and the
 * Python layer picks the best of them unless DDLCOMM_KERNEL_ISA says otherwise.
 * All ISAs give bit-identical results (NaN payloads aside).
 *
 * Arguments come through the buffer protocol (PyBUF_SIMPLE: NumPy arrays,
 * including bfloat16 ones whose format a memoryview cannot express, mpi4py's
 * raw buffers in MPI user operations, bytearrays ...), read as the reducer's
 * dtype.  out may be a or b; any other overlap is refused.  The GIL is released
 * around loops of at least GIL_RELEASE_BYTES.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* -DDDLCOMM_NO_SIMD builds the portable loops only, as on a CPU or compiler without x86 SIMD. */
#if !defined(DDLCOMM_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && \
    ((defined(__clang__) && __clang_major__ >= 8) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 7))
#define DDL_X86 1
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define DDL_HAVE_AVX512BF16_INTRINSICS 1
#else
#define DDL_HAVE_AVX512BF16_INTRINSICS 0
#endif
#else
#define DDL_X86 0
#define DDL_HAVE_AVX512BF16_INTRINSICS 0
#endif

#include "loops_portable.h"
#if DDL_X86
#include <cpuid.h>
#include "loops_x86.h"
#endif

/* The name of the capsule that hands a Reducer's loop to other C code (ddlcomm.comm._shmpipe). */
#define LOOP_CAPSULE "ddlcomm.kernels._reduce.loop"

/* Below this many bytes a loop is shorter than releasing and taking the GIL. */
#define GIL_RELEASE_BYTES 16384

enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, N_OPS };
static const char *const OP_NAMES[N_OPS] = {"sum", "prod", "min", "max"};

enum { DT_F32, DT_F64, DT_I32, DT_I64, DT_U8, DT_F16, DT_BF16, N_DTYPES };
static const char *const DT_NAMES[N_DTYPES] = {
    "float32", "float64", "int32", "int64", "uint8", "float16", "bfloat16"};
static const Py_ssize_t DT_SIZES[N_DTYPES] = {4, 8, 4, 8, 1, 2, 2};

enum { ISA_PORTABLE, ISA_AVX2, ISA_AVX512, ISA_AVX512BF16, N_ISAS };
static const char *const ISA_NAMES[N_ISAS] = {"portable", "avx2", "avx512", "avx512bf16"};

static ddl_loop LOOPS[N_ISAS][N_DTYPES][N_OPS];
static int ISA_OK[N_ISAS];                 /* this build and this CPU can run it */
static int CPU_AVX2, CPU_F16C, CPU_AVX512F, CPU_AVX512BF16;

#define SET_ROW(ISA, DT, SFX, LEVEL)                                             \
    do {                                                                          \
        LOOPS[ISA][DT][OP_SUM] = sum_##SFX##_##LEVEL;                             \
        LOOPS[ISA][DT][OP_PROD] = prod_##SFX##_##LEVEL;                           \
        LOOPS[ISA][DT][OP_MIN] = min_##SFX##_##LEVEL;                             \
        LOOPS[ISA][DT][OP_MAX] = max_##SFX##_##LEVEL;                             \
    } while (0)

static void detect_and_fill(void)
{
    SET_ROW(ISA_PORTABLE, DT_F32, f32, portable);
    SET_ROW(ISA_PORTABLE, DT_F64, f64, portable);
    SET_ROW(ISA_PORTABLE, DT_I32, i32, portable);
    SET_ROW(ISA_PORTABLE, DT_I64, i64, portable);
    SET_ROW(ISA_PORTABLE, DT_U8, u8, portable);
    SET_ROW(ISA_PORTABLE, DT_F16, f16, portable);
    SET_ROW(ISA_PORTABLE, DT_BF16, bf16, portable);
    ISA_OK[ISA_PORTABLE] = 1;
#if DDL_X86
    {
        unsigned eax, ebx, ecx, edx;
        __builtin_cpu_init();
        /* __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV) */
        CPU_AVX2 = __builtin_cpu_supports("avx2") != 0;
        CPU_AVX512F = __builtin_cpu_supports("avx512f") != 0;
        CPU_F16C = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
        if (__get_cpuid_max(0, NULL) >= 7) {
            __cpuid_count(7, 1, eax, ebx, ecx, edx);
            CPU_AVX512BF16 = CPU_AVX512F && ((eax >> 5) & 1u);
        }
    }
    SET_ROW(ISA_AVX2, DT_F32, f32, avx2);
    SET_ROW(ISA_AVX2, DT_F64, f64, avx2);
    SET_ROW(ISA_AVX2, DT_I32, i32, avx2);
    SET_ROW(ISA_AVX2, DT_I64, i64, avx2);
    SET_ROW(ISA_AVX2, DT_U8, u8, avx2);
    SET_ROW(ISA_AVX2, DT_F16, f16, avx2);
    SET_ROW(ISA_AVX2, DT_BF16, bf16, avx2);
    ISA_OK[ISA_AVX2] = CPU_AVX2 && CPU_F16C;

    SET_ROW(ISA_AVX512, DT_F32, f32, avx512);
    SET_ROW(ISA_AVX512, DT_F64, f64, avx512);
    SET_ROW(ISA_AVX512, DT_I32, i32, avx512);
    SET_ROW(ISA_AVX512, DT_I64, i64, avx512);
    SET_ROW(ISA_AVX512, DT_U8, u8, avx2);
    SET_ROW(ISA_AVX512, DT_F16, f16, avx512);
    SET_ROW(ISA_AVX512, DT_BF16, bf16, avx512);
    ISA_OK[ISA_AVX512] = ISA_OK[ISA_AVX2] && CPU_AVX512F;

    memcpy(LOOPS[ISA_AVX512BF16], LOOPS[ISA_AVX512], sizeof LOOPS[ISA_AVX512]);
#if DDL_HAVE_AVX512BF16_INTRINSICS
    SET_ROW(ISA_AVX512BF16, DT_BF16, bf16, bf16insn);
    ISA_OK[ISA_AVX512BF16] = ISA_OK[ISA_AVX512] && CPU_AVX512BF16;
#endif
#endif /* DDL_X86 */
}

static int index_of(const char *const *names, int count, PyObject *name, const char *what)
{
    const char *s;
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(name)->tp_name);
        return -1;
    }
    s = PyUnicode_AsUTF8(name);
    if (s == NULL)
        return -1;
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "unknown %s %R", what, name);
    return -1;
}

/* ================================================================ Reducer */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    ddl_loop loop;
    Py_ssize_t itemsize;
    int op, dtype, isa;
} ReducerObject;

static int overlaps_partly(const Py_buffer *x, const Py_buffer *out)
{
    const char *p = (const char *)x->buf, *q = (const char *)out->buf;
    return p != q && p < q + out->len && q < p + x->len;
}

static PyObject *reducer_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames)
{
    ReducerObject *self = (ReducerObject *)self_;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), n;
    Py_buffer va, vb, vo;
    const char *bad = NULL;

    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a reducer takes three positional arguments: (a, b, out)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &va, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&va);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &vo, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&va);
        PyBuffer_Release(&vb);
        return NULL;
    }
    if (va.len != vo.len || vb.len != vo.len)
        bad = "a, b and out must have the same size in bytes";
    else if (vo.len % self->itemsize != 0)
        bad = "the buffers' size is not a multiple of the dtype's item size";
    else if ((va.itemsize != 1 && va.itemsize != self->itemsize) ||
             (vb.itemsize != 1 && vb.itemsize != self->itemsize) ||
             (vo.itemsize != 1 && vo.itemsize != self->itemsize))
        bad = "an array's item size does not match the reducer's dtype";
    else if (overlaps_partly(&va, &vo) || overlaps_partly(&vb, &vo))
        bad = "out overlaps a or b without being the same memory";
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "%s reducer (%s): %s (sizes %zd, %zd, %zd bytes)",
                     DT_NAMES[self->dtype], OP_NAMES[self->op], bad, va.len, vb.len, vo.len);
    } else {
        n = vo.len / self->itemsize;
        if (vo.len >= GIL_RELEASE_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            self->loop(va.buf, vb.buf, vo.buf, (size_t)n);
            Py_END_ALLOW_THREADS
        } else if (n > 0) {
            self->loop(va.buf, vb.buf, vo.buf, (size_t)n);
        }
    }
    PyBuffer_Release(&va);
    PyBuffer_Release(&vb);
    PyBuffer_Release(&vo);
    if (bad != NULL)
        return NULL;
    Py_RETURN_NONE;
}

static int best_isa(void)
{
    int best = ISA_PORTABLE;
    for (int i = 0; i < N_ISAS; i++)
        if (ISA_OK[i])
            best = i;
    return best;
}

static PyObject *reducer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"op", "dtype", "isa", NULL};
    PyObject *op_name, *dtype_name, *isa_name = Py_None;
    int op, dtype, isa;
    ReducerObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:Reducer", kwlist, &op_name, &dtype_name,
                                     &isa_name))
        return NULL;
    if ((op = index_of(OP_NAMES, N_OPS, op_name, "op")) < 0 ||
        (dtype = index_of(DT_NAMES, N_DTYPES, dtype_name, "dtype")) < 0)
        return NULL;
    if (isa_name == Py_None) {
        isa = best_isa();
    } else {
        if ((isa = index_of(ISA_NAMES, N_ISAS, isa_name, "ISA")) < 0)
            return NULL;
        if (!ISA_OK[isa]) {
            PyErr_Format(PyExc_ValueError, "this CPU (or this build) cannot run ISA %R", isa_name);
            return NULL;
        }
    }
    self = (ReducerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = reducer_vectorcall;
    self->loop = LOOPS[isa][dtype][op];
    self->itemsize = DT_SIZES[dtype];
    self->op = op;
    self->dtype = dtype;
    self->isa = isa;
    return (PyObject *)self;
}

static PyObject *reducer_repr(PyObject *self_)
{
    ReducerObject *self = (ReducerObject *)self_;
    return PyUnicode_FromFormat("<ddlcomm C reducer %s %s %s>", OP_NAMES[self->op],
                                DT_NAMES[self->dtype], ISA_NAMES[self->isa]);
}

static PyObject *get_op(PyObject *self, void *c) { return PyUnicode_FromString(OP_NAMES[((ReducerObject *)self)->op]); }
static PyObject *get_dtype(PyObject *self, void *c) { return PyUnicode_FromString(DT_NAMES[((ReducerObject *)self)->dtype]); }
static PyObject *get_isa(PyObject *self, void *c) { return PyUnicode_FromString(ISA_NAMES[((ReducerObject *)self)->isa]); }
static PyObject *get_itemsize(PyObject *self, void *c) { return PyLong_FromSsize_t(((ReducerObject *)self)->itemsize); }
static PyObject *get_loop(PyObject *self, void *c)
{
    return PyCapsule_New((void *)((ReducerObject *)self)->loop, LOOP_CAPSULE, NULL);
}

static PyGetSetDef reducer_getset[] = {
    {"op", get_op, NULL, "the reduction: sum, prod, min or max", NULL},
    {"dtype", get_dtype, NULL, "the element type the buffers are read as", NULL},
    {"isa", get_isa, NULL, "the instruction set its loop uses", NULL},
    {"itemsize", get_itemsize, NULL, "bytes per element of its dtype", NULL},
    {"loop", get_loop, NULL, "its loop for other C code: a capsule named " LOOP_CAPSULE
     " holding void (*)(const void *a, const void *b, void *out, size_t n)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ddlcomm.kernels._reduce.Reducer",
    .tp_basicsize = sizeof(ReducerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Reducer(op, dtype, isa=None): a callable f(a, b, out) computing out = a (op) b.",
    .tp_new = reducer_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ReducerObject, vectorcall),
    .tp_repr = reducer_repr,
    .tp_getset = reducer_getset,
};

/* ================================================================ module */
static PyObject *names_tuple(const char *const *names, int count, const int *keep)
{
    PyObject *t = PyTuple_New(0), *item;
    for (int i = 0; t != NULL && i < count; i++) {
        if (keep != NULL && !keep[i])
            continue;
        item = PyUnicode_FromString(names[i]);
        if (item == NULL || _PyTuple_Resize(&t, PyTuple_GET_SIZE(t) + 1) < 0) {
            Py_XDECREF(item);
            Py_XDECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, PyTuple_GET_SIZE(t) - 1, item);
    }
    return t;
}

static PyObject *supported_isas(PyObject *m, PyObject *unused)
{
    return names_tuple(ISA_NAMES, N_ISAS, ISA_OK);
}

static PyObject *cpu_features(PyObject *m, PyObject *unused)
{
    return Py_BuildValue("{sOsOsOsOsO}", "avx2", CPU_AVX2 ? Py_True : Py_False,
                         "f16c", CPU_F16C ? Py_True : Py_False,
                         "avx512f", CPU_AVX512F ? Py_True : Py_False,
                         "avx512bf16", CPU_AVX512BF16 ? Py_True : Py_False,
                         "avx512bf16_compiled", DDL_HAVE_AVX512BF16_INTRINSICS ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"supported_isas", supported_isas, METH_NOARGS,
     "The ISAs this CPU and build can run, weakest first (always starts with 'portable')."},
    {"cpu_features", cpu_features, METH_NOARGS,
     "The CPU features this build detects and uses (all False in a build without x86 SIMD loops)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_reduce",
    "Compiled SIMD reductions out = a (op) b; see ddlcomm.kernels.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__reduce(void)
{
    PyObject *m;
    detect_and_fill();
    if (PyType_Ready(&ReducerType) < 0)
        return NULL;
    m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ReducerType);
    if (PyModule_AddObject(m, "Reducer", (PyObject *)&ReducerType) < 0 ||
        PyModule_AddObject(m, "OPS", names_tuple(OP_NAMES, N_OPS, NULL)) < 0 ||
        PyModule_AddObject(m, "DTYPES", names_tuple(DT_NAMES, N_DTYPES, NULL)) < 0 ||
        PyModule_AddObject(m, "ISAS", names_tuple(ISA_NAMES, N_ISAS, NULL)) < 0 ||
        PyModule_AddIntConstant(m, "GIL_RELEASE_BYTES", GIL_RELEASE_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
