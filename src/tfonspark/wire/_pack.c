/* Optional accelerator for tfonspark.wire.codec: one column of rows of Python numbers, packed;
 * chunks of rows packed into a frame as they are pulled from an iterator (fill_frame, below);
 * and, for tfonspark.wire.framing, receive buffers that are not zero-filled first.
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
 * override __float__ or __index__ that numpy calls: plain_float below); a float for "q";
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

_Static_assert(sizeof(double) == 8 && sizeof(long long) == 8, "float64 and int64 are 8 bytes");

/* numpy.float64, once a value of it was seen (a static type: it lives as long as the process). */
static PyTypeObject *float64_type = NULL;

/* A float whose stored value is what float() gives and numpy reads: an exact float, or a
 * numpy.float64 (numpy's own C type, a float subclass storing its value as a float does). Any
 * other subclass may override __float__ (numpy calls it; the stored value is not it), or look
 * like a sequence to numpy: 0, the caller falls back. */
static inline int
plain_float(PyObject *v)
{
    PyTypeObject *type = Py_TYPE(v);

    if (type == &PyFloat_Type || type == float64_type) {
        return 1;
    }
    if (float64_type == NULL && PyFloat_Check(v) && !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
        strcmp(type->tp_name, "numpy.float64") == 0) {
        float64_type = type; /* a class made in Python is a heap type, whatever its name */
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

/* fill_frame(rows, rowtype, fields, names, specs, start, stop, size) -> (end, leftover)
 *
 * Chunks of `size` rows of a frame, packed row by row as rows come: pulls rows from the
 * iterator `rows` and packs each at once, while its objects are still in the CPU caches, into
 * rows start, start+1, ... of the columns' buffers, then drops it (Spark's own loop frees a row
 * as soon as it is used; a row kept longer is freed out of the caches). Stops at row `stop`,
 * when the iterator ends (leftover None), or at the first row it does not handle: leftover is
 * (that row,) (not packed: a row may be None), end its index. The caller then packs the rows
 * of that row's chunk (rebuilt from the columns: codec.rebuilt_rows), the row and the rest of
 * the chunk as one chunk, which decides it as before. Exceptions from the iterator (a user's
 * map function) propagate.
 *
 * Rows are handled exactly where pack_rows, given the chunk, would pack them into the specs'
 * columns, dtypes, shapes and kinds, so frames are the same as chunk by chunk:
 * - a chunk's first row (row r with r % size == 0) sets a chunk's layout there: it must be of
 *   exactly `rowtype` with `fields` items and, for a rowtype other than list and tuple
 *   (pyspark's Row), `__fields__` equal to `names` (None: none); a number exactly a float ("d")
 *   or an int ("q"); a list/tuple of numbers exactly of `valuetype`, of exact floats (or
 *   numpy.float64s) and exact ints within int64, with a float iff "d" (number_code's rule);
 *   an exception while reading `__fields__` propagates at once (the pure-Python packer reads
 *   them there too, with getattr, and raises it);
 * - every later row of a chunk is handled as pack_column/pack_arrays handle it.
 *
 *   specs  a tuple of column specs, one per column:
 *          (field, 0, width, code, valuetype, out): numbers; width 0: one a row
 *          (field, 1, fmt, shape, nbytes, arraytype, out): arrays of exactly `nbytes` bytes
 *          field -1: the row is the value itself
 *   out    a writable C-contiguous buffer of at least `stop` rows of the column
 *
 * Safety: Python code (the iterator, a Row's attributes, a row's deallocation) runs between
 * packings, never during one; the buffers stay exported (not resizable) for the whole call.
 */
static int
parse_numbers(PyObject *spec, colspec *c)
{
    PyObject *code = PyTuple_GET_ITEM(spec, 3);
    c->width = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    c->valuetype = PyTuple_GET_ITEM(spec, 4);
    if (c->width < 0 || c->width > PY_SSIZE_T_MAX / 8 || !PyUnicode_Check(code) ||
        (c->width > 0 && c->valuetype != (PyObject *)&PyList_Type && c->valuetype != (PyObject *)&PyTuple_Type)) {
        return -1;
    }
    if (PyUnicode_CompareWithASCIIString(code, "d") == 0) {
        c->as_double = 1;
    }
    else if (PyUnicode_CompareWithASCIIString(code, "q") != 0) {
        return -1;
    }
    c->rowbytes = (c->width > 0 ? c->width : 1) * 8;
    return 0;
}

static int
parse_arrays(PyObject *spec, colspec *c)
{
    c->arrays = 1;
    c->fmt = PyUnicode_Check(PyTuple_GET_ITEM(spec, 2)) ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 2)) : NULL;
    PyObject *shape = PyTuple_GET_ITEM(spec, 3);
    c->rowbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 4));
    c->arraytype = PyTuple_GET_ITEM(spec, 5);
    if (c->fmt == NULL || !PyTuple_Check(shape) || !PyType_Check(c->arraytype) || c->rowbytes <= 0 ||
        PyTuple_GET_SIZE(shape) < 1 || PyTuple_GET_SIZE(shape) > MAX_DIMS) {
        return -1;
    }
    c->ndim = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t d = 0; d < c->ndim; d++) {
        if ((c->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d))) < 0) {
            return -1;
        }
    }
    return 0;
}

