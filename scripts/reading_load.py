"""How much a reader has to read in each built chapter, outside what is collapsed.

    python scripts/reading_load.py [HTML_DIR]      # a table, one row per chapter (default: _build/html)
    python scripts/reading_load.py page EXECUTED.ipynb   # one executed chapter, built alone as a page (approximate:
                                                         # theorem boxes and citations render as in no book)

Measured on the built HTML page of each chapter, after removing what a reader sees only on request: collapsed
admonitions (class `dropdown`: the "Reproducibility notes", solutions, hints), hidden code cells (`hide-input`,
`hide-cell`, `remove-*`) and every `<details>` block. What remains is the page's main text:

- **prose words**: words in the paragraphs, list items and tables (mathematics, code and citations not counted);
- **numbers per paragraph**: standalone numerals in each paragraph or list item (tables are not paragraphs) (a number glued in, "3.5 %", "[0.2, 0.4]"
  counts each numeral); numerals that are part of a name (ResNet-20, FC4, 32×32 counts as two), chapter, table,
  figure, section, equation and exercise numbers, years in citations and anything in mathematics or code are
  not counted;
- **visible code cells**: the source lines of every code cell whose input is shown (median and maximum).

The thresholds of issue 38 (a tutorial, not an audit) are checked by tests/rendered/test_reading_load.py.
"""
from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_CELL_TAGS = ("tag_hide-input", "tag_hide-cell", "tag_remove-input", "tag_remove-cell")
# a numeral on its own: not glued to a letter (FC4, vgg11) or to a hyphenated name (ResNet-20)
NUMERAL = re.compile(r"(?<![\w.\-])[-+−]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]\d+)?(?![\w])")
REFERENCE_WORDS = re.compile(
    r"\b(?:Chapters?|Ch\.|Tables?|Figures?|Fig\.|Sections?|§|Eqs?\.|Equations?|Exercises?|Theorems?|Lemmas?|"
    r"Definitions?|Propositions?|Corollary|Appendix|Steps?|Parts?|Algorithm|Remark|Example|v)\s*"
    r"\d+(?:\.\d+)*(?:\s*(?:,|and|–|-|to)\s*\d+(?:\.\d+)*)*", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z0-9][\w'’\-]*")


@dataclass
class Load:
    chapter: str
    words: int
    paragraphs: int
    numbers_per_paragraph: float
    most_numbers: int
    code_cells: int
    code_median: float
    code_max: int

    def row(self) -> str:
        return (f"| {self.chapter} | {self.words:,} | {self.paragraphs} | {self.numbers_per_paragraph:.2f} | "
                f"{self.most_numbers} | {self.code_cells} | {self.code_median:g} | {self.code_max} |")


def _strip_collapsed(article) -> None:
    for tag in article.find_all("details"):
        tag.decompose()
    for tag in article.find_all("div", class_="dropdown"):
        if not tag.decomposed:
            tag.decompose()
    for tag in article.find_all("div", class_="toggle-hidden"):
        if not tag.decomposed:
            tag.decompose()


def _visible_code(article) -> list[int]:
    lines = []
    for cell in article.find_all("div", class_="cell"):
        classes = cell.get("class", [])
        if any(t in classes for t in HIDDEN_CELL_TAGS):
            continue
        source = cell.find("div", class_="cell_input")
        if source is None:
            continue
        text = source.get_text().rstrip("\n")
        lines.append(len(text.splitlines()) if text.strip() else 0)
    return lines


def numerals(text: str) -> list[str]:
    """The numerals counted in a paragraph's text (see the module's docstring)."""
    text = REFERENCE_WORDS.sub(" ", text)
    return NUMERAL.findall(text.replace("×", " × "))


def measure(page: Path) -> Load:
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    article = soup.find("article") or soup
    code = _visible_code(article)
    _strip_collapsed(article)
    for cell in article.find_all("div", class_="cell"):
        cell.decompose()  # code and its outputs are not prose
    for tag in article.find_all(class_=["math", "bibtex-citation", "headerlink", "highlight"]):
        if not tag.decomposed:
            tag.decompose()
    for tag in article.find_all(["code", "pre", "script", "style"]):
        if not tag.decomposed:
            tag.decompose()
    blocks = [p for p in article.find_all(["p", "li"])
              if p.find_parent("li") is None or p.name == "li" and p.find_parent("li") is None]
    # list items count as paragraphs; a <p> inside a list item is part of it
    paragraphs = [b for b in blocks if not (b.name == "p" and b.find_parent("li") is not None)]
    paragraphs = [b for b in paragraphs if "admonition-title" not in (b.get("class") or [])
                  and "caption" not in " ".join(b.parent.get("class") or [])]
    in_table = [b for b in paragraphs if b.find_parent("table") is not None]
    table_words = sum(len(WORD.findall(cell.get_text(" "))) for cell in article.find_all(["td", "th"]))
    texts = [" ".join(b.get_text(" ").split()) for b in paragraphs if b not in in_table]
    texts = [t for t in texts if WORD.search(t)]
    counts = [len(numerals(t)) for t in texts]
    words = sum(len(WORD.findall(t)) for t in texts) + table_words
    return Load(chapter=page.stem, words=words, paragraphs=len(texts),
                numbers_per_paragraph=(sum(counts) / len(counts)) if counts else 0.0,
                most_numbers=max(counts, default=0), code_cells=len(code),
                code_median=statistics.median(code) if code else 0, code_max=max(code, default=0))


def chapter_pages(html: Path) -> list[Path]:
    return sorted((html / "book").glob("[0-9][0-9]_*.html"))


def page_load(executed: Path) -> Load:
    """Build one executed chapter as a stand-alone page (jupyter-book's single-page build, no execution) and
    measure it: a chapter's figures without building the whole book."""
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(executed, tmp)
        Path(tmp, "_config.yml").write_text("execute:\n  execute_notebooks: 'off'\n")  # measure, never execute
        subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", executed.name,
                        "--path-output", "out", "--config", "_config.yml"], cwd=tmp, check=True,
                       capture_output=True)
        return measure(Path(tmp, "out", "_build", "_page", executed.stem, "html", executed.stem + ".html"))


def main(argv: list[str]) -> int:
    if len(argv) > 2 and argv[1] == "page":
        for name in argv[2:]:
            print(page_load(Path(name).resolve()).row())
        return 0
    html = Path(argv[1]) if len(argv) > 1 else ROOT / "_build" / "html"
    pages = chapter_pages(html)
    if not pages:
        print(f"no chapter pages under {html / 'book'}: build the book first (make book)", file=sys.stderr)
        return 1
    print("| chapter | prose words | paragraphs | numbers / paragraph | most in one | visible code cells "
          "| median lines | longest |")
    print("|---|---|---|---|---|---|---|---|")
    for page in pages:
        print(measure(page).row())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
