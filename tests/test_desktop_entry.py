"""``workbench install-desktop-entry``: real files under a temporary XDG data folder, the
installed ``Exec`` line actually launched, and ``--uninstall`` removing only our files."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import APP_ID, __version__
from workbench.cli import main
from workbench.commands.desktop import (
    install_desktop_entry,
    quote_exec_argument,
    uninstall_desktop_entry,
    user_data_dir,
)
from workbench.resources import resources_root

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="freedesktop entries are for Linux/BSD desktops"
)

ENTRY_NAME = f"{APP_ID}.desktop"


def parse_exec(value: str) -> list[str]:
    """Split an ``Exec`` value the way the Desktop Entry spec says (written independently of
    the code under test): undo the string escapes, then split on spaces outside double quotes,
    where a backslash escapes the next character."""
    unescaped, chars = [], iter(value)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars)
            unescaped.append({"s": " ", "n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
        else:
            unescaped.append(ch)
    words: list[str] = []
    current: list[str] | None = None
    in_quotes = False
    chars = iter("".join(unescaped))
    for ch in chars:
        if in_quotes:
            if ch == "\\":
                current.append(next(chars))  # type: ignore[union-attr]
            elif ch == '"':
                in_quotes = False
            else:
                current.append(ch)  # type: ignore[union-attr]
        elif ch == " ":
            if current is not None:
                words.append("".join(current))
            current = None
        else:
            current = current if current is not None else []
            if ch == '"':
                in_quotes = True
            else:
                current.append(ch)
    if current is not None:
        words.append("".join(current))
    return [word.replace("%%", "%") for word in words]


def read_entry(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return parser


def installed_files(data_dir: Path) -> set[Path]:
    """Files under ``data_dir``, less what the desktop's tools generate from ours (caches and
    the compiled MIME database beside ``mime/packages``)."""
    mime = data_dir / "mime"
    return {
        p
        for p in data_dir.rglob("*")
        if p.is_file()
        and not p.name.endswith(".cache")
        and (mime not in p.parents or p.parent == mime / "packages")
    }


def without_field_codes(command: list[str]) -> list[str]:
    """The command a launcher runs when it has no file to pass (``%f`` is dropped)."""
    return [word for word in command if word not in ("%f", "%F", "%u", "%U")]


def test_cli_installs_entry_and_every_icon_under_xdg_data_home(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "xdg-data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data_dir))

    assert main(["install-desktop-entry"]) == 0

    entry = data_dir / "applications" / ENTRY_NAME
    pngs = sorted((resources_root() / "icons" / "hicolor").glob(f"*/apps/{APP_ID}.png"))
    assert len(pngs) >= 8  # 16..256 px
    expected = {entry, data_dir / "icons/hicolor/scalable/apps" / f"{APP_ID}.svg"}
    expected.add(data_dir / "mime/packages" / f"{APP_ID}.xml")
    expected |= {data_dir / "icons/hicolor" / p.parent.parent.name / "apps" / p.name for p in pngs}
    assert installed_files(data_dir) == expected
    for png in pngs:
        target = data_dir / "icons/hicolor" / png.parent.parent.name / "apps" / png.name
        assert target.read_bytes() == png.read_bytes()
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
    section = read_entry(entry)["Desktop Entry"]
    assert section["Icon"] == APP_ID
    assert section["Type"] == "Application"
    assert Path(section["TryExec"]).is_absolute()
    assert str(entry) in capsys.readouterr().out


def test_installed_exec_line_launches_this_installation(tmp_path):
    entry = install_desktop_entry(tmp_path)[0]
    parsed = read_entry(entry)
    with_file = parse_exec(parsed["Desktop Entry"]["Exec"])
    assert with_file[-1] == "%f"  # a file manager passes the file it opens
    command = without_field_codes(with_file)
    assert Path(command[0]).is_absolute()

    result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"workbench {__version__}"
    demo_action = parse_exec(parsed["Desktop Action demo"]["Exec"])
    assert demo_action == [*command, "--demo"]


def test_exec_line_survives_paths_with_spaces_and_shell_characters(tmp_path):
    odd_dir = tmp_path / 'my apps $HOME 100% "q" back\\slash'
    odd_dir.mkdir()
    launcher = odd_dir / "workbench"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m workbench "$@"\n')
    launcher.chmod(0o755)

    entry = install_desktop_entry(tmp_path / "data", command=[str(launcher)])[0]
    parsed = read_entry(entry)["Desktop Entry"]
    command = without_field_codes(parse_exec(parsed["Exec"]))

    assert command == [str(launcher)]
    assert parsed["TryExec"].replace("\\\\", "\\") == str(launcher)
    result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert __version__ in result.stdout


def test_quote_exec_argument_leaves_plain_words_alone():
    assert quote_exec_argument("/usr/bin/workbench") == "/usr/bin/workbench"
    assert quote_exec_argument("a b") == '"a b"'
    assert quote_exec_argument('say "hi"') == '"say \\\\"hi\\\\""'


def test_uninstall_removes_only_our_files_and_is_idempotent(tmp_path, capsys):
    data_dir = tmp_path / "data"
    install_desktop_entry(data_dir)
    other_entry = data_dir / "applications" / "org.example.Other.desktop"
    other_entry.write_text("[Desktop Entry]\nType=Application\nName=Other\nExec=other\n")
    other_icon = data_dir / "icons/hicolor/48x48/apps/org.example.Other.png"
    other_icon.write_bytes(b"not ours")
    stale_size = data_dir / "icons/hicolor/96x96/apps" / f"{APP_ID}.png"  # an older release
    stale_size.parent.mkdir(parents=True)
    stale_size.write_bytes(b"old")

    assert main(["install-desktop-entry", "--uninstall", "--data-dir", str(data_dir)]) == 0

    assert installed_files(data_dir) == {other_entry, other_icon}
    assert "removed" in capsys.readouterr().out
    assert uninstall_desktop_entry(data_dir) == []
    assert main(["install-desktop-entry", "--uninstall", "--data-dir", str(data_dir)]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_reinstall_overwrites_a_stale_entry(tmp_path):
    entry = tmp_path / "applications" / ENTRY_NAME
    entry.parent.mkdir(parents=True)
    entry.write_text("[Desktop Entry]\nExec=/old/place/workbench\n")
    install_desktop_entry(tmp_path, command=["/new/place/workbench"])
    assert read_entry(entry)["Desktop Entry"]["Exec"] == "/new/place/workbench %f"


def test_user_data_dir_follows_xdg_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "custom"))
    assert user_data_dir() == tmp_path / "custom"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the spec says: ignore it
    assert user_data_dir() == tmp_path / ".local" / "share"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert user_data_dir() == tmp_path / ".local" / "share"


def test_unwritable_data_dir_fails_with_the_path(tmp_path, capsys):
    blocker = tmp_path / "file-not-folder"  # unwritable as a folder, even for root
    blocker.write_text("x")
    with pytest.raises(OSError) as raised:
        install_desktop_entry(blocker)
    assert str(blocker) in str(raised.value)
    assert main(["install-desktop-entry", "--data-dir", str(blocker)]) != 0
    assert str(blocker) in capsys.readouterr().err
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(PermissionError) as denied:
            install_desktop_entry(locked)
        assert str(locked) in str(denied.value)


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils")
def test_bundled_and_installed_entries_pass_desktop_file_validate(tmp_path):
    entry = install_desktop_entry(tmp_path)[0]
    for path in (resources_root() / ENTRY_NAME, entry):
        result = subprocess.run(
            ["desktop-file-validate", str(path)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip() == "", result.stdout  # not even a hint


def test_the_entry_opens_our_own_file_types_and_no_other_json(tmp_path):
    """``MimeType`` lists the session and map types, whose globs are double extensions:
    Qt's MIME database (which reads ``$XDG_DATA_HOME/mime``) maps ``s.wbsession.json`` to ours
    and a plain ``s.json`` stays application/json."""
    data_dir = tmp_path / "data"
    entry = install_desktop_entry(data_dir)[0]
    types = read_entry(entry)["Desktop Entry"]["MimeType"].strip(";").split(";")
    assert types == ["application/x-workbench-session", "application/x-workbench-device-map"]
    names = {"s.wbsession.json": types[0], "m.wbmap.json": types[1], "s.json": "application/json"}
    for name in names:
        (tmp_path / name).write_text('{"format": "workbench-session"}')
    probe = (
        "import sys; from PySide6.QtCore import QMimeDatabase; db = QMimeDatabase(); "
        "print(','.join(db.mimeTypeForFile(p).name() for p in sys.argv[1:]))"
    )
    env = {**os.environ, "XDG_DATA_HOME": str(data_dir), "XDG_DATA_DIRS": "/usr/share"}
    result = subprocess.run(
        [sys.executable, "-c", probe, *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(",") == list(names.values())
