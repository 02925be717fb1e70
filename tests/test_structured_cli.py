"""Structured output from the command line with the real model: `llamacy run --json / --json-schema /
--grammar` (stdout carries only the JSON; bad input is a one-line error, exit 2) and chat's /json toggle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0, "maximum": 50000000},
    },
    "required": ["city", "population"],
}


def llamacy(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "llamacy", *args], input=input, capture_output=True, timeout=300, env=env
    )


def test_run_json_schema_file_and_inline(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMA))
    for spec in (str(f), json.dumps(SCHEMA)):
        r = llamacy("run", "-n", "60", "--temp", "0", "-t", "2", "--json-schema", spec, "A city as JSON:")
        assert r.returncode == 0, r.stderr
        jsonschema.validate(json.loads(r.stdout), SCHEMA)  # stdout is the JSON and nothing else


def test_run_json_and_grammar(tmp_path):
    r = llamacy("run", "-n", "80", "--temp", "0", "-t", "2", "--json", "A dog as JSON:")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= ("yes" | "no") "."\n')
    r = llamacy("run", "-n", "5", "--temp", "0", "-t", "2", "--grammar", str(g), "Is ice cold? Answer:")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() in ("yes.", "no.")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json-schema", '{"type": "objekt"}'), "invalid --json-schema: Invalid type: objekt"),
        (("--json-schema", "missing.json"), "cannot read JSON schema file missing.json"),
        (("--grammar", "missing.gbnf"), "cannot read grammar file missing.gbnf"),
        (("--json", "--json-schema", "{}"), "give only one of --json, --json-schema"),
    ],
)
def test_run_bad_input_is_one_line(args, message):
    r = llamacy("run", "-n", "5", *args, "x")
    assert r.returncode == 2 and r.stdout == b""
    err = r.stderr.decode().strip()
    assert message in err and "\n" not in err


def test_chat_json_toggle(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMA))
    script = f"/json\nGive me a JSON with a name and age of a person\n/json {f}\nDescribe Paris.\n/json off\nSay hi.\n"
    r = llamacy("chat", "--temp", "0", "-n", "80", "-t", "2", input=script.encode())
    assert r.returncode == 0, r.stderr
    replies = r.stdout.decode().split("\n\n")
    assert isinstance(json.loads(replies[0]), dict)
    jsonschema.validate(json.loads(replies[1]), SCHEMA)
    assert (
        "(replies are JSON objects)" in r.stderr.decode() and "(replies are free text)" in r.stderr.decode()
    )
    r = llamacy("chat", "-n", "5", input=b'/json {"type": 1}\n')
    assert r.returncode == 1 and "invalid --json-schema" in r.stderr.decode()
