/* fill_frame, of the optional C packer tfonspark.wire._pack (its module and column packers are in
 * _pack.c, the value packers both use in _pack.h): the rows of a frame packed one by one as the
 * feed task pulls them from Spark's iterator.
 */
#include "_pack.h"

/* fill_frame(rows, rowtype, fields, names, specs, start, stop, size) -> (end, leftover)
 *
 * Chunks of `size` rows of a frame, packed row by row as rows come: pulls rows from the
 * iterator `rows` and packs each at once, while its objects are still in the CPU caches, into
 * rows start, start+1, ... of the columns' buffers, then drops it (Spark's own loop frees a row
 * as soon as it is used; a row kept longer is freed out of the caches). Stops at row `stop`,
 * when the iterator ends (leftover None), or at the first row it does not handle: leftover is
 * (that row,) (not packed: a row may be None), end its index. The caller then packs the rows
 * of that row's chunk (rebuilt from the columns: packing.rebuilt_rows), the row and the rest of
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

PyObject *
tfos_fill_frame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
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
