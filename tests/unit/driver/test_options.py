"""``driver/options.py``: ``ClusterOptions`` and ``RunOptions`` are one list of options.

Python's typing cannot derive a ``TypedDict`` (``run()``'s ``**options: Unpack[RunOptions]``) from
a dataclass, so the two are written out and this is the one check that they agree: the same
names in the same order, each of the same type, and nothing else in ``RunOptions`` than those
and the settings' keywords (``SettingKeywords``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TypedDict

from tfonspark.driver.options import ClusterOptions, RunOptions, SettingKeywords, split_options


def drift(options: type, keywords: type, settings: type) -> list[str]:
    """Where ``keywords`` (a TypedDict over ``settings``) differs from the dataclass ``options``."""
    fields = typing.get_type_hints(options)
    named = {k: v for k, v in typing.get_type_hints(keywords).items() if k not in typing.get_type_hints(settings)}
    out = [f"{name}: a field of {options.__name__}, not a key of {keywords.__name__}" for name in fields.keys() - named]
    out += [
        f"{name}: a key of {keywords.__name__}, not a field of {options.__name__}" for name in named.keys() - fields
    ]
    out += [
        f"{name}: {options.__name__} says {fields[name]}, {keywords.__name__} {named[name]}"
        for name in fields.keys() & named.keys()
        if fields[name] != named[name]
    ]
    if not out and [f.name for f in dataclasses.fields(options)] != list(named):
        out.append(f"the order differs: {list(named)}")
    return sorted(out)


def test_run_options_name_every_cluster_option_with_its_type():
    assert drift(ClusterOptions, RunOptions, SettingKeywords) == []


def test_the_check_finds_a_missing_an_extra_and_a_retyped_option():
    @dataclasses.dataclass(frozen=True)
    class Options:
        num_ps: int = 0
        tensorboard: bool = False
        coordinator: bool = False

    class Keywords(SettingKeywords, total=False):
        num_ps: str  # retyped
        tensorboard: bool
        max_restarts: int  # not an option

    assert drift(Options, Keywords, SettingKeywords) == [
        "coordinator: a field of Options, not a key of Keywords",
        "max_restarts: a key of Keywords, not a field of Options",
        "num_ps: Options says <class 'int'>, Keywords <class 'str'>",
    ]


def test_every_run_option_is_sorted_into_cluster_options():
    keywords = {name: object() for name in typing.get_type_hints(RunOptions)}
    options, settings = split_options(keywords)
    assert {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}.items() <= keywords.items()
    assert set(settings) == set(typing.get_type_hints(SettingKeywords))
    assert isinstance(RunOptions, type(TypedDict("Probe", {})))  # a TypedDict, as Unpack needs


def test_run_takes_data_service_on_as_a_keyword():
    options, _ = split_options({"data_service": 2, "data_service_on": "nodes"})
    assert options.data_service_on == "nodes" and ClusterOptions().data_service_on == "executors"


def test_run_takes_data_service_as_a_keyword():
    options, by_name = split_options({"data_service": 2, "heartbeat_timeout": 30})
    assert options.data_service == 2 and by_name == {"heartbeat_timeout": 30}
    assert ClusterOptions().data_service == 0


def test_coordinator_is_an_option_of_run_not_a_setting():
    options, by_name = split_options({"num_ps": 1, "coordinator": True, "heartbeat_timeout": 30})
    assert (options.coordinator, options.num_ps, by_name) == (True, 1, {"heartbeat_timeout": 30})
    assert ClusterOptions().coordinator is False