/* One spec tuple into c, its buffer acquired (released by the caller when c->out.obj is set). */
static int
parse_spec(PyObject *spec, colspec *c, Py_ssize_t fields, Py_ssize_t stop)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2) {
        return -1;
    }
    c->field = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
    int bad = c->field >= fields || c->field < -1 || PyErr_Occurred();
    if (!bad && kind == 0 && PyTuple_GET_SIZE(spec) == 6) {
        bad = parse_numbers(spec, c) < 0;
    }
    else if (!bad && kind == 1 && PyTuple_GET_SIZE(spec) == 7) {
        bad = parse_arrays(spec, c) < 0;
    }
    else {
        bad = 1;
    }
    if (bad || PyErr_Occurred()) {
        return -1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, PyTuple_GET_SIZE(spec) - 1), &c->out,
                           PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    return stop <= c->out.len / c->rowbytes ? 0 : -1;
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

/* A chunk's first value gives pack_rows this column's dtype and kind (see fill_frame): 0, or -1. */
static int
sets_layout(PyObject *value, const colspec *c)
{
    if (c->width == 0) {
        return (c->as_double ? PyFloat_CheckExact(value) : PyLong_CheckExact(value)) ? 0 : -1;
    }
    return (PyObject *)Py_TYPE(value) == c->valuetype && sequence_code(value) == c->as_double ? 0 : -1;
}

/* One row's value of one column into row r of its buffer; -1 where the row is left over. */
static int
pack_value(PyObject *row, PyObject *rowtype, Py_ssize_t fields, const colspec *c, Py_ssize_t r, int first)
{
    PyObject *value = value_of(row, rowtype, fields, c->field);
    char *dst = (char *)c->out.buf + r * c->rowbytes;

    if (value == NULL) {
        return -1;
    }
    if (c->arrays) {
        return copy_like(value, c, dst);
    }
    if (first && sets_layout(value, c) < 0) {
        return -1;
    }
    return pack_numbers(value, c->width, c->as_double, dst);
}

/* A Row's field names are the frame's (rows of other tuple subclasses: getattr(row, "__fields__",
 * None) == names): 1, 0, or -1 with an exception set (reading them raised other than
 * AttributeError, as getattr(row, "__fields__", None) would: the caller stops there). */
