"""The framework callbacks are optional (pyproject.toml's extras): `import probes` and the
Monitor never load transformers or lightning, and a callback whose framework is missing says in
one sentence which extra installs it. Each in a fresh interpreter (nothing imported yet)."""

from __future__ import annotations

import pytest
from factories import run_python


def test_probes_and_the_monitor_never_import_a_framework():
    code = ("import sys, probes, probes.integrations, probes.integrations.common\n"
            "from probes import Monitor\n"
            "from probes.integrations import StepDriver\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'transformers', 'lightning', 'pytorch_lightning', 'accelerate'})\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    done = run_python(code)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("module", "framework", "extra"), [
    ("probes.integrations.transformers", "transformers", "transformers"),
    ("probes.integrations.lightning", "lightning", "lightning")])
def test_a_missing_framework_is_one_sentence_naming_the_extra(module, framework, extra):
    code = ("import sys\n"
            f"sys.modules[{framework!r}] = None  # as if it were not installed\n"
            "from probes import MemtopError\n"
            "try:\n"
            f"    __import__({module!r})\n"
            "except ImportError as err:\n"
            "    assert isinstance(err, MemtopError), type(err)\n"
            "    print(err)\n"
            "else:\n"
            "    sys.exit('imported without its framework')\n")
    done = run_python(code)
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert "\n" not in line and f"pip install 'memtop[{extra}]'" in line
    assert line.startswith(f"{module} needs {framework}")
