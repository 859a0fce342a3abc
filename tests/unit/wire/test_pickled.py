"""Pickled row batches read as columns (wire/pickled.py) equal the unpickled rows packed by
``pack_rows``, or are refused (None) so that the row path decides; the feeder's use of them.
The last tests fuzz the reader with mutated batches (their notes below)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfonspark.errors import InputError
from tfonspark.executor.feedbatches import decoded_batches, row_batches
from tfonspark.wire.packing import pack_rows
from tfonspark.wire.pickled import PickledRows

rng = np.random.default_rng(7)


def floats(n: int) -> list[float]:
    return rng.random(n).tolist()


RECOGNISED = {
    "mnist (list, label)": lambda n: [(floats(784), i % 10) for i in range(n)],
    "(tuple, label)": lambda n: [(tuple(floats(32)), i % 10) for i in range(n)],
    "[list, float]": lambda n: [[floats(5), float(i)] for i in range(n)],
    "bare floats": lambda n: [float(i) for i in range(n)],
    "bare small ints": lambda n: [i % 200 for i in range(n)],
    "3 scalars": lambda n: [(1.5, i % 7, float(i)) for i in range(n)],
    "5 fields, MARK tuple": lambda n: [(1.5, i % 7, 2.5, 3, floats(3)) for i in range(n)],
    "lists over 1000 values": lambda n: [(floats(2500), 1) for _ in range(n)],
    "exactly 1000 values": lambda n: [(floats(1000),) for _ in range(n)],
    "ints 0-255": lambda n: [(list(range(i % 50, i % 50 + 200)), 1) for i in range(n)],
    "ints 256-65535": lambda n: [(list(range(300, 900)), i % 9) for i in range(n)],
    "negative ints": lambda n: [(list(range(-15, -5)), 1) for _ in range(n)],
    "bare list rows": lambda n: [floats(5) for _ in range(n)],
    "nested tuples": lambda n: [((float(i), 2.0), (i % 3 + 1, 4)) for i in range(n)],
    "nan and inf": lambda n: [(float("nan"), float("inf"), -0.0) for _ in range(n)],
}

REFUSED = {
    "floats and ints in one list": [([1.0, 2], 1) for _ in range(3)],
    "ints of two widths in one list": [(list(range(250, 260)), 1) for _ in range(3)],
    "labels of two widths": [([1.0], i) for i in range(250, 260)],
    "None": [([1.0, None], 1) for _ in range(3)],
    "bool": [([1.0, 2.0], True) for _ in range(3)],
    "str": [([1.0, 2.0], "a") for _ in range(3)],
    "ragged": [([1.0, 2.0], 1), ([1.0, 2.0, 3.0], 1)],
    "dicts": [{"a": 1.0} for _ in range(3)],
    "numpy scalars": [np.float64(1.0) for _ in range(3)],
    "numpy rows": [np.arange(3.0) for _ in range(3)],
    "more than 64 columns": [floats(100) for _ in range(3)],
    "nested lists": [([[1.0]], 1) for _ in range(3)],
    "empty lists": [([], 1) for _ in range(3)],
    "ints beyond 32 bits": [(2**40, 1.0) for _ in range(3)],
}


def assert_same(got: Any, rows: list[Any]) -> None:
    want = pack_rows(rows)
    assert got.layout == want.layout
    assert len(got.columns) == len(want.columns)
    for a, b in zip(got.columns, want.columns):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert np.array_equal(a, b, equal_nan=True)
    assert got.kinds == want.kinds  # next_batch gives lists and tuples back as fed
    if not any(isinstance(v, float) and v != v for r in rows for v in (r if isinstance(r, (list, tuple)) else [r])):
        assert got.rows(as_fed=True) == rows


@pytest.mark.parametrize("n", [1, 1000, 2001])  # the pickler groups a list's items by 1,000
@pytest.mark.parametrize("case", sorted(RECOGNISED))
def test_a_recognised_batch_decodes_to_what_pack_rows_makes(case, n):
    if max(map(len, map(pickle.dumps, RECOGNISED[case](1)))) > 1000 and n > 1:
        n = 30  # large rows: a few suffice
    rows = RECOGNISED[case](n)
    got = PickledRows().decode(pickle.dumps(rows, 5))
    assert got is not None, case
    assert_same(got, rows)


def test_protocol_4_is_read_and_older_protocols_are_refused():
    rows = RECOGNISED["mnist (list, label)"](3)
    assert_same(PickledRows().decode(pickle.dumps(rows, 4)), rows)
    assert PickledRows().decode(pickle.dumps(rows, 3)) is None
    assert PickledRows().decode(pickle.dumps(rows, 2)) is None


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_is_not_recognised_is_refused(case):
    assert PickledRows().decode(pickle.dumps(REFUSED[case], 5)) is None


def test_a_shared_object_is_a_memo_reference_and_refused():
    shared = [1.0, 2.0]
    assert PickledRows().decode(pickle.dumps([(shared, 1), (shared, 2)], 5)) is None


def test_the_layout_is_kept_between_batches_and_relearned_when_it_changes():
    decoder = PickledRows()
    for rows in (
        RECOGNISED["mnist (list, label)"](16),
        RECOGNISED["mnist (list, label)"](3),
        RECOGNISED["(tuple, label)"](50),  # another layout: learned anew
        RECOGNISED["mnist (list, label)"](1),
    ):
        assert_same(decoder.decode(pickle.dumps(rows, 5)), rows)


# ---- the feeder over pickled batches --------------------------------------------------------------


def blobs_of(rows: list[Any], per_batch: int) -> list[bytes]:
    return [pickle.dumps(rows[i : i + per_batch], 5) for i in range(0, len(rows), per_batch)]


def joined(batches: Any) -> list[list[np.ndarray]]:
    """Each batch's columns, copied (scratch memory is reused by the next batch)."""
    return [[np.array(c) for c in b.columns] for b in batches]


