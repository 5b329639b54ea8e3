"""The adapter protocol is the whole contract: every adapter satisfies it and every caller outside
training uses nothing of an adapter that it does not declare."""

import ast
from pathlib import Path

import pytest

import vidsight
from vidsight.models import load_model, write_tiny_model
from vidsight.models.base import VLMAdapter
from vidsight.models.loading import ADAPTERS
from vidsight.models.tiny import TINY_FAMILIES

PACKAGE = Path(vidsight.__file__).parent
# Training and the watch bench's FLOP estimate read the task model's own modules on purpose.
OWN_MODEL_READERS = {"train/loop.py", "train/batches.py", "bench/watch.py"}


def declared() -> set[str]:
    members = set(VLMAdapter.__annotations__)
    members |= {name for name, value in vars(VLMAdapter).items() if callable(value) and not name.startswith("_")}
    return members


def adapter_uses(path: Path) -> set[str]:
    """Attributes read off names called ``adapter`` (or ``self.adapter``) in a module."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "adapter") or \
                (isinstance(owner, ast.Attribute) and owner.attr == "adapter"):
            used.add(node.attr)
    return used


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_family_satisfies_the_protocol(family, tmp_path):
    adapter = load_model(write_tiny_model(tmp_path / family, family=family), "cpu")
    assert adapter.family == family
    assert isinstance(adapter, VLMAdapter)
    assert all(hasattr(adapter, name) for name in declared())


def test_every_loadable_family_has_a_tiny_builder():
    assert set(TINY_FAMILIES) == set(ADAPTERS)


def test_callers_use_only_what_the_protocol_declares():
    undeclared = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in OWN_MODEL_READERS or relative.startswith("models/"):
            continue
        extra = adapter_uses(path) - declared()
        if extra:
            undeclared[relative] = sorted(extra)
    assert undeclared == {}
