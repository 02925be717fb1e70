"""Start-up shortcuts keep behaviour: the command-line coercion shortcut against typer's own coercer."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main

from llamacy.cli import coercion
from llamacy.cli.app import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
# typer's per-parameter coercers (0.29), which the shortcut stands in front of; older typers have none.
needs_runtime_coercion = pytest.mark.skipif(
    importlib.util.find_spec("typer._coercion") is None, reason="this typer has no per-parameter coercers"
)

# Strings a user may type for an int, float or str option, values click hands over, and defaults.
TEXTS = [
    "0", "-0", "7", "007", "-3", "42", "+5", " 5", "5 ", "1_000", "1e3", "1.0", "1.", ".5", "-0.0", "0.8",
    "0.10000000000000000001", "123456789012345678", "1234567890123456789012", "3.14159265358979323846",
    "inf", "nan", "-inf", "", " ", "abc", "0x10", "١٢", "True", "false", "1,5", "--5",
]  # fmt: skip
VALUES = [
    *TEXTS,
    None,
    0,
    1,
    -1,
    256,
    0.0,
    0.8,
    -0.0,
    1.5,
    True,
    False,
    b"5",
    ("a", "b"),
    ["x"],
    (),
    ("a", 1),
]


def _fresh_python(code: str) -> list[str]:
    """The lines `code` prints in a new interpreter (imports start from nothing)."""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _command() -> typer.core.TyperCommand:
    app = typer.Typer()

    @app.command(cls=coercion.FastCommand)
    def cmd(
        s: str = typer.Option(None),
        i: int = typer.Option(None),
        f: float = typer.Option(None),
        b: bool = typer.Option(None, "--b/--no-b"),
        many: list[str] = typer.Option(None),
        p: Path = typer.Option(None),
    ) -> None:
        pass

    return typer.main.get_command(app)


def _outcome(coercer, value, param, ctx):
    try:
        value = coercer.coerce(value, param=param, ctx=ctx)
    except Exception as e:
        return ("error", type(e).__name__, str(e))
    return ("value", type(value).__name__, repr(value))


@needs_runtime_coercion
@pytest.mark.parametrize("name", ["s", "i", "f", "b", "many", "p"])
def test_shortcut_gives_what_typer_gives(name: str) -> None:
    from typer._coercion import build_runtime_param

    cmd = _command()
    ctx = cmd.make_context("cmd", [])
    param = next(p for p in cmd.get_params(ctx) if p.name == name)
    stand_in = param._runtime_param
    assert isinstance(stand_in, coercion._Coercion)
    full = build_runtime_param(param.type_descriptor)
    taken = 0
    for value in VALUES:
        expected = _outcome(full, value, param, ctx)
        assert _outcome(stand_in, value, param, ctx) == expected, (name, value)
        multi = bool(param.multiple or param.nargs == -1)
        taken += coercion.shortcut(stand_in._annotation, multi, value) is not coercion._MISS
    assert taken >= 1  # at least None: the shortcut is used


@needs_runtime_coercion
def test_help_option_and_root_options_get_the_shortcut() -> None:
    from llamacy.cli.app import app

    group = typer.main.get_command(app)
    ctx = group.make_context("llamacy", ["run", "x"])
    assert all(isinstance(p._runtime_param, coercion._Coercion) for p in group.get_params(ctx))
    run = group.commands["run"]
    run_ctx = run.make_context("run", ["x"], parent=ctx)
    assert all(isinstance(p._runtime_param, coercion._Coercion) for p in run.get_params(run_ctx))


def test_run_imports_no_pydantic_nor_llguidance() -> None:
    # `llamacy run` parses its options without building pydantic coercers (the import is the tell), and
    # the engine loads llguidance only for constrained generation.
    code = (
        "import sys\n"
        "from llamacy.cli.app import app\n"
        "try:\n"
        "    app(args=['run', '--help'], prog_name='llamacy')\n"
        "except SystemExit:\n"
        "    pass\n"
        "cmd = __import__('typer.main').main.get_command(app).commands['run']\n"
        "ctx = cmd.make_context('run', ['hi', '-n', '3', '--temp', '0.5', '--stop', 'x', '-t', '2'])\n"
        "print(ctx.params['predict'], ctx.params['temperature'], ctx.params['stop'], ctx.params['threads'])\n"
        "import llamacy.engine\n"
        "print('pydantic' in sys.modules, 'llguidance' in sys.modules)\n"
    )
    assert _fresh_python(code)[-2:] == ["3 0.5 ['x'] 2", "False False"]


@pytest.mark.parametrize(
    "args",
    [
        *([name, "--help"] for name in COMMANDS),
        ["run", "-n", "x", "hi"],
        ["run", "--no-such-option"],
        ["info"],
        ["rm"],
    ],
)
def test_one_command_app_answers_as_the_whole_app(args: list[str]) -> None:
    # app_for builds only the command that argv names; what it prints must not change.
    from typer.testing import CliRunner

    from llamacy.cli.app import app_for, build_app

    assert app_for(args).registered_commands[0].name == args[0]
    assert len(app_for(args).registered_commands) == 1
    whole = CliRunner().invoke(build_app(), args, prog_name="llamacy")
    one = CliRunner().invoke(app_for(args), args, prog_name="llamacy")
    assert (one.exit_code, one.output) == (whole.exit_code, whole.output)


def test_no_command_or_an_unknown_one_gets_the_whole_app() -> None:
    from llamacy.cli.app import app_for

    for args in ([], ["--version"], ["--help"], ["runn"], ["-h", "run"]):
        assert {c.name for c in app_for(args).registered_commands} == set(COMMANDS)


def test_run_loads_neither_the_gguf_package_nor_the_request_modules(default_model_path: Path) -> None:
    # A plain generation needs gguf-py's name tables only (llamacy.gguf_names), not its writer, vocabulary and
    # metadata modules (PyYAML), nor the converter's pipeline or the structured-output request modules.
    code = (
        "import sys\n"
        "from llamacy.engine import Llama\n"
        f"llm = Llama({str(default_model_path)!r}, n_ctx=64, n_threads=1)\n"
        "print(len(list(llm.generate_tokens('Hi', 2, temperature=0))))\n"
        "late = ['gguf', 'yaml', 'llamacy.convert.pipeline', 'llamacy.structured.request',\n"
        "        'llamacy.structured.tools', 'llamacy.openai_shapes']\n"
        "print([m for m in late if m in sys.modules])\n"
    )
    assert _fresh_python(code)[-2:] == ["2", "[]"]


@pytest.mark.parametrize("first", ["gguf_names", "gguf"])
def test_gguf_tables_are_one_module_whichever_loads_first(first: str) -> None:
    code = (
        f"import {'llamacy.gguf_names' if first == 'gguf_names' else 'gguf'}\n"
        "import gguf, gguf.constants\n"
        "from llamacy import gguf_names\n"
        "from llamacy.convert.mixtures import target\n"
        "same = [getattr(gguf_names, n) is getattr(gguf, n) is getattr(gguf.constants, n) for n in gguf_names.__all__]\n"
        "print(all(same), gguf.TENSOR_NAMES[gguf_names.MODEL_TENSOR.OUTPUT], target('q8_0').file_type is gguf.LlamaFileType.MOSTLY_Q8_0)\n"
    )
    assert _fresh_python(code)[-1] == "True output True"


def test_structured_exports_every_name_it_lists() -> None:
    # llamacy.structured loads its modules per name (_HOME); a name listed in __all__ without a home, or a
    # home without the name, would fail only when some caller first asked for it.
    code = (
        "import llamacy.structured as s\n"
        "print(sorted(s.__all__) == sorted(s._HOME), all(getattr(s, n) is not None for n in s.__all__))\n"
        "from llamacy.structured import *\n"
        "print(callable(response_format_grammar), StructuredRequest.__name__)\n"
    )
    assert _fresh_python(code)[-2:] == ["True True", "True StructuredRequest"]
