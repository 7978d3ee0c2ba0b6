"""A user's weights file, whatever it holds, is read or refused in one sentence (issue 44 item 5).

`memtop infer --weights afile` with a text file ended in torch's weights-only unpickler's
``KeyError`` and a traceback (exit 1). The loader is fuzzed here with hypothesis over what a user
may point it at: text, nothing, a cut-short or garbled zip, a pickle of the wrong object, a state
dict of another model; and the CLI is checked once end to end (one line, exit 2).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import in_thread

pytestmark = pytest.mark.filterwarnings("ignore")
_FUZZ = settings(max_examples=60, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def _good_bytes() -> bytes:
    """A real memtop weights file of a tiny model, as `memtop train` writes it."""
    import tempfile

    from trainer.checkpoint import save_weights
    from trainer.model import GPT, GPTConfig

    def make() -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "weights.pt"
            save_weights(GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16)), path)
            return path.read_bytes()

    return in_thread(make)


GOOD = _good_bytes()


def _refused_or_read(tmp_path: Path, data: bytes, name: str = "afile") -> None:
    """read_weights either returns a header and tensors, or raises CheckpointError: never
    anything else (which would be a traceback at the CLI)."""
    from trainer.checkpoint import CheckpointError, read_weights

    path = tmp_path / name
    path.write_bytes(data)
    try:
        header, state = in_thread(read_weights, path)
    except CheckpointError as exc:
        text = str(exc)
        assert text and "\n" not in text and str(path) in text, text
    else:
        assert isinstance(header, dict) and isinstance(state, dict)


@_FUZZ
@given(st.text(max_size=200))
def test_text_files_are_refused(tmp_path, text):
    _refused_or_read(tmp_path, text.encode("utf-8"))


@_FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused(tmp_path, data):
    _refused_or_read(tmp_path, data)


@_FUZZ
@given(st.integers(min_value=0, max_value=len(GOOD) - 1))
def test_a_truncated_weights_file_is_refused(tmp_path, cut):
    _refused_or_read(tmp_path, GOOD[:cut])


@_FUZZ
@given(st.integers(min_value=0, max_value=len(GOOD) - 1), st.integers(0, 255))
def test_a_garbled_weights_file_is_refused_or_read(tmp_path, at, value):
    data = bytearray(GOOD)
    data[at] = value
    _refused_or_read(tmp_path, bytes(data))


def _plain() -> st.SearchStrategy:
    leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6) | st.integers(), inner,
                                          max_size=3), max_leaves=8)


@_FUZZ
@given(_plain())
def test_a_pickle_of_the_wrong_object_is_refused(tmp_path, obj):
    _refused_or_read(tmp_path, pickle.dumps(obj, protocol=2))


@_FUZZ
@given(st.dictionaries(st.text(max_size=10) | st.integers(), _plain(), max_size=4),
       st.one_of(st.none(), _plain(), st.dictionaries(st.text(max_size=10), _plain())))
def test_a_memtop_header_over_a_wrong_body_is_refused(tmp_path, model, state):
    """A header that says memtop, with any model and any state: refused in one sentence."""
    import torch

    def save() -> bytes:
        buf = io.BytesIO()
        header = {"format": "memtop-weights", "version": 1, "model": model}
        torch.save({"memtop": header, "state_dict": state}, buf)
        return buf.getvalue()

    _refused_or_read(tmp_path, in_thread(save))


def test_another_models_state_dict_and_odd_tensors_are_refused(tmp_path):
    """A torchvision-style state dict, one under memtop's header, integer keys, an int tensor
    where a float weight goes: each refused, each in one sentence."""
    import torch

    from trainer.checkpoint import CheckpointError, read_weights

    def files() -> dict[str, bytes]:
        out = {}
        for name, obj in {
            "linear": torch.nn.Linear(4, 3).state_dict(),
            "headed": {"memtop": {"format": "memtop-weights", "version": 1,
                                  "model": {"n_layer": 1}},
                       "state_dict": torch.nn.Linear(4, 3).state_dict()},
            "intkeys": {"memtop": torch.load(io.BytesIO(GOOD), weights_only=True)["memtop"],
                        "state_dict": {1: torch.zeros(2), "x": torch.zeros(1)}},
        }.items():
            buf = io.BytesIO()
            torch.save(obj, buf)
            out[name] = buf.getvalue()
        data = torch.load(io.BytesIO(GOOD), weights_only=True)
        data["state_dict"] = {k: v.to(torch.int64) if v.is_floating_point() else v
                              for k, v in data["state_dict"].items()}
        buf = io.BytesIO()
        torch.save(data, buf)
        out["ints"] = buf.getvalue()
        for name, change in {"note": lambda d: d["state_dict"].update(note=3),  # not a tensor
                             "huge": lambda d: d["memtop"]["model"].update(n_layer=10**9),
                             "floaty": lambda d: d["memtop"]["model"].update(n_embd=16.0)
                             }.items():
            data = torch.load(io.BytesIO(GOOD), weights_only=True)
            change(data)
            buf = io.BytesIO()
            torch.save(data, buf)
            out[name] = buf.getvalue()
        return out

    for name, data in in_thread(files).items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        with pytest.raises(CheckpointError):
            in_thread(read_weights, path)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("archive/data.pkl", b"not a pickle")
    (tmp_path / "junk.zip").write_bytes(zipped.getvalue())
    with pytest.raises(CheckpointError):
        in_thread(read_weights, tmp_path / "junk.zip")


def test_infer_with_a_text_file_says_one_line_and_exits_2(tmp_path, capsys):
    from tui.cli import main

    (tmp_path / "afile").write_text("hello world\n", encoding="utf-8")
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("afile", "empty.pt"):
        capsys.readouterr()
        code = in_thread(main, ["infer", "--headless", "--device", "cpu", "--weights",
                                str(tmp_path / name), "--run-dir", str(tmp_path / "runs")])
        err = capsys.readouterr().err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "not a memtop weights file" in err, err
    assert not (tmp_path / "runs").exists()
