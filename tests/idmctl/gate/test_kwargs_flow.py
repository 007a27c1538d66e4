"""A kwarg taken by ``**kwargs`` is followed to where it goes: bound by a base, read by name,
or nowhere. Each class is real source in a temporary code root, and each verdict is checked against what
Python itself does when the class is built with that kwarg."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from idmctl.gate import kwargs_flow
from idmctl.gate.kwargs_flow import BOUND, READ, REJECTED, SWALLOWED, UNKNOWN

# Card A's job 6321, the subtle form: the parameter went into HiddenRaw, and HiddenMultiLayer (the class the
# spec builds) takes **kwargs, so the misspelt or misplaced kwarg raises nothing and goes nowhere.
DATA_PY = '''\
class Base:
    def __init__(self, window=2, **kwargs):
        self.window = window
        self.mmap = kwargs.get("mmap", True)


class Strict:
    def __init__(self, window=2):
        self.window = window


class HiddenRaw:
    def __init__(self, root, selected_layer_indices=None):
        self.root = root


class HiddenMultiLayer:
    def __init__(self, root, **kwargs):
        self.root = root


class ToBase(Base):
    def __init__(self, root, **kwargs):
        super().__init__(**kwargs)


class ToStrict(Strict):
    def __init__(self, root, **kw):
        Strict.__init__(self, **kw)


class ToObject:
    def __init__(self, root, **kwargs):
        super().__init__(**kwargs)


class PopsFirst:
    def __init__(self, root, **kwargs):
        self.mmap = kwargs.pop("mmap", True)
        super().__init__(**kwargs)


class Stores:
    def __init__(self, root, **kwargs):
        self.extra = kwargs
'''


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "teamrepo"
    (root / "flowpkg").mkdir(parents=True)
    (root / "flowpkg" / "__init__.py").write_text("")
    (root / "flowpkg" / "data.py").write_text(DATA_PY)
    sys.path.insert(0, str(root))
    yield root
    for name in [m for m in sys.modules if m == "flowpkg" or m.startswith("flowpkg.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p != str(root)]


def _verdicts(cls: type, **kwargs: object) -> dict[str, str]:
    return {f.name: f.verdict for f in kwargs_flow.follow(cls, list(kwargs))}


def _python_says(cls: type, **kwargs: object) -> str | None:
    try:
        cls("/cache", **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def test_each_fate_agrees_with_python(team: Path) -> None:
    data = importlib.import_module("flowpkg.data")
    # 6321's shape: accepted silently by Python, and going nowhere.
    assert _python_says(data.HiddenMultiLayer, selected_layer_indice=[1, 4]) is None
    assert _verdicts(data.HiddenMultiLayer, selected_layer_indice=[1, 4]) == {"selected_layer_indice": SWALLOWED}
    # Passed on by super() to a base that binds one name, reads another and swallows a third.
    assert _python_says(data.ToBase, window=3, mmap=False, windw=3) is None
    assert _verdicts(data.ToBase, window=3, mmap=False, windw=3) == {"window": BOUND, "mmap": READ, "windw": SWALLOWED}
    # Passed on by Base.__init__(self, **kw) to a base without **kwargs: Python raises, and so does the gate.
    assert "unexpected keyword argument 'windw'" in _python_says(data.ToStrict, windw=3)
    assert _verdicts(data.ToStrict, window=3, windw=3) == {"window": BOUND, "windw": REJECTED}
    # super() of a class with no base: object.__init__ takes nothing.
    assert "takes exactly one argument" in _python_says(data.ToObject, mmap=False)
    assert _verdicts(data.ToObject, mmap=False) == {"mmap": REJECTED}
    # Popped before it is passed on: read, and object.__init__ never sees it.
    assert _python_says(data.PopsFirst, mmap=False) is None
    assert _verdicts(data.PopsFirst, mmap=False) == {"mmap": READ}
    # Stored whole: where it goes is not in this source, so no verdict.
    assert _verdicts(data.Stores, anything=1) == {"anything": UNKNOWN}


def test_a_rejecting_base_is_named_with_the_line_that_passes_the_kwarg(team: Path) -> None:
    data = importlib.import_module("flowpkg.data")
    (fate,) = kwargs_flow.follow(data.ToStrict, ["windw"])
    line = 1 + DATA_PY.splitlines().index("        Strict.__init__(self, **kw)")
    assert fate.where.startswith("Strict (") and fate.where.endswith(f"flowpkg/data.py:{_line('class Strict:')})"), fate
    assert fate.path.startswith("ToStrict (") and f"Strict.__init__(**kw) at line {line} → " in fate.path, fate


def _line(text: str) -> int:
    return 1 + DATA_PY.splitlines().index(text)


def _spec(tiny_cache, directory: Path, team: Path, dataset: object) -> Path:
    path = tiny_cache.spec_file(directory, "flow_spec")
    document = yaml.safe_load(path.read_text())
    document["data"]["dataset"] = dataset
    document["code"] = {"roots": [str(team)]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _introspection(cli, spec: Path) -> dict:  # type: ignore[no-untyped-def]
    result = cli("preflight", str(spec), "--no-smoke", "--json")
    assert "Traceback" not in result.output, result.output
    (check,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "introspection"]
    return check


def test_preflight_warns_on_6321s_swallowed_kwarg_and_fails_on_a_rejecting_base(
        cli, tiny_cache, tmp_path: Path, team: Path, idmctl_home: Path) -> None:
    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "flowpkg.data.HiddenMultiLayer",
                                              "init_args": {"root": "/cache", "selected_layer_indices": [1, 4, 7, 10]}})
    check = _introspection(cli, spec)
    assert check["status"] == "WARN", check
    multi, raw = _line("class HiddenMultiLayer:"), _line("class HiddenRaw:")
    assert ("dataset: `selected_layer_indices` goes nowhere: HiddenMultiLayer (" in check["summary"]
            and f"flowpkg/data.py:{multi}) takes it by **kwargs" in check["summary"]), check["summary"]
    assert "it is a parameter of HiddenRaw (" in check["summary"] and f"flowpkg/data.py:{raw}), a look-alike" in check["summary"]
    assert check["numbers"]["dataset"]["kwargs_flow"] == {"selected_layer_indices": "swallowed"}

    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "flowpkg.data.ToStrict",
                                              "init_args": {"root": "/cache", "windw": 3}})
    check = _introspection(cli, spec)
    assert check["status"] == "FAIL", check
    assert "`windw` is taken by ToStrict (" in check["summary"] and "which does not take it → TypeError" in check["summary"]
    assert "remove `windw` from data.dataset init_args, or add it to Strict (" in check["fix"], check["fix"]

    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "flowpkg.data.ToBase",
                                              "init_args": {"root": "/cache", "window": 3, "mmap": False}})
    check = _introspection(cli, spec)
    assert check["status"] == "PASS", check
