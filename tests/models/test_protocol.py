"""The adapter protocol is the whole contract: every adapter satisfies it and every caller outside
training uses nothing of an adapter that it does not declare."""

import ast
from pathlib import Path

import vidsight
from vidsight.models.base import VLMAdapter

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


def test_the_adapters_satisfy_the_protocol(tiny_adapter):
    assert isinstance(tiny_adapter, VLMAdapter)
    assert all(hasattr(tiny_adapter, name) for name in declared())


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
