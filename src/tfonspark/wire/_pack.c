/* Optional accelerator for tfonspark.wire.packing: one column of rows of Python numbers, packed;
 * chunks of rows packed into a frame as they are pulled from an iterator (fill_frame, in
 * _fill_frame.c); and, for tfonspark.wire.buffers, receive buffers that are not zero-filled
 * first. This file holds the column packers and the module; the value packers both files use
 * are in _pack.h.
 *
 * pack_column(out, rows, rowtype, fields, field, width, code) -> bool
 *   out      a writable C-contiguous buffer of at least len(rows) * max(width, 1) * 8 bytes
 *   rows     a list or tuple
 *   field    -1: each row is the value itself; else each row must be of exactly `rowtype` (a
 *            list, a tuple or a tuple subclass such as pyspark's Row) with `fields` items, and
 *            the value is its item `field`
 *   width    0: each value is one number; else an exact list or tuple of `width` numbers
 *   code     "d" (float64) or "q" (int64)
 *
 * Writes the values in native byte order, the bytes numpy/struct write for them, and returns
 * True. Returns False (what it wrote does not count) at the first thing it does not handle: a
 * row or value of another type or length; a number that is not an exact float, a numpy.float64,
 * an exact int or a bool (numpy.float32, str, None, a subclass of float or int, which may
 * override __float__ or __index__ that numpy calls: plain_float in _pack.h); a float for "q";
 * an int beyond int64. The caller then packs
 * the rows in pure Python, which gives the result or the error (with its row number), so
 * results and messages are the pure-Python ones. Bad arguments (a short or read-only buffer,
 * an unknown code) raise ValueError/TypeError.
 *
 * pack_arrays(out, rows, rowtype, fields, field, arraytype, fmt, shape) -> bool
 *   the same for a column of arrays: each value must be of exactly `arraytype` (numpy.ndarray),
 *   C-contiguous, with the buffer format `fmt` (a str) and the shape `shape` (a tuple of ints),
 *   as the first row's array; its bytes are copied as they are. False at the first value that
 *   is not (another type, dtype or shape, a strided view), where numpy decides.
 *
 * Safety: the GIL is held throughout and no Python code runs while the rows are read (floats,
 * exact ints and bools convert without calling back into Python), so no row can change under us;
 * items are borrowed from `rows`, which the caller keeps alive. Every write is inside the
 * buffer length checked up front.
 */
#include "_pack.h"

PyTypeObject *tfos_float64_type = NULL;

