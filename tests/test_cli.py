"""The command line (autograder/cli.py, autograder/arguments.py): the parser and the commands agree."""

from __future__ import annotations

import pytest

from autograder import arguments, cli


def test_every_subcommand_the_parser_accepts_runs_a_command_and_no_command_is_unreachable():
    choices = set(arguments.parser()._subparsers._group_actions[0].choices)
    assert choices == set(cli.COMMANDS), f"in the parser only: {choices - set(cli.COMMANDS)}; " \
                                         f"in cli.COMMANDS only: {set(cli.COMMANDS) - choices}"


def test_an_unknown_command_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["no-such-command"])
    assert exit.value.code == 2 and "invalid choice" in capsys.readouterr().err
