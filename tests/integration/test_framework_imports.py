"""The framework callbacks are optional (pyproject.toml's extras): `import probes` and the
Monitor never load transformers or lightning, and a callback whose framework is missing says in
one sentence which extra installs it. In a fresh interpreter (nothing imported yet)."""

from __future__ import annotations

from factories import run_python

CODE = """
import sys
import probes, probes.integrations, probes.integrations.common
from probes import Monitor, MemtopError
from probes.integrations import StepDriver
loaded = sorted({m.split('.')[0] for m in sys.modules}
                & {'transformers', 'lightning', 'pytorch_lightning', 'accelerate'})
assert not loaded, f'imported: {loaded}'
for module, framework in (('probes.integrations.transformers', 'transformers'),
                          ('probes.integrations.lightning', 'lightning')):
    sys.modules[framework] = None  # as if it were not installed
    try:
        __import__(module)
    except ImportError as err:
        assert isinstance(err, MemtopError), type(err)
        print(err)
    else:
        sys.exit(f'{module} imported without {framework}')
"""


def test_no_framework_on_import_and_a_missing_one_is_one_sentence_naming_its_extra():
    done = run_python(CODE)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, lines  # one sentence each
    for line, (module, extra) in zip(lines, (("transformers", "transformers"),
                                             ("lightning", "lightning")), strict=True):
        assert line.startswith(f"probes.integrations.{module} needs {extra}")
        assert line.endswith(f"pip install 'memtop[{extra}]'")
