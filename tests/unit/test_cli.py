"""The `kubeseer` entry point: every command's help renders (argparse formats help lazily, so a
stray `%` in a help string only fails when someone asks for help)."""

import pytest

from kubeseer import cli


def subcommands() -> list[str]:
    parser = cli.build_parser()
    actions = [a for a in parser._actions if a.dest == "command"]
    return sorted(actions[0].choices)


def test_every_room_registers_its_commands():
    expected = {"graph", "predict", "train", "eval", "zoo", "dataset", "devcluster", "operator"}
    assert expected | {"demo"} <= set(subcommands())


@pytest.mark.parametrize("argv", [[], *[[name] for name in subcommands()]])
def test_help_renders_for_the_program_and_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: kubeseer" in capsys.readouterr().out
