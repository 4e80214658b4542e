"""The README is a front page: at most 150 lines, no table row over 200 characters, no
paragraph over six lines, and its two commands are the ones CI runs (.ci/run)."""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINES = README.splitlines()


def _prose_paragraphs() -> list[list[str]]:
    """Runs of non-blank lines outside code fences, tables, headings and comments; each list
    item is one."""
    out, cur, fenced = [], [], False
    for line in LINES:
        if line.startswith("```"):
            fenced = not fenced
            line = ""
        if fenced or not line.strip() or line.startswith(("|", "#", "<!--")):
            if cur:
                out.append(cur)
            cur = []
            continue
        if line.startswith(("- ", "* ")) and cur:  # a list item is a paragraph of its own
            out.append(cur)
            cur = []
        cur.append(line)
    if cur:
        out.append(cur)
    return out


def test_readme_is_at_most_150_lines():
    assert len(LINES) <= 150, f"README.md has {len(LINES)} lines"


def test_no_table_row_is_over_200_characters():
    long = [(i + 1, len(x)) for i, x in enumerate(LINES) if x.startswith("|") and len(x) > 200]
    assert not long, f"table rows over 200 characters (line, length): {long}"


def test_no_paragraph_is_over_six_lines():
    paragraphs = _prose_paragraphs()
    assert paragraphs
    long = [p[0][:60] for p in paragraphs if len(p) > 6]
    assert not long, f"paragraphs over six lines, starting: {long}"


def _readme_commands() -> list[str]:
    block = re.search(r"## The two commands.*?```bash\n(.*?)```", README, re.S)
    assert block, "README.md has no bash block under 'The two commands'"
    return [x for x in block.group(1).splitlines() if x.strip() and not x.startswith("#")]


def test_the_two_commands_are_the_main_job_and_what_ci_runs():
    first, second = _readme_commands()
    assert first == "pip install . && jaxoff train"
    ci = (ROOT / ".ci/run").read_text()
    install, test = (shlex.split(x) for x in second.split(" && "))
    assert install[:2] == ["pip", "install"] and test[0] == "pytest"
    # CI's pip install carries the same arguments (it adds -q); its pytest the same options
    ci_install = next(
        shlex.split(x) for x in ci.splitlines() if "-m pip install" in x and "-e" in x
    )
    assert [a for a in ci_install[4:] if a != "-q"] == install[2:]
    ci_test = next(shlex.split(x) for x in ci.splitlines() if "-m pytest" in x)
    assert all(a in ci_test for a in test[1:]), (test, ci_test)


def test_the_readme_states_each_commands_time():
    text = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"\d+ min", text) and "minutes" in text
    assert "tests took" in text
