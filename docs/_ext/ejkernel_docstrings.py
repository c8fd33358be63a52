"""Reads ejkernel's docstrings, written in a plain Markdown-like style, as reStructuredText.

The docstrings put code in single backticks (`conf.py` makes those inline literals), start a bullet
list or an indented formula block right after a line of text, and sometimes glue a suffix to a
literal (`vmap` + "ped"). reStructuredText needs a blank line around lists and blocks and a word
boundary after inline markup; without them docutils warns and the `-W` build fails. This hook adds
exactly those, before napoleon reads the Google-style sections:

- a blank line before a bullet list that follows text, and after it;
- an indented block that follows text becomes a literal block (the formulas of the scans);
- a literal glued to letters (`` `vmap`ped ``) gets an escaped, invisible space after it.

Google-style sections (`Args:`, `Returns:`, `Raises:`, `Example:`, ...) are left to napoleon, except
for the last fix; literal blocks (after `::`) and doctest blocks (`>>>`) are left as they are.
"""

from __future__ import annotations

import re

SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|Returns?|Yields?"
    r"|Raises|Warns|Examples?|Notes?|Warnings?|See Also|References|Attributes|Methods|Todo)\s*:\s*$"
)
BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
GLUED_LITERAL = re.compile(r"(?<![`\\])(`[^`\s](?:[^`]*[^`\s])?`)(?=[A-Za-z0-9])")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _inline(line: str) -> str:
    return GLUED_LITERAL.sub(r"\1\\ ", line)


def normalise(lines: list[str]) -> list[str]:
    """The docstring `lines` (dedented, as autodoc gives them) with the fixes above."""
    out: list[str] = []
    i, n = 0, len(lines)

    def blank_before() -> None:
        if out and out[-1].strip():
            out.append("")

    def copy_block(base: int, fix: bool) -> None:
        """Copy the lines from `i` on that are blank or indented deeper than `base`."""
        nonlocal i
        while i < n and (not lines[i].strip() or _indent(lines[i]) > base):
            code = lines[i].lstrip().startswith((">>>", "..."))
            out.append(_inline(lines[i]) if fix and not code else lines[i])
            i += 1

    list_indent: int | None = None  # indentation of the bullets of the list being read, if any
    literal_base: int | None = None  # indentation of the text that ended with "::", if any
    while i < n:
        line = lines[i]
        text, indent = line.strip(), _indent(line)
        if not text:
            out.append(line)
            i += 1
            continue
        if literal_base is not None and indent > literal_base:  # the literal block after "::"
            copy_block(literal_base, fix=False)
            literal_base = None
            continue
        literal_base = None
        if SECTION.match(text):  # napoleon's: only the inline fix
            blank_before()
            out.append(line)
            i += 1
            copy_block(indent, fix=True)
            list_indent = None
            continue
        if text.startswith(">>>"):  # a doctest block runs to the next blank line
            blank_before()
            while i < n and lines[i].strip():
                out.append(lines[i])
                i += 1
            list_indent = None
            continue
        if BULLET.match(line):
            if list_indent is None or indent != list_indent or not out[-1].strip():
                blank_before()
            list_indent = indent
        elif list_indent is not None and out[-1].strip() and indent > list_indent:
            pass  # the current item goes on
        else:
            if list_indent is not None:
                blank_before()  # the list ended
                list_indent = None
            previous = out[-1] if out else ""
            if previous.strip() and indent > _indent(previous):
                # An indented block right after text: make it a literal block.
                base = _indent(previous)
                out[-1] = previous.rstrip() + (":" if previous.rstrip().endswith(":") else " ::")
                out.append("")
                copy_block(base, fix=False)
                while not out[-1].strip():
                    out.pop()
                out.append("")
                continue
        out.append(_inline(line))
        if text.endswith("::"):
            literal_base = indent
        i += 1
    return out


def _process(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = normalise(lines)


def setup(app):
    # Before napoleon (priority 500), which turns the Google-style sections into field lists.
    app.connect("autodoc-process-docstring", _process, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
