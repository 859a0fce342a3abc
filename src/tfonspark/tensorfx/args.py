"""``ModelArguments``: a model's hyper-parameters, parsed from the command line.

TensorFX's ``ModelArguments`` in TF 2 terms. A model subclasses it and adds its own arguments
by extending :meth:`ModelArguments.build_parser` through ``super().build_parser()``; parsed
values become attributes (``args.learning_rate``). Parsing never exits the process: an unknown
argument, a value of the wrong type or one that :meth:`ModelArguments.process` refuses raises
:class:`~tfonspark.errors.ConfigError` naming the argument, so a driver can report it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar

from ..errors import ConfigError

__all__ = ["ArgumentParser", "ModelArguments"]

_Args = TypeVar("_Args", bound="ModelArguments")


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser that raises ConfigError instead of printing usage and exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """argparse calls this for unknown or missing arguments: a ConfigError, never SystemExit."""
        raise ConfigError(f"{self.prog}: {message}")


class ModelArguments:
    """A model's arguments: the base parser's (batch, epochs, learning rate ...) and a subclass's.

    Parameters
    ----------
    **kwargs : Any
        The parsed values; each becomes an attribute.

    Examples
    --------
    >>> class MyArgs(ModelArguments):
    ...     @classmethod
    ...     def build_parser(cls):
    ...         parser = super().build_parser()
    ...         parser.add_argument("--hidden", type=int, default=64)
    ...         return parser
    >>> args = MyArgs.parse(["--hidden", "32", "--learning-rate", "0.01"])
    >>> args.hidden, args.learning_rate
    (32, 0.01)
    """

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        """Only for mypy: attributes come from the parser (``args.learning_rate``)."""
        raise AttributeError(f"{type(self).__name__} has no argument {name!r}")

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({values})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        """The argument parser; subclasses add theirs to ``super().build_parser()``'s.

        Returns
        -------
        argparse.ArgumentParser
            A parser (:class:`ArgumentParser`) holding the standard training arguments.

        Examples
        --------
        >>> sorted(a.dest for a in ModelArguments.build_parser()._actions if a.dest != "help")[:3]
        ['batch_size', 'checkpoint_every_steps', 'epochs']
        """
        parser = ArgumentParser(prog=cls.__name__, description=cls.__doc__)
        parser.add_argument("--batch-size", type=int, default=64, help="global batch size (default: 64)")
        parser.add_argument("--epochs", type=int, default=1, help="passes over the training data (default: 1)")
        parser.add_argument(
            "--steps-per-epoch", type=int, default=None, help="steps per epoch (required with a Spark feed)"
        )
        parser.add_argument("--learning-rate", type=float, default=1e-3, help="learning rate (default: 0.001)")
        parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        parser.add_argument(
            "--checkpoint-every-steps", type=int, default=None, help="steps between checkpoints (default: 100)"
        )
        parser.add_argument("--log-every-steps", type=int, default=100, help="steps between summaries (default: 100)")
        return parser

    @classmethod
    def default(cls: type[_Args]) -> _Args:
        """The arguments with their default values.

        Returns
        -------
        ModelArguments
            An instance of ``cls``, processed.

        Examples
        --------
        >>> ModelArguments.default().epochs
        1
        """
        parsed: _Args = cls.parse([])
        return parsed

    @classmethod
    def parse(cls: type[_Args], args: Sequence[str] | None = None, parse_job: bool = False) -> Any:
        """Parse ``args`` (default: the process's arguments), then :meth:`process` them.

        Parameters
        ----------
        args : sequence of str, optional
            The arguments; ``sys.argv[1:]`` when None.
        parse_job : bool
            Also parse the job's standard ``--job-dir`` (the training output path) and return it.

        Returns
        -------
        ModelArguments or tuple
            The arguments, or ``(arguments, job_dir)`` with ``parse_job``.

        Raises
        ------
        ConfigError
            For an unknown argument, an ill-typed value or one :meth:`process` refuses, naming it.

        Examples
        --------
        >>> args, job_dir = ModelArguments.parse(["--epochs", "3", "--job-dir", "/tmp/job"], parse_job=True)
        >>> args.epochs, job_dir
        (3, '/tmp/job')
        """
        parser = cls.build_parser()
        if parse_job:
            parser.add_argument("--job-dir", required=True, help="where the job writes its output")
        argv = list(sys.argv[1:] if args is None else args)
        try:
            namespace = parser.parse_args(argv)
        except argparse.ArgumentError as err:
            raise ConfigError(f"{cls.__name__}: argument {err.argument_name}: {err.message}") from err
        values = vars(namespace)
        job_dir = values.pop("job_dir", None)
        parsed = cls(**values)
        parsed.process()
        return (parsed, job_dir) if parse_job else parsed

    def process(self) -> None:
        """Check the parsed values and derive any others; subclasses extend it (call super).

        Raises
        ------
        ConfigError
            Naming the argument whose value is out of range.

        Examples
        --------
        >>> ModelArguments(batch_size=0).process()
        Traceback (most recent call last):
        ...
        tfonspark.errors.ConfigError: ModelArguments: --batch-size must be >= 1. Received: 0
        """
        for name in ("batch_size", "epochs", "steps_per_epoch", "checkpoint_every_steps"):
            value = vars(self).get(name)
            if value is not None and value < 1:
                self.fail(name, "must be >= 1", value)
        rate = vars(self).get("learning_rate")
        if rate is not None and not rate > 0:
            self.fail("learning_rate", "must be > 0", rate)

    def fail(self, name: str, problem: str, value: Any) -> NoReturn:
        """Raise the ConfigError :meth:`process` raises for argument ``name`` (its ``dest``).

        Parameters
        ----------
        name : str
            The argument's attribute name (``learning_rate``), shown as ``--learning-rate``.
        problem : str
            What is wrong (``"must be > 0"``).
        value : Any
            The value received.

        Examples
        --------
        >>> ModelArguments().fail("hidden", "must be even", 3)
        Traceback (most recent call last):
        ...
        tfonspark.errors.ConfigError: ModelArguments: --hidden must be even. Received: 3
        """
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{type(self).__name__}: {flag} {problem}. Received: {value!r}")