def test_pickled_batches_deliver_every_row_in_order_in_large_frames():
    rows = RECOGNISED["mnist (list, label)"](1000)
    batches = joined(decoded_batches(3, iter(blobs_of(rows, 16))))
    features = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert np.array_equal(features, np.array([r[0] for r in rows]))
    assert labels.tolist() == [r[1] for r in rows]
    assert len(batches) == 2  # ~4 MB frames, not one per 16-row pickle


def test_from_the_first_unrecognised_batch_rows_are_unpickled_and_packed():
    rows = [(floats(4), i % 10) for i in range(256)] + [(floats(4), "x") for _ in range(64)]
    from_pickles = joined(decoded_batches(0, iter(blobs_of(rows, 64))))
    labels = [v for b in from_pickles for v in (b[1].tolist() if isinstance(b[1], np.ndarray) else b[1])]
    assert labels == [r[1] for r in rows]


def test_a_ragged_row_is_named_as_the_row_path_names_it():
    rows = [(floats(4), 1) for _ in range(300)]
    rows[257] = (floats(3), 1)
    with pytest.raises(InputError) as by_rows:
        list(row_batches(5, iter(rows)))
    with pytest.raises(InputError) as by_pickles:
        list(decoded_batches(5, iter(blobs_of(rows, 64))))
    assert "partition=5, row=257" in str(by_pickles.value)
    assert str(by_pickles.value) == str(by_rows.value)


def test_unrecognised_partitions_feed_what_the_row_path_feeds():
    rows = [{"x": i, "y": [i, i]} for i in range(500)]
    want = joined(row_batches(0, iter(rows)))
    got = joined(decoded_batches(0, iter(blobs_of(rows, 100))))
    for a, b in zip(zip(*got), zip(*want), strict=True):
        assert np.array_equal(np.concatenate(a), np.concatenate(b))


# ---- from test_pickled_fuzz.py ----------------------------------------------------------------------
# Mutated Spark-style pickled batches through the pickled-batch reader (``wire/pickled.py``).
#
# Every batch must either give exactly the rows ``pickle.loads`` gives (the reader's columns equal
# what the row path packs from them), or be refused so that the feed falls back to unpickling and
# raises what ``pickle.loads`` raises. Nothing may hang: each case runs under its own deadline in a
# child process (which also refuses every ``find_class``, so a mutated pickle can import nothing,
# and caps its address space, so a mutated memo index cannot make it allocate gigabytes).
#
# Run by hand for the figures: ``python tests/unit/wire/test_pickled.py [seed] [cases]``.


ROOT = Path(__file__).resolve().parents[3]


SEED = 20260521


CASES = 12_000


CASE_SECONDS = 5.0  # one case takes ~1 ms; a loop without progress is caught here


MAX_HANGS = 3  # after this many the run stops (each one costs CASE_SECONDS)


