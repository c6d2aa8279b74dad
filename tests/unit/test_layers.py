"""The import arrows of the code base, as a table read from the source (every import, also the
ones under ``if TYPE_CHECKING``): a wrong-way import fails here, naming the file and the line.

Inside the broker the rooms are stacked

    model <- namespace <- ledger <- topics <- protocol <- admin <- broker.py

with ``schema`` and ``cluster`` beside ``ledger`` (they never import ``topics``, ``protocol`` or
``admin``). The root's leaf modules (``config``, ``errors``) may be imported from any room; the
composition root (``broker.py``) and the metrics binding (``metrics.py``) from none.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> import name, as pyproject.toml maps them.
FOLDERS = {"services": "magnetar", "common": "magnetar.common", "spark": "magnetar.spark"}

#: What each room of the broker may import from the other rooms.
ROOMS: dict[str, set[str]] = {
    "model": set(),
    "namespace": {"model"},
    "ledger": {"model", "namespace"},
    "schema": {"model", "namespace"},
    "cluster": {"model", "namespace"},
    "topics": {"model", "namespace", "ledger", "schema", "cluster"},
    "protocol": {"model", "namespace", "ledger", "schema", "cluster", "topics"},
    "admin": {"model", "namespace", "ledger", "schema", "cluster", "topics"},
}
#: Modules at the broker's top that every room may import: they import no room themselves.
SHARED_LEAVES = {"config", "errors"}
#: Modules at the broker's top that only the top may import.
TOP = {"broker", "metrics"}
#: Services that ``common`` must never import, and that stay apart from each other.
SERVICES = ("magnetar.broker", "magnetar.bookie", "magnetar.proxy", "magnetar.spark")


@dataclass(frozen=True)
class Import:
    source: Path
    line: int
    importer: str
    imported: str


def module_name(path: Path) -> str:
    folder = path.relative_to(ROOT).parts[0]
    parts = path.relative_to(ROOT / folder).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((FOLDERS[folder], *parts))


def imports_of(path: Path) -> list[Import]:
    importer = module_name(path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports pkg.mod when mod is a module: count both.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        found += [Import(path, node.lineno, importer, name) for name in names]
    return found


def all_imports() -> list[Import]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += imports_of(path)
    return found


def broker_place(module: str) -> str | None:
    """The room (or top-level module) of a broker module; None outside the broker."""
    if not module.startswith("magnetar.broker."):
        return None
    return module.split(".")[2]


def wrong_way(imp: Import) -> str | None:
    """Why ``imp`` breaks the table, or None when it is allowed."""
    if imp.importer.startswith("magnetar.common") and imp.imported.startswith(SERVICES):
        return "common imports no service"
    for service in SERVICES:
        other = [s for s in SERVICES if s != service]
        if imp.importer.startswith(service + ".") or imp.importer == service:
            if imp.imported.startswith(tuple(other)) and service != "magnetar.spark":
                return f"{service} imports another service"
    here, there = broker_place(imp.importer), broker_place(imp.imported)
    if here is None or there is None or here == there:
        return None
    if here not in ROOMS:
        return None  # the broker's top (broker.py, metrics.py, config, errors) may import rooms
    if there in SHARED_LEAVES:
        return None
    if there in TOP:
        return f"room {here!r} imports the top-level module {there!r}"
    if there not in ROOMS[here]:
        return f"room {here!r} may not import room {there!r}"
    return None


def test_rooms_exist() -> None:
    broker = ROOT / "services" / "broker"
    for room in ROOMS:
        assert (broker / room / "__init__.py").is_file(), f"missing room {room}"
    top = [p.name for p in broker.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 8, f"the broker's top holds {sorted(top)}: move them into rooms"


def test_every_import_goes_the_allowed_way() -> None:
    broken = [
        f"{imp.source.relative_to(ROOT)}:{imp.line}: {imp.imported} ({reason})"
        for imp in all_imports()
        if (reason := wrong_way(imp)) is not None
    ]
    assert broken == [], "wrong-way imports:\n" + "\n".join(broken)


def test_nothing_imports_admin() -> None:
    offenders = [
        f"{imp.source.relative_to(ROOT)}:{imp.line}"
        for imp in all_imports()
        if imp.imported.startswith("magnetar.broker.admin")
        and broker_place(imp.importer) not in {"admin", "broker"}
    ]
    assert offenders == []


def test_the_table_catches_a_wrong_way_import() -> None:
    """The rule itself, on made-up imports: a topic importing the wire layer is refused, a
    topic importing a position is not."""
    fake = ROOT / "services" / "broker" / "topics" / "x.py"
    assert wrong_way(Import(fake, 1, "magnetar.broker.topics.x", "magnetar.broker.protocol.c"))
    assert wrong_way(Import(fake, 1, "magnetar.broker.cluster.x", "magnetar.broker.topics.c"))
    assert wrong_way(Import(fake, 1, "magnetar.common.x", "magnetar.broker.model.position"))
    assert wrong_way(Import(fake, 1, "magnetar.broker.topics.x", "magnetar.broker.broker"))
    assert not wrong_way(Import(fake, 1, "magnetar.broker.topics.x", "magnetar.broker.model.p"))
    assert not wrong_way(Import(fake, 1, "magnetar.broker.broker", "magnetar.broker.admin.app"))
