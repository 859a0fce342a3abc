"""Imports only go down the layers of ``docs/architecture.md``'s table (the house section).

The table is read from the page itself, so the page and this test cannot drift apart: its rows
are the layers, bottom to top, and its second column names the layer's rooms, relative to
``src/tfonspark/``: a module (``errors.py``, ``__init__.py`` for the package itself) or a
package with everything in it (``driver/``). A module belongs to the room that names it most
closely. Every module must have a room; a module may import modules of its own layer or of a
lower one, never of a higher one. Every ``import`` counts, lazy and ``TYPE_CHECKING`` ones too
(``_graph.py``). The page also shows the arrows between rooms (``summary()``); regenerate that
block with ``python -m tests.unit.house.test_layers`` when an arrow between rooms appears or goes.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit._graph import graph

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
HEADER = "| layer | rooms | job |"


def layer_table(text: str) -> list[tuple[str, list[str]]]:
    """The (layer, rooms) rows of the table that starts with ``HEADER``, bottom layer first."""
    lines = text.splitlines()
    assert HEADER in lines, f"{DOC} has no layer table starting with {HEADER!r}"
    rows = []
    for line in lines[lines.index(HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def room_module(room: str) -> str:
    """``driver/`` -> ``tfonspark.driver``; ``wire/codec.py`` -> ``tfonspark.wire.codec``."""
    path = room.removesuffix("/").removesuffix(".py").removesuffix("__init__").removesuffix("/")
    return ".".join(["tfonspark", *filter(None, path.split("/"))])


def rooms_of(modules: set[str], table: list[tuple[str, list[str]]]) -> dict[str, tuple[int, str]]:
    """Each module's (layer index, room); a package room holds its submodules, a file room one."""
    out: dict[str, tuple[int, str]] = {}
    for module in modules:
        best: tuple[int, int, str] | None = None  # (specificity, layer, room)
        for layer, (_, rooms) in enumerate(table):
            for room in rooms:
                name = room_module(room)
                inside = room.endswith("/") and module.startswith(name + ".")
                if (module == name or inside) and (best is None or len(name) > best[0]):
                    best = (len(name), layer, room)
        if best is not None:
            out[module] = (best[1], best[2])
    return out


def upward(arrows: dict[str, set[str]], where: dict[str, tuple[int, str]]) -> list[str]:
    """Every import of a module in a higher layer, as ``importer -> imported``."""
    return sorted(f"{m} -> {d}" for m, targets in arrows.items() for d in targets if where[d][0] > where[m][0])


def summary(text: str | None = None) -> str:
    """The arrows between rooms, one line per room, bottom layer first (the page shows it)."""
    table = layer_table(DOC.read_text() if text is None else text)
    arrows = graph()
    where = rooms_of(set(arrows), table)
    order = {room: i for i, room in enumerate(room for _, rooms in table for room in rooms)}
    lines = []
    for layer, rooms in table:
        for room in rooms:
            targets = {where[d][1] for m, ds in arrows.items() if where[m][1] == room for d in ds} - {room}
            named = ", ".join(sorted(targets, key=order.__getitem__)) or "-"
            lines.append(f"{layer:<11} {room:<16} -> {named}")
    return "\n".join(lines)


def test_every_module_has_a_room_and_every_room_exists():
    table = layer_table(DOC.read_text())
    modules = set(graph())
    where = rooms_of(modules, table)
    assert sorted(modules - set(where)) == [], "modules without a room in the layer table"
    named = [room for _, rooms in table for room in rooms]
    assert len(named) == len(set(named)), "a room is named twice"
    assert [room for room in named if room_module(room) not in modules] == [], "rooms that do not exist"


def test_imports_never_go_up_a_layer():
    arrows = graph()
    assert upward(arrows, rooms_of(set(arrows), layer_table(DOC.read_text()))) == []


def test_the_page_shows_the_current_arrows_between_rooms():
    text = DOC.read_text()
    assert summary(text) in text, "docs/architecture.md: regenerate with python -m tests.unit.house.test_layers"


def test_the_checker_finds_an_upward_import():
    table = [("low", ["a.py", "b/"]), ("high", ["b/c.py", "__init__.py"])]
    arrows = {"tfonspark.a": {"tfonspark.b.c"}, "tfonspark.b.d": {"tfonspark.a"}, "tfonspark.b.c": set()}
    arrows["tfonspark"] = {"tfonspark.a"}
    where = rooms_of(set(arrows), table)
    assert where["tfonspark.b.c"] == (1, "b/c.py") and where["tfonspark.b.d"] == (0, "b/")
    assert where["tfonspark"] == (1, "__init__.py")
    assert upward(arrows, where) == ["tfonspark.a -> tfonspark.b.c"]


if __name__ == "__main__":
    print(summary())
