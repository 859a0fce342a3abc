"""tfonspark.tensorfx.ModelArguments: parsing into attributes, ConfigError (never SystemExit)."""

from __future__ import annotations

import argparse

import pytest

from tfonspark.errors import ConfigError
from tfonspark.tensorfx import ModelArguments


class HiddenArgs(ModelArguments):
    """A subclass that adds an argument and checks it."""

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        parser = super().build_parser()
        parser.add_argument("--hidden", type=int, default=8)
        return parser

    def process(self) -> None:
        super().process()
        if self.hidden % 2:
            self.fail("hidden", "must be even", self.hidden)
        self.width = self.hidden * 2


def test_parse_into_attributes_and_process() -> None:
    args = HiddenArgs.parse(["--hidden", "4", "--learning-rate", "0.5", "--epochs", "2"])
    assert (args.hidden, args.width, args.learning_rate, args.epochs, args.batch_size) == (4, 8, 0.5, 2, 64)
    assert HiddenArgs.default() == HiddenArgs.parse([])
    assert HiddenArgs.default().hidden == 8


def test_parse_job_returns_the_job_dir() -> None:
    args, job_dir = HiddenArgs.parse(["--job-dir", "/out", "--hidden", "2"], parse_job=True)
    assert (args.hidden, job_dir) == (2, "/out")
    assert not hasattr(args, "job_dir")


def test_parse_defaults_to_the_process_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["prog", "--batch-size", "7"])
    assert ModelArguments.parse().batch_size == 7


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--nope", "1"], "--nope"),
        (["--epochs", "x"], "--epochs"),
        (["--learning-rate", "fast"], "--learning-rate"),
        (["--epochs"], "--epochs"),
        (["--epochs", "0"], "--epochs"),
        (["--learning-rate", "-1"], "--learning-rate"),
        (["--hidden", "3"], "--hidden"),
    ],
)
def test_bad_arguments_raise_config_error_naming_them(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        HiddenArgs.parse(argv)
    assert "HiddenArgs" in str(info.value)


def test_parse_job_requires_job_dir_without_exiting() -> None:
    with pytest.raises(ConfigError, match="--job-dir"):
        ModelArguments.parse([], parse_job=True)


def test_unknown_attribute_and_pickle() -> None:
    import pickle

    args = ModelArguments.default()
    with pytest.raises(AttributeError, match="no argument 'nope'"):
        _ = args.nope
    assert pickle.loads(pickle.dumps(args)) == args
