"""``workbench install-desktop-entry [--uninstall]``: the start-menu entry and icons for the
current user, following the freedesktop.org specs (Linux and BSD desktops).

Installs, under ``$XDG_DATA_HOME`` (default ``~/.local/share``):

- ``applications/io.github.model_memory_workbench.desktop`` (the name is ``workbench.APP_ID``,
  which the app also passes to ``QGuiApplication.setDesktopFileName`` so docks and Wayland
  compositors match the window to the entry and show its icon);
- ``icons/hicolor/scalable/apps/<APP_ID>.svg`` and ``icons/hicolor/<N>x<N>/apps/<APP_ID>.png``;
- ``mime/packages/<APP_ID>.xml``: the workbench's own file types, ``*.wbsession.json``
  (application/x-workbench-session) and ``*.wbmap.json`` (application/x-workbench-device-map),
  which the entry lists in ``MimeType`` and opens with ``Exec=workbench %f``. Only these double
  extensions are claimed, never every ``.json`` (shared-mime-info prefers the longest glob).

The entry's ``Exec`` points at the launcher that runs this command (the bundle's executable,
the ``workbench`` script on ``PATH`` or ``python -m workbench``), quoted per the Desktop Entry
spec, so it works from a virtual environment that is not on the desktop session's ``PATH``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from workbench import APP_ID
from workbench.resources import resource_path, resources_root
from workbench.runtime import atomic_write_text

logger = logging.getLogger(__name__)

DESKTOP_FILE_NAME = f"{APP_ID}.desktop"
MIME_FILE_NAME = f"{APP_ID}.mime.xml"  # in resources/; installed as mime/packages/<APP_ID>.xml
_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
_EXEC_ESCAPED_IN_QUOTES = set('"`$\\')


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "install-desktop-entry",
        help="add the app to the desktop's start menu (current user)",
        description="Install the freedesktop .desktop entry and the app icons for the current "
        "user under $XDG_DATA_HOME (default ~/.local/share), or remove them with --uninstall. "
        "Windows and macOS shortcuts: see docs/desktop-integration.md.",
    )
    parser.add_argument("--uninstall", action="store_true", help="remove the installed files")
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="XDG data folder to use instead of $XDG_DATA_HOME or ~/.local/share",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.data_dir is None and sys.platform in ("win32", "darwin"):
        print(
            "error: desktop entries are a Linux/BSD feature; for a Start-menu shortcut on "
            "Windows or a Dock icon on macOS see docs/desktop-integration.md",
            file=sys.stderr,
        )
        return 2
    data_dir = args.data_dir or user_data_dir()
    if args.uninstall:
        removed = uninstall_desktop_entry(data_dir)
        for path in removed:
            print(f"removed {path}")
        if not removed:
            print(f"nothing to remove under {data_dir}")
        return 0
    installed = install_desktop_entry(data_dir)
    for path in installed:
        print(f"installed {path}")
    print(f"launcher: {' '.join(launcher_command())}")
    return 0


def user_data_dir() -> Path:
    """``$XDG_DATA_HOME`` when set to an absolute path, else ``~/.local/share`` (XDG spec)."""
    explicit = os.environ.get("XDG_DATA_HOME", "")
    if explicit and os.path.isabs(explicit):
        return Path(explicit)
    return Path.home() / ".local" / "share"


def launcher_command() -> list[str]:
    """The command that starts this installation of the app, as absolute paths.

    The frozen bundle's executable; else the ``workbench`` script beside this interpreter or
    on ``PATH``; else ``python -m workbench`` with this interpreter.
    """
    if getattr(sys, "frozen", False):
        return [str(Path(sys.executable).resolve())]
    script_dir = Path(sys.executable).parent
    for candidate in (script_dir / "workbench", script_dir / "workbench.exe"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate.absolute())]
    found = shutil.which("workbench")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "workbench"]


def quote_exec_argument(argument: str) -> str:
    """Quote one argument for a ``.desktop`` ``Exec`` value (quoting, then string escapes).

    Example:
        >>> quote_exec_argument("/opt/my apps/workbench")
        '"/opt/my apps/workbench"'
    """
    argument = argument.replace("%", "%%")  # a literal percent sign is %% in Exec
    if argument and not (set(argument) & _EXEC_RESERVED):
        return argument
    quoted = "".join(f"\\{ch}" if ch in _EXEC_ESCAPED_IN_QUOTES else ch for ch in argument)
    # The value is also a desktop-file string, where a backslash is itself written as \\.
    return '"' + quoted.replace("\\", "\\\\") + '"'


def desktop_entry_text(template: str, command: Sequence[str]) -> str:
    """Return the entry ``template`` with every ``Exec``/``TryExec`` pointing at ``command``.

    ``Exec=workbench --demo`` becomes ``Exec=<command> --demo``; ``TryExec`` names the
    command's first word, so the desktop hides the entry once that file is gone.
    """
    launcher = " ".join(quote_exec_argument(part) for part in command)
    lines = []
    for line in template.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "Exec":
            rest = value.strip().split(" ", 1)[1:]  # arguments after `workbench`
            line = "Exec=" + " ".join([launcher, *rest])
        elif sep and key.strip() == "TryExec":
            line = "TryExec=" + _escape_string(command[0])
        lines.append(line)
    return "\n".join(lines) + "\n"


def install_desktop_entry(data_dir: Path, command: Sequence[str] | None = None) -> list[Path]:
    """Install the ``.desktop`` entry and the icons under ``data_dir``.

    Args:
        data_dir: the XDG data folder (``~/.local/share`` for the current user).
        command: the launcher; default :func:`launcher_command`.

    Returns:
        The files written: the entry first, then the icons, then the MIME types.

    Raises:
        FileNotFoundError: when the bundled entry or icons are missing from ``resources/``.
        OSError: when ``data_dir`` is not writable.

    Example:
        >>> install_desktop_entry(Path.home() / ".local/share")  # doctest: +SKIP
    """
    template = resource_path(DESKTOP_FILE_NAME).read_text(encoding="utf-8")
    entry = data_dir / "applications" / DESKTOP_FILE_NAME
    entry.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(entry, desktop_entry_text(template, command or launcher_command()))
    entry.chmod(0o644)
    written = [entry]
    for source, target in _icon_pairs(data_dir):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.tmp")  # copy, then rename: atomic
        shutil.copyfile(source, staging)
        staging.chmod(0o644)
        os.replace(staging, target)
        written.append(target)
    mime = _mime_package(data_dir)
    mime.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(mime, resource_path(MIME_FILE_NAME).read_text(encoding="utf-8"))
    mime.chmod(0o644)
    written.append(mime)
    _refresh_desktop_caches(data_dir)
    return written


def uninstall_desktop_entry(data_dir: Path) -> list[Path]:
    """Remove what :func:`install_desktop_entry` put under ``data_dir``; return what was removed.

    Only our own files go; folders and other apps' files stay.
    """
    candidates = [data_dir / "applications" / DESKTOP_FILE_NAME, _mime_package(data_dir)]
    candidates += [target for _source, target in _icon_pairs(data_dir)]
    # Sizes a previous version installed but this one no longer ships.
    hicolor = data_dir / "icons" / "hicolor"
    if hicolor.is_dir():
        candidates += sorted(hicolor.glob(f"*/apps/{APP_ID}.*"))
    removed: list[Path] = []
    for path in dict.fromkeys(candidates):
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path)
    if removed:
        _refresh_desktop_caches(data_dir)
    return removed


def _icon_pairs(data_dir: Path) -> list[tuple[Path, Path]]:
    """(bundled icon, installed path) for the scalable SVG and every PNG size we ship."""
    icons = resources_root() / "icons"
    hicolor = data_dir / "icons" / "hicolor"
    pairs = [(resource_path("icons", "app.svg"), hicolor / "scalable" / "apps" / f"{APP_ID}.svg")]
    pngs = (icons / "hicolor").glob(f"*/apps/{APP_ID}.png")
    for png in sorted(pngs, key=lambda p: int(p.parent.parent.name.split("x")[0])):
        size_dir = png.parent.parent.name  # e.g. "48x48"
        pairs.append((png, hicolor / size_dir / "apps" / png.name))
    return pairs


def _mime_package(data_dir: Path) -> Path:
    return data_dir / "mime" / "packages" / f"{APP_ID}.xml"


def _escape_string(value: str) -> str:
    return value.replace("\\", "\\\\")


def _refresh_desktop_caches(data_dir: Path) -> None:
    """Ask the desktop to notice the change; the tools are optional, failures only logged."""
    jobs = [
        ("update-desktop-database", ["-q", str(data_dir / "applications")]),
        ("gtk-update-icon-cache", ["-q", "-t", "-f", str(data_dir / "icons" / "hicolor")]),
    ]
    if (data_dir / "mime" / "packages").is_dir():
        jobs.append(("update-mime-database", [str(data_dir / "mime")]))
    for tool, tool_args in jobs:
        executable = shutil.which(tool)
        if executable is None:
            continue
        try:
            subprocess.run([executable, *tool_args], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.info("%s failed: %s", tool, exc)
