/* The value packers both C files of tfonspark.wire._pack share (_pack.c: a column at a time;
 * _fill_frame.c: a frame row by row): one number, one row's value, one array, and the checks that
 * decide whether a value packs as the pure-Python packer would. Defined here, static, so that
 * each file's loops inline them as one file's did.
 *
 * Safety: as _pack.c says; none of these runs Python code.
 */
#ifndef TFOS_PACK_H
#define TFOS_PACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

_Static_assert(sizeof(double) == 8 && sizeof(long long) == 8, "float64 and int64 are 8 bytes");

/* numpy.float64, once a value of it was seen (a static type: it lives as long as the process);
 * defined in _pack.c. */
extern PyTypeObject *tfos_float64_type;

/* A float whose stored value is what float() gives and numpy reads: an exact float, or a
 * numpy.float64 (numpy's own C type, a float subclass storing its value as a float does). Any
 * other subclass may override __float__ (numpy calls it; the stored value is not it), or look
 * like a sequence to numpy: 0, the caller falls back. */
static inline int
plain_float(PyObject *v)
{
    PyTypeObject *type = Py_TYPE(v);

    if (type == &PyFloat_Type || type == tfos_float64_type) {
        return 1;
    }
    if (tfos_float64_type == NULL && PyFloat_Check(v) && !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
        strcmp(type->tp_name, "numpy.float64") == 0) {
        tfos_float64_type = type; /* a class made in Python is a heap type, whatever its name */
        return 1;
    }
    return 0;
}

/* pack_number's cases other than an exact float for "d" (kept out of line: the loop stays small). */
static int
pack_other(PyObject *v, int as_double, char *dst)
{
    int overflow = 0;
    long long i;
    double d;

    if (PyFloat_Check(v)) { /* numpy.float64: its value, as struct/numpy read it; other subclasses fall back */
        if (!as_double || !plain_float(v)) {
            return -1;
        }
        d = PyFloat_AS_DOUBLE(v);
        memcpy(dst, &d, sizeof d);
        return 0;
    }
    if (!PyLong_CheckExact(v) && !PyBool_Check(v)) { /* other int subclasses may override __float__ */
        return -1;
    }
    i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (i == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (as_double) {
        d = PyLong_AsDouble(v); /* correctly rounded, as numpy and struct convert it */
        memcpy(dst, &d, sizeof d);
    }
    else {
        memcpy(dst, &i, sizeof i);
    }
    return 0;
}

/* One number as a double (code "d") or an int64 (code "q") into dst; -1 to fall back. */
static inline int
pack_number(PyObject *v, int as_double, char *dst)
{
    if (as_double && PyFloat_CheckExact(v)) { /* the common case */
        double d = PyFloat_AS_DOUBLE(v);
        memcpy(dst, &d, sizeof d);
        return 0;
    }
    return pack_other(v, as_double, dst);
}

/* The value of one row: the row itself, or its item `field`; NULL to fall back. */
static PyObject *
value_of(PyObject *row, PyObject *rowtype, Py_ssize_t fields, Py_ssize_t field)
{
    if (field < 0) {
        return row;
    }
    if ((PyObject *)Py_TYPE(row) != rowtype) {
        return NULL;
    }
    if (PyList_Check(row)) {
        return PyList_GET_SIZE(row) == fields ? PyList_GET_ITEM(row, field) : NULL;
    }
    if (PyTuple_Check(row)) {
        return PyTuple_GET_SIZE(row) == fields ? PyTuple_GET_ITEM(row, field) : NULL;
    }
    return NULL;
}

/* One value into dst: a number (width 0), or an exact list/tuple of `width` numbers; -1 to fall back. */
static int
pack_numbers(PyObject *value, Py_ssize_t width, int as_double, char *dst)
{
    if (width == 0) {
        return pack_number(value, as_double, dst);
    }
    if ((!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) || PySequence_Fast_GET_SIZE(value) != width) {
        return -1;
    }
    PyObject **numbers = PySequence_Fast_ITEMS(value);
    for (Py_ssize_t i = 0; i < width; i++) {
        if (pack_number(numbers[i], as_double, dst + i * 8) < 0) {
            return -1;
        }
    }
    return 0;
}

/* One column to pack: numbers (pack_column's) or arrays (pack_arrays'), and its buffer. */
#define MAX_DIMS 64 /* numpy's most */

typedef struct {
    Py_ssize_t field, width, rowbytes, ndim;
    int arrays, as_double;
    PyObject *valuetype, *arraytype;
    const char *fmt;
    Py_ssize_t dims[MAX_DIMS];
    Py_buffer out;
} colspec;

/* An array value's bytes into dst if it is exactly like the spec's; -1 (nothing counts) if not. */
static int
copy_like(PyObject *value, const colspec *c, char *dst)
{
    Py_buffer view;
    int same;

    if ((PyObject *)Py_TYPE(value) != c->arraytype) {
        return -1;
    }
    if (PyObject_GetBuffer(value, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear(); /* e.g. a strided view */
        return -1;
    }
    same = view.len == c->rowbytes && view.ndim == c->ndim && strcmp(view.format ? view.format : "B", c->fmt) == 0;
    for (Py_ssize_t d = 0; same && d < c->ndim; d++) {
        same = view.shape[d] == c->dims[d];
    }
    if (same) {
        memcpy(dst, view.buf, (size_t)c->rowbytes);
    }
    PyBuffer_Release(&view);
    return same ? 0 : -1;
}

/* numpy's dtype for a non-empty exact list or tuple of exact floats (and numpy.float64s) and
 * exact ints within int64: 1 float64 (any float), 0 int64, -1 anything else (bools, other types,
 * float subclasses, bigger ints, nesting, empty: numpy decides). Reads no more than it must. */
static int
sequence_code(PyObject *value)
{
    int any_float = 0;

    if ((!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) || PySequence_Fast_GET_SIZE(value) == 0) {
        return -1;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
    PyObject **items = PySequence_Fast_ITEMS(value);
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *v = items[i];
        if (plain_float(v)) {
            any_float = 1;
            continue;
        }
        int overflow = 0;
        if (!PyLong_CheckExact(v)) {
            return -1;
        }
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
    }
    return any_float;
}

/* fill_frame (_fill_frame.c), in _pack.c's method table. */
PyObject *tfos_fill_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* TFOS_PACK_H */
