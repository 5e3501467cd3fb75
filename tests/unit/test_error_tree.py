"""errors.py's docstring draws the error classes as a tree with their JSON-RPC codes and
HTTP statuses: the drawing is held to the classes (issue 51), so it cannot drift from them.
Every class of the module is in it, under its base, with the code and status it has."""

from __future__ import annotations

import inspect
import re

from gateway import errors

LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)(?P<rest>.*)$")
NUMBERS = re.compile(r"^\s+(?P<code>-\d{5})?\s*(?P<status>[1-5]\d\d)?(?:\s|$)")


def drawn() -> dict[str, tuple[str | None, int | None, int | None]]:
    """Each class the docstring draws: its drawn base, code and status (None: not drawn,
    inherited)."""
    doc = errors.__doc__ or ""
    tree = doc[:doc.index("Raise where")]
    out: dict[str, tuple[str | None, int | None, int | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in tree.splitlines():
        m = LINE.match(line)
        if m is None or not hasattr(errors, m["name"]):
            continue  # a line that goes on describing the one above
        depth = len(m["indent"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        numbers = NUMBERS.match(m["rest"])
        code = int(numbers["code"]) if numbers and numbers["code"] else None
        status = int(numbers["status"]) if numbers and numbers["status"] else None
        out[m["name"]] = (stack[-1][1] if stack else None, code, status)
        stack.append((depth, m["name"]))
    return out


def test_the_drawn_tree_is_the_classes() -> None:
    tree = drawn()
    classes = {name: cls for name, cls in vars(errors).items() if inspect.isclass(cls)
               and issubclass(cls, errors.GatewayError) and cls.__module__ == errors.__name__}
    assert sorted(tree) == sorted(classes), "a class missing from the drawing, or drawn only"
    for name, (base, code, status) in tree.items():
        cls = classes[name]
        if base is not None:
            assert cls.__bases__[0] is classes[base], f"{name} is drawn under {base}"
        if code is not None:
            assert cls.code == code, f"{name}: drawn {code}, is {cls.code}"
        if status is not None:
            assert cls.http_status == status, f"{name}: drawn {status}, is {cls.http_status}"
