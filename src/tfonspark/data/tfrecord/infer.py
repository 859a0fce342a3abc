"""Schema inference: the DataFrame schema a set of serialized Examples asks for.

Stats per feature (kinds seen, always one value or not, all UTF-8 or not) are gathered per file
on executors (:func:`summarize_files`), merged on the driver (:meth:`FeatureStats.merge`) and
turned into a schema by the rules in :mod:`tfonspark.data.tfrecord`'s docstring
(:func:`schema_from_stats`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import types as T

from ...errors import ConfigError, DataFormatError
from .example import BYTES, FLOAT, INT64, parse_features
from .records import iter_file_records

__all__ = ["FeatureStats", "binary_set", "infer_schema", "schema_from_stats", "summarize_files", "summarize_record"]


@dataclass
class FeatureStats:
    """What the records seen so far say about one feature (merged across files on the driver)."""

    kinds: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # kind -> first seen
    scalar: bool = True  # exactly one value wherever present
    utf8: bool = True  # every bytes value decodes as UTF-8

    def merge(self, other: FeatureStats) -> None:
        """Fold ``other`` (from later files) into this one."""
        for kind, where in other.kinds.items():
            self.kinds.setdefault(kind, where)
        self.scalar = self.scalar and other.scalar
        self.utf8 = self.utf8 and other.utf8


def summarize_record(
    stats: dict[str, FeatureStats],
    data: bytes,
    binary: frozenset[str],
    path: str,
    offset: int | None,
) -> None:
    """Update ``stats`` with one serialized Example."""
    for name, feature in parse_features(data, path, offset).items():
        st = stats.get(name)
        if st is None:
            st = stats[name] = FeatureStats()
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else ()
        if kind and kind not in st.kinds:
            st.kinds[kind] = (path, offset)
        if len(values) != 1:
            st.scalar = False
        if kind == BYTES and st.utf8 and name not in binary:
            st.utf8 = all(_is_utf8(v) for v in values)


def _is_utf8(value: bytes) -> bool:
    """Whether ``value`` decodes as UTF-8."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def schema_from_stats(stats: dict[str, FeatureStats], binary: frozenset[str]) -> T.StructType:
    """The DataFrame schema the inference rules (module docstring) give for ``stats``."""
    fields = []
    for name in sorted(stats):
        st = stats[name]
        numeric = [k for k in (INT64, FLOAT) if k in st.kinds]
        if BYTES in st.kinds and numeric:
            path, offset = st.kinds[numeric[0]]
            raise DataFormatError(
                f"feature {name!r} is a bytes_list in some records and a {numeric[0]} in "
                "others; load it with an explicit schema or fix the data",
                path=path,
                offset=offset,
            )
        leaf: T.DataType
        if name in binary:
            if numeric:
                raise ConfigError(
                    f"binary_features names {name!r}, but that feature holds a {numeric[0]}. "
                    f"Received: binary_features={sorted(binary)}"
                )
            leaf = T.BinaryType()
        elif FLOAT in st.kinds:
            leaf = T.DoubleType()
        elif INT64 in st.kinds:
            leaf = T.LongType()
        else:
            leaf = T.StringType() if st.utf8 else T.BinaryType()
        fields.append(T.StructField(name, leaf if st.scalar else T.ArrayType(leaf, True), True))
    return T.StructType(fields)


def infer_schema(records: Iterable[bytes], binary_features: Sequence[str] = ()) -> T.StructType:
    """The DataFrame schema for serialized Examples, by the rules in this module's docstring."""
    binary = binary_set(binary_features)
    stats: dict[str, FeatureStats] = {}
    for index, data in enumerate(records):
        summarize_record(stats, data, binary, f"record {index}", None)
    return schema_from_stats(stats, binary)


def binary_set(binary_features: Sequence[str] | str | None) -> frozenset[str]:
    """``binary_features`` as a set, accepting one name as a plain string."""
    if binary_features is None:
        return frozenset()
    if isinstance(binary_features, str):
        return frozenset([binary_features])
    return frozenset(binary_features)


def summarize_files(uris: Iterable[str], *, binary: frozenset[str], limit: int | None) -> dict[str, FeatureStats]:
    """Stats over (the first ``limit`` records of) each file: the executor side of inference."""
    stats: dict[str, FeatureStats] = {}
    for uri in uris:
        for count, (offset, data) in enumerate(iter_file_records(uri)):
            if limit is not None and count >= limit:
                break
            summarize_record(stats, data, binary, uri, offset)
    return stats
