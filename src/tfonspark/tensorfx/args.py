"""``ModelArguments``: a model's hyper-parameters, parsed from the command line.

TensorFX's ``ModelArguments`` in TF 2 terms. A model subclasses it and adds its own arguments
by extending :meth:`ModelArguments.build_parser` through ``super().build_parser()``; parsed
values become attributes (``args.learning_rate``); a subclass that declares a base argument
again (``--learning-rate`` with its own default) re-declares it, and its default is the one
used. Parsing never exits the process: an unknown
argument, a value of the wrong type or one that :meth:`ModelArguments.process` refuses raises
:class:`~tfonspark.errors.ConfigError` naming the argument, so a driver can report it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar, cast

from ..errors import ConfigError

__all__ = ["ArgumentParser", "ModelArguments"]

_Args = TypeVar("_Args", bound="ModelArguments")
_Action = TypeVar("_Action", bound=argparse.Action)


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser that raises ConfigError instead of printing usage and exiting,
    and where a later declaration of an argument re-declares it rather than being shadowed.

    ``argparse`` keeps both actions of a dest declared twice and fills the default from the
    *first*: a subclass's ``parser.add_argument("--learning_rate", type=float, default=0.01)``
    left ``learning_rate`` at the base's 0.001 until the flag was given. Here a declaration
    whose dest (``learning_rate``) or flag (``--learning-rate``) is already declared, with the
    same kind of action, re-declares that argument: the default, help, choices and metavar it
    gives replace the earlier ones (``required`` too), its flags are added to the earlier
    ones, and one argument remains; what it does not give (``type=``, ``action=``) stays the
    earlier's. It may not change what the value is: a different type, action, ``nargs``,
    ``const`` or optional/positional kind, or a flag of another dest, is a ConfigError naming
    both declarations. A declaration of the same dest with another action
    class is an extra flag for that value (argparse's ``--verbose``/``--quiet`` idiom); giving
    it a ``default=`` other than the argument's is a ConfigError, since argparse would ignore it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        self._given: frozenset[str] | None = None  # the keywords of the add_argument call being handled
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """argparse calls this for unknown or missing arguments: a ConfigError, never SystemExit."""
        raise ConfigError(f"{self.prog}: {message}")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """``argparse``'s ``add_argument``; an argument already declared is re-declared (see the class)."""
        self._given = frozenset(kwargs)
        try:
            return super().add_argument(*args, **kwargs)
        finally:
            self._given = None

    def _add_action(self, action: _Action) -> _Action:
        """Add ``action``, or fold it into the argument it re-declares (argparse's hook)."""
        by_flag = {self._option_string_actions[f] for f in action.option_strings if f in self._option_string_actions}
        for other in by_flag:
            if other.dest != action.dest:
                raise ConfigError(
                    f"{self.prog}: {_flags(action)} (dest {action.dest!r}) uses {_shared(other, action)}, already "
                    f"the flag of argument {other.dest!r} ({_flags(other)}); a re-declaration keeps the "
                    "argument's dest, and a new argument needs flags of its own"
                )
        if len(by_flag) > 1:
            raise ConfigError(
                f"{self.prog}: {_flags(action)} names the flags of {len(by_flag)} arguments of "
                f"{action.dest!r} ({', '.join(sorted(_flags(a) for a in by_flag))}); re-declare one at a time"
            )
        same_dest = [a for a in self._actions if a.dest == action.dest and action.dest != argparse.SUPPRESS]
        earlier = next(iter(by_flag), None) or next((a for a in same_dest if type(a) is type(action)), None)
        if earlier is not None:
            self._redeclare(earlier, action)
            return cast(_Action, earlier)  # the argument now declared (argparse only keeps it)
        if same_dest and self._gave("default") and action.default is not None:
            first = same_dest[0]
            if action.default != first.default:
                raise ConfigError(
                    f"{self.prog}: {_flags(action)} sets argument {action.dest!r}, whose default is "
                    f"{first.default!r} ({_flags(first)}); argparse would ignore its default={action.default!r}. "
                    f"Re-declare {_flags(first)} with that default, or call set_defaults({action.dest}=...)"
                )
        return super()._add_action(action)

    def _gave(self, keyword: str) -> bool:
        """Whether the declaration being added gave ``keyword`` (any action added directly: all)."""
        return self._given is None or keyword in self._given

    def _redeclare(self, earlier: argparse.Action, action: argparse.Action) -> None:
        """Fold ``action`` into ``earlier``, the argument it re-declares, after checking it may.

        What the re-declaration does not give (its type, its action) stays the earlier's.
        """
        if self._gave("action") and type(earlier) is not type(action):
            raise ConfigError(
                f"{self.prog}: {_flags(action)} re-declares argument {earlier.dest!r} ({_flags(earlier)}) with "
                f"action {_kind(action)}; it is declared with action {_kind(earlier)}. {_MAY_CHANGE}"
            )
        for attribute in ("type", "nargs", "const"):
            was, now = getattr(earlier, attribute), getattr(action, attribute)
            if self._gave(attribute) and was != now:
                raise ConfigError(
                    f"{self.prog}: {_flags(action)} re-declares argument {earlier.dest!r} ({_flags(earlier)}) with "
                    f"{attribute} {_name(now)}; it is declared with {attribute} {_name(was)}. {_MAY_CHANGE}"
                )
        if bool(earlier.option_strings) != bool(action.option_strings):
            raise ConfigError(
                f"{self.prog}: {_flags(action)} re-declares argument {earlier.dest!r} ({_flags(earlier)}) as "
                f"{'an optional' if action.option_strings else 'a positional'} argument; it is declared as "
                f"{'an optional' if earlier.option_strings else 'a positional'} one. {_MAY_CHANGE}"
            )
        added = [flag for flag in action.option_strings if flag not in earlier.option_strings]
        earlier.option_strings = [*earlier.option_strings, *added]
        for flag in added:
            self._option_string_actions[flag] = earlier
        if self._gave("default"):
            earlier.default = action.default
        for attribute in ("help", "choices", "metavar", "required"):
            if self._gave(attribute):
                setattr(earlier, attribute, getattr(action, attribute))

    def parse_known_args(  # type: ignore[override]  # one signature for argparse's overloads
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """``argparse``'s, after checking that no argument is declared twice (e.g. in a group)."""
        seen: dict[tuple[str, type], argparse.Action] = {}
        for action in self._actions:
            key = (action.dest, type(action))
            if key in seen and action.dest != argparse.SUPPRESS:
                raise ConfigError(
                    f"{self.prog}: argument {action.dest!r} is declared twice ({_flags(seen[key])} and "
                    f"{_flags(action)}), so argparse would take the first one's default; re-declare an "
                    "argument with add_argument on the parser itself, not in an argument group"
                )
            seen[key] = action
        return super().parse_known_args(args, namespace)


_MAY_CHANGE = (
    "A re-declaration may change an argument's default, help, choices and metavar (and make it "
    "required), not what its value is (type, nargs, const, action): give a different argument a "
    "name of its own"
)


def _flags(action: argparse.Action) -> str:
    """How an argument is written: ``--learning-rate/--lr``, or the dest of a positional."""
    return "/".join(action.option_strings) or action.dest


def _shared(other: argparse.Action, action: argparse.Action) -> str:
    return "/".join(f for f in action.option_strings if f in other.option_strings)


def _kind(action: argparse.Action) -> str:
    return type(action).__name__


def _name(value: Any) -> str:
    """A type or value as a user reads it: ``float``, not ``<class 'float'>``."""
    return getattr(value, "__name__", None) or repr(value)


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

        A subclass changes a base argument's default by declaring it again
        (``parser.add_argument("--learning-rate", type=float, default=0.01)``, or ``--learning_rate``)
        or with ``parser.set_defaults(learning_rate=0.01)``: its default wins in :meth:`default`,
        ``parse([])`` and ``parse(args)``. A re-declaration keeps the type (see :class:`ArgumentParser`).

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
        try:
            parser = cls.build_parser()
            if parse_job:
                parser.add_argument("--job-dir", required=True, help="where the job writes its output")
        except argparse.ArgumentError as err:  # e.g. a flag declared twice in an argument group
            raise ConfigError(f"{cls.__name__}: argument {err.argument_name}: {err.message}") from err
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
