"""`kubeseer devcluster` subcommands without a cluster: parsing, and clear failures where no
cluster was started."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kubeseer.devcluster import commands


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kubeseer")
    commands.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["devcluster", *argv])


def test_up_defaults_to_the_shared_inventory_and_no_extender():
    args = parse("up")
    assert args.nodes.name == "nodes.yaml" and args.nodes.parent.name == "devcluster"
    assert args.extender_url is None
    assert args.crd is None and args.rbac is None
    assert args.dir == commands.DEFAULT_DIR


def test_up_collects_repeated_manifest_options(tmp_path: Path):
    args = parse("up", "--dir", str(tmp_path), "--rbac", "a.yaml", "--rbac", "b.yaml")
    assert args.rbac == [Path("a.yaml"), Path("b.yaml")]
    assert args.dir == tmp_path


@pytest.mark.parametrize("action", ["status", "down"])
def test_status_and_down_fail_clearly_where_no_cluster_was_started(
    action, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    args = parse(action, "--dir", str(tmp_path))
    assert args.handler(args) == 1
    assert "no cluster state" in capsys.readouterr().err


def test_up_reports_an_invalid_inventory_without_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes: []\n")
    args = parse("up", "--dir", str(tmp_path / "run"), "--nodes", str(bad))
    assert args.handler(args) == 1
    err = capsys.readouterr().err
    assert "devcluster up failed" in err
    assert "`nodes` must be a non-empty list" in err
    assert not (tmp_path / "run").exists()