def _rows(rng: random.Random, shape: str, n: int) -> list[Any]:
    def floats(k: int) -> list[float]:
        return [rng.random() for _ in range(k)]

    if shape == "mnist (list, label)":
        return [(floats(784), rng.randrange(10)) for _ in range(n)]
    if shape == "mnist (tuple, label)":
        return [(tuple(floats(784)), rng.randrange(10)) for _ in range(n)]
    if shape == "32 floats (list, label)":
        return [(floats(32), rng.randrange(10)) for _ in range(n)]
    if shape == "32 floats (tuple, label)":
        return [(tuple(floats(32)), rng.randrange(10)) for _ in range(n)]
    if shape == "32 floats (list, float label)":
        return [(floats(32), float(rng.randrange(10))) for _ in range(n)]
    if shape == "[label, *32 floats]":
        return [[float(rng.randrange(10)), *floats(32)] for _ in range(n)]
    if shape == "numpy (array, label)":
        return [(np.array(floats(32)), rng.randrange(10)) for _ in range(n)]
    if shape == "numpy rows":
        return [np.array(floats(32)) for _ in range(n)]
    raise AssertionError(shape)


SHAPES = {  # shape -> rows per batch (PySpark's auto-batching doubles 1, 2, 4, ...)
    "mnist (list, label)": (1, 2, 3, 4),
    "mnist (tuple, label)": (1, 2, 3),
    "32 floats (list, label)": (1, 2, 5, 16, 64),
    "32 floats (tuple, label)": (1, 3, 16, 64),
    "32 floats (list, float label)": (1, 8, 32),
    "[label, *32 floats]": (1, 8, 32),
    "numpy (array, label)": (1, 4),
    "numpy rows": (1, 4),
}


def corpus(rng: random.Random) -> list[bytes]:
    out = []
    for shape, sizes in SHAPES.items():
        for n in sizes:
            for _ in range(3):
                out.append(pickle.dumps(_rows(rng, shape, n), pickle.HIGHEST_PROTOCOL))
    # a batch over the pickler's 64 KiB frame size (several frames) and one over 1,000 rows
    out.append(pickle.dumps(_rows(rng, "mnist (list, label)", 12), pickle.HIGHEST_PROTOCOL))
    out.append(pickle.dumps(_rows(rng, "32 floats (list, label)", 1100), pickle.HIGHEST_PROTOCOL))
    return out


_OPCODES = b"]\x94(eat\x85\x86\x87GKMJ.\x95N\x88\x89q"


