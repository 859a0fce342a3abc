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


# ---- a subclass's declaration of a base argument wins (issue 43, row 5) -------------------------

BASE_ARGUMENTS = [a for a in ModelArguments.build_parser()._actions if a.dest != "help"]


def _subclass(*declarations: tuple[tuple[str, ...], dict], name: str = "Redeclared") -> type[ModelArguments]:
    """A ModelArguments subclass whose build_parser adds ``declarations`` to the base's."""

    def build_parser(cls: type[ModelArguments]) -> argparse.ArgumentParser:
        parser = super(subclass, cls).build_parser()
        for flags, options in declarations:
            parser.add_argument(*flags, **options)
        return parser

    subclass = type(name, (ModelArguments,), {"build_parser": classmethod(build_parser)})
    return subclass


def _other_value(action: argparse.Action, offset: int) -> object:
    """A valid value of ``action``'s type that is not its default."""
    return action.type(offset) if action.default is None else action.default + action.type(offset)


def _spellings(action: argparse.Action) -> list[tuple[tuple[str, ...], dict]]:
    """The ways a subclass re-declares ``action``: its own flag, the underscore flag, a new alias by dest."""
    flag = action.option_strings[0]
    return [((flag,), {}), (("--" + action.dest,), {}), (("--my-alias",), {"dest": action.dest})]


def test_the_base_arguments_are_all_found():
    assert {a.dest for a in BASE_ARGUMENTS} >= {"batch_size", "epochs", "learning_rate", "seed", "steps_per_epoch"}
    assert all(a.option_strings and a.type is not None for a in BASE_ARGUMENTS)


@pytest.mark.parametrize("base", BASE_ARGUMENTS, ids=lambda a: a.dest)
@pytest.mark.parametrize("spelling", [0, 1, 2], ids=["same-flag", "underscore-flag", "alias-by-dest"])
def test_a_subclass_default_wins_in_default_parse_and_parse_args(base, spelling):
    """default(), parse([]) and parse(args) all give the subclass's default, or the value given."""
    flags, options = _spellings(base)[spelling]
    default, given = _other_value(base, 7), _other_value(base, 12)
    args = _subclass((flags, {**options, "type": base.type, "default": default}))
    assert getattr(args.default(), base.dest) == default
    assert getattr(args.parse([]), base.dest) == default
    for flag in {base.option_strings[0], flags[0]}:  # the base's spelling and the subclass's both parse
        assert getattr(args.parse([flag, str(given)]), base.dest) == given
    others = {a.dest: a.default for a in BASE_ARGUMENTS if a.dest != base.dest}
    assert {name: getattr(args.parse([]), name) for name in others} == others
    assert getattr(args.parse(["--job-dir", "/out"], parse_job=True)[0], base.dest) == default


@pytest.mark.parametrize("base", BASE_ARGUMENTS, ids=lambda a: a.dest)
def test_a_re_declaration_with_another_type_is_a_config_error_naming_both(base):
    other = str if base.type is not str else int
    args = _subclass((base.option_strings[:1], {"type": other, "default": other("3")}), name="Retyped")
    for call in (args.default, lambda: args.parse([]), lambda: args.parse([base.option_strings[0], "3"])):
        with pytest.raises(ConfigError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"Retyped: {base.option_strings[0]} re-declares argument {base.dest!r}")
        assert f"with type {other.__name__}; it is declared with type {base.type.__name__}" in message


def test_a_re_declaration_that_gives_no_type_keeps_the_base_type_and_default():
    args = _subclass((("--learning-rate",), {"help": "the step size"}))
    assert args.default().learning_rate == 0.001
    assert args.parse(["--learning-rate", "0.5"]).learning_rate == 0.5  # a float, not the string "0.5"
    assert "the step size" in args.build_parser().format_help()


def test_set_defaults_in_a_subclass_wins_too():
    class Defaults(ModelArguments):
        @classmethod
        def build_parser(cls) -> argparse.ArgumentParser:
            parser = super().build_parser()
            parser.set_defaults(learning_rate=0.01, epochs=5)
            parser.add_argument("--learning_rate", type=float, help="re-declared after set_defaults")
            return parser

    assert (Defaults.default().learning_rate, Defaults.parse([]).epochs) == (0.01, 5)


def test_a_subclass_of_a_subclass_re_declares_again_and_the_last_default_wins():
    class First(ModelArguments):
        @classmethod
        def build_parser(cls) -> argparse.ArgumentParser:
            parser = super().build_parser()
            parser.add_argument("--learning_rate", type=float, default=0.01)
            return parser

    class Second(First):
        @classmethod
        def build_parser(cls) -> argparse.ArgumentParser:
            parser = super().build_parser()
            parser.add_argument("--lr", dest="learning_rate", type=float, default=0.1)
            return parser

    assert (First.default().learning_rate, Second.default().learning_rate) == (0.01, 0.1)
    for flag in ("--learning-rate", "--learning_rate", "--lr"):
        assert Second.parse([flag, "0.5"]).learning_rate == 0.5
    (action,) = [a for a in Second.build_parser()._actions if a.dest == "learning_rate"]
    assert action.option_strings == ["--learning-rate", "--learning_rate", "--lr"]  # one argument, in help too


@pytest.mark.parametrize(
    ("flags", "options", "message"),
    [
        (("--learning-rate",), {"dest": "lr", "type": float}, "already the flag of argument 'learning_rate'"),
        (("--epochs",), {"action": "store_true"}, "with action _StoreTrueAction; it is declared with action _StoreAction"),
        (("--epochs",), {"type": int, "nargs": 2}, "with nargs 2; it is declared with nargs None"),
        (("epochs",), {"type": int}, "re-declares argument 'epochs' (--epochs) as a positional argument"),
        (("--fast",), {"dest": "learning_rate", "action": "store_const", "const": 0.1, "default": 0.5},
         "argparse would ignore its default=0.5"),
    ],
)  # fmt: skip
def test_a_re_declaration_that_changes_what_the_argument_is_is_a_config_error(flags, options, message):
    args = _subclass((flags, options), name="Changed")
    with pytest.raises(ConfigError, match="^Changed: ") as info:
        args.parse([])
    assert message in str(info.value)


def test_an_extra_flag_for_a_base_value_keeps_argparse_behaviour():
    args = _subclass((("--fast",), {"dest": "learning_rate", "action": "store_const", "const": 0.1}))
    assert (args.parse([]).learning_rate, args.parse(["--fast"]).learning_rate) == (0.001, 0.1)
    pair = _subclass(
        (("--augment",), {"action": "store_true"}), (("--no-augment",), {"dest": "augment", "action": "store_false"})
    )
    assert [pair.parse(argv).augment for argv in ([], ["--augment"], ["--no-augment"])] == [False, True, False]


def test_a_re_declaration_in_an_argument_group_is_a_config_error_not_the_base_default():
    def grouped(flag: str) -> type[ModelArguments]:
        class Grouped(ModelArguments):
            @classmethod
            def build_parser(cls) -> argparse.ArgumentParser:
                parser = super().build_parser()
                parser.add_argument_group("model").add_argument(flag, type=float, default=0.01)
                return parser

        return Grouped

    with pytest.raises(ConfigError, match=r"'learning_rate' is declared twice .*argument group"):
        grouped("--learning_rate").default()
    with pytest.raises(ConfigError, match="^Grouped: argument --learning-rate: conflicting option string"):
        grouped("--learning-rate").default()