/* Pack every row's value into buf (the caller checked its size); 0, or -1 to fall back. */
static int
pack_all(char *buf, PyObject *rows, PyObject *rowtype, Py_ssize_t fields, Py_ssize_t field, Py_ssize_t width,
         int as_double)
{
    Py_ssize_t count = PySequence_Fast_GET_SIZE(rows);
    PyObject **items = PySequence_Fast_ITEMS(rows); /* fixed: no Python code runs below */

    for (Py_ssize_t r = 0; r < count; r++) {
        PyObject *value = value_of(items[r], rowtype, fields, field);
        if (value == NULL || pack_numbers(value, width, as_double, buf + r * (width > 0 ? width : 1) * 8) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
pack_column(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t fields, field, width;
    int as_double, failed;
    Py_buffer view;

    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "pack_column(out, rows, rowtype, fields, field, width, code) takes 7 arguments");
        return NULL;
    }
    PyObject *out = args[0], *rows = args[1], *rowtype = args[2], *code = args[6];
    if ((fields = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((field = PyLong_AsSsize_t(args[4])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((width = PyLong_AsSsize_t(args[5])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (width < 0 || width > PY_SSIZE_T_MAX / 8 || field >= fields || (field >= 0 && !PyType_Check(rowtype))) {
        PyErr_SetString(PyExc_ValueError, "pack_column: bad width, field or rowtype");
        return NULL;
    }
    if (!PyUnicode_Check(code) || (PyUnicode_CompareWithASCIIString(code, "d") != 0 &&
                                   PyUnicode_CompareWithASCIIString(code, "q") != 0)) {
        PyErr_SetString(PyExc_ValueError, "pack_column: code must be \"d\" or \"q\"");
        return NULL;
    }
    as_double = PyUnicode_CompareWithASCIIString(code, "d") == 0;
    if (!PyList_CheckExact(rows) && !PyTuple_CheckExact(rows)) {
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t per_row = (width > 0 ? width : 1) * 8;
    if (PySequence_Fast_GET_SIZE(rows) > view.len / per_row) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pack_column: buffer too small for the rows");
        return NULL;
    }
    failed = pack_all((char *)view.buf, rows, rowtype, fields, field, width, as_double);
    PyBuffer_Release(&view);
    if (failed) {
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyObject *
pack_arrays(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t fields, field, nbytes = 1;
    Py_buffer out;
    int failed = 0;
    colspec spec = {0};

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "pack_arrays(out, rows, rowtype, fields, field, arraytype, fmt, shape) takes 8 arguments");
        return NULL;
    }
    PyObject *rows = args[1], *rowtype = args[2], *arraytype = args[5], *shape = args[7];
    if ((fields = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((field = PyLong_AsSsize_t(args[4])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    const char *fmt = PyUnicode_Check(args[6]) ? PyUnicode_AsUTF8(args[6]) : NULL;
    if (fmt == NULL || !PyTuple_Check(shape) || !PyType_Check(arraytype) || field >= fields ||
        (field >= 0 && !PyType_Check(rowtype))) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "pack_arrays: bad fmt, shape, arraytype, field or rowtype");
        return NULL;
    }
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (size < 0 || (size > 0 && nbytes > PY_SSIZE_T_MAX / 16 / size)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "pack_arrays: bad shape");
            return NULL;
        }
        if (d < MAX_DIMS) {
            spec.dims[d] = size; /* converted once, not per row */
        }
        nbytes *= size;
    }
    if ((!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])) || PyTuple_GET_SIZE(shape) > MAX_DIMS) {
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(rows);
    PyObject **items = PySequence_Fast_ITEMS(rows);
    /* nbytes so far counts items; the first row's buffer gives the item size */
    Py_ssize_t itemsize = 0;
    if (count > 0) {
        PyObject *first = value_of(items[0], rowtype, fields, field);
        Py_buffer probe;
        if (first == NULL || (PyObject *)Py_TYPE(first) != arraytype ||
            PyObject_GetBuffer(first, &probe, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&out);
            Py_RETURN_FALSE;
        }
        itemsize = probe.itemsize;
        PyBuffer_Release(&probe);
    }
    if (itemsize > 16) { /* not a numeric dtype the caller asks for */
        PyBuffer_Release(&out);
        Py_RETURN_FALSE;
    }
    nbytes *= itemsize;
    if (nbytes > 0 && count > out.len / nbytes) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "pack_arrays: buffer too small for the rows");
        return NULL;
    }
    spec.arrays = 1;
    spec.fmt = fmt;
    spec.arraytype = arraytype;
    spec.ndim = PyTuple_GET_SIZE(shape);
    spec.rowbytes = nbytes;
    for (Py_ssize_t r = 0; r < count && !failed; r++) {
        PyObject *value = value_of(items[r], rowtype, fields, field);
        failed = value == NULL || copy_like(value, &spec, (char *)out.buf + r * nbytes) < 0;
    }
    PyBuffer_Release(&out);
    if (failed) {
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* number_code(value) -> "d", "q" or None: sequence_code's answer (_pack.h), the code of numpy's
 * dtype for a flat list or tuple of numbers; None where the caller asks numpy. */
static PyObject *
number_code(PyObject *Py_UNUSED(module), PyObject *value)
{
    int code = sequence_code(value);
    if (code < 0) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(code ? "d" : "q");
}

/* empty_bytearray(n): a bytearray of n bytes whose contents are not set (bytearray(n) zero-fills
 * them, a pass over fresh memory that a receive overwrites at once). The caller fills every byte
 * before anything reads them (framing._recv_exact does, or drops the buffer). */
static PyObject *
empty_bytearray(PyObject *self, PyObject *arg)
{
    Py_ssize_t size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "empty_bytearray: size must be >= 0");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, size);
}

static PyMethodDef methods[] = {
    {"empty_bytearray", empty_bytearray, METH_O,
     "empty_bytearray(n) -> bytearray of n bytes, contents not set: the caller overwrites them."},
    {"fill_frame", (PyCFunction)(void (*)(void))tfos_fill_frame, METH_FASTCALL,
     "fill_frame(rows, rowtype, fields, names, specs, start, stop, size) -> (end, leftover): chunks "
     "of rows pulled from an iterator, each packed at once; leftover: (the first row it does not handle,)."},
    {"number_code", number_code, METH_O,
     "number_code(value) -> 'd', 'q' or None: numpy's float64/int64 for a flat list/tuple of numbers."},
    {"pack_arrays", (PyCFunction)(void (*)(void))pack_arrays, METH_FASTCALL,
     "pack_arrays(out, rows, rowtype, fields, field, arraytype, fmt, shape) -> bool: one column of rows "
     "of equal C-contiguous arrays into out; False where numpy must decide."},
    {"pack_column", (PyCFunction)(void (*)(void))pack_column, METH_FASTCALL,
     "pack_column(out, rows, rowtype, fields, field, width, code) -> bool: one column of rows of "
     "floats/ints into out; False where the pure-Python packer must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pack", "C packing of rows of Python numbers (optional).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__pack(void)
{
    return PyModule_Create(&module);
}