def _flip(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    b[rng.randrange(len(b))] = rng.randrange(256)


def _opcode(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    b[rng.randrange(len(b))] = rng.choice(_OPCODES)


def _truncate(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    """Cut the batch short, keeping (usually) its closing APPENDS/APPEND and STOP."""
    tail = bytes(b[-2:]) if rng.random() < 0.8 else b""
    del b[rng.randrange(2, len(b)) :]
    b += tail


def _delete(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    at = rng.randrange(len(b))
    del b[at : at + rng.choice((1, 1, 2, 8, 9, 10, rng.randrange(1, 64)))]


def _insert(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    at = rng.randrange(len(b) + 1)
    b[at:at] = bytes(
        rng.choice(_OPCODES) if rng.random() < 0.5 else rng.randrange(256) for _ in range(rng.randrange(1, 10))
    )


def _duplicate(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    at, size = rng.randrange(len(b)), rng.randrange(1, 400)
    b[at:at] = b[at : at + size]


def _splice(rng: random.Random, b: bytearray, others: list[bytes]) -> None:
    other = rng.choice(others)
    b[rng.randrange(len(b)) :] = other[rng.randrange(len(other)) :]


def _frame_size(rng: random.Random, b: bytearray, _: list[bytes]) -> None:
    """Change a FRAME header's length (the first frame's, or a later one's if there are any)."""
    frames = [i for i in range(2, len(b) - 9) if b[i] == 0x95] or [2]
    at = rng.choice(frames) + 1
    size = int.from_bytes(b[at : at + 8], "little")
    size = max(0, size + rng.choice((-9, -1, 1, 9, rng.randrange(-size - 1, 64))))
    b[at : at + 8] = size.to_bytes(8, "little")


MUTATIONS: list[Callable[[random.Random, bytearray, list[bytes]], None]] = [
    _flip,
    _flip,
    _opcode,
    _opcode,
    _truncate,
    _delete,
    _insert,
    _duplicate,
    _splice,
    _frame_size,
]


@functools.cache
def _opcode_stream(blob: bytes) -> bytes:
    """A well-formed pickle's opcodes after PROTO, with its frame headers taken out."""
    out, pos = bytearray(), 2
    while pos < len(blob):
        if blob[pos] != 0x95:
            out += blob[pos:]
            break
        size = int.from_bytes(blob[pos + 1 : pos + 9], "little")
        out += blob[pos + 9 : pos + 9 + size]
        pos += 9 + size
    return bytes(out)


def _framed(rng: random.Random, ops: bytes) -> bytes:
    """``ops`` as a protocol 5 pickle whose FRAME headers agree with what follows them (one
    frame, none, or several split anywhere, even inside an opcode's argument, where
    ``pickle.loads`` reads the header as part of the argument)."""
    how = rng.random()
    if how < 0.6:
        return b"\x80\x05\x95" + len(ops).to_bytes(8, "little") + ops
    if how < 0.75:
        return b"\x80\x05" + ops
    cuts = sorted({0, *(rng.randrange(len(ops) + 1) for _ in range(rng.randrange(1, 4))), len(ops)})
    parts = [ops[a:b] for a, b in itertools.pairwise(cuts)]
    return b"\x80\x05" + b"".join(b"\x95" + len(p).to_bytes(8, "little") + p for p in parts)


def mutate(rng: random.Random, blob: bytes, others: list[bytes]) -> bytes:
    """1-3 mutations of the batch: of its opcode stream, reframed so that the frames agree (most
    cases; a frame that disagrees is refused by both readers at once), or of its bytes as stored."""
    framed = rng.random() < 0.8
    b = bytearray(_opcode_stream(blob) if framed else blob)
    streams = [_opcode_stream(o) for o in others] if framed else others
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if len(b) < 4:
            break
        rng.choice(MUTATIONS)(rng, b, streams)
    return _framed(rng, bytes(b)) if framed else bytes(b)


class Mismatch(AssertionError):
    pass


def _columns(batches: Iterator[Any]) -> tuple[str, ...] | list[Any]:
    """The batches' rows as (layout, per-column dtype/shape/values), or the exception raised."""
    from tfonspark.errors import InputError

    try:
        # copies (scratch memory is reused); the layout with the containers the rows were fed as
        got = [((b.layout, b.kinds), [np.array(c) for c in b.columns]) for b in batches]
    except InputError as e:
        return ("raise", "InputError", str(e))
    except Exception as e:
        return ("raise", type(e).__name__)
    if not got:
        return []
    layouts = {layout for layout, _ in got}
    widths = {len(columns) for _, columns in got}
    if len(layouts) != 1 or len(widths) != 1:
        return [(layout, columns) for layout, columns in got]
    return [(layouts.pop(), [np.concatenate(parts) for parts in zip(*(columns for _, columns in got))])]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return a == b
    if len(a) != len(b):
        return False
    for (la, ca), (lb, cb) in zip(a, b):
        if la != lb or len(ca) != len(cb):
            return False
        for x, y in zip(ca, cb):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if x.dtype.kind == "O":
                if repr(x.tolist()) != repr(y.tolist()):
                    return False
            elif not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                return False
    return True


def check(blob: bytes, clean: bytes, primed: bool) -> str:
    """'fast' if the reader decoded ``blob`` (and matched ``pickle.loads``), else 'fallback'."""
    from tfonspark.executor.feedbatches import decoded_batches, row_batches
    from tfonspark.wire.packing import pack_rows
    from tfonspark.wire.pickled import PickledRows

    reader = PickledRows()
    if primed:  # the layout learned from a good batch is then checked against the mutated one
        reader.decode(clean)
    got = reader.decode(blob)  # raises nothing, whatever the bytes
    try:
        rows: Any = pickle.loads(blob, encoding="bytes")
        loads_error = None
    except Exception as e:
        loads_error = type(e).__name__
    if got is not None:
        if loads_error is not None:
            raise Mismatch(f"decoded, but pickle.loads raises {loads_error}")
        if not isinstance(rows, list) or len(rows) != got.count:
            raise Mismatch(f"decoded {got.count} rows, pickle.loads gives {type(rows).__name__}")
        want = pack_rows(rows)
        if not _same([((got.layout, got.kinds), got.columns)], [((want.layout, want.kinds), want.columns)]):
            raise Mismatch("decoded columns differ from pickle.loads' rows")
        if repr(got.rows(as_fed=True)) != repr(rows):  # repr: NaN == NaN, -0.0 != 0.0
            raise Mismatch("decoded rows, given back as fed, differ from pickle.loads' rows")

    # the product path, which falls back, against the row path over pickle.loads' rows
    def row_path() -> Iterator[Any]:
        return row_batches(0, itertools.chain.from_iterable(map(lambda b: pickle.loads(b, encoding="bytes"), [blob])))

    feed, reference = _columns(decoded_batches(0, iter([blob]))), _columns(row_path())
    if not _same(feed, reference):
        raise Mismatch(f"decoded_batches gives {_describe(feed)}, the row path {_describe(reference)}")
    return "fallback" if got is None else "fast"


def _describe(outcome: Any) -> str:
    if isinstance(outcome, tuple):
        return " ".join(outcome)
    return str([(layout, [(c.dtype.str, c.shape) for c in columns]) for layout, columns in outcome])


class Hang(BaseException):  # not an Exception: the checks that catch those let it through
    pass


def _refuse_globals(event: str, args: tuple[Any, ...]) -> None:
    """No mutated pickle may import anything; numpy's own reconstructors stay allowed."""
    if event == "pickle.find_class":
        module, name = args
        if (module, name) not in {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }:
            raise RuntimeError(f"find_class refused: {module}.{name}")


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang


def fuzz(seed: int, cases: int, blobs: list[bytes] | None = None) -> dict[str, Any]:
    """Run ``cases`` mutated batches (or the given ``blobs``, unmutated) with a deadline each."""
    import resource

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (768 << 20), resource.RLIM_INFINITY))
    sys.addaudithook(_refuse_globals)
    signal.signal(signal.SIGALRM, _on_alarm)
    rng = random.Random(seed)
    originals = corpus(rng)
    counts = {"cases": 0, "fast": 0, "fallback": 0, "loads_raises": 0, "primed": 0}
    hangs: list[str] = []
    mismatches: list[str] = []
    started = time.perf_counter()
    for i in range(len(blobs) if blobs is not None else cases):
        clean = rng.choice(originals)
        blob = blobs[i] if blobs is not None else mutate(rng, clean, originals)
        primed = blobs is None and rng.random() < 0.5
        signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
        try:
            kind = check(blob, clean, primed)
        except Hang:
            hangs.append(blob[:200].hex())
            if len(hangs) >= MAX_HANGS:
                break
            continue
        except Mismatch as e:
            mismatches.append(f"{e}: {blob[:200].hex()}")
            continue
        except Exception as e:  # the reader itself raised
            mismatches.append(f"{type(e).__name__}: {e}: {blob[:200].hex()}")
            continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        counts["cases"] += 1
        counts[kind] += 1
        counts["primed"] += primed
        try:
            pickle.loads(blob)
        except Exception:
            counts["loads_raises"] += 1
    return {
        **counts,
        "hangs": hangs,
        "mismatches": mismatches[:20],
        "mismatch_count": len(mismatches),
        "seconds": round(time.perf_counter() - started, 2),
    }


def run_child(args: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


CRAFTED = {
    # _Walk.numbers counted 0 numbers in a truncated float and never advanced (RSS grew ~20 MiB/s)
    "truncated float after two MARKs": b"\x80\x05]\x94((G\x00\x00\x00e.",
    # a row of 0 bytes: divmod by 0 in _groups
    "truncated float after a MARK": b"\x80\x05]\x94(G\x00\x00\x00e.",
    "truncated float, no MEMOIZE": b"\x80\x05](G\x00\x00\x00e.",
    "truncated int": b"\x80\x05]\x94(J\x00\x00e.",
    "truncated float, single row": b"\x80\x05]\x94G\x00\x00a.",
}


def test_crafted_batches_that_hung_or_raised_fall_back_to_pickle_loads():
    report = run_child(["--blobs", *(b.hex() for b in CRAFTED.values())], timeout=120)
    assert report["hangs"] == [], report
    assert report["mismatches"] == [], report
    assert report["cases"] == len(CRAFTED) and report["fallback"] == len(CRAFTED), report
    assert report["loads_raises"] == len(CRAFTED), report


def test_mutated_batches_give_pickle_loads_rows_or_its_error_and_never_hang():
    report = run_child([str(SEED), str(CASES)], timeout=600)
    print(json.dumps(report))
    assert report["hangs"] == [], report
    assert report["mismatch_count"] == 0, report
    assert report["cases"] == CASES, report
    # the corpus must exercise both paths, and the template-reuse path, substantially
    assert report["fast"] > CASES // 10 and report["fallback"] > CASES // 10, report
    assert report["primed"] > CASES // 4, report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--blobs"]:
        result = fuzz(0, 0, [bytes.fromhex(h) for h in sys.argv[2:]])
    else:
        result = fuzz(int(sys.argv[1]) if len(sys.argv) > 1 else SEED, int(sys.argv[2]) if len(sys.argv) > 2 else CASES)
    print(json.dumps(result))
