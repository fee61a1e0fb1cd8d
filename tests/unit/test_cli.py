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


def test_building_the_parser_imports_no_heavy_dependency():
    """`kubeseer --help` and every command's help stay fast: torch, torch-geometric, onnx,
    pyarrow, numpy and kopf load only in the handlers that need them (bench/cli_startup.py)."""
    import subprocess
    import sys

    heavy = ["torch", "torch_geometric", "onnx", "pyarrow", "numpy", "kopf", "kubernetes"]
    code = (
        "import sys; from kubeseer import cli; cli.build_parser(); "
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == []
