"""Every README and docs/*.md cites only what exists: each `path:name`, repository path and
dotted `package.module.Name` in backticks is found in the code (the rules and the checker are
those of test_architecture_citations.py, here applied to every page).

A path is looked up from the repository root, from the page's own folder and from that folder's
tests (a package README names its files, and its tests' fixtures, relatively). Paths of a
running cluster's data dir (`D/...`), of generated bundles and the like are not repository
paths: `NOT_IN_THE_REPO` says which, by pattern.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.test_architecture_citations import PATH, PATH_NAME, ROOT, citations, missing

PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("*/README.md")),
    *sorted(ROOT.glob("*/*/README.md")),
]
# Things in backticks that look like paths or dotted names but name no file of the repository:
# a data dir and what `quorumq init` writes in it, bundles, MIME types, Spark's own files, and
# the hypothetical next machine version a README uses as its example.
NOT_IN_THE_REPO = re.compile(
    r"^(?:D/.*|tls/?|qq-bundles/.*|cluster\.toml|raft\.dump|application/\w+|--[\w/-]+"
    r"|_progress/|sbin/.*|bin/spark-class|fifo/v5/.*|fifo\.v5)$"
)


def problems_of(page: Path) -> list[str]:
    """The citations of one page that name nothing in the repository."""
    found: list[str] = []
    for token in citations(page.read_text()):
        if NOT_IN_THE_REPO.match(token):
            continue
        why = missing(token)
        if why is not None and (
            PATH.match(token) or PATH_NAME.match(token) or token.endswith(".py")
        ):
            folder = page.parent.relative_to(ROOT)
            local = [folder / token, Path("tests") / folder / token]
            if any((ROOT / place).exists() or missing(place.as_posix()) is None for place in local):
                why = None
        if why is not None:
            found.append(f"{page.relative_to(ROOT)}: `{token}`: {why}")
    return found


def test_every_page_cites_only_what_exists() -> None:
    """README.md, docs/*.md and the package READMEs name existing files and names."""
    assert len(PAGES) >= 10
    problems = [problem for page in PAGES for problem in problems_of(page)]
    assert not problems, "\n".join(problems)


def test_a_stale_reference_in_a_page_is_reported() -> None:
    """The check is not vacuous: a removed file, a renamed function, a missing module."""
    page = ROOT / "docs" / "x-planted.md"  # read by problems_of, never written to the tree
    text = "`cluster/client/nope.py` `cluster/client/sansio.py:Nope` `cluster.client.nope` `D/x`"

    class Planted(type(page)):  # type: ignore[misc]
        def read_text(self, *args: object, **kwargs: object) -> str:
            return text

    found = problems_of(Planted(page))
    assert [line.split("`")[1] for line in found] == [
        "cluster/client/nope.py",
        "cluster/client/sansio.py:Nope",
        "cluster.client.nope",
    ], found