static int
same_names(PyObject *row, PyObject *rowtype, PyObject *names)
{
    if (rowtype == (PyObject *)&PyTuple_Type || rowtype == (PyObject *)&PyList_Type || rowtype == Py_None) {
        return 1;
    }
    PyObject *fields = PyObject_GetAttrString(row, "__fields__");
    if (fields == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return names == Py_None;
    }
    int same = names != Py_None && PyList_CheckExact(fields) && PyObject_RichCompareBool(fields, names, Py_EQ) == 1;
    Py_DECREF(fields);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        same = 0;
    }
    return same;
}

typedef struct {
    PyObject *rowtype, *names;
    Py_ssize_t fields, ncols, size;
    colspec *cols;
} chunk;

/* Rows start.. into the columns; the index reached, *leftover the row not handled (or NULL);
 * -1 with an exception set where the iterator failed. */
static Py_ssize_t
fill_rows(PyObject *rows, const chunk *k, Py_ssize_t start, Py_ssize_t stop, PyObject **leftover)
{
    *leftover = NULL;
    for (Py_ssize_t r = start; r < stop; r++) {
        PyObject *row = PyIter_Next(rows);
        if (row == NULL) {
            return PyErr_Occurred() ? -1 : r;
        }
        int first = r % k->size == 0;
        /* not `!first || same_names(...)`: that makes same_names' -1 (an exception) a 1 */
        int ok = first ? same_names(row, k->rowtype, k->names) : 1;
        for (Py_ssize_t j = 0; ok == 1 && j < k->ncols; j++) {
            ok = pack_value(row, k->rowtype, k->fields, &k->cols[j], r, first) == 0;
        }
        if (ok == 0) {
            *leftover = row; /* the caller's reference now */
            return r;
        }
        Py_DECREF(row); /* packed: freed now, as Spark's own loop would */
        if (ok < 0) {
            return -1;
        }
    }
    return stop;
}

static PyObject *
fill_frame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *leftover = NULL, *result = NULL;
    chunk k = {0};
    Py_ssize_t start, stop, end;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "fill_frame(rows, rowtype, fields, names, specs, start, stop, size) takes 8 arguments");
        return NULL;
    }
    PyObject *rows = args[0], *specs = args[4];
    k.rowtype = args[1];
    k.names = args[3];
    k.fields = PyLong_AsSsize_t(args[2]);
    start = PyLong_AsSsize_t(args[5]);
    stop = PyLong_AsSsize_t(args[6]);
    k.size = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred() || !PyIter_Check(rows) || !PyTuple_Check(specs) || PyTuple_GET_SIZE(specs) == 0 ||
        (k.names != Py_None && !PyList_CheckExact(k.names)) || start < 0 || stop < start || k.fields < 0 ||
        k.size < 1 || start % k.size != 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "fill_frame: bad rows, fields, names, specs, start, stop or size");
        return NULL;
    }
    k.ncols = PyTuple_GET_SIZE(specs);
    if ((k.cols = PyMem_Calloc((size_t)k.ncols, sizeof *k.cols)) == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < k.ncols; j++) {
        if (parse_spec(PyTuple_GET_ITEM(specs, j), &k.cols[j], k.fields, stop) < 0 ||
            (k.cols[j].field >= 0 && !PyType_Check(k.rowtype))) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "fill_frame: bad spec %zd (or its buffer is too small)", j);
            }
            goto done;
        }
    }
    end = fill_rows(rows, &k, start, stop, &leftover);
    if (end >= 0) {
        /* (end, None) or (end, (row,)): a row may itself be None */
        result = leftover ? Py_BuildValue("(n(O))", end, leftover) : Py_BuildValue("(nO)", end, Py_None);
    }
done:
    Py_XDECREF(leftover);
    for (Py_ssize_t j = 0; j < k.ncols; j++) {
        if (k.cols[j].out.obj != NULL) {
            PyBuffer_Release(&k.cols[j].out);
        }
    }
    PyMem_Free(k.cols);
    return result;
}

/* number_code(value) -> "d", "q" or None: sequence_code's answer (above), the code of numpy's
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
    {"fill_frame", (PyCFunction)(void (*)(void))fill_frame, METH_FASTCALL,
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
