"""`workbench PATH` is `workbench --open PATH`; subcommands and typos keep argparse's rules."""

from __future__ import annotations

import pytest

from workbench.cli import (
    _positional_source_as_open,
    build_parser,
    looks_like_source,
    runs_headless,
)


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def parse(parser, argv):
    return parser.parse_args(_positional_source_as_open(parser, list(argv)))


def test_a_positional_path_opens_the_gui_on_it(parser, tmp_path):
    session = tmp_path / "s.wbsession.json"
    session.write_text("{}")
    for argv in ([str(session)], ["-v", str(session)], [str(tmp_path)], ["./model"]):
        args = parse(parser, argv)
        assert args.command is None and args.open == argv[-1], argv
    assert parse(parser, ["hf-cache:org/repo"]).open == "hf-cache:org/repo"


def test_subcommands_options_and_typos_are_unchanged(parser, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan").mkdir()  # a folder named like a subcommand: the subcommand wins
    assert parse(parser, ["plan", "gpt2"]).command == "plan"
    assert parse(parser, ["--open", "gpt2"]).open == "gpt2"
    with pytest.raises(SystemExit):
        parse(parser, ["plann"])
    assert "invalid choice: 'plann'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(parser, ["--open", "a.json", "b.json"])
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(parser, ["--demo", "a.json"])
    assert "not allowed with argument --demo" in capsys.readouterr().err


def test_the_bundle_smoke_hook_sees_path_launches_as_gui(tmp_path):
    assert not runs_headless([str(tmp_path / "s.json")])
    assert not runs_headless(["./folder"])
    assert runs_headless(["plan", "gpt2"])
    assert looks_like_source(str(tmp_path)) and not looks_like_source("plan")


def test_a_bundled_config_name_opens_the_gui_on_it(parser, tmp_path, monkeypatch):
    """``workbench llama-3.1-70b`` opens it, as ``--open llama-3.1-70b`` does."""
    monkeypatch.chdir(tmp_path)  # no file or folder of that name here
    for name in ("llama-3.1-70b", "gpt2"):
        args = parse(parser, [name])
        assert args.command is None and args.open == name
        assert looks_like_source(name) and not runs_headless([name])
    assert parse(parser, ["plan", "llama-3.1-70b"]).command == "plan"
    assert not looks_like_source("llama-3.1-7b")  # not bundled: still a mistyped subcommand
