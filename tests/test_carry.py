"""Code carried forward: what one notebook's checks measured is what later notebooks load back.

The functions come back with the imports, constants and helper functions they use; what cannot
be carried (a tensor made in another cell) is named, and a notebook whose code was never kept
gets an error that names the notebook to run.
"""

import linecache
import textwrap

import pytest
import torch

from labsupport import carry


def _cell(source: str, namespace: dict, name: str = "<cell>") -> None:
    """Run ``source`` as a notebook cell would: registered in linecache, as IPython does."""
    source = textwrap.dedent(source)
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results" / "code"


def test_a_function_comes_back_with_its_imports_constants_and_helpers(store):
    space = {"__name__": "__main__", "torch": torch}
    _cell("""
        import numpy as np
        import torch.nn.functional as F
        SCALE = 2.5
        DTYPE = torch.bfloat16

        def _helper(x):
            return np.float64(x) * SCALE

        def choose_precision(machine):
            return {"dtype": DTYPE, "channels_last": _helper(1) > 2 and F is not None}
    """, space, "<cell 1>")
    path = carry.keep("03", space)
    text = path.read_text()
    assert "import numpy as np" in text and "SCALE = 2.5" in text and "def _helper" in text
    assert "from torch.nn import functional as F" in text and "DTYPE = torch.bfloat16" in text
    back = carry.load("03")
    assert back.choose_precision(None) == {"dtype": torch.bfloat16, "channels_last": True}
    assert not hasattr(back, "amp_train_step")  # not defined in that notebook: not carried


def test_what_cannot_be_carried_is_named(store, capsys):
    space = {"__name__": "__main__", "weights": torch.ones(3)}
    _cell("""
        def make_fast_loader(lab, split="train", augment=True):
            return weights
    """, space, "<cell 2>")
    text = carry.keep("02", space).read_text()
    assert "# not carried: weights: a Tensor object" in text
    assert "create it inside the function" in capsys.readouterr().out


def test_missing_code_names_the_notebook_to_run(store):
    with pytest.raises(carry.CarryError, match="02_data_loading.ipynb.*Check your work"):
        carry.load("02")


def test_the_reference_loader_round_trips(store, tiny_data, tiny, monkeypatch):
    from autograder import reference
    from labsupport.hardware import Lab, describe_machine

    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    carry.keep("02", reference.namespace("02"))
    lab = Lab(torch.device("cpu"), describe_machine(torch.device("cpu")), tiny, seed=0)
    images, labels = next(iter(carry.load("02", lab=lab).make_fast_loader(lab, split="val", augment=False)))
    assert images.shape == (tiny.batch_size, 3, tiny.image_size, tiny.image_size)


def test_a_helper_class_beside_the_graded_function_is_carried(tmp_path):
    """Classes defined in notebook cells, as IPython runs them (inspect.getsource cannot read a
    class whose module is __main__): a helper with a static method and a property, and a
    dataclass whose generated methods have no cell, are carried with the function that uses them."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for cell in ("from dataclasses import dataclass\nSCALE = 2\n\n@dataclass\nclass Cfg:\n    n: int = 3\n",
                     "class Helper:\n    def __init__(self, n):\n        self.n = n\n\n    @staticmethod\n"
                     "    def k():\n        return SCALE\n\n    @property\n    def twice(self):\n"
                     "        return self.k() * self.n * Cfg().n\n",
                     "def graded(x):\n    return Helper(x).twice\n"):
            assert shell.run_cell(cell).success
        source, problems = carry.source_of(["graded"], shell.user_ns)
    finally:
        InteractiveShell.clear_instance()
    assert problems == [], problems
    namespace = {"__name__": "carried"}
    exec(compile(source, "carried", "exec"), namespace)
    assert namespace["graded"](5) == 30


def test_what_cannot_be_carried_fails_the_self_check_loudly(tmp_path, monkeypatch):
    """In a kernel (IPython, ``__name__ == "__main__"``), a graded function that needs a notebook
    object carry cannot rebuild (a tensor) fails its checks there, saying what, rather than
    passing in the kernel and scoring 0 in the grader; constants that are tuples of literals carry."""
    from IPython.core.interactiveshell import InteractiveShell

    from labsupport import grading

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    shell = InteractiveShell.instance()
    try:
        for cell in ("import torch\nWEIGHTS = torch.ones(3)\nNAMES = ('compute', 'data wait')\n",
                     "def diagnose(breakdown):\n    assert WEIGHTS.sum() == 3 and len(NAMES) == 2\n"
                     "    return max(breakdown, key=breakdown.get)\n"):
            assert shell.run_cell(cell).success
        assert carry.problems("01", shell.user_ns) == [
            "WEIGHTS: a Tensor object, which later notebooks cannot get back; create it inside the function that uses it"]
        found = grading.run("01", shell.user_ns, only=("01-diagnose",))["01-diagnose"]
        shell.run_cell("WEIGHTS = 3.0\ndef diagnose(breakdown):\n    assert WEIGHTS == 3 and len(NAMES) == 2\n"
                       "    return max(breakdown, key=breakdown.get)\n")
        fixed = grading.run("01", shell.user_ns, only=("01-diagnose",))["01-diagnose"]
    finally:
        InteractiveShell.clear_instance()
    assert found.status == "fail" and "WEIGHTS: a Tensor object" in found.note, found
    assert fixed.reason == "below bar" and fixed.measured is not None, fixed  # measured (its answers are wrong)
