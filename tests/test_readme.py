"""Every Python example in README.md runs on its own, in a fresh namespace, as a reader would paste it."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert BLOCKS, "README.md has no python examples"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_alone(index):
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {})
